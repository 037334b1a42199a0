"""When a heartbeat may return other workers' expired leases (``worker/reapgate.py``).

Pure logic over monotonic seconds: no database. A worker whose own round was late, or
whose database step was slow or failed, was held up by something that held up the other
workers' renewals too, so it leaves their leases alone for one visibility timeout.
"""

from __future__ import annotations

from django_tasks_plus.worker.reapgate import MAX_DEFERRAL, ReapGate, Verdict

VISIBILITY = 30.0
INTERVAL = 10.0  # the heartbeat's: a third of the visibility timeout


def _gate() -> ReapGate:
    return ReapGate(VISIBILITY, INTERVAL)


def _round(gate: ReapGate, at: float, step_seconds: float = 0.01, *, ok: bool = True) -> Verdict:
    """One heartbeat round starting at ``at``: one step, then the verdict."""
    gate.round_started(at)
    gate.step(at, at + step_seconds, succeeded=ok)
    verdict = gate.verdict(at + step_seconds)
    gate.round_ended(at + step_seconds)
    return verdict


def test_regular_prompt_rounds_reap_every_time():
    gate = _gate()
    assert gate.slack == INTERVAL / 2
    assert [_round(gate, INTERVAL * n) for n in range(6)] == [Verdict.REAP] * 6
    assert not gate.deferring


def test_a_late_round_defers_reaping_for_one_visibility_timeout():
    """A paused process (or a heartbeat that waited for its session): the round after
    the gap does not reap, nor does any until a lease's time has passed since."""
    gate = _gate()
    assert _round(gate, 0.0) is Verdict.REAP
    woke = 0.01 + INTERVAL + gate.slack + 1.0  # later than the interval allows
    assert _round(gate, woke) is Verdict.DEFER
    assert gate.deferring
    assert _round(gate, woke + INTERVAL) is Verdict.DEFER
    assert _round(gate, woke + 2 * INTERVAL) is Verdict.DEFER
    assert _round(gate, woke + VISIBILITY + 0.1) is Verdict.REAP
    assert not gate.deferring


def test_a_round_just_within_the_slack_is_not_late():
    gate = _gate()
    _round(gate, 0.0)
    assert _round(gate, 0.01 + INTERVAL + gate.slack - 0.01) is Verdict.REAP


def test_a_slow_step_defers_from_when_it_ended():
    gate = _gate()
    stalled_for = gate.slack + 0.5
    assert _round(gate, 0.0, stalled_for) is Verdict.DEFER
    # One lease's time after the slow step ended, not after it began.
    assert gate.verdict(stalled_for + VISIBILITY - 0.1) is Verdict.DEFER
    assert gate.verdict(stalled_for + VISIBILITY) is Verdict.REAP


def test_a_failed_step_defers_however_fast():
    gate = _gate()
    assert _round(gate, 0.0, 0.001, ok=False) is Verdict.DEFER


def test_each_new_stall_restarts_the_wait():
    gate = _gate()
    _round(gate, 0.0, gate.slack + 1)  # held up until 6.0
    gate.held_up(20.0)  # and again
    assert gate.verdict(6.0 + VISIBILITY + 1) is Verdict.DEFER
    assert gate.verdict(20.0 + VISIBILITY) is Verdict.REAP


def test_a_stall_reported_late_does_not_shorten_the_wait():
    """The worker's main thread reports its slow start after the heartbeat's thread has
    reported a later stall: the later end still counts."""
    gate = _gate()
    gate.held_up(20.0)
    gate.held_up(5.0)  # reported afterwards, ended earlier
    assert gate.verdict(5.0 + VISIBILITY) is Verdict.DEFER
    assert gate.verdict(20.0 + VISIBILITY) is Verdict.REAP


def test_stalls_without_end_defer_at_most_so_long():
    """Every round held up: after ``MAX_DEFERRAL`` visibility timeouts the reaper goes
    ahead anyway, and keeps going while the stalls last; one calm lease's time later it
    is back to the ordinary verdict."""
    gate = _gate()
    at, verdicts = 0.0, []
    while at < (MAX_DEFERRAL + 1) * VISIBILITY:
        verdicts.append((at, _round(gate, at, gate.slack + 1)))
        at += INTERVAL
    deferred = [at for at, verdict in verdicts if verdict is Verdict.DEFER]
    forced = [at for at, verdict in verdicts if verdict is Verdict.REAP_DESPITE_STALLS]
    assert deferred and forced
    assert max(deferred) < min(forced)
    first_stall_end = gate.slack + 1
    assert min(forced) >= first_stall_end + MAX_DEFERRAL * VISIBILITY - INTERVAL
    assert min(forced) - first_stall_end <= MAX_DEFERRAL * VISIBILITY + INTERVAL
    last_stall_end = at - INTERVAL + gate.slack + 1
    calm = [(at + INTERVAL * n, _round(gate, at + INTERVAL * n)) for n in range(5)]
    # The stalls ended: prompt rounds defer again, for a lease's time since the last.
    within_a_lease = [verdict for at, verdict in calm if at < last_stall_end + VISIBILITY]
    assert within_a_lease and set(within_a_lease) == {Verdict.DEFER}
    assert calm[-1][1] is Verdict.REAP
    assert not gate.deferring


def test_a_stall_as_long_as_the_deferral_bound_still_gives_the_renewals_their_time():
    """The stall lasted ``MAX_DEFERRAL`` leases and has ended: the first prompt round
    after it does not reap (before: it reaped despite stalls, just as the renewals and
    the outcome writes the stall had held up were landing, and a live task ran twice)."""
    gate = _gate()
    assert _round(gate, 0.0) is Verdict.REAP
    at = INTERVAL
    while at <= MAX_DEFERRAL * VISIBILITY:  # each round's step waits a whole interval
        assert _round(gate, at, INTERVAL) is not Verdict.REAP
        at += INTERVAL
    stall_end = at  # when the last slow step ended
    assert _round(gate, stall_end + 0.1) is Verdict.DEFER  # prompt: the stall is over
    assert gate.verdict(stall_end + VISIBILITY - 0.1) is Verdict.DEFER
    assert gate.verdict(stall_end + VISIBILITY) is Verdict.REAP


def test_a_first_round_later_than_an_interval_after_the_start_was_held_up():
    """The first round of a heartbeat that waited through a stall (its turn on the
    session was held by a service stuck behind the stall) judges nothing before the
    renewals the stall held up have had their time; an on-time first round reaps."""
    gate = _gate()
    gate.began(0.0)
    late = INTERVAL + gate.slack + 1.0
    assert _round(gate, late) is Verdict.DEFER
    assert gate.verdict(late + VISIBILITY) is Verdict.REAP

    on_time = _gate()
    on_time.began(0.0)
    assert _round(on_time, INTERVAL + gate.slack - 0.01) is Verdict.REAP


def test_the_slack_can_be_given():
    gate = ReapGate(VISIBILITY, INTERVAL, slack=1.0)
    assert _round(gate, 0.0, 0.9) is Verdict.REAP
    assert _round(gate, 1.0, 1.1) is Verdict.DEFER


def test_a_slack_of_zero_is_kept_not_replaced_by_the_default():
    gate = ReapGate(VISIBILITY, INTERVAL, slack=0.0)
    assert gate.slack == 0.0
    assert _round(gate, 0.0, 0.0) is Verdict.REAP
    assert _round(gate, INTERVAL, 0.01) is Verdict.DEFER  # any slower step is held up
