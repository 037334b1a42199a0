"""Doers: the in-process governors that pace and order a worker's tasks.

A worker claims tasks from the database and hands them to a doer. The doer answers two
questions: how many more tasks may be claimed for the queues it governs (``capacity``), and
which admitted task should start when a thread frees up (``next``).

Doers are deliberately pure bookkeeping: no threads, locks, clocks, I/O or Django imports.
The worker drives them under one lock, which keeps them cheap and easy to test.
They live outside ``worker/`` because ``conf`` validates doer specs at settings time, and
settings must not depend on the worker.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, ClassVar, Generic, Protocol, TypeVar

__all__ = [
    "DOERS",
    "AgeDoer",
    "BalancedDoer",
    "Doer",
    "PriorityDoer",
    "Schedulable",
    "UnlimitedDoer",
    "make_doer",
]


class Schedulable(Protocol):
    """What a doer needs to know about a claimed task.

    Members are read-only so that frozen dataclasses and model instances both qualify.
    """

    @property
    def priority(self) -> int:
        """-100..100; the priority doer starts higher values first."""
        ...

    @property
    def queue_name(self) -> str: ...

    @property
    def task_path(self) -> str:
        """Dotted path of the task function."""
        ...

    @property
    def enqueued_at(self) -> datetime:
        """Aware datetime; the age doer starts the oldest first."""
        ...


T = TypeVar("T", bound=Schedulable)


def _check_limit(limit: object) -> int | None:
    """Reject limits that would silently disable or break throttling."""
    if limit is None:
        return None
    # bool is an int subclass, but ``limit=True`` is almost certainly a config mistake.
    if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
        return limit
    raise ValueError(f"doer limit must be an int >= 1 or None, got {limit!r}")


class Doer(ABC, Generic[T]):
    """Base doer: counts waiting and running tasks and enforces ``limit``.

    Subclasses only decide the order of waiting tasks, via ``_put`` and ``_take``.
    Running tasks are tracked by identity, because task objects need not be hashable
    and two distinct claims may compare equal by value.
    """

    name: ClassVar[str]

    def __init__(self, limit: int | None = None) -> None:
        self._limit = _check_limit(limit)
        self._waiting = 0
        # id(item) -> (item, times started). Holding the item keeps its id from being reused.
        self._running: dict[int, tuple[T, int]] = {}
        self._running_total = 0

    @property
    def limit(self) -> int | None:
        """Most tasks from this doer allowed to run at once; None means no limit of its own."""
        return self._limit

    @property
    def waiting(self) -> int:
        """Tasks admitted but not yet started."""
        return self._waiting

    @property
    def running(self) -> int:
        """Tasks started via ``next()`` and not yet ``finished()``."""
        return self._running_total

    def capacity(self, free_slots: int) -> int:
        """How many more tasks to claim now.

        ``free_slots`` already excludes tasks waiting in any doer. Waiting tasks count
        against the limit too, so the worker never claims work it could not start soon.
        """
        if self._limit is None:
            return max(0, free_slots)
        return max(0, min(free_slots, self._limit - self._running_total - self._waiting))

    def admit(self, items: Iterable[T]) -> None:
        """Add claimed tasks to the waiting room.

        The batch is validated before anything is added, so a bad item leaves no partial
        admission behind.
        """
        batch = list(items)
        for item in batch:
            self._check(item)
        for item in batch:
            self._put(item)
        self._waiting += len(batch)

    def next(self) -> T | None:
        """Start and return the next task, or None if nothing waits or the limit is reached."""
        if self._waiting == 0:
            return None
        if self._limit is not None and self._running_total >= self._limit:
            return None
        item = self._take()
        self._waiting -= 1
        key = id(item)
        _, count = self._running.get(key, (item, 0))
        self._running[key] = (item, count + 1)
        self._running_total += 1
        return item

    def finished(self, item: T) -> None:
        """Mark a started task as ended, freeing its slot.

        Raises ValueError for a task that is not running, since that means the worker's
        accounting has gone wrong and the limit could otherwise be exceeded.
        """
        key = id(item)
        entry = self._running.get(key)
        if entry is None or entry[0] is not item:
            raise ValueError(f"{self.name} doer: task {item!r} is not running")
        count = entry[1]
        if count == 1:
            del self._running[key]
        else:
            self._running[key] = (item, count - 1)
        self._running_total -= 1

    def drain(self) -> list[T]:
        """Remove and return all waiting tasks, in the order ``next()`` would give them.

        Used at graceful shutdown so unstarted claims can be released back to the queue.
        """
        drained: list[T] = []
        while self._waiting:
            drained.append(self._take())
            self._waiting -= 1
        return drained

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(limit={self._limit!r}, "
            f"waiting={self._waiting}, running={self._running_total})"
        )

    def _check(self, item: T) -> None:
        """Validate an item before admission; subclasses raise ValueError to reject it."""

    @abstractmethod
    def _put(self, item: T) -> None:
        """Store one admitted item."""

    @abstractmethod
    def _take(self) -> T:
        """Remove and return the item to start next; only called when one is waiting."""


class UnlimitedDoer(Doer[T]):
    """Starts tasks in admission order (FIFO)."""

    name: ClassVar[str] = "unlimited"

    def __init__(self, limit: int | None = None) -> None:
        super().__init__(limit)
        self._queue: deque[T] = deque()

    def _put(self, item: T) -> None:
        self._queue.append(item)

    def _take(self) -> T:
        return self._queue.popleft()


class PriorityDoer(Doer[T]):
    """Starts the highest ``priority`` first; equal priorities keep admission order."""

    name: ClassVar[str] = "priority"

    def __init__(self, limit: int | None = None) -> None:
        super().__init__(limit)
        # The sequence number breaks ties stably and means items are never compared.
        self._heap: list[tuple[int, int, T]] = []
        self._seq = itertools.count()

    def _put(self, item: T) -> None:
        heapq.heappush(self._heap, (-item.priority, next(self._seq), item))

    def _take(self) -> T:
        return heapq.heappop(self._heap)[2]


class AgeDoer(Doer[T]):
    """Starts the oldest ``enqueued_at`` first; equal times keep admission order."""

    name: ClassVar[str] = "age"

    def __init__(self, limit: int | None = None) -> None:
        super().__init__(limit)
        self._heap: list[tuple[datetime, int, T]] = []
        self._seq = itertools.count()

    def _check(self, item: T) -> None:
        # A naive datetime would only fail later, inside a heap comparison with an aware one.
        when = item.enqueued_at
        if when.tzinfo is None or when.utcoffset() is None:
            raise ValueError(f"age doer: enqueued_at must be timezone-aware, got {when!r}")

    def _put(self, item: T) -> None:
        heapq.heappush(self._heap, (item.enqueued_at, next(self._seq), item))

    def _take(self) -> T:
        return heapq.heappop(self._heap)[2]


class BalancedDoer(Doer[T]):
    """Shares starts fairly across groups (queues or task functions) by round-robin.

    Groups are visited in the order they were first seen, resuming after the group served
    last and skipping groups with nothing waiting; within a group tasks are FIFO. A group
    keeps its place in the rotation when it empties, so it rejoins where it was.
    """

    name: ClassVar[str] = "balanced"
    KEYS: ClassVar[tuple[str, ...]] = ("queue", "task")

    def __init__(self, limit: int | None = None, key: str = "queue") -> None:
        if not isinstance(key, str) or key not in self.KEYS:
            raise ValueError(
                f"unknown balanced doer key {key!r}; choose one of: {', '.join(self.KEYS)}"
            )
        super().__init__(limit)
        self._key = key
        self._groups: dict[str, deque[T]] = {}
        self._order: list[str] = []
        self._last = -1  # index in _order of the group served last

    @property
    def key(self) -> str:
        """What tasks are grouped by: "queue" (queue_name) or "task" (task_path)."""
        return self._key

    def _group_of(self, item: T) -> str:
        return item.queue_name if self._key == "queue" else item.task_path

    def _put(self, item: T) -> None:
        group = self._group_of(item)
        pending = self._groups.get(group)
        if pending is None:
            pending = self._groups[group] = deque()
            self._order.append(group)
        pending.append(item)

    def _take(self) -> T:
        size = len(self._order)
        for step in range(1, size + 1):
            index = (self._last + step) % size
            pending = self._groups[self._order[index]]
            if pending:
                self._last = index
                return pending.popleft()
        raise AssertionError("BalancedDoer._take called with nothing waiting")

    def drain(self) -> list[T]:
        """Remove and return all waiting tasks without disturbing the rotation position."""
        last = self._last
        drained = super().drain()
        self._last = last
        return drained

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(limit={self._limit!r}, key={self._key!r}, "
            f"waiting={self._waiting}, running={self._running_total})"
        )


DOERS: dict[str, type[Doer]] = {
    cls.name: cls for cls in (UnlimitedDoer, PriorityDoer, AgeDoer, BalancedDoer)
}

_OPTIONS = ("doer", "limit")
_BALANCED_OPTIONS = ("doer", "key", "limit")


def _doer_class(name: object) -> type[Doer]:
    if isinstance(name, str) and name in DOERS:
        return DOERS[name]
    raise ValueError(f"unknown doer {name!r}; choose one of: {', '.join(sorted(DOERS))}")


def make_doer(spec: str | Mapping[str, object] | Doer | None) -> Doer:
    """Build a doer from a settings value.

    Accepts None (an unlimited doer), a doer name, a ready-made Doer (returned as-is), or a
    mapping such as ``{"doer": "balanced", "limit": 4, "key": "task"}``. Mistakes raise
    ValueError naming the bad value and the valid choices, so settings errors surface early.
    """
    if spec is None:
        return UnlimitedDoer()
    if isinstance(spec, Doer):
        return spec
    if isinstance(spec, str):
        return _doer_class(spec)()
    if isinstance(spec, Mapping):
        name = spec.get("doer", "unlimited")
        cls = _doer_class(name)
        allowed = _BALANCED_OPTIONS if issubclass(cls, BalancedDoer) else _OPTIONS
        for option in spec:
            if option not in allowed:
                raise ValueError(
                    f"unknown option {option!r} for doer {cls.name!r}; "
                    f"choose one of: {', '.join(allowed)}"
                )
        kwargs: dict[str, Any] = {
            option: value for option, value in spec.items() if option != "doer"
        }
        return cls(**kwargs)
    raise TypeError(
        f"doer spec must be None, a name, a mapping or a Doer instance, got {type(spec).__name__}"
    )
