"""Per-attempt time limits for synchronous task functions running on worker threads.

Python cannot kill a thread, but it can raise an exception in one: when the limit passes,
``TaskTimeout`` is raised asynchronously inside the task's thread at its next Python
bytecode. Code blocked inside a C call (a socket read without a timeout, ``time.sleep``)
sees it when the call returns. If the task finishes first, a pending exception is
cleared, so it can never leak into the worker's own bookkeeping.

An exception raised between any two bytecodes can land inside the database driver or
Django's transaction bookkeeping (``atomic()`` entering or leaving, commit, switching
autocommit), leaving Django's record of the connection out of step with the driver's
real state, or a query in flight. So a thread a timeout was raised in is marked
``interrupted``, and the connection hygiene after the attempt discards every connection
it used (``hygiene.clean_up_after_attempt``): nothing of that state survives into the
next task.

Python drops an asynchronous exception that lands inside a ``__del__`` method or a weakref
callback (it reports it as "unraisable" and goes on), so one raise is not enough: until
the attempt ends, the timeout is raised again, at growing intervals (``REPEAT_FIRST`` up
to ``REPEAT_MAX`` seconds). Without that, a task looping over ``atomic()`` blocks could
lose its only timeout and run for ever.
"""

from __future__ import annotations

import ctypes
import threading
from types import TracebackType

from ..exceptions import TaskTimeout

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)

# A raised timeout that Python dropped is raised again after these many seconds, doubling.
REPEAT_FIRST = 0.1
REPEAT_MAX = 1.0

_interrupted: set[int] = set()  # threads a timeout was raised in, until hygiene asks


def interrupted() -> bool:
    """Whether a timeout was raised asynchronously in this thread since the last call;
    the answer is given once."""
    ident = threading.get_ident()
    if ident in _interrupted:
        _interrupted.discard(ident)
        return True
    return False


def _raise_in(thread_id: int, exc_type: type[BaseException] | None) -> None:
    # py_object(None) is NULL on the C side: it clears a pending asynchronous exception.
    _set_async_exc(thread_id, ctypes.py_object(exc_type) if exc_type else ctypes.py_object())


class AttemptTimer:
    """Context manager: raise ``TaskTimeout`` in this thread after ``seconds``, and again
    while the attempt goes on. Call ``stop()`` after the block too (see there)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.fired = False
        self._lock = threading.Lock()
        self._active = False
        self._done = threading.Event()
        self._thread_id = threading.get_ident()
        self._watcher: threading.Thread | None = None

    def _fire(self) -> bool:
        """Raise the timeout in the attempt's thread; False once the attempt has ended."""
        with self._lock:
            if not self._active:
                return False
            self.fired = True
            _interrupted.add(self._thread_id)
            _raise_in(self._thread_id, TaskTimeout)
            return True

    def _watch(self, seconds: float) -> None:
        if self._done.wait(seconds):
            return
        delay = REPEAT_FIRST
        while self._fire() and not self._done.wait(delay):
            delay = min(delay * 2, REPEAT_MAX)

    def __enter__(self) -> AttemptTimer:
        if self.seconds is not None:
            self._thread_id = threading.get_ident()
            self._active = True
            self._watcher = threading.Thread(
                target=self._watch, args=(self.seconds,), name="tasks-timeout", daemon=True
            )
            self._watcher.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """End the attempt's timer and clear a raise still pending. Idempotent: callers
        call it once more after the ``with`` block, because a raise that lands as
        ``__exit__`` is entered skips its body, and the timer would go on raising."""
        if self._watcher is None:
            return
        with self._lock:
            self._active = False
            self._done.set()
            if self.fired:
                _raise_in(self._thread_id, None)
