"""The worker's own count of the attempts it finished, for its row (the admin's worker page).

The outcome writer adds each outcome once its row landed; the heartbeat reads the totals
and writes them in the UPDATE that touches the row anyway, so counting costs no
statement. An attempt counts as processed when it ran to an outcome (succeeded, or failed:
a retry scheduled or a dead letter); a deferral, a middleware's hold and a release at
shutdown did not spend an attempt and are not counted. The totals start at zero with the
process and are not a fleet-wide history: that is what the metrics are for.
"""

from __future__ import annotations

import threading

from ..compat import TaskResultStatus
from ..lifecycle import Transition


def counts_of(outcome: Transition) -> tuple[int, int]:
    """(processed, failed) that one written outcome adds."""
    if outcome.error is not None:
        return 1, 1
    if outcome.status == TaskResultStatus.SUCCESSFUL:
        return 1, 0
    return 0, 0


class OutcomeTally:
    """Processed and failed attempts so far; added to by one thread, read by another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the pair is read together, never half-updated
        self._processed = 0
        self._failed = 0

    def add(self, outcome: Transition) -> None:
        processed, failed = counts_of(outcome)
        if processed:
            with self._lock:
                self._processed += processed
                self._failed += failed

    def totals(self) -> tuple[int, int]:
        with self._lock:
            return self._processed, self._failed
