"""When a worker may judge other workers' leases: not right after it was held up itself.

A stall that holds this worker's heartbeat up (a lock on the task table, SQLite's write
lock kept by a paused process, this process paused, a saturated database) holds up the
other workers' lease renewals too. When it ends, most of the leases that ran out during
it belong to live workers whose renewals are about to land; a reaper that judged them at
once would return live tasks, to be run a second time. So a heartbeat that finds itself
held up reaps again only one visibility timeout later: every live worker renews about
three times in that while.

A database where every round looks held up could otherwise never return a dead worker's
tasks; past ``MAX_DEFERRAL`` visibility timeouts of deferring, a round that is itself held
up reaps anyway. A prompt round never does: the stall has ended, and the renewals it held
up get their lease's time, however long the stall was.

A worker's first round is judged from when its upkeep began (``began``): a first round
that waited through a stall was held up like any later one.

Pure logic: the heartbeat reports its rounds and steps in monotonic seconds.
"""

from __future__ import annotations

import threading
from enum import Enum

MAX_DEFERRAL = 3
"""Visibility timeouts of continuous deferral after which reaping goes ahead anyway."""


def default_slack(interval: float) -> float:
    """How much slower than usual a heartbeat step or round may be before it counts as
    held up: half the heartbeat interval."""
    return interval / 2


class Verdict(Enum):
    REAP = "reap"
    DEFER = "defer"
    REAP_DESPITE_STALLS = "reap despite stalls"


class ReapGate:
    """Tracks whether this worker was held up lately, from the times of its own rounds.

    ``slack``: a step slower than this, or a gap between rounds longer than the interval
    by this, counts as being held up (``default_slack``: half the heartbeat interval).

    Thread-safe: the heartbeat's thread reports its rounds, and the worker's main thread
    reports a slow start (``Heartbeat.reap_at_start``) while those rounds may be running.
    """

    def __init__(
        self, visibility_timeout: float, interval: float, slack: float | None = None
    ) -> None:
        self.visibility_timeout = visibility_timeout
        self.interval = interval
        self.slack = default_slack(interval) if slack is None else slack
        self._reap_from: float | None = None
        self._deferring_since: float | None = None
        self._last_round_end: float | None = None
        self._held_this_round = False
        self._lock = threading.RLock()

    def began(self, now: float) -> None:
        """The upkeep begins: the first round is due one interval from ``now``."""
        with self._lock:
            self._last_round_end = now

    def round_started(self, now: float) -> None:
        """A round begins: a late one means this worker was held up (paused, or waiting
        for its session) since the last round ended."""
        with self._lock:
            self._held_this_round = False
            last = self._last_round_end
            if last is not None and now - last > self.interval + self.slack:
                self.held_up(now)

    def step(self, started: float, ended: float, *, succeeded: bool) -> None:
        """One database step of the round: a failed or slow one means a stall."""
        with self._lock:
            if not succeeded or ended - started > self.slack:
                self.held_up(ended)

    def held_up(self, now: float) -> None:
        """This worker was held up until ``now``: give the others a lease's time."""
        with self._lock:
            # The latest end wins: the main thread may report an earlier one late.
            reap_from = now + self.visibility_timeout
            if self._reap_from is None or reap_from > self._reap_from:
                self._reap_from = reap_from
            self._held_this_round = True
            if self._deferring_since is None:
                self._deferring_since = now

    def round_ended(self, now: float) -> None:
        with self._lock:
            self._last_round_end = now

    def verdict(self, now: float) -> Verdict:
        """Whether this round may return other workers' expired leases."""
        with self._lock:
            if self._reap_from is None or now >= self._reap_from:
                self._reap_from = self._deferring_since = None
                return Verdict.REAP
            assert self._deferring_since is not None
            stalled_for = now - self._deferring_since
            if self._held_this_round and stalled_for >= MAX_DEFERRAL * self.visibility_timeout:
                return Verdict.REAP_DESPITE_STALLS
            return Verdict.DEFER

    @property
    def deferring(self) -> bool:
        return self._reap_from is not None
