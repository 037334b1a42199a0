"""Why a READY task is not running yet: one reason, as an operator asks for it (pure).

A READY task waits for exactly one thing at a time, checked in this order:

* its time has not come: a circuit breaker holds it (``held_since`` set), or it waits
  for its next attempt after a failure (``attempt`` > 0: *retrying*), or it was enqueued
  to run later (*scheduled*);
* it is due, but an earlier task of its ordering key is waiting, running or dead and
  blocking the key (*blocked*);
* otherwise it is *due*: it runs as soon as a worker serving its queue has a free slot.

The rules are the claim's (``db/sql.py``: a task is taken when due and at the head of its
key) and the breaker's (a held task is parked until its circuit may probe), read from the
row's columns; the blocking task is found by a query (``db/waiting.py``). Rate limits and
paused queues will be further reasons once those features exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from .durations import duration
from .retry import no_retry


class Reason(StrEnum):
    """What a READY task waits for; the value is the list filter's (``?waiting=``)."""

    DUE = "due"
    BLOCKED = "blocked"
    HELD = "held"
    RETRYING = "retrying"
    SCHEDULED = "scheduled"


# The labels the admin and ``taskstats`` show for each reason, in the overview's order.
LABELS: dict[Reason, str] = {
    Reason.DUE: "due now",
    Reason.BLOCKED: "blocked by ordering key",
    Reason.HELD: "held by a breaker",
    Reason.RETRYING: "retrying later",
    Reason.SCHEDULED: "scheduled",
}


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why one READY task waits, and the facts that go with the reason."""

    reason: Reason
    run_after: datetime  # when it is due (in the past for DUE and BLOCKED)
    attempt: int  # attempts started so far
    max_attempts: int | None = None  # the task's retry budget, when known
    breaker_key: str | None = None  # HELD: the circuit (``name/key``) holding it
    blocker_id: str | None = None  # BLOCKED: the earlier task of its key it waits behind

    @property
    def can_run_now(self) -> bool:
        """Whether a free worker would take it: due, not held, not blocked."""
        return self.reason is Reason.DUE

    def describe(self, now: datetime) -> str:
        """One line: "due, waiting 3 min", "retrying: attempt 3 of 5 in 40 s", …"""
        left = duration((self.run_after - now).total_seconds())
        if self.reason is Reason.HELD:
            return f"held by breaker {self.breaker_key or '?'} for {left} more"
        if self.reason is Reason.RETRYING:
            return f"retrying: {attempt_of(self.attempt + 1, self.max_attempts)} in {left}"
        if self.reason is Reason.SCHEDULED:
            return f"scheduled, due in {left}"
        waited = duration(max(0.0, (now - self.run_after).total_seconds()))
        if self.reason is Reason.BLOCKED:
            behind = f" behind {self.blocker_id[:8]}" if self.blocker_id else ""
            return f"blocked by its ordering key{behind}, due {waited} ago"
        return f"due, waiting {waited}"


def attempt_of(attempt: int, max_attempts: int | None) -> str:
    """``"attempt 3 of 5"``, or ``"attempt 3"`` when the retry budget is not known."""
    return f"attempt {attempt} of {max_attempts}" if max_attempts else f"attempt {attempt}"


def waiting_reason(
    *,
    status: str,
    run_after: datetime | None,
    attempt: int,
    held_since: datetime | None,
    breaker_key: str | None,
    blocker_id: str | None,
    now: datetime,
    max_attempts: int | None = None,
) -> Waiting | None:
    """Why the task waits; None unless it is READY (a running or finished task does not
    wait). ``blocker_id``: the earlier task of its ordering key that is in its way, if
    any (the caller looks it up: it needs a query)."""
    if status != "READY" or run_after is None:
        return None
    if run_after > now:
        if held_since is not None:
            reason = Reason.HELD
        elif attempt > 0:
            reason = Reason.RETRYING
        else:
            reason = Reason.SCHEDULED
    elif blocker_id is not None:
        reason = Reason.BLOCKED
    else:
        reason = Reason.DUE
    return Waiting(
        reason=reason,
        run_after=run_after,
        attempt=attempt,
        max_attempts=max_attempts,
        breaker_key=breaker_key if reason is Reason.HELD else None,
        blocker_id=blocker_id if reason is Reason.BLOCKED else None,
    )


@dataclass(frozen=True, slots=True)
class Capped:
    """A count read with a cap: ``at_least`` says the true number may be higher (it is
    "10,000+"), ``at_most`` that it may be lower (a difference with a capped count)."""

    count: int
    at_least: bool = False
    at_most: bool = False

    @property
    def exact(self) -> bool:
        return not (self.at_least or self.at_most)

    def __str__(self) -> str:
        if self.at_least:
            return f"{self.count:,}+"
        return f"≤ {self.count:,}" if self.at_most else f"{self.count:,}"


def max_attempts_of(policy: object) -> int | None:
    """The retry budget a policy states (``ExponentialBackoff.max_attempts``; 1 for
    ``no_retry``); None for a policy that does not say (any callable may decide)."""
    if policy is no_retry:
        return 1
    found = getattr(policy, "max_attempts", None)
    return found if isinstance(found, int) and not isinstance(found, bool) else None
