"""Unit tests for the pure doer governors (no database, no Django)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone

import pytest

from django_tasks_plus.worker.doers import (
    DOERS,
    AgeDoer,
    BalancedDoer,
    Doer,
    PriorityDoer,
    UnlimitedDoer,
    make_doer,
)

BASE = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Item:
    label: str
    priority: int = 0
    queue_name: str = "default"
    task_path: str = "app.tasks.work"
    enqueued_at: datetime = field(default=BASE)


def labels(items: list[Item]) -> list[str]:
    return [item.label for item in items]


def take_all(doer: Doer) -> list[str]:
    """Start every waiting task, as a worker with unlimited threads would."""
    started = []
    while (item := doer.next()) is not None:
        started.append(item.label)
    return started


def at(minutes: int) -> datetime:
    return BASE + timedelta(minutes=minutes)


ALL_CLASSES = [UnlimitedDoer, PriorityDoer, AgeDoer, BalancedDoer]


# --- choice order -----------------------------------------------------------------------------


def test_unlimited_is_fifo() -> None:
    doer = UnlimitedDoer()
    doer.admit([Item("a", priority=-5), Item("b", priority=50)])
    doer.admit([Item("c", enqueued_at=at(-60))])
    assert take_all(doer) == ["a", "b", "c"]


def test_priority_runs_highest_first() -> None:
    doer = PriorityDoer()
    doer.admit([Item("low", -100), Item("high", 100), Item("mid", 0), Item("mid+", 1)])
    assert take_all(doer) == ["high", "mid+", "mid", "low"]


def test_priority_ties_keep_admission_order() -> None:
    doer = PriorityDoer()
    doer.admit([Item("a1", 5), Item("b1", 1), Item("a2", 5)])
    doer.admit([Item("b2", 1), Item("a3", 5)])
    assert take_all(doer) == ["a1", "a2", "a3", "b1", "b2"]


def test_priority_later_admission_can_jump_ahead() -> None:
    doer = PriorityDoer()
    doer.admit([Item("a", 0), Item("b", 0)])
    assert doer.next() == Item("a", 0)
    doer.admit([Item("urgent", 10)])
    assert take_all(doer) == ["urgent", "b"]


def test_age_runs_oldest_first() -> None:
    doer = AgeDoer()
    doer.admit([Item("new", enqueued_at=at(10)), Item("old", enqueued_at=at(-10))])
    doer.admit([Item("mid", enqueued_at=at(0), priority=99)])
    assert take_all(doer) == ["old", "mid", "new"]


def test_age_ties_keep_admission_order() -> None:
    doer = AgeDoer()
    doer.admit([Item("x", enqueued_at=at(1)), Item("y", enqueued_at=at(1))])
    doer.admit([Item("z", enqueued_at=at(1)), Item("first", enqueued_at=at(0))])
    assert take_all(doer) == ["first", "x", "y", "z"]


def test_age_compares_instants_across_timezones() -> None:
    plus_two = timezone(timedelta(hours=2))
    doer = AgeDoer()
    # 13:00+02:00 is 11:00 UTC, earlier than 12:00 UTC.
    doer.admit(
        [
            Item("utc", enqueued_at=BASE),
            Item("cest", enqueued_at=BASE.replace(hour=13, tzinfo=plus_two)),
        ]
    )
    assert take_all(doer) == ["cest", "utc"]


def test_age_rejects_naive_datetimes_without_partial_admission() -> None:
    doer = AgeDoer()
    batch = [Item("ok", enqueued_at=BASE), Item("naive", enqueued_at=datetime(2024, 1, 1))]
    with pytest.raises(ValueError, match="timezone-aware"):
        doer.admit(batch)
    assert doer.waiting == 0
    assert doer.next() is None


def test_balanced_round_robins_across_queues() -> None:
    doer = BalancedDoer()
    doer.admit(
        [
            Item("a1", queue_name="A"),
            Item("a2", queue_name="A"),
            Item("a3", queue_name="A"),
            Item("b1", queue_name="B"),
            Item("c1", queue_name="C"),
            Item("c2", queue_name="C"),
        ]
    )
    assert take_all(doer) == ["a1", "b1", "c1", "a2", "c2", "a3"]


def test_balanced_ignores_priority_and_age() -> None:
    doer = BalancedDoer()
    doer.admit(
        [
            Item("a1", priority=-10, enqueued_at=at(5), queue_name="A"),
            Item("a2", priority=10, enqueued_at=at(-5), queue_name="A"),
        ]
    )
    assert take_all(doer) == ["a1", "a2"]


def test_balanced_resumes_after_last_served_group() -> None:
    doer = BalancedDoer()
    doer.admit([Item("a1", queue_name="A"), Item("b1", queue_name="B")])
    assert doer.next() == Item("a1", queue_name="A")
    # A gets more work, but B is next in the rotation.
    doer.admit([Item("a2", queue_name="A"), Item("c1", queue_name="C")])
    assert take_all(doer) == ["b1", "c1", "a2"]


def test_balanced_group_rejoins_at_original_position() -> None:
    doer = BalancedDoer()
    doer.admit(
        [
            Item("a1", queue_name="A"),
            Item("b1", queue_name="B"),
            Item("c1", queue_name="C"),
            Item("a2", queue_name="A"),
            Item("c2", queue_name="C"),
        ]
    )
    assert take_all(doer) == ["a1", "b1", "c1", "a2", "c2"]
    # B emptied long ago; new groups D and a refilled B: B keeps its slot between A and C.
    doer.admit(
        [
            Item("d1", queue_name="D"),
            Item("b2", queue_name="B"),
            Item("a3", queue_name="A"),
            Item("c3", queue_name="C"),
        ]
    )
    # Last served was C, so the rotation continues D, A, B, C.
    assert take_all(doer) == ["d1", "a3", "b2", "c3"]


def test_balanced_by_task_path() -> None:
    doer = BalancedDoer(key="task")
    doer.admit(
        [
            Item("s1", queue_name="q1", task_path="app.send"),
            Item("s2", queue_name="q2", task_path="app.send"),
            Item("r1", queue_name="q1", task_path="app.resize"),
            Item("s3", queue_name="q1", task_path="app.send"),
            Item("r2", queue_name="q2", task_path="app.resize"),
        ]
    )
    assert doer.key == "task"
    assert take_all(doer) == ["s1", "r1", "s2", "r2", "s3"]


def test_balanced_by_queue_ignores_task_path() -> None:
    doer = BalancedDoer(key="queue")
    doer.admit(
        [
            Item("x1", queue_name="q", task_path="app.one"),
            Item("x2", queue_name="q", task_path="app.two"),
            Item("y1", queue_name="r", task_path="app.one"),
        ]
    )
    assert doer.key == "queue"
    assert take_all(doer) == ["x1", "y1", "x2"]


@pytest.mark.parametrize("key", ["tasks", "Queue", "", None, 1])
def test_balanced_rejects_unknown_key(key: object) -> None:
    with pytest.raises(ValueError, match=r"unknown balanced doer key .*choose one of: queue, task"):
        BalancedDoer(key=key)  # type: ignore[arg-type]


# --- counters, limits, capacity ---------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_empty_doer_returns_none(cls: type[Doer]) -> None:
    doer = cls()
    assert doer.next() is None
    assert (doer.waiting, doer.running) == (0, 0)
    assert doer.drain() == []


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_counters_track_waiting_and_running(cls: type[Doer]) -> None:
    doer = cls()
    items = [Item("a"), Item("b"), Item("c")]
    doer.admit(iter(items))  # any iterable, including a one-shot iterator
    assert (doer.waiting, doer.running) == (3, 0)
    first = doer.next()
    assert first is items[0]
    assert (doer.waiting, doer.running) == (2, 1)
    doer.finished(first)
    assert (doer.waiting, doer.running) == (2, 0)


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_limit_blocks_next_until_finished(cls: type[Doer]) -> None:
    doer = cls(limit=2)
    doer.admit([Item("a"), Item("b"), Item("c")])
    first, second = doer.next(), doer.next()
    assert labels([first, second]) == ["a", "b"]
    assert doer.next() is None
    assert (doer.waiting, doer.running) == (1, 2)
    doer.finished(second)
    assert doer.running == 1
    third = doer.next()
    assert third is not None and third.label == "c"
    assert doer.next() is None
    assert (doer.waiting, doer.running) == (0, 2)


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_limit_of_one_serialises(cls: type[Doer]) -> None:
    doer = cls(limit=1)
    doer.admit([Item("a"), Item("b")])
    started = doer.next()
    assert started is not None and started.label == "a"
    assert doer.next() is None
    doer.finished(started)
    assert labels([doer.next()]) == ["b"]


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_capacity_without_limit(cls: type[Doer]) -> None:
    doer = cls()
    assert doer.limit is None
    assert doer.capacity(5) == 5
    assert doer.capacity(0) == 0
    assert doer.capacity(-3) == 0
    doer.admit([Item("a"), Item("b")])
    doer.next()
    # Without a limit only the worker's free slots matter.
    assert doer.capacity(7) == 7


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_capacity_with_limit(cls: type[Doer]) -> None:
    doer = cls(limit=4)
    assert doer.limit == 4
    assert doer.capacity(10) == 4
    assert doer.capacity(3) == 3
    assert doer.capacity(-1) == 0
    doer.admit([Item("a"), Item("b"), Item("c")])
    doer.next()
    # running 1 + waiting 2 leaves room for 1.
    assert doer.capacity(10) == 1
    assert doer.capacity(0) == 0
    doer.next()
    doer.next()
    # running 3 + waiting 0 still leaves room for 1.
    assert doer.capacity(10) == 1
    doer.admit([Item("d")])
    assert doer.capacity(10) == 0
    doer.next()
    assert doer.capacity(10) == 0
    assert doer.capacity(-5) == 0


def test_capacity_never_negative_when_over_admitted() -> None:
    doer = UnlimitedDoer(limit=2)
    doer.admit([Item("a"), Item("b"), Item("c"), Item("d")])
    assert doer.waiting == 4
    assert doer.capacity(10) == 0


@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize("limit", [0, -1, True, False, 1.0, "2"])
def test_invalid_limit_rejected(cls: type[Doer], limit: object) -> None:
    with pytest.raises(ValueError, match=r"limit must be an int >= 1 or None, got "):
        cls(limit=limit)  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_limit_one_and_none_accepted(cls: type[Doer]) -> None:
    assert cls(limit=1).limit == 1
    assert cls(limit=None).limit is None


# --- finished ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_finished_unknown_item_raises(cls: type[Doer]) -> None:
    doer = cls()
    with pytest.raises(ValueError, match="is not running"):
        doer.finished(Item("ghost"))
    assert doer.running == 0


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_finished_waiting_item_raises(cls: type[Doer]) -> None:
    doer = cls()
    waiting = Item("w")
    doer.admit([waiting])
    with pytest.raises(ValueError, match="is not running"):
        doer.finished(waiting)
    assert doer.waiting == 1


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_finished_twice_raises(cls: type[Doer]) -> None:
    doer = cls()
    doer.admit([Item("a")])
    item = doer.next()
    assert item is not None
    doer.finished(item)
    with pytest.raises(ValueError, match="is not running"):
        doer.finished(item)
    assert doer.running == 0


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_finished_compares_by_identity(cls: type[Doer]) -> None:
    doer = cls()
    running = Item("same")
    lookalike = Item("same")
    assert running == lookalike and running is not lookalike
    doer.admit([running])
    assert doer.next() is running
    with pytest.raises(ValueError, match="is not running"):
        doer.finished(lookalike)
    assert doer.running == 1
    doer.finished(running)
    assert doer.running == 0


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_equal_items_are_tracked_separately(cls: type[Doer]) -> None:
    doer = cls()
    first, second = Item("dup"), Item("dup")
    doer.admit([first, second])
    started = [doer.next(), doer.next()]
    assert started[0] is first and started[1] is second
    doer.finished(second)
    assert doer.running == 1
    doer.finished(first)
    assert doer.running == 0


# --- drain ------------------------------------------------------------------------------------


DRAIN_BATCH = [
    Item("a1", priority=1, queue_name="A", enqueued_at=at(3)),
    Item("a2", priority=5, queue_name="A", enqueued_at=at(1)),
    Item("b1", priority=5, queue_name="B", enqueued_at=at(2)),
    Item("c1", priority=-1, queue_name="C", enqueued_at=at(0)),
]


@pytest.mark.parametrize(
    ("doer", "expected"),
    [
        (UnlimitedDoer(), ["a1", "a2", "b1", "c1"]),
        (PriorityDoer(), ["a2", "b1", "a1", "c1"]),
        (AgeDoer(), ["c1", "a2", "b1", "a1"]),
        (BalancedDoer(), ["a1", "b1", "c1", "a2"]),
    ],
    ids=lambda value: getattr(value, "name", None),
)
def test_drain_matches_next_order_and_empties(doer: Doer, expected: list[str]) -> None:
    doer.admit(DRAIN_BATCH)
    assert labels(doer.drain()) == expected
    assert doer.waiting == 0
    assert doer.next() is None
    assert doer.drain() == []


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_drain_leaves_running_tasks_alone(cls: type[Doer]) -> None:
    doer = cls(limit=1)
    doer.admit([Item("a"), Item("b"), Item("c")])
    started = doer.next()
    assert started is not None
    assert labels(doer.drain()) == ["b", "c"]
    assert (doer.waiting, doer.running) == (0, 1)
    assert doer.capacity(5) == 0
    doer.finished(started)
    assert doer.capacity(5) == 1


def test_balanced_drain_keeps_rotation_position() -> None:
    doer = BalancedDoer()
    doer.admit([Item("a1", queue_name="A"), Item("b1", queue_name="B")])
    assert labels([doer.next()]) == ["a1"]
    assert labels(doer.drain()) == ["b1"]
    # The drained B task never ran, so B is still next in the rotation.
    doer.admit([Item("a2", queue_name="A"), Item("b2", queue_name="B")])
    assert take_all(doer) == ["b2", "a2"]


# --- repr -------------------------------------------------------------------------------------


def test_repr_shows_state() -> None:
    doer = PriorityDoer(limit=3)
    doer.admit([Item("a"), Item("b")])
    doer.next()
    assert repr(doer) == "PriorityDoer(limit=3, waiting=1, running=1)"
    assert repr(BalancedDoer(key="task")) == (
        "BalancedDoer(limit=None, key='task', waiting=0, running=0)"
    )


# --- registry and make_doer -------------------------------------------------------------------


def test_registry_maps_names_to_classes() -> None:
    expected = {
        "unlimited": UnlimitedDoer,
        "priority": PriorityDoer,
        "age": AgeDoer,
        "balanced": BalancedDoer,
    }
    assert expected == DOERS
    for name, cls in DOERS.items():
        assert cls.name == name


def test_make_doer_none_is_unlimited() -> None:
    doer = make_doer(None)
    assert type(doer) is UnlimitedDoer
    assert doer.limit is None


@pytest.mark.parametrize("name", sorted(DOERS))
def test_make_doer_from_name(name: str) -> None:
    doer = make_doer(name)
    assert type(doer) is DOERS[name]
    assert doer.limit is None


def test_make_doer_from_name_balanced_defaults_to_queue() -> None:
    doer = make_doer("balanced")
    assert isinstance(doer, BalancedDoer)
    assert doer.key == "queue"


def test_make_doer_returns_instance_as_is() -> None:
    existing = PriorityDoer(limit=2)
    assert make_doer(existing) is existing


def test_make_doer_from_mapping_balanced() -> None:
    doer = make_doer({"doer": "balanced", "limit": 4, "key": "task"})
    assert isinstance(doer, BalancedDoer)
    assert (doer.limit, doer.key) == (4, "task")


@pytest.mark.parametrize("name", sorted(DOERS))
def test_make_doer_from_mapping_with_limit(name: str) -> None:
    doer = make_doer({"doer": name, "limit": 3})
    assert type(doer) is DOERS[name]
    assert doer.limit == 3


def test_make_doer_mapping_defaults() -> None:
    assert type(make_doer({})) is UnlimitedDoer
    doer = make_doer({"limit": 2})
    assert type(doer) is UnlimitedDoer
    assert doer.limit == 2
    assert make_doer({"doer": "priority", "limit": None}).limit is None


def test_make_doer_unknown_name() -> None:
    message = r"unknown doer 'fast'; choose one of: age, balanced, priority, unlimited"
    with pytest.raises(ValueError, match=message):
        make_doer("fast")
    with pytest.raises(ValueError, match=message):
        make_doer({"doer": "fast"})


def test_make_doer_non_string_doer_name() -> None:
    with pytest.raises(ValueError, match=r"unknown doer 5; choose one of: age, balanced"):
        make_doer({"doer": 5})


def test_make_doer_unknown_option() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown option 'limt' for doer 'priority'; choose one of: doer, limit",
    ):
        make_doer({"doer": "priority", "limt": 3})


@pytest.mark.parametrize("name", ["unlimited", "priority", "age"])
def test_make_doer_key_only_for_balanced(name: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"unknown option 'key' for doer '{name}'; choose one of: doer, limit$",
    ):
        make_doer({"doer": name, "key": "task"})


def test_make_doer_unknown_option_for_balanced_lists_key() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown option 'weights' for doer 'balanced'; choose one of: doer, key, limit",
    ):
        make_doer({"doer": "balanced", "weights": {}})


def test_make_doer_bad_balanced_key() -> None:
    with pytest.raises(ValueError, match=r"unknown balanced doer key 'group'; choose one of"):
        make_doer({"doer": "balanced", "key": "group"})


@pytest.mark.parametrize("limit", [0, True, "4"])
def test_make_doer_bad_limit(limit: object) -> None:
    with pytest.raises(ValueError, match=r"limit must be an int >= 1 or None"):
        make_doer({"doer": "age", "limit": limit})


@pytest.mark.parametrize("spec", [3, ["priority"], PriorityDoer])
def test_make_doer_rejects_other_types(spec: object) -> None:
    with pytest.raises(TypeError, match="doer spec must be None, a name, a mapping or a Doer"):
        make_doer(spec)  # type: ignore[arg-type]
