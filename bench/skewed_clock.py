"""Run ``manage.py runtasks`` in a process whose host clock is off by ``--skew`` seconds.

    python bench/skewed_clock.py --skew 90 [runtasks options ...]

This simulates a worker on a host with a wrong clock without touching product code.
Before Django or django_tasks_plus is imported, ``time.time``, ``time.time_ns`` and
``django.utils.timezone.now`` are replaced by shifted versions. Because this happens
first, a later ``from django.utils.timezone import now`` and a default argument bound at
import time see the shifted clock too. ``time.monotonic`` is left alone: a wrong wall
clock does not make intervals longer. The database's clock (``now()``,
``clock_timestamp()``, SQLite's ``'now'``) is not shifted either, which is the point: code
that takes its time from the database does not care about the skew.

The chaos run (``bench/chaos.py``) starts its skewed-clock worker with this launcher;
tests can start it as a subprocess the same way (``python bench/skewed_clock.py ...``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import runpy
import sys
import time
from pathlib import Path

MANAGE = Path(__file__).resolve().parent.parent / "testproject" / "manage.py"
DEFAULT_SKEW = 90.0


def install(skew: float) -> None:
    """Shift this process's wall clock by ``skew`` seconds (positive: ahead)."""
    if "django_tasks_plus" in sys.modules:
        raise RuntimeError(
            "skewed_clock.install() must run before django_tasks_plus is imported: modules "
            "that bound timezone.now at import would keep the true clock."
        )
    real_time, real_time_ns = time.time, time.time_ns
    shift_ns = round(skew * 1_000_000_000)

    def skewed_time() -> float:
        return real_time() + skew

    def skewed_time_ns() -> int:
        return real_time_ns() + shift_ns

    time.time = skewed_time
    time.time_ns = skewed_time_ns

    # Reads no settings at import, so it is safe before django.setup().
    from django.utils import timezone

    real_now = timezone.now
    delta = dt.timedelta(seconds=skew)

    def skewed_now() -> dt.datetime:
        return real_now() + delta

    timezone.now = skewed_now


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], allow_abbrev=False, add_help=False
    )
    parser.add_argument("--skew", type=float, default=DEFAULT_SKEW, help="seconds (90)")
    options, runtasks_args = parser.parse_known_args(argv)
    install(options.skew)
    # As if manage.py had been run directly: its folder, not bench/, is sys.path[0].
    sys.path[0] = str(MANAGE.parent)
    sys.argv = [str(MANAGE), "runtasks", *runtasks_args]
    runpy.run_path(str(MANAGE), run_name="__main__")


if __name__ == "__main__":
    main()
