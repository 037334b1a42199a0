"""Python's cyclic garbage collector, paused while a big batch of tasks is built.

An ``enqueue_many`` of thousands of calls makes about a dozen container objects per call
(the call, its encoded and shown arguments, the row, the result and its lists), none of
them in a reference cycle. The collector counts those allocations, and as they survive it
runs full collections that walk every object of the process: a fifth of the time of a
20,000-task bulk enqueue went there. Nothing a batch makes needs the collector, so it
waits until the batch is written; reference counting frees everything as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Below this many calls the collector's share is too small to be worth touching it.
PAUSE_FROM = 64


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector if it is on; afterwards it is on again. Another
    thread's pause (or the program's own ``gc.disable()``) is left alone: this only turns
    on what it turned off. Callers pause it for batches of ``PAUSE_FROM`` calls or more."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
