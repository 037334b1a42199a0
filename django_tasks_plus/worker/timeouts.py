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
"""

from __future__ import annotations

import ctypes
import threading
from types import TracebackType

from ..exceptions import TaskTimeout

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)

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
    """Context manager: raise ``TaskTimeout`` in this thread after ``seconds``."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.fired = False
        self._lock = threading.Lock()
        self._active = False
        self._thread_id = threading.get_ident()
        self._timer: threading.Timer | None = None

    def _fire(self) -> None:
        with self._lock:
            if self._active:
                self.fired = True
                _interrupted.add(self._thread_id)
                _raise_in(self._thread_id, TaskTimeout)

    def __enter__(self) -> AttemptTimer:
        if self.seconds is not None:
            self._thread_id = threading.get_ident()
            self._active = True
            self._timer = threading.Timer(self.seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is None:
            return
        with self._lock:
            self._active = False
            self._timer.cancel()
            if self.fired:
                _raise_in(self._thread_id, None)
