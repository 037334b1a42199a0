"""When a worker counts as alive, and when its row may be forgotten: pure rules, judged
by each worker's own visibility timeout (stored on its row), never by the reader's.

A worker beats every third of its visibility timeout. Silent for a whole timeout (three
missed beats) it is shown stale: by then its leases are expiring too. Silent for
``STALE_WORKER_FACTOR`` timeouts, the leader deletes its row; a worker that was only
paused inserts it again on its next heartbeat.
"""

from __future__ import annotations

import math
from datetime import datetime

# A worker row silent for this many of its visibility timeouts belongs to a dead process.
STALE_WORKER_FACTOR = 10


# Judges a row whose stored timeout is unusable (not a positive finite number).
FALLBACK_VISIBILITY_TIMEOUT = 60.0


def is_stale(last_heartbeat: datetime, now: datetime, visibility_timeout: float) -> bool:
    """No heartbeat for longer than the worker's visibility timeout."""
    return _silence(last_heartbeat, now) > _usable(visibility_timeout)


def may_forget(last_heartbeat: datetime, now: datetime, visibility_timeout: float) -> bool:
    """Silent for ``STALE_WORKER_FACTOR`` of the worker's visibility timeouts."""
    return _silence(last_heartbeat, now) > _usable(visibility_timeout) * STALE_WORKER_FACTOR


def _silence(last_heartbeat: datetime, now: datetime) -> float:
    return (now - last_heartbeat).total_seconds()


def _usable(visibility_timeout: float) -> float:
    """Seconds as floats (a huge timeout must not overflow a ``timedelta``)."""
    if isinstance(visibility_timeout, int | float) and 0 < visibility_timeout < math.inf:
        return float(visibility_timeout)
    return FALLBACK_VISIBILITY_TIMEOUT
