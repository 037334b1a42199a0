"""The pure circuit breaker: its definition and its state machine, with the clock injected."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import pytest

from django_tasks_plus import Abort, Breaker, BreakerHeldTooLong, InvalidTaskOptions, TaskDeferred
from django_tasks_plus.breaker import (
    CLOSED,
    MAX_DURATION,
    MAX_REMEMBERED_FAILURES,
    PREDICATE_RETENTION,
    Circuit,
    CorruptCircuit,
    Drop,
    Run,
    State,
    Wait,
    check_key,
    decide,
    failures_text,
    force,
    next_probe,
    parse_circuit,
    prune,
    record_failure,
    record_neutral,
    record_success,
    scoped_key,
    split_scoped_key,
)
from django_tasks_plus.limits import BREAKER_NAME_MAX_LENGTH, KEY_MAX_LENGTH

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)


def host(url: str, **kwargs) -> str | None:
    return urlsplit(url).hostname


def breaker(**options) -> Breaker:
    return Breaker(key=host, **options)


def fail_times(circuit: Circuit, times, *, guard: Breaker, task_id: str = "t") -> Circuit:
    for at in times:
        circuit, problem = record_failure(guard, circuit, now=at, task_id=task_id)
        assert problem is None
    return circuit


def open_circuit(opened_at: datetime = NOW) -> Circuit:
    return Circuit(state=State.OPEN, opened_at=opened_at)


def half_open(probe: str | None = "probe", started: datetime | None = NOW) -> Circuit:
    return Circuit(
        state=State.HALF_OPEN,
        opened_at=NOW - timedelta(hours=1),
        probe_task_id=probe,
        probe_started_at=started,
    )


# -- the definition -----------------------------------------------------------------------


def test_breaker_defaults():
    guard = breaker()
    assert guard.name == "default"
    assert guard.failure_threshold == 5
    assert guard.failure_window == timedelta(minutes=5)
    assert guard.failure is None
    assert guard.recovery == guard.recovery_delay == timedelta(minutes=30)
    assert guard.ttl == guard.held_ttl == timedelta(days=7)
    assert guard.recheck == guard.release_interval == timedelta(seconds=1)
    assert guard.retention == timedelta(minutes=5)
    assert guard.failures is None
    assert guard.on_state_change is None
    assert guard.on_drop is None


def test_breaker_takes_seconds_as_numbers_for_every_duration():
    guard = breaker(failure_window=90, recovery_delay=2.5, held_ttl=3600, release_interval=0.25)
    assert guard.failure_window == timedelta(seconds=90)
    assert guard.recovery == timedelta(seconds=2.5)
    assert guard.ttl == timedelta(hours=1)
    assert guard.recheck == timedelta(milliseconds=250)
    assert guard.retention == timedelta(seconds=90)


def test_breaker_with_only_a_threshold_keeps_the_default_window_and_vice_versa():
    assert breaker(failure_threshold=2).failure_window == timedelta(minutes=5)
    assert breaker(failure_window=MINUTE).failure_threshold == 5


def test_breaker_with_a_predicate_has_no_threshold_and_remembers_an_hour():
    guard = breaker(failure=lambda times: len(times) > 3)
    assert guard.failure_threshold is None
    assert guard.failure_window is None
    assert guard.retention == PREDICATE_RETENTION == timedelta(hours=1)


@pytest.mark.parametrize(
    "options",
    [
        {"failure_threshold": 3},
        {"failure_window": MINUTE},
        {"failure_threshold": 3, "failure_window": MINUTE},
    ],
    ids=["threshold", "window", "both"],
)
def test_breaker_refuses_a_predicate_with_a_threshold_or_window(options):
    with pytest.raises(InvalidTaskOptions, match="not both"):
        breaker(failure=lambda times: True, **options)


@pytest.mark.parametrize("threshold", [0, -1, True, False, 1.5, "5", 5.0])
def test_breaker_refuses_a_threshold_that_is_not_a_positive_integer(threshold):
    with pytest.raises(InvalidTaskOptions, match="failure_threshold"):
        breaker(failure_threshold=threshold)


def test_breaker_accepts_a_threshold_of_one():
    assert breaker(failure_threshold=1).failure_threshold == 1


@pytest.mark.parametrize(
    "field", ["failure_window", "recovery_delay", "held_ttl", "release_interval"]
)
@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        0.0,
        timedelta(0),
        timedelta(seconds=-1),
        math.nan,
        math.inf,
        -math.inf,
        True,
        "60",
        "1 minute",
        1e20,
        timedelta.max,
        MAX_DURATION + SECOND,
    ],
)
def test_breaker_refuses_a_bad_duration(field, value):
    with pytest.raises(InvalidTaskOptions, match=field):
        breaker(**{field: value})


@pytest.mark.parametrize("field", ["recovery_delay", "held_ttl", "release_interval"])
def test_breaker_refuses_none_for_a_duration_without_a_default_fallback(field):
    with pytest.raises(InvalidTaskOptions, match=field):
        breaker(**{field: None})


@pytest.mark.parametrize(
    "field", ["failure_window", "recovery_delay", "held_ttl", "release_interval"]
)
def test_breaker_accepts_the_longest_duration(field):
    guard = breaker(**{field: MAX_DURATION})
    assert getattr(guard, field) == MAX_DURATION


def test_a_breaker_with_the_longest_durations_still_decides_without_overflow():
    guard = breaker(
        failure_window=MAX_DURATION,
        recovery_delay=MAX_DURATION,
        held_ttl=MAX_DURATION,
        release_interval=MAX_DURATION,
    )
    decision, _ = decide(guard, open_circuit(), now=NOW, task_id="t", held_since=NOW)
    assert decision == Wait(NOW + MAX_DURATION, decision.reason, NOW + MAX_DURATION)
    decision, _ = decide(guard, half_open(), now=NOW, task_id="t", held_since=None)
    assert isinstance(decision, Wait)
    assert prune(guard, [NOW - SECOND], NOW) == (NOW - SECOND,)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a/b",
        "/",
        "a\x00b",
        "x" * (BREAKER_NAME_MAX_LENGTH + 1),
        None,
        5,
        b"bytes",
    ],
    ids=["empty", "slash", "only-slash", "nul", "too-long", "none", "int", "bytes"],
)
def test_breaker_refuses_a_bad_name(name):
    with pytest.raises(InvalidTaskOptions, match="name"):
        breaker(name=name)


def test_breaker_accepts_a_name_of_the_longest_length():
    name = "x" * BREAKER_NAME_MAX_LENGTH
    assert breaker(name=name).name == name


@pytest.mark.parametrize("key", [None, "host", 5])
def test_breaker_refuses_a_key_that_is_not_callable(key):
    with pytest.raises(InvalidTaskOptions, match="key"):
        Breaker(key=key)


@pytest.mark.parametrize("predicate", [5, "len", True])
def test_breaker_refuses_a_predicate_that_is_not_callable(predicate):
    with pytest.raises(InvalidTaskOptions, match="predicate"):
        breaker(failure=predicate)


@pytest.mark.parametrize("hook", ["on_state_change", "on_drop"])
@pytest.mark.parametrize("value", [5, "print", object()])
def test_breaker_refuses_a_hook_that_is_not_callable(hook, value):
    with pytest.raises(InvalidTaskOptions, match=hook):
        breaker(**{hook: value})


def test_breaker_keeps_callable_hooks():
    def changed(key, old, new):
        return None

    def dropped(key, task):
        return None

    guard = breaker(on_state_change=changed, on_drop=dropped)
    assert guard.on_state_change is changed
    assert guard.on_drop is dropped


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        (ConnectionError, (ConnectionError,)),
        ((ConnectionError, TimeoutError), (ConnectionError, TimeoutError)),
        ([ConnectionError, TimeoutError], (ConnectionError, TimeoutError)),
        ((KeyboardInterrupt,), (KeyboardInterrupt,)),
    ],
    ids=["one-class", "tuple", "list", "base-exception"],
)
def test_breaker_normalises_the_failure_classes_to_a_tuple(given, kept):
    assert breaker(failures=given).failures == kept


@pytest.mark.parametrize(
    "given",
    [
        int,
        (ValueError, int),
        (ValueError, "OSError"),
        "ValueError",
        ValueError("instance"),
        (ValueError("instance"),),
        {ValueError},
        5,
    ],
    ids=["int", "tuple-with-int", "tuple-with-str", "str", "instance", "tuple-of-instance",
         "set", "number"],
)  # fmt: skip
def test_breaker_refuses_failures_that_are_not_exception_classes(given):
    with pytest.raises(InvalidTaskOptions, match="failures"):
        breaker(failures=given)


def test_breakers_compare_by_identity_and_are_hashable():
    one, two = breaker(), breaker()
    assert one != two
    assert one == one
    assert len({one, two, one}) == 2


def test_breaker_is_frozen():
    guard = breaker()
    with pytest.raises(AttributeError):
        guard.name = "other"


# -- which exceptions count -------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [ValueError("x"), ConnectionError("x"), TimeoutError(), OSError(), RuntimeError(), Exception()],
)
def test_every_exception_counts_by_default(exc):
    assert breaker().counts(exc)


@pytest.mark.parametrize(
    "exc",
    [
        Abort("stop"),
        BreakerHeldTooLong("held"),
        TaskDeferred(delay=5),
        KeyboardInterrupt(),
        SystemExit(1),
        GeneratorExit(),
        BaseException(),
    ],
)
def test_abort_deferral_and_base_exceptions_do_not_count_by_default(exc):
    assert not breaker().counts(exc)


def test_only_the_listed_classes_and_their_subclasses_count():
    guard = breaker(failures=(ConnectionError, TimeoutError))
    assert guard.counts(ConnectionError())
    assert guard.counts(ConnectionRefusedError())
    assert guard.counts(TimeoutError())
    assert not guard.counts(ValueError())
    assert not guard.counts(OSError())
    assert not guard.counts(Abort())


def test_listed_classes_may_include_abort_or_base_exceptions():
    guard = breaker(failures=(Abort, KeyboardInterrupt))
    assert guard.counts(Abort())
    assert guard.counts(BreakerHeldTooLong())
    assert guard.counts(KeyboardInterrupt())
    assert not guard.counts(ValueError())


def test_an_empty_failure_list_is_refused_since_it_could_never_open():
    with pytest.raises(InvalidTaskOptions, match="non-empty tuple"):
        breaker(failures=())


# -- keys -------------------------------------------------------------------------------------

LONGEST_KEY = KEY_MAX_LENGTH - BREAKER_NAME_MAX_LENGTH - 1


def test_check_key_passes_none_and_good_strings():
    assert check_key(None, "key") is None
    assert check_key("example.com", "key") == "example.com"
    assert check_key("a/b", "key") == "a/b"
    assert check_key("k" * LONGEST_KEY, "key") == "k" * LONGEST_KEY


@pytest.mark.parametrize(
    "value",
    ["", "a\x00b", 5, b"host", ["host"], "k" * (LONGEST_KEY + 1)],
    ids=["empty", "nul", "int", "bytes", "list", "too-long"],
)
def test_check_key_refuses_bad_keys_naming_where(value):
    with pytest.raises(ValueError, match=r"deliver\.key"):
        check_key(value, "deliver.key")


def test_the_longest_key_with_the_longest_name_fits_the_column():
    scoped = scoped_key("n" * BREAKER_NAME_MAX_LENGTH, "k" * LONGEST_KEY)
    assert len(scoped) == KEY_MAX_LENGTH


@pytest.mark.parametrize("key", ["example.com", "a/b/c", "/", "x"])
def test_scoped_keys_split_back_into_name_and_key(key):
    scoped = scoped_key("webhooks", key)
    assert scoped == f"webhooks/{key}"
    assert split_scoped_key(scoped) == ("webhooks", key)


def test_split_scoped_key_without_a_slash_has_an_empty_key():
    assert split_scoped_key("lonely") == ("lonely", "")


# -- failures and the threshold -----------------------------------------------------------


def test_failures_below_the_threshold_keep_the_circuit_closed():
    guard = breaker(failure_threshold=3, failure_window=MINUTE)
    circuit = fail_times(CLOSED, [NOW, NOW + SECOND], guard=guard)
    assert circuit.state is State.CLOSED
    assert circuit.failures == (NOW, NOW + SECOND)
    assert circuit.opened_at is None


def test_reaching_the_threshold_inside_the_window_opens_the_circuit():
    guard = breaker(failure_threshold=3, failure_window=MINUTE)
    times = [NOW, NOW + 10 * SECOND, NOW + 59 * SECOND]
    circuit = fail_times(CLOSED, times, guard=guard)
    assert circuit.state is State.OPEN
    assert circuit.opened_at == times[-1]
    assert circuit.failures == tuple(times)
    assert circuit.probe_task_id is None


def test_failures_spread_wider_than_the_window_do_not_open_the_circuit():
    guard = breaker(failure_threshold=3, failure_window=MINUTE)
    times = [NOW, NOW + 40 * SECOND, NOW + 80 * SECOND, NOW + 120 * SECOND]
    circuit = fail_times(CLOSED, times, guard=guard)
    assert circuit.state is State.CLOSED
    # At the last failure, only the one 40 s earlier is still inside the window.
    assert circuit.failures == (NOW + 80 * SECOND, NOW + 120 * SECOND)


def test_a_failure_exactly_one_window_old_is_forgotten():
    guard = breaker(failure_threshold=2, failure_window=MINUTE)
    circuit = fail_times(CLOSED, [NOW, NOW + MINUTE], guard=guard)
    assert circuit.state is State.CLOSED
    assert circuit.failures == (NOW + MINUTE,)
    circuit = fail_times(CLOSED, [NOW, NOW + MINUTE - timedelta(microseconds=1)], guard=guard)
    assert circuit.state is State.OPEN


def test_old_stored_failures_are_pruned_before_counting():
    guard = breaker(failure_threshold=3, failure_window=MINUTE)
    stale = Circuit(failures=(NOW - timedelta(hours=2), NOW - timedelta(hours=1)))
    circuit, problem = record_failure(guard, stale, now=NOW, task_id="t")
    assert problem is None
    assert circuit.state is State.CLOSED
    assert circuit.failures == (NOW,)


def test_a_threshold_of_one_opens_on_the_first_failure():
    circuit = fail_times(CLOSED, [NOW], guard=breaker(failure_threshold=1))
    assert circuit.state is State.OPEN
    assert circuit.opened_at == NOW


def test_failures_recorded_out_of_order_are_kept_sorted():
    guard = breaker(failure_threshold=10, failure_window=MINUTE)
    circuit = fail_times(CLOSED, [NOW + 5 * SECOND, NOW, NOW + 2 * SECOND], guard=guard)
    assert circuit.failures == (NOW, NOW + 2 * SECOND, NOW + 5 * SECOND)


def test_prune_keeps_failures_inside_the_retention_oldest_first():
    guard = breaker(failure_window=MINUTE)
    kept = prune(guard, [NOW, NOW - 30 * SECOND, NOW - MINUTE, NOW - 2 * MINUTE], NOW)
    assert kept == (NOW - 30 * SECOND, NOW)
    assert prune(guard, [], NOW) == ()


def test_prune_keeps_at_most_the_newest_thousand():
    guard = breaker(failure_window=timedelta(hours=1))
    times = [NOW - timedelta(milliseconds=i) for i in range(MAX_REMEMBERED_FAILURES + 50)]
    kept = prune(guard, times, NOW)
    assert len(kept) == MAX_REMEMBERED_FAILURES
    assert kept[-1] == NOW
    assert kept[0] == NOW - timedelta(milliseconds=MAX_REMEMBERED_FAILURES - 1)


def test_recorded_failures_are_capped_at_the_thousand_newest():
    guard = breaker(failure_threshold=5000, failure_window=timedelta(hours=1))
    full = Circuit(
        failures=tuple(NOW - timedelta(seconds=i) for i in range(MAX_REMEMBERED_FAILURES, 0, -1))
    )
    circuit, _ = record_failure(guard, full, now=NOW, task_id="t")
    assert circuit.state is State.CLOSED
    assert len(circuit.failures) == MAX_REMEMBERED_FAILURES
    assert circuit.failures[-1] == NOW
    assert circuit.failures[0] == NOW - timedelta(seconds=MAX_REMEMBERED_FAILURES - 1)


def test_a_threshold_above_the_cap_can_never_trip():
    guard = breaker(failure_threshold=MAX_REMEMBERED_FAILURES + 1, failure_window=3600)
    times = [NOW + timedelta(milliseconds=i) for i in range(MAX_REMEMBERED_FAILURES + 10)]
    circuit = fail_times(CLOSED, times, guard=guard)
    assert circuit.state is State.CLOSED
    assert len(circuit.failures) == MAX_REMEMBERED_FAILURES


# -- predicate mode ---------------------------------------------------------------------------


def test_the_predicate_sees_the_pruned_failure_times_as_a_tuple():
    seen = []

    def predicate(times):
        seen.append(times)
        return False

    guard = breaker(failure=predicate)
    old = NOW - timedelta(hours=1)  # exactly one retention old: forgotten
    recent = NOW - timedelta(minutes=59)
    circuit, problem = record_failure(guard, Circuit(failures=(old, recent)), now=NOW, task_id="t")
    assert problem is None
    assert circuit.state is State.CLOSED
    assert seen == [(recent, NOW)]
    assert isinstance(seen[0], tuple)
    assert circuit.failures == (recent, NOW)


def test_a_predicate_that_says_yes_opens_the_circuit():
    guard = breaker(failure=lambda times: len(times) >= 2 and times[-1] - times[0] < MINUTE)
    circuit = fail_times(CLOSED, [NOW], guard=guard)
    assert circuit.state is State.CLOSED
    circuit = fail_times(circuit, [NOW + 30 * SECOND], guard=guard)
    assert circuit.state is State.OPEN
    assert circuit.opened_at == NOW + 30 * SECOND


def test_a_truthy_predicate_result_opens_the_circuit():
    circuit = fail_times(CLOSED, [NOW], guard=breaker(failure=lambda times: [1]))
    assert circuit.state is State.OPEN


def test_a_predicate_remembers_an_hour_of_failures_not_the_default_window():
    guard = breaker(failure=lambda times: False)
    times = [NOW, NOW + timedelta(minutes=30), NOW + timedelta(minutes=59)]
    circuit = fail_times(CLOSED, times, guard=guard)
    assert circuit.failures == tuple(times)
    circuit = fail_times(circuit, [NOW + timedelta(minutes=61)], guard=guard)
    assert circuit.failures == (*times[1:], NOW + timedelta(minutes=61))


def test_a_predicate_that_raises_leaves_the_circuit_closed_and_returns_the_exception():
    def predicate(times):
        raise ZeroDivisionError("oops")

    guard = breaker(failure=predicate)
    before = Circuit(failures=(NOW - SECOND,))
    circuit, problem = record_failure(guard, before, now=NOW, task_id="t")
    assert isinstance(problem, ZeroDivisionError)
    assert circuit == Circuit(failures=(NOW - SECOND, NOW))


def test_a_predicate_sees_at_most_the_thousand_newest_failures():
    sizes = []
    guard = breaker(failure=lambda times: sizes.append(len(times)) or False)
    full = Circuit(
        failures=tuple(NOW - timedelta(seconds=i) for i in range(MAX_REMEMBERED_FAILURES, 0, -1))
    )
    circuit, _ = record_failure(guard, full, now=NOW, task_id="t")
    assert sizes == [MAX_REMEMBERED_FAILURES]
    assert len(circuit.failures) == MAX_REMEMBERED_FAILURES


def test_the_predicate_is_not_asked_while_the_circuit_is_open_or_half_open():
    asked = []
    guard = breaker(failure=lambda times: asked.append(times) or True)
    record_failure(guard, open_circuit(), now=NOW, task_id="t")
    record_failure(guard, half_open(), now=NOW, task_id="other")
    record_failure(guard, half_open(), now=NOW, task_id="probe")
    assert asked == []


# -- decide -------------------------------------------------------------------------------------


def test_a_closed_circuit_runs_every_task_even_one_held_past_its_ttl():
    guard = breaker()
    circuit = Circuit(failures=(NOW,))
    assert decide(guard, circuit, now=NOW, task_id="t", held_since=None) == (Run(), circuit)
    long_ago = NOW - timedelta(days=30)
    assert decide(guard, circuit, now=NOW, task_id="t", held_since=long_ago) == (Run(), circuit)


def test_an_open_circuit_holds_until_the_recovery_delay_and_parks_the_others():
    guard = breaker(recovery_delay=timedelta(minutes=30))
    circuit = open_circuit(NOW)
    decision, after = decide(guard, circuit, now=NOW + MINUTE, task_id="t", held_since=None)
    probe_at = NOW + timedelta(minutes=30)
    assert isinstance(decision, Wait)
    assert decision.until == probe_at
    assert decision.park_until == probe_at
    assert probe_at.isoformat() in decision.reason
    assert after == circuit


def test_an_open_circuit_hold_is_capped_by_the_held_ttl_deadline():
    guard = breaker(recovery_delay=timedelta(hours=2), held_ttl=timedelta(hours=1))
    circuit = open_circuit(NOW)
    held_since = NOW - timedelta(minutes=50)
    decision, _ = decide(guard, circuit, now=NOW, task_id="t", held_since=held_since)
    assert decision.until == held_since + timedelta(hours=1)
    assert decision.park_until == NOW + timedelta(hours=2)  # the others still park to the probe


def test_a_first_hold_is_capped_by_now_plus_the_ttl():
    guard = breaker(recovery_delay=timedelta(hours=2), held_ttl=timedelta(hours=1))
    decision, _ = decide(guard, open_circuit(NOW), now=NOW, task_id="t", held_since=None)
    assert decision.until == NOW + timedelta(hours=1)


def test_an_open_circuit_past_its_recovery_delay_lets_the_task_probe():
    guard = breaker(recovery_delay=timedelta(minutes=30))
    circuit = Circuit(state=State.OPEN, failures=(NOW,), opened_at=NOW)
    later = NOW + timedelta(minutes=30)
    decision, after = decide(guard, circuit, now=later, task_id="p1", held_since=NOW)
    assert decision == Run(probe=True)
    assert after.state is State.HALF_OPEN
    assert after.probe_task_id == "p1"
    assert after.probe_started_at == later
    assert after.opened_at == NOW
    assert after.failures == (NOW,)


def test_an_open_circuit_without_an_opened_at_holds_from_now():
    guard = breaker(recovery_delay=MINUTE)
    circuit = Circuit(state=State.OPEN)
    decision, _ = decide(guard, circuit, now=NOW, task_id="t", held_since=None)
    assert decision.until == NOW + MINUTE


def test_half_open_the_probe_reclaimed_stays_the_probe():
    guard = breaker()
    circuit = half_open("p1", NOW)
    later = NOW + MINUTE
    decision, after = decide(guard, circuit, now=later, task_id="p1", held_since=None)
    assert decision == Run(probe=True)
    assert after.state is State.HALF_OPEN
    assert after.probe_task_id == "p1"
    assert after.probe_started_at == later


def test_half_open_another_task_joins_the_park_until_the_probe_would_be_stale():
    """Held one by one for a release interval, it would be claimed (and take the circuit
    row's lock) again every interval for as long as the probe runs."""
    guard = breaker(recovery_delay=timedelta(minutes=30), release_interval=2)
    circuit = half_open("p1", NOW)
    now = NOW + MINUTE
    decision, after = decide(guard, circuit, now=now, task_id="t2", held_since=None)
    assert isinstance(decision, Wait)
    stale_at = NOW + timedelta(minutes=30)
    assert decision.until == decision.park_until == stale_at
    assert "p1" in decision.reason
    assert after == circuit


def test_half_open_hold_is_capped_by_the_held_ttl_deadline():
    guard = breaker(release_interval=10, held_ttl=60)
    circuit = half_open("p1", NOW)
    held_since = NOW - 55 * SECOND
    decision, _ = decide(guard, circuit, now=NOW, task_id="t2", held_since=held_since)
    assert decision.until == held_since + MINUTE


def test_half_open_a_stale_probe_is_replaced_by_the_next_task():
    guard = breaker(recovery_delay=timedelta(minutes=30))
    circuit = half_open("p1", NOW)
    stale = NOW + timedelta(minutes=30)
    decision, after = decide(guard, circuit, now=stale, task_id="t2", held_since=NOW)
    assert decision == Run(probe=True)
    assert after.probe_task_id == "t2"
    assert after.probe_started_at == stale
    # Just before it is stale, the probe still owns the slot.
    decision, _ = decide(guard, circuit, now=stale - SECOND, task_id="t2", held_since=None)
    assert isinstance(decision, Wait)


@pytest.mark.parametrize(
    ("probe", "started"), [(None, None), (None, NOW), ("p1", None)], ids=["none", "id", "time"]
)
def test_half_open_without_a_live_probe_the_next_task_probes(probe, started):
    circuit = half_open(probe, started)
    decision, after = decide(breaker(), circuit, now=NOW, task_id="t2", held_since=None)
    assert decision == Run(probe=True)
    assert (after.probe_task_id, after.probe_started_at) == ("t2", NOW)


@pytest.mark.parametrize(
    "circuit", [open_circuit(NOW), half_open("p1", NOW)], ids=["open", "half-open"]
)
def test_a_task_held_past_its_ttl_is_dropped_while_the_circuit_is_not_closed(circuit):
    guard = breaker(held_ttl=timedelta(days=7))
    held_since = NOW - timedelta(days=7)
    decision, after = decide(guard, circuit, now=NOW, task_id="t", held_since=held_since)
    assert decision == Drop(held_since)
    assert after == circuit
    just_in_time = held_since + timedelta(microseconds=1)
    decision, _ = decide(guard, circuit, now=NOW, task_id="t", held_since=just_in_time)
    assert isinstance(decision, Wait)
    assert decision.until <= just_in_time + timedelta(days=7)


def test_a_probe_due_task_held_past_its_ttl_is_dropped_rather_than_probing():
    guard = breaker(recovery_delay=MINUTE, held_ttl=timedelta(hours=1))
    circuit = open_circuit(NOW - timedelta(hours=2))
    held_since = NOW - timedelta(hours=1)
    decision, after = decide(guard, circuit, now=NOW, task_id="t", held_since=held_since)
    assert decision == Drop(held_since)
    assert after.state is State.OPEN


def test_the_probe_itself_held_past_its_ttl_is_dropped():
    guard = breaker(held_ttl=MINUTE)
    circuit = half_open("p1", NOW)
    decision, _ = decide(guard, circuit, now=NOW + MINUTE, task_id="p1", held_since=NOW)
    assert decision == Drop(NOW)


# -- outcomes -----------------------------------------------------------------------------------


def test_a_success_in_a_closed_circuit_forgets_its_failures():
    circuit = Circuit(failures=(NOW, NOW + SECOND), parked_until=NOW)
    assert record_success(circuit, task_id="t") == CLOSED


def test_the_probe_success_closes_the_circuit():
    circuit = Circuit(
        state=State.HALF_OPEN,
        failures=(NOW,),
        opened_at=NOW,
        probe_task_id="p1",
        probe_started_at=NOW,
        parked_until=NOW + MINUTE,
    )
    assert record_success(circuit, task_id="p1") == CLOSED


@pytest.mark.parametrize(
    "circuit", [open_circuit(NOW), half_open("p1", NOW)], ids=["open", "half-open"]
)
def test_a_success_other_than_the_probe_changes_nothing(circuit):
    assert record_success(circuit, task_id="late") == circuit


def test_the_probe_failure_reopens_the_circuit_from_now():
    guard = breaker()
    circuit = half_open("p1", NOW)
    later = NOW + MINUTE
    after, problem = record_failure(guard, circuit, now=later, task_id="p1")
    assert problem is None
    assert after == Circuit(state=State.OPEN, failures=(later,), opened_at=later)


def test_a_failure_other_than_the_probe_in_half_open_only_records():
    guard = breaker()
    circuit = half_open("p1", NOW)
    after, problem = record_failure(guard, circuit, now=NOW + SECOND, task_id="late")
    assert problem is None
    assert after.state is State.HALF_OPEN
    assert after.probe_task_id == "p1"
    assert after.probe_started_at == NOW
    assert after.opened_at == circuit.opened_at
    assert after.failures == (NOW + SECOND,)


def test_a_failure_in_an_open_circuit_records_without_moving_opened_at():
    guard = breaker(failure_threshold=1)
    circuit = Circuit(state=State.OPEN, failures=(NOW,), opened_at=NOW, parked_until=NOW)
    after, problem = record_failure(guard, circuit, now=NOW + SECOND, task_id="late")
    assert problem is None
    assert after == Circuit(
        state=State.OPEN, failures=(NOW, NOW + SECOND), opened_at=NOW, parked_until=NOW
    )


def test_a_neutral_probe_frees_the_probe_slot():
    circuit = half_open("p1", NOW)
    after = record_neutral(circuit, task_id="p1")
    assert after.state is State.HALF_OPEN
    assert after.probe_task_id is None
    assert after.probe_started_at is None
    assert after.opened_at == circuit.opened_at
    decision, _ = decide(breaker(), after, now=NOW + SECOND, task_id="t2", held_since=None)
    assert decision == Run(probe=True)


@pytest.mark.parametrize(
    ("circuit", "task_id"),
    [
        (CLOSED, "t"),
        (Circuit(failures=(NOW,)), "t"),
        (open_circuit(NOW), "t"),
        (half_open("p1", NOW), "other"),
    ],
    ids=["closed", "closed-with-failures", "open", "half-open-not-probe"],
)
def test_a_neutral_outcome_otherwise_changes_nothing(circuit, task_id):
    assert record_neutral(circuit, task_id=task_id) == circuit


# -- force --------------------------------------------------------------------------------------


def test_force_closed_forgets_everything():
    assert force(State.CLOSED, now=NOW) == CLOSED


def test_force_open_opens_from_now_with_no_failures():
    assert force(State.OPEN, now=NOW) == Circuit(state=State.OPEN, opened_at=NOW)


def test_force_half_open_is_refused():
    with pytest.raises(ValueError, match="half-open"):
        force(State.HALF_OPEN, now=NOW)


# -- the stored form ----------------------------------------------------------------------------


def test_failures_text_round_trips_through_parse_circuit():
    times = (NOW - MINUTE, NOW, NOW + timedelta(microseconds=1))
    text = failures_text(times)
    assert text.startswith("[")
    circuit = parse_circuit("closed", text, None, None, None, None)
    assert circuit == Circuit(failures=times)


def test_parse_circuit_reads_every_column():
    circuit = parse_circuit(
        "half-open", failures_text([NOW]), NOW, "p1", NOW + SECOND, NOW + MINUTE
    )
    assert circuit == Circuit(
        state=State.HALF_OPEN,
        failures=(NOW,),
        opened_at=NOW,
        probe_task_id="p1",
        probe_started_at=NOW + SECOND,
        parked_until=NOW + MINUTE,
    )


@pytest.mark.parametrize("empty", [None, "", "[]"])
def test_parse_circuit_reads_no_failures(empty):
    assert parse_circuit("closed", empty, None, None, None, None) == CLOSED


def test_parse_circuit_makes_naive_failure_times_utc_and_sorts_them():
    text = '["2026-01-01T12:00:05", "2026-01-01T12:00:00+00:00", "2026-01-01T13:00:01+01:00"]'
    circuit = parse_circuit("closed", text, None, None, None, None)
    assert circuit.failures == (NOW, NOW + SECOND, NOW + 5 * SECOND)
    assert all(at.tzinfo is not None for at in circuit.failures)


def test_parse_circuit_keeps_the_thousand_newest_failures():
    times = [NOW + timedelta(seconds=i) for i in range(MAX_REMEMBERED_FAILURES + 5)]
    circuit = parse_circuit("closed", failures_text(times), None, None, None, None)
    assert circuit.failures == tuple(times[5:])


def test_parse_circuit_reads_an_empty_probe_id_as_none():
    circuit = parse_circuit("half-open", "[]", NOW, "", None, None)
    assert circuit.probe_task_id is None


@pytest.mark.parametrize(
    ("columns", "problem"),
    [
        (("ajar", "[]", None, None, None, None), "unknown state"),
        (("CLOSED", "[]", None, None, None, None), "unknown state"),
        ((None, "[]", None, None, None, None), "unknown state"),
        (("closed", "not json", None, None, None, None), "failure times"),
        (("closed", '{"at": "2026-01-01"}', None, None, None, None), "failure times"),
        (("closed", '"2026-01-01T12:00:00"', None, None, None, None), "failure times"),
        (("closed", "5", None, None, None, None), "failure times"),
        (("closed", "null", None, None, None, None), "failure times"),
        (("closed", '["yesterday"]', None, None, None, None), "failure times"),
        (("closed", "[1767268800]", None, None, None, None), "failure times"),
        (("closed", "[null]", None, None, None, None), "failure times"),
        (("closed", '[["2026-01-01"]]', None, None, None, None), "failure times"),
        (("closed", "[NaN]", None, None, None, None), "failure times"),
        (("closed", "[" * 100_000, None, None, None, None), "failure times"),
        (("closed", 5, None, None, None, None), "failure times"),
        (("closed", ["2026-01-01T12:00:00"], None, None, None, None), "failure times"),
        (("open", "[]", None, None, None, None), "no time it opened"),
        (("half-open", "[]", NOW, 5, NOW, None), "probe task id"),
        (("half-open", "[]", NOW, b"p1", NOW, None), "probe task id"),
    ],
    ids=[
        "unknown-state",
        "upper-case-state",
        "no-state",
        "not-json",
        "object",
        "bare-string",
        "number",
        "null",
        "not-iso",
        "epoch-number",
        "null-item",
        "nested-list",
        "nan",
        "deeply-nested",
        "not-text",
        "list-not-text",
        "open-without-time",
        "int-probe-id",
        "bytes-probe-id",
    ],
)
def test_parse_circuit_refuses_a_corrupt_row(columns, problem):
    with pytest.raises(CorruptCircuit, match=problem):
        parse_circuit(*columns)


def test_corrupt_circuit_is_a_value_error():
    assert issubclass(CorruptCircuit, ValueError)


# -- a whole walk through the state machine -----------------------------------------------------


def test_a_full_walk_closed_open_held_probe_fail_open_probe_succeed_closed():
    guard = breaker(
        failure_threshold=3,
        failure_window=MINUTE,
        recovery_delay=timedelta(minutes=10),
        release_interval=SECOND,
        held_ttl=timedelta(days=1),
        failures=(ConnectionError,),
    )
    clock = NOW
    circuit = CLOSED

    # Closed: tasks run; an exception that does not count is neutral.
    decision, circuit = decide(guard, circuit, now=clock, task_id="a", held_since=None)
    assert decision == Run()
    assert not guard.counts(ValueError())
    circuit = record_neutral(circuit, task_id="a")
    assert circuit == CLOSED

    # Two failures, then a success forgets them.
    for task_id in ("a", "b"):
        clock += SECOND
        circuit, _ = record_failure(guard, circuit, now=clock, task_id=task_id)
    assert len(circuit.failures) == 2
    circuit = record_success(circuit, task_id="c")
    assert circuit == CLOSED

    # Three failures inside the window open it.
    for task_id in ("d", "e", "f"):
        clock += SECOND
        assert guard.counts(ConnectionError())
        circuit, _ = record_failure(guard, circuit, now=clock, task_id=task_id)
    assert circuit.state is State.OPEN
    opened_at = clock
    assert circuit.opened_at == opened_at

    # A task that started before the circuit opened fails late: recorded, no reset.
    clock += SECOND
    circuit, _ = record_failure(guard, circuit, now=clock, task_id="late")
    assert circuit.state is State.OPEN
    assert circuit.opened_at == opened_at

    # Open: tasks are held until the probe time, the others parked to it.
    clock += MINUTE
    held_since = clock
    decision, circuit = decide(guard, circuit, now=clock, task_id="g", held_since=None)
    probe_at = opened_at + timedelta(minutes=10)
    assert decision == Wait(probe_at, decision.reason, probe_at)

    # Recovery delay over: the held task becomes the probe; another waits.
    clock = probe_at
    decision, circuit = decide(guard, circuit, now=clock, task_id="g", held_since=held_since)
    assert decision == Run(probe=True)
    assert circuit.state is State.HALF_OPEN
    decision, circuit = decide(guard, circuit, now=clock, task_id="h", held_since=held_since)
    stale_at = clock + timedelta(minutes=10)
    assert decision == Wait(stale_at, decision.reason, stale_at)  # joins the park

    # The probe fails: open again from now.
    clock += 5 * SECOND
    circuit, _ = record_failure(guard, circuit, now=clock, task_id="g")
    assert circuit.state is State.OPEN
    assert circuit.opened_at == clock
    assert circuit.probe_task_id is None
    reopened_at = clock

    # The old probe time has passed but the new one has not: held again.
    decision, circuit = decide(guard, circuit, now=clock, task_id="h", held_since=held_since)
    assert isinstance(decision, Wait)
    assert decision.until == reopened_at + timedelta(minutes=10)

    # Second probe; a non-probe success meanwhile changes nothing.
    clock = reopened_at + timedelta(minutes=10)
    decision, circuit = decide(guard, circuit, now=clock, task_id="h", held_since=held_since)
    assert decision == Run(probe=True)
    assert circuit.probe_task_id == "h"
    assert record_success(circuit, task_id="late") == circuit

    # The probe succeeds: closed, failures forgotten; tasks run again.
    clock += SECOND
    circuit = record_success(circuit, task_id="h")
    assert circuit == CLOSED
    decision, circuit = decide(guard, circuit, now=clock, task_id="i", held_since=held_since)
    assert decision == Run()


def test_a_walk_through_a_dead_probe_and_a_held_ttl_drop():
    guard = breaker(failure_threshold=1, recovery_delay=MINUTE, held_ttl=timedelta(minutes=3))
    circuit, _ = record_failure(guard, CLOSED, now=NOW, task_id="a")
    assert circuit.state is State.OPEN

    # The first task after the delay probes, then its worker dies: no report.
    clock = NOW + MINUTE
    decision, circuit = decide(guard, circuit, now=clock, task_id="p1", held_since=None)
    assert decision == Run(probe=True)
    held_since = NOW + 10 * SECOND
    decision, circuit = decide(guard, circuit, now=clock, task_id="b", held_since=held_since)
    assert isinstance(decision, Wait)

    # After another recovery delay, the probe is stale and "b" takes over.
    clock += MINUTE
    decision, circuit = decide(guard, circuit, now=clock, task_id="b", held_since=held_since)
    assert decision == Run(probe=True)
    assert circuit.probe_task_id == "b"

    # "b" fails: open again; by the time it may probe, "c" has been held too long.
    circuit, _ = record_failure(guard, circuit, now=clock, task_id="b")
    clock += MINUTE
    decision, _ = decide(guard, circuit, now=clock, task_id="c", held_since=clock - 3 * MINUTE)
    assert decision == Drop(clock - 3 * MINUTE)


# -- when the next probe comes ------------------------------------------------------------------


def test_an_open_circuit_probes_a_recovery_delay_after_it_opened():
    recovery = timedelta(minutes=30)
    assert next_probe(open_circuit(NOW), recovery) == NOW + recovery
    # Without the breaker loaded here: the time the workers parked its tasks until.
    parked = replace(open_circuit(NOW), parked_until=NOW + recovery)
    assert next_probe(parked, None) == NOW + recovery
    stale = replace(open_circuit(NOW), parked_until=NOW - MINUTE)  # parked before it reopened
    assert next_probe(stale, None) is None


def test_a_half_open_circuit_probes_again_if_its_probe_stays_silent_and_a_closed_one_never():
    recovery = timedelta(minutes=10)
    assert next_probe(half_open(started=NOW), recovery) == NOW + recovery
    assert next_probe(half_open(started=NOW), None) is None
    assert next_probe(CLOSED, recovery) is None


def test_a_circuit_the_database_cannot_answer_for_holds_until_the_held_ttl_runs_out():
    """``_undecided``: a short hold while the task has not been held for ``held_ttl``;
    after that the database's error fails the attempt (tests/test_breakers.py has the
    worker's side, with a real lock timeout)."""
    from django.db import OperationalError

    from django_tasks_plus.circuits import UNDECIDED_HOLD, _Key, _undecided
    from django_tasks_plus.middleware import Attempt, Hold
    from tests import tasks

    breaker = Breaker(key=lambda host: host, name="web", held_ttl=60)
    where = _Key("default", "default", "web", "example.com")
    task = tasks.call_host
    error = OperationalError("canceling statement due to lock timeout")

    def attempt(held_for: timedelta | None) -> Attempt:
        held_since = None if held_for is None else datetime.now(UTC) - held_for
        return Attempt(
            id="t1",
            task=task,
            task_path=task.module_path,
            queue_name="default",
            priority=0,
            number=1,
            args=("example.com", 1),
            kwargs={},
            result=None,  # type: ignore[arg-type]  # not read
            backend="default",
            held_since=held_since,
        )

    for held_for in (None, timedelta(seconds=30)):
        hold = _undecided(breaker, where, attempt(held_for), error)
        assert isinstance(hold, Hold)
        assert hold.delay == UNDECIDED_HOLD and hold.until is None
        assert "web/example.com: its state could not be read (OperationalError)" in hold.reason
    with pytest.raises(OperationalError, match="lock timeout"):
        _undecided(breaker, where, attempt(timedelta(seconds=61)), error)
