"""``runtasks --reload``: run the worker in a child process and restart it on code change.

For development only. The parent process imports no task code: it watches the Python
files under a folder with ``watchfiles`` (Rust-backed, maintained, an optional extra),
and when one changes it stops the child the way a deploy would (SIGTERM, then the
shutdown timeout, then SIGKILL) and starts a fresh one, so edited tasks run without a
manual restart. A child that crashes (a syntax error just saved) is started again on the
next change. SIGTERM or SIGINT to the parent stops the child the same way and exits with
the child's status.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from .childwatch import SUPERVISOR_PID

logger = logging.getLogger("django_tasks_plus.worker")

# Set in the child's environment, so that the child runs the worker itself.
CHILD_ENV = "DJANGO_TASKS_PLUS_RELOADED_CHILD"
# Past the child's own shutdown timeout, before it is killed.
STOP_GRACE = 5.0
INSTALL_HINT = (
    "runtasks --reload needs the watchfiles package: pip install 'django-tasks-plus[reload]'"
)


def is_reloaded_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def require_watchfiles() -> Any:
    """The ``watchfiles`` module, or ``ImportError`` with the command that installs it."""
    try:
        import watchfiles
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return watchfiles


class Reloader:
    """Runs ``command`` as a child process and restarts it when a Python file changes."""

    def __init__(self, command: Sequence[str], root: Path, *, stop_timeout: float) -> None:
        self.command = list(command)
        self.root = root
        self.stop_timeout = stop_timeout
        self.stopping = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.exit_noticed = False

    def run(self) -> int:
        watchfiles = require_watchfiles()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _STOP_SIGNALS}
        try:
            logger.info(
                "Reloading on change: watching the Python files under %s (development only).",
                self.root,
            )
            self._start()
            for changes in watchfiles.watch(
                self.root,
                watch_filter=watchfiles.PythonFilter(),
                stop_event=self.stopping,
                raise_interrupt=False,
                rust_timeout=1000,
                yield_on_timeout=True,
            ):
                if self.stopping.is_set():
                    break
                if not changes:  # a quiet second: only see whether the child is alive
                    self._notice_exit()
                    continue
                changed = sorted({_relative(path, self.root) for _, path in changes})
                logger.info("Changed: %s; restarting the worker.", ", ".join(changed[:5]))
                self._stop()
                self._start()
            return self._stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping.set()

    def _start(self) -> None:
        env = {**os.environ, CHILD_ENV: "1", SUPERVISOR_PID: str(os.getpid())}
        self.child = subprocess.Popen(self.command, env=env)
        self.exit_noticed = False

    def _notice_exit(self) -> None:
        if self.child is not None and self.child.poll() is not None and not self.exit_noticed:
            self.exit_noticed = True
            logger.warning(
                "The worker exited (status %d); it starts again when a Python file changes.",
                self.child.returncode,
            )

    def _stop(self) -> int:
        """Stop the child as a deploy would; its exit status (0 if it had already gone)."""
        child, self.child = self.child, None
        if child is None:
            return 0
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(self.stop_timeout + STOP_GRACE)
            except subprocess.TimeoutExpired:
                logger.warning("The worker did not stop in time; killing it.")
                child.kill()
                child.wait()
        code = child.returncode
        return code if code >= 0 else 128 - code  # killed by a signal: as a shell says


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path
