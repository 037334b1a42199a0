"""Other Python task queues measured side by side with ours (``run.py --peers``).

Each peer gets its own virtualenv in the repository root (``.venv-peer-<name>``, pinned
from PyPI, never a dependency of the project or its tests) and its own freshly recreated
PostgreSQL database (``bench_peer_<name>``; Celery two flushed Redis databases instead). A
driver in ``bench/peer_drivers/`` runs inside that venv and does one measurement per
process with the peer's own public API and its own worker command, like ``driver.py``
does for us. Peers run one at a time, after our workloads, once each; every step is
bounded in time, and a peer that cannot be installed or fails is reported as such while
the run goes on.

    python bench/peers.py --tasks 2000 --single 500 --latency-tasks 100   # peers alone
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from benchenv import BENCH, PG_SERVER, REDIS_SERVER, REPO
from report import Row, Series, fmt_ratio, ratio

DRIVERS = BENCH / "peer_drivers"
INSTALL_TIMEOUT = 600.0
SETUP_TIMEOUT = 120.0
MARKER = ".installed"


@dataclass(frozen=True)
class Peer:
    """A task queue from PyPI, pinned, with the driver that measures it."""

    name: str
    version: str
    requirements: tuple[str, ...]
    database: str | None  # None: the peer keeps nothing in PostgreSQL (Celery + Redis)
    driver: str
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None  # another interpreter for the venv (see find_python), e.g. python3.12

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"

    @property
    def venv(self) -> Path:
        return REPO / f".venv-peer-{self.name}"

    @property
    def dsn(self) -> str:
        return f"{PG_SERVER}/{self.database}" if self.database else ""


# psycopg is pinned to the bench venv's version so every contender talks through the same
# driver; django-tasks-db's [compat] extra brings the django-tasks backport that Django 5.2
# (the only Django on Python 3.11, like our bench venv) needs.
_PSYCOPG = f"psycopg[binary]=={psycopg.__version__}"
# psutil samples the peer's worker processes' memory from inside the driver, as benchenv's
# TreeRssSampler does for ours; same version as the bench venv's where it has one.
try:
    _PSUTIL = f"psutil=={importlib.metadata.version('psutil')}"
except importlib.metadata.PackageNotFoundError:
    _PSUTIL = "psutil"
PEERS = (
    Peer(
        "procrastinate",
        "3.10.0",
        ("procrastinate==3.10.0", _PSYCOPG),
        "bench_peer_procrastinate",
        "procrastinate_driver.py",
    ),
    Peer(
        "django-tasks-db",
        "0.13.0",
        ("django-tasks-db[compat]==0.13.0", _PSYCOPG),
        "bench_peer_djdb",
        "djdb_driver.py",
        {"DJANGO_SETTINGS_MODULE": "djdb_settings"},
    ),
    Peer(
        "pgqueuer",
        "1.6.0",
        ("pgqueuer[asyncpg]==1.6.0", _PSYCOPG),  # asyncpg: its README's driver
        "bench_peer_pgqueuer",
        "pgqueuer_driver.py",
    ),
    Peer(
        "oban",
        "0.7.0",
        ("oban==0.7.0", _PSYCOPG),
        "bench_peer_oban",
        "oban_driver.py",
        python="python3.12",  # oban-py requires Python >= 3.12
    ),
    Peer(
        "celery",
        "5.7.0",
        ("celery[redis]==5.7.0", "redis==8.1.0"),
        None,
        "celery_driver.py",
        {"PEER_REDIS_BROKER": f"{REDIS_SERVER}/14", "PEER_REDIS_RESULTS": f"{REDIS_SERVER}/15"},
    ),
)


@dataclass(frozen=True)
class PeerPlan:
    """The sizes of our own run, so both sides measure the same amount of work."""

    workloads: tuple[str, ...]
    single: int
    tasks: int
    latency_tasks: int
    latency_rate: float
    processes: int

    def steps(self) -> list[tuple[str, dict[str, Any], float]]:
        """(driver workload, options, time bound) for the selected workloads.

        The bounds assume a peer does at least 20 tasks/s; a slower one is cut off.
        """
        steps: list[tuple[str, dict[str, Any], float]] = []
        if "W1" in self.workloads:
            steps.append(("enqueue-single", {"tasks": self.single}, 60 + self.single / 20))
            steps.append(("enqueue-bulk", {"tasks": self.tasks}, 60 + self.tasks / 20))
        if "W2" in self.workloads:
            wait = 60 + self.tasks / 20
            options = {"tasks": self.tasks, "processes": self.processes, "timeout": wait}
            steps.append(("drain", options, 60 + self.tasks / 20 + wait))
        if "W3" in self.workloads:
            options = {
                "tasks": self.latency_tasks,
                "rate": self.latency_rate,
                "processes": self.processes,
            }
            steps.append(("latency", options, 120 + self.latency_tasks / self.latency_rate))
        return steps

    def deadline(self) -> float:
        """Overall bound for one peer: install, setup and every step."""
        return INSTALL_TIMEOUT + SETUP_TIMEOUT + sum(bound for _, _, bound in self.steps())


class PeerError(RuntimeError):
    """A peer step failed; the message is short enough for the table."""


# --------------------------------------------------------------------------------------
# Installing and running
# --------------------------------------------------------------------------------------


def _tail(text: str) -> str:
    """The last non-empty line (the drivers end with a one-line reason), shortened."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return kept[-1][:300] if kept else "no output"


def find_python(name: str) -> str:
    """The real interpreter behind ``name``: on PATH, else a pyenv-built one.

    A pyenv shim for a version that is not the selected one exits with an error, so each
    candidate is asked for its own ``sys.executable`` before it is used.
    """
    candidates = [
        shutil.which(name),
        *sorted(glob.glob(f"{Path.home()}/.pyenv/versions/*/bin/{name}")),
    ]
    for candidate in filter(None, candidates):
        done = subprocess.run(
            [candidate, "-c", "import sys; print(sys.executable)"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    raise PeerError(f"needs {name} (on PATH or built by pyenv)")


def install(peer: Peer) -> None:
    """Create the peer's venv and pip-install its pinned requirements (once per pin)."""
    marker = peer.venv / MARKER
    wanted = "\n".join([*peer.requirements, _PSUTIL, peer.python or sys.executable])
    if marker.exists() and marker.read_text() == wanted:
        return
    python = peer.venv / "bin" / "python"
    base = find_python(peer.python) if peer.python else sys.executable
    commands = [
        [base, "-m", "venv", "--clear", str(peer.venv)],
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            *peer.requirements,
            _PSUTIL,
        ],
    ]
    for command in commands:
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired as error:
            raise PeerError(f"{command[2]} timed out after {INSTALL_TIMEOUT:.0f} s") from error
        if done.returncode:
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            reason = errors[0][:300] if errors else _tail(done.stderr)
            raise PeerError(f"{command[2]} failed: {reason}")
    marker.write_text(wanted)


def recreate_database(peer: Peer) -> None:
    if peer.database is None:
        return
    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {peer.database} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {peer.database}")


def _driver_env(peer: Peer) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV"}
    }
    env.update(peer.env)
    env["PYTHONPATH"] = os.pathsep.join([str(DRIVERS), str(BENCH)])
    env["PEER_DSN"] = peer.dsn
    return env


def _kill_group(pgid: int) -> None:
    """SIGKILL the driver's process group: the driver and any worker it left behind."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def run_driver(
    peer: Peer, workload: str, options: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """One measurement in the peer's venv; its workers share the driver's process group."""
    command = [str(peer.venv / "bin" / "python"), str(DRIVERS / peer.driver), workload]
    for name, value in options.items():
        command += [f"--{name}", str(value)]
    process = subprocess.Popen(
        command,
        env=_driver_env(peer),
        cwd=DRIVERS,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired as error:
        _kill_group(process.pid)
        process.communicate()
        raise PeerError(f"{workload} timed out after {timeout:.0f} s") from error
    if process.returncode:
        _kill_group(process.pid)
        raise PeerError(f"{workload} failed: {_tail(stderr)}")
    return json.loads(stdout.strip().splitlines()[-1])


def measure(peer: Peer, plan: PeerPlan, progress: Callable[[str], None]) -> dict[str, Any]:
    """Install, recreate the database, then every selected step; failures are recorded."""
    started = time.monotonic()
    deadline = started + plan.deadline()
    result: dict[str, Any] = {
        "name": peer.name,
        "version": peer.version,
        "requirements": list(peer.requirements),
        "database": peer.database,
        "processes": plan.processes,
        "loadavg_start": os.getloadavg(),
        "results": {},
        "errors": {},
    }
    try:
        progress(f"peer {peer.label}: venv {peer.venv.name}")
        install(peer)
        recreate_database(peer)
        run_driver(peer, "setup", {}, SETUP_TIMEOUT)
    except (PeerError, psycopg.Error) as error:
        result.update(available=False, reason=str(error))
        return result
    result["available"] = True
    for workload, options, bound in plan.steps():
        remaining = deadline - time.monotonic()
        progress(f"peer {peer.label}: {workload} {options}")
        try:
            result["results"][workload] = run_driver(peer, workload, options, min(bound, remaining))
        except PeerError as error:
            result["errors"][workload] = str(error)
    result["seconds"] = time.monotonic() - started
    result["loadavg_end"] = os.getloadavg()
    return result


def measure_all(
    plan: PeerPlan, progress: Callable[[str], None], names: set[str] | None = None
) -> list[dict[str, Any]]:
    """Every peer (or those ``names``) in turn, never two at once."""
    return [measure(peer, plan, progress) for peer in PEERS if names is None or peer.name in names]


# --------------------------------------------------------------------------------------
# Comparing with our figures of the same run
# --------------------------------------------------------------------------------------

# (label, peer workload, peer key, our series, our key); latency is lower-is-better.
METRICS = (
    ("single enqueue", "enqueue-single", "rate", "W1a", "rate"),
    ("bulk enqueue", "enqueue-bulk", "rate", "W1b", "rate"),
    ("drain, first start -> last finish", "drain", "rate", "W2", "rate"),
    ("drain, process start included", "drain", "rate_with_start", "W2", "rate_with_start"),
    ("enqueue->start p50 (lower is better)", "latency", "p50_ms", "W3", "p50_ms"),
    ("enqueue->start p99 (lower is better)", "latency", "p99_ms", "W3", "p99_ms"),
    ("drain peak RSS, all workers (lower is better)", "drain", "peak_rss_mb", "W2", "peak_rss_mb"),
    ("drain peak PSS, all workers (lower is better)", "drain", "peak_pss_mb", "W2", "peak_pss_mb"),
)

UNITS = {"_ms": "ms", "_mb": "MB"}  # by key suffix; anything else is a rate


def compare(peer: dict[str, Any], ours: dict[str, Series]) -> list[dict[str, Any]]:
    """Peer figure, our median and ``ours / theirs`` for each metric both sides have."""
    compared = []
    for label, workload, key, series, our_key in METRICS:
        if workload in peer["errors"]:
            compared.append({"metric": label, "series": series, "error": peer["errors"][workload]})
            continue
        theirs = peer["results"].get(workload, {}).get(key)
        if theirs is None:
            continue
        mine = ours[series].value(our_key) if series in ours else None
        compared.append(
            {
                "metric": label,
                "series": series,
                "unit": UNITS.get(key[-3:], "/s"),
                "theirs": theirs,
                "ours": mine,
                "ours_vs_peer": ratio(mine, theirs),
                "api": peer["results"][workload].get("api"),
            }
        )
    return compared


NOTE = (
    "Peer rows ('vs ...'): the peer's figure is in the baseline column and ratio is ours / "
    "theirs\n(for latency and memory lower is better). Peers run once each, after our "
    "workloads, with the same\nsizes and worker process count (our W3 uses one runtasks "
    "process; Celery runs one prefork worker\nwith that many children)."
)


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:.1f} ms"
    return f"{value:.0f} MB" if unit == "MB" else f"{value:,.0f}/s"


def attach_comparisons(peers: list[dict[str, Any]], ours: dict[str, Series]) -> None:
    """Store each peer's comparison with our run next to its raw results (for the JSON)."""
    for peer in peers:
        if peer.get("available"):
            peer["compared"] = compare(peer, ours)


def table_rows(peers: list[dict[str, Any]]) -> list[Row]:
    """Extra table rows: our figure, the peer's in the baseline column, ours / theirs."""
    rows: list[Row] = []
    for peer in peers:
        label = f"{peer['name']} {peer['version']}"
        if not peer.get("available"):
            rows.append(Row("peer", label, "", baseline=f"not available: {peer['reason']}"))
            continue
        for entry in peer.get("compared", []):
            metric = f"vs {label}: {entry['metric']}"
            if "error" in entry:
                rows.append(Row(entry["series"], metric, "", baseline=entry["error"][:80]))
                continue
            if (entry.get("api") or "").startswith("no bulk API"):
                metric += " (no bulk API: loop in 1 txn)"
            rows.append(
                Row(
                    entry["series"],
                    metric,
                    _figure(entry["ours"], entry["unit"]),
                    baseline=_figure(entry["theirs"], entry["unit"]),
                    ratio=fmt_ratio(entry["ours_vs_peer"]),
                )
            )
    return rows


def main() -> int:
    """Peers alone (no comparison), for developing a driver."""
    parser = argparse.ArgumentParser(description="Measure the peer task queues only.")
    parser.add_argument("--workloads", default="W1,W2,W3")
    parser.add_argument("--tasks", type=int, default=2_000)
    parser.add_argument("--single", type=int, default=500)
    parser.add_argument("--latency-tasks", type=int, default=100)
    parser.add_argument("--latency-rate", type=float, default=50.0, help="tasks/s")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--only", help="one peer name, e.g. procrastinate")
    args = parser.parse_args()
    plan = PeerPlan(
        workloads=tuple(w.strip().upper() for w in args.workloads.split(",")),
        single=args.single,
        tasks=args.tasks,
        latency_tasks=args.latency_tasks,
        latency_rate=args.latency_rate,
        processes=args.processes,
    )

    def progress(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    for peer in PEERS:
        if args.only in (None, peer.name):
            print(json.dumps(measure(peer, plan, progress), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
