"""Where each microsecond of one enqueue and of one drained task goes: ours, pgqueuer, bare.

    python bench/account.py --db-prefix acct --single 2000 --tasks 20000 --runs 3

For each side (``ours``: ``add.enqueue`` and ``runtasks --burst``; ``pgqueuer`` 1.6.0 in
``.venv-peer-pgqueuer`` with the peer drivers' client and worker; ``bare``: the psycopg
INSERT and ``FOR UPDATE SKIP LOCKED`` loops of ``baseline.py``) it measures CPU, not rates,
because the machine is shared:

* **one enqueue**: ``--single`` calls in autocommit from a fresh client process, which
  reads its own CPU and its backend's (``cpuaccount``); wall per call, client CPU, server
  CPU, and the rest of the wall time (network, commit flush, scheduling);
* **one drained task**: ``--tasks`` queued, then the side's workers (``--processes``)
  drain them while a thread samples every worker process and every backend of the
  side's database every 10 ms; CPU per task is taken between the 10th and the 90th
  percentile of the tasks' own finish times (start-up and shutdown left out), and over
  the whole run;
* a **layer breakdown**: one more run of each under ``py-spy record --format raw --rate
  1000 --gil``; the on-CPU samples are grouped by the innermost frame that
  belongs to a known layer (``LAYERS``) and their shares applied to the measured CPU.

``--binding`` also replays our enqueue's statement from plain psycopg, bound three ways;
``--unvacuumed`` (ours only) leaves each drain's table as the fill's COPY left it, as W6
does, so that autovacuum, where the server runs it, works during the drain (its CPU is a
row of its own);
``--report FILE --spy-dir DIR`` prints an earlier run again. Medians of ``--runs``;
every run and the profiles' layer samples go to
``bench/results/account-<time>.json``. Databases ``<prefix>_ours``, ``<prefix>_pgqueuer``
and ``<prefix>_bare`` are dropped and recreated, and dropped at the end.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import itertools
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from benchenv import (
    BENCH,
    PG_SERVER,
    RESULTS,
    BackgroundSampler,
    django_env,
    precompile,
    recreate_database,
    run_for_json,
    runtasks_command,
)
from cpuaccount import accounted_loop, thread_cpu

SIDES = ("ours", "pgqueuer", "bare")
BINDINGS = ("client_side", "server_side_prepared", "server_side_unprepared")
STEADY = (0.10, 0.90)  # the steady window, as fractions of the finished tasks
SAMPLE_EVERY = 0.01
# --gil: only the thread holding the interpreter lock is sampled, i.e. Python's CPU; with
# --nonblocking instead, py-spy reads threads blocked in psycopg's wait as active.
PYSPY = ["record", "--format", "raw", "--rate", "1000", "--gil", "--nolineno"]

# A sample's layer is that of its innermost frame matching one of these (frame text is
# "function (path)"); standard-library frames other than the event loop's are charged to
# their caller. Waits are read from the leaf frame alone and left out of the CPU shares.
PARAMS = "psycopg: parameters (placeholders, quoting)"
DJANGO_DB = "Django db (connections[], cursor wrapper)"
LAYERS: tuple[tuple[str, str], ...] = (
    ("django_tasks_plus/", "ours: "),  # split by file, below
    ("pgqueuer_tasks.py", "task body"),
    ("example/tasks.py", "task body"),
    ("pgqueuer/", "pgqueuer: "),  # split by file, below
    ("psycopg/_queries.py", PARAMS),
    ("psycopg/adapt.py", PARAMS),
    ("psycopg/types/", PARAMS),
    ("psycopg/_typeinfo.py", PARAMS),
    ("psycopg/_adapters_map.py", PARAMS),
    ("psycopg", "psycopg: execute, send, results"),
    ("asyncpg/", "asyncpg"),
    ("django/dispatch/", "Django signals"),
    ("django/db/models/", "Django ORM (query, compiler, fields)"),
    ("django/db/", DJANGO_DB),
    ("django/utils/connection.py", DJANGO_DB),
    ("django/utils/asyncio.py", DJANGO_DB),
    ("asgiref/", DJANGO_DB),
    ("django/tasks/", "Django tasks API (Task, TaskResult)"),
    ("django/", "Django: "),  # split by file, below
    ("cpuaccount.py", "bench loop"),
    ("pgqueuer_driver.py", "bench loop (payload)"),
    ("pgqueuer_account.py", "bench loop"),
    ("peerkit.py", "bench loop"),
    ("baseline.py", "bare loop (psycopg calls, row building)"),
    ("account.py", "bench loop"),
    ("asyncio/", "asyncio event loop"),
    ("selectors.py", "asyncio event loop"),
    ("threading.py", "threads, locks, queues"),
    ("queue.py", "threads, locks, queues"),
    ("concurrent/futures", "threads, locks, queues"),
)
# The rows of the summary tables: each layer goes to the first row one of whose
# prefixes it starts with.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "queue library: API, validation, envelope, query building",
        (
            "ours: backend.py",
            "ours: envelope.py",
            "ours: definition.py",
            "ours: registries.py",
            "ours: conf.py",
            "ours: metadata.py",
            "pgqueuer: adapters/",
            "pgqueuer: domain/",
        ),
    ),
    (
        "queue library: worker loop, dispatch, outcomes",
        (
            "ours: worker/",
            "ours: doers.py",
            "ours: lifecycle.py",
            "ours: finished.py",
            "ours: management/",
            "pgqueuer: core/",
        ),
    ),
    (
        "queue library: SQL text, row encoding/decoding",
        ("ours: db/", "ours: codec.py", "ours: stored.py"),
    ),
    ("queue library: result objects (TaskResult)", ("ours: results.py", "Django tasks API")),
    (
        "queue library: events, metrics, signals",
        ("ours: events.py", "ours: metrics/", "ours: apps.py", "Django signals"),
    ),
    ("queue library: other", ("ours: ", "pgqueuer: ")),
    ("Django db layer (connections[], cursor wrapper, ORM, utils)", ("Django",)),
    ("driver: parameters (placeholders, quoting)", (PARAMS,)),
    ("driver: execute, send, read results", ("psycopg: ", "asyncpg")),
    ("asyncio event loop", ("asyncio event loop",)),
    ("threads, locks, queues", ("threads",)),
    ("task body", ("task body",)),
    ("bench or bare loop's own code", ("bench loop", "bare loop")),
    ("other", ("",)),
)


def group_of(layer: str) -> str:
    return next(name for name, prefixes in GROUPS if layer.startswith(prefixes))


WAITS: tuple[tuple[str, str], ...] = (  # (function, file) of a leaf that is a wait
    ("select", "selectors.py"),
    ("poll", "selectors.py"),
    ("wait", "threading.py"),
    ("_wait_for_tstate_lock", "threading.py"),
    ("wait", "psycopg/connection.py"),
    ("wait", "psycopg/waiting.py"),
    ("run", "worker/childwatch.py"),  # the supervisor, waiting for its children
)
# A stack under one of these is start-up: imports, django.setup(), checks, finding and
# parsing the management command.
STARTUP = (
    "_find_and_load",
    "setup (django/__init__.py)",
    "run_checks",
    "fetch_command",
    "create_parser",
)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# The sides: databases, client steps, worker commands, finish times
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Side:
    name: str
    database: str
    python: str
    env: dict[str, str]
    client: list[str]  # argv of the side's client script, before its step
    table: str = ""
    fill_options: tuple[str, ...] = ()  # extra options of its "fill" step (ours: --unvacuumed)

    @property
    def dsn(self) -> str:
        return f"{PG_SERVER}/{self.database}"

    def step(
        self,
        step: str,
        tasks: int = 0,
        spy: list[str] | None = None,
        options: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Run one client step in a fresh process (optionally under py-spy); its JSON line."""
        command = [self.python, *self.client, step, "--tasks", str(tasks), *options]
        return run_for_json(
            [*(spy or []), *command], what=f"{self.name} {step}", env=self.env, cwd=BENCH
        )

    def workers(self, processes: int) -> list[list[str]]:
        """The worker commands of a drain: one supervisor, or one process per worker."""
        if self.name == "ours":
            return [runtasks_command("--burst", "--processes", str(processes))]
        if self.name == "pgqueuer":
            script = BENCH / "peer_drivers" / "pgqueuer_worker.py"
            return [[self.python, str(script)] for _ in range(processes)]
        return [[self.python, __file__, "_bare-worker", "--dsn", self.dsn]] * processes

    def finished(self, conn: psycopg.Connection[Any]) -> list[float]:
        """Epoch seconds at which each drained task finished, from the side's own records."""
        query = {
            "ours": f'SELECT extract(epoch FROM finished_at) FROM "{self.table}"'
            " WHERE status = 'SUCCESSFUL'",
            "pgqueuer": "SELECT extract(epoch FROM created) FROM pgqueuer_log"
            " WHERE status = 'successful'",
            "bare": "SELECT extract(epoch FROM finished_at) FROM baseline_claim"
            " WHERE status = 'SUCCESSFUL'",
        }[self.name]
        return sorted(float(row[0]) for row in conn.execute(query))


def make_sides(prefix: str, names: Sequence[str]) -> list[Side]:
    """Create each side's database and schema (pgqueuer: its venv too, once per pin)."""
    sides = []
    for name in names:
        database = f"{prefix}_{name}"
        recreate_database(database)
        if name == "ours":
            precompile()
            env = django_env(f"postgres://root@127.0.0.1:5432/{database}")
            side = Side(name, database, sys.executable, env, [str(BENCH / "account_driver.py")])
            side.table = side.step("setup")["table"]
        elif name == "pgqueuer":
            import peers

            peer = dataclasses.replace(
                next(p for p in peers.PEERS if p.name == "pgqueuer"), database=database
            )
            progress(f"pgqueuer: venv {peer.venv.name}")
            peers.install(peer)
            python = str(peer.venv / "bin" / "python")
            script = str(BENCH / "peer_drivers" / "pgqueuer_account.py")
            side = Side(name, database, python, peers._driver_env(peer), [script])
            side.step("setup")
        else:
            env = {**os.environ, "PYTHONPATH": str(BENCH), "ACCOUNT_DSN": f"{PG_SERVER}/{database}"}
            side = Side(name, database, sys.executable, env, [__file__])
        sides.append(side)
    return sides


# -- the bare side's client steps (run as ``account.py <step>``)


def bare_single(dsn: str, tasks: int) -> dict[str, Any]:
    """baseline.insert_loop's INSERT per call, timed by the loop that times the others."""
    import baseline

    baseline._reset(dsn, baseline.CREATE_TASKS)
    columns = baseline.TASK_COLUMNS
    sql = (
        f"INSERT INTO {baseline.TASKS_TABLE} ({', '.join(columns)})"
        f" VALUES ({', '.join(['%s'] * len(columns))})"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        for i in range(200):
            conn.execute(sql, baseline._task_row(-1 - i))
        return accounted_loop(lambda i: conn.execute(sql, baseline._task_row(i)), tasks, backend)


class _NoBarrier:
    def wait(self) -> None:
        return None


def bare_worker(dsn: str) -> None:
    """One process of baseline.claim_drain's loop (batch 100), until the table is empty."""
    import baseline

    baseline._claim_worker(dsn, 100, _NoBarrier())  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# Sampling a drain: every worker process and every backend of the database
# --------------------------------------------------------------------------------------


class Sampler(BackgroundSampler):
    """CPU seconds of worker processes (``w``) and of the database's backends (``b``:
    client backends, ``v``: autovacuum), sampled every 10 ms with their wall times."""

    def __init__(self, database: str, roots: Sequence[int], exclude: Sequence[int]) -> None:
        import psutil

        self.database = database
        self.roots = [psutil.Process(pid) for pid in roots]
        self.exclude = list(exclude)
        self.series: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
        self._processes: dict[int, Any] = {}
        super().__init__()

    def _backends(self, conn: psycopg.Connection[Any]) -> list[tuple[str, int]]:
        rows = conn.execute(
            "SELECT backend_type, pid FROM pg_stat_activity WHERE datname = %s AND pid <> ALL(%s)",
            (self.database, self.exclude),
        ).fetchall()
        return [("b" if kind == "client backend" else "v", pid) for kind, pid in rows]

    def _record(self, key: tuple[str, int], value: float) -> None:
        stamps, values = self.series.setdefault(key, ([], []))
        stamps.append(time.time())
        values.append(value)

    def _loop(self) -> None:
        import psutil

        backends: list[tuple[str, int]] = []
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            for tick in itertools.count():
                if self._stop.is_set():
                    return
                if tick % 5 == 0:
                    backends = self._backends(conn)
                    for root in self.roots:
                        try:
                            for child in [root, *root.children(recursive=True)]:
                                self._processes.setdefault(child.pid, child)
                        except psutil.Error:
                            continue
                for pid, process in list(self._processes.items()):
                    try:
                        times = process.cpu_times()
                    except psutil.Error:
                        continue
                    self._record(("w", pid), times.user + times.system)
                for kind, pid in backends:
                    try:
                        self._record((kind, pid), thread_cpu(pid))
                    except OSError:
                        continue
                self._stop.wait(SAMPLE_EVERY)

    def at(self, key: tuple[str, int], moment: float) -> float:
        """CPU of one process at ``moment``, interpolated between its samples."""
        stamps, values = self.series[key]
        index = bisect.bisect_left(stamps, moment)
        if index == 0:
            return values[0] if stamps[0] - moment < 1.0 else 0.0
        if index >= len(stamps):
            return values[-1]
        before, after = stamps[index - 1], stamps[index]
        share = (moment - before) / (after - before) if after > before else 0.0
        return values[index - 1] + share * (values[index] - values[index - 1])

    def total(self, kind: str, low: float, high: float) -> float:
        return sum(self.at(key, high) - self.at(key, low) for key in self.series if key[0] == kind)

    def whole(self, kind: str) -> float:
        """Last sampled CPU of every process of a kind (backends: since they started)."""
        return sum(values[-1] for key, (_, values) in self.series.items() if key[0] == kind)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def running(commands: list[list[str]], env: dict[str, str]) -> Iterator[list[subprocess.Popen]]:
    """Start the worker processes; SIGTERM (then SIGKILL) whatever is still running at exit."""
    processes = [
        subprocess.Popen(c, env=env, cwd=BENCH, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for c in commands
    ]
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


def _wait_drained(
    side: Side, processes: list[subprocess.Popen], conn: psycopg.Connection[Any], tasks: int
) -> None:
    """ours and bare exit by themselves; pgqueuer's workers run until every job succeeded."""
    deadline = time.monotonic() + 60 + tasks / 20
    while time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in processes):
            errors = b" ".join(p.stderr.read()[-500:] for p in processes if p.stderr)
            raise RuntimeError(f"{side.name}: a worker failed: {errors.decode(errors='replace')}")
        if all(p.poll() == 0 for p in processes):
            return
        if side.name == "pgqueuer" and len(side.finished(conn)) >= tasks:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{side.name}: drain not done in time")


def fill(side: Side, tasks: int) -> None:
    if side.name == "bare":
        import baseline

        baseline._fill_claim_table(side.dsn, tasks)
    else:
        side.step("fill", tasks, options=side.fill_options)


def drain(side: Side, tasks: int, processes: int) -> dict[str, Any]:
    """One measured drain: CPU per task of the workers and of their backends."""
    fill(side, tasks)
    with psycopg.connect(side.dsn, autocommit=True) as conn:
        mine = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        cpu_before, started = _children_cpu(), time.time()
        with (
            running(side.workers(processes), side.env) as workers,
            Sampler(side.database, [w.pid for w in workers], [mine]) as sampler,
        ):
            _wait_drained(side, workers, conn, tasks)
        wall = time.time() - started
        worker_cpu = _children_cpu() - cpu_before
        finished = side.finished(conn)
    if len(finished) != tasks:
        raise RuntimeError(f"{side.name}: {len(finished)} of {tasks} tasks finished")
    low = finished[int(STEADY[0] * (tasks - 1))]
    high = finished[int(STEADY[1] * (tasks - 1))]
    steady_tasks = sum(1 for moment in finished if low < moment <= high)
    per_task = 1e6 / steady_tasks
    return {
        "worker_cpu_us": sampler.total("w", low, high) * per_task,
        "server_cpu_us": sampler.total("b", low, high) * per_task,
        "autovacuum_cpu_us": sampler.total("v", low, high) * per_task,
        "steady_rate": steady_tasks / (high - low),
        "steady_cores_busy": (sampler.total("w", low, high) + sampler.total("b", low, high))
        / (high - low),
        "whole_worker_cpu_us": worker_cpu * 1e6 / tasks,
        "whole_server_cpu_us": sampler.whole("b") * 1e6 / tasks,
        "wall_seconds": wall,
        "backends": sum(1 for key in sampler.series if key[0] == "b"),
        "loadavg": os.getloadavg(),
    }


def single(side: Side, tasks: int) -> dict[str, Any]:
    result = bare_single(side.dsn, tasks) if side.name == "bare" else side.step("single", tasks)
    result["wait_us"] = result["wall_us"] - result["client_cpu_us"]
    result["loadavg"] = os.getloadavg()
    return result


# --------------------------------------------------------------------------------------
# Profiles: py-spy samples by layer, applied to the measured CPU
# --------------------------------------------------------------------------------------


def layer_of(frames: list[str]) -> str:
    """The layer of one sample (frames outermost first)."""
    leaf = frames[-1]
    function = leaf.partition(" (")[0].rpartition(".")[2]  # "Condition.wait (…)" -> "wait"
    for name, where in WAITS:
        if function == name and where in leaf:
            return "wait"
    for frame in reversed(frames):
        for fragment, name in LAYERS:
            if fragment in frame:
                if name.endswith(": "):  # a package split by file
                    path = frame.rpartition(fragment)[2].rstrip(")")
                    return name + path
                return name
    return "other (interpreter, standard library)"


def layers(raw: Path, keep: Callable[[list[str]], bool]) -> Counter[str]:
    """Samples per layer of one ``py-spy --format raw`` file, for the stacks ``keep`` takes."""
    counts: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if frames and keep(frames):
            counts[layer_of(frames)] += int(count)
    return counts


def in_loop(frames: list[str]) -> bool:
    return any(frame.startswith("accounted_loop ") for frame in frames)


def not_startup(frames: list[str]) -> bool:
    # The supervisor's own frame as the leaf is its collect, freeze and fork before the
    # children start: start-up, though the children's stacks hold the frame too.
    if frames[-1].startswith("supervise ("):
        return False
    return not any(marker in frame for frame in frames for marker in STARTUP)


def pyspy() -> str:
    import shutil

    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found


def single_samples(folder: Path, side: str) -> Counter[str]:
    return layers(folder / f"single-{side}.txt", in_loop)


def drain_samples(folder: Path, side: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for raw in sorted(folder.glob(f"drain-{side}-*.txt")):
        counts += layers(raw, not_startup)
    return counts


def profile_single(side: Side, tasks: int, folder: Path) -> dict[str, Any]:
    raw = folder / f"single-{side.name}.txt"
    spy = [pyspy(), *PYSPY, "--output", str(raw), "--"]
    if side.name == "bare":
        run = side.step("_bare-single", tasks, spy)
    else:
        run = side.step("single", tasks, spy)
    samples = dict(single_samples(folder, side.name))
    return {"run": run, "samples": samples, "coverage": coverage(samples, run)}


def coverage(samples: dict[str, int], run: dict[str, Any]) -> float:
    """On-CPU samples (1 ms each) against the profiled run's own CPU: near 1 if py-spy
    sampled at its rate and told waits from work."""
    busy = sum(count for layer, count in samples.items() if layer != "wait")
    return busy / 1000 / (run["client_cpu_us"] * run["calls"] / 1e6)


def profile_drain(side: Side, tasks: int, processes: int, folder: Path) -> dict[str, Any]:
    """A drain with every worker process under py-spy (``--subprocesses`` for ours)."""
    fill(side, tasks)
    commands = []
    for index, command in enumerate(side.workers(processes)):
        raw = folder / f"drain-{side.name}-{index}.txt"
        sub = ["--subprocesses"] if side.name == "ours" else []
        commands.append([pyspy(), *PYSPY, *sub, "--output", str(raw), "--", *command])
    started = time.time()
    with (
        psycopg.connect(side.dsn, autocommit=True) as conn,
        running(commands, side.env) as spies,
    ):
        _stop_when_drained(side, spies, conn, tasks)
    samples = drain_samples(folder, side.name)
    return {"seconds": time.time() - started, "samples": dict(samples)}


def _stop_when_drained(
    side: Side, spies: list[subprocess.Popen], conn: psycopg.Connection[Any], tasks: int
) -> None:
    """Wait for the drain; stop pgqueuer's workers (not py-spy, which then writes its file)."""
    import psutil

    _wait_drained(side, spies, conn, tasks)
    for spy in spies:
        try:
            for child in psutil.Process(spy.pid).children():
                child.send_signal(signal.SIGTERM)
        except psutil.Error:  # the worker exited by itself and py-spy with it
            continue
    for spy in spies:
        spy.wait(timeout=60)


def apportion(samples: dict[str, int], cpu_us: float) -> dict[str, float]:
    """Microseconds per layer: the on-CPU samples' shares of the measured CPU."""
    busy = {layer: count for layer, count in samples.items() if layer != "wait"}
    total = sum(busy.values()) or 1
    return {layer: cpu_us * count / total for layer, count in busy.items()}


# --------------------------------------------------------------------------------------
# Orchestration and report
# --------------------------------------------------------------------------------------


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and k != "backend_pid"]
    return {key: statistics.median(run[key] for run in runs) for key in keys}


def table(title: str, rows: list[tuple[str, dict[str, float]]], names: Sequence[str]) -> str:
    lines = [f"\n{title}", "| µs | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, values in rows:
        cells = [f"{values[n]:.1f}" if n in values else "-" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakdown(
    results: dict[str, Any], part: str, cpu_key: str, names: Sequence[str]
) -> list[tuple[str, dict[str, float]]]:
    """Rows of layer µs, largest first (by the largest side), then the measured totals."""
    per_side = {
        name: apportion(results[name][f"{part}_profile"]["samples"], results[name][part][cpu_key])
        for name in names
        if f"{part}_profile" in results[name]
    }
    for name, values in per_side.items():
        results[name][f"{part}_layers_us"] = values
    labels = sorted(
        {label for values in per_side.values() for label in values},
        key=lambda label: -max(values.get(label, 0.0) for values in per_side.values()),
    )
    rows = [(label, {n: v[label] for n, v in per_side.items() if label in v}) for label in labels]
    return [row for row in rows if max(row[1].values()) >= 0.05]


def grouped(rows: list[tuple[str, dict[str, float]]]) -> list[tuple[str, dict[str, float]]]:
    """The layer rows summed into ``GROUPS``' rows, in their order."""
    sums: dict[str, dict[str, float]] = {name: {} for name, _ in GROUPS}
    for label, values in rows:
        target = sums[group_of(label)]
        for side, value in values.items():
            target[side] = target.get(side, 0.0) + value
    return [(name, values) for name, values in sums.items() if values]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-prefix", default="account")
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--single", type=int, default=2_000, help="single enqueues per run")
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks per drain")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy runs")
    parser.add_argument(
        "--binding",
        action="store_true",
        help="also replay our enqueue's INSERT from psycopg, bound three ways (ours only)",
    )
    parser.add_argument(
        "--unvacuumed",
        action="store_true",
        help="ours only: no VACUUM after each drain's fill, as W6 (autovacuum's CPU is its row)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--spy-dir", help="keep the raw py-spy files here (default: deleted)")
    parser.add_argument(
        "--report", help="no runs: print this results JSON again, layers re-read from --spy-dir"
    )
    args = parser.parse_args()
    if args.report:
        return report_again(Path(args.report), Path(args.spy_dir) if args.spy_dir else None)
    names = [name.strip() for name in args.sides.split(",")]
    if args.unvacuumed and names != ["ours"]:
        parser.error("--unvacuumed needs --sides ours (the other sides always vacuum)")
    sides = make_sides(args.db_prefix, names)
    if args.unvacuumed:
        sides = [dataclasses.replace(side, fill_options=("--unvacuumed",)) for side in sides]
    results: dict[str, Any] = {s.name: {"single_runs": [], "drain_runs": []} for s in sides}
    meta = {
        "argv": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_start": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    try:
        for run in range(args.runs):
            for side in sides:
                progress(f"run {run + 1}/{args.runs}: {side.name} single x{args.single}")
                results[side.name]["single_runs"].append(single(side, args.single))
            if args.binding and "ours" in results:
                progress(f"run {run + 1}/{args.runs}: ours' INSERT bound three ways")
                ours = next(side for side in sides if side.name == "ours")
                results["ours"].setdefault("binding_runs", []).append(
                    ours.step("binding", args.single)
                )
            for side in sides:
                progress(f"run {run + 1}/{args.runs}: {side.name} drain of {args.tasks}")
                results[side.name]["drain_runs"].append(drain(side, args.tasks, args.processes))
        if not args.no_profile:
            with tempfile.TemporaryDirectory(prefix="account-spy-") as temporary:
                folder = args.spy_dir or temporary
                Path(folder).mkdir(parents=True, exist_ok=True)
                for side in sides:
                    progress(f"profile: {side.name} single, drain")
                    entry = results[side.name]
                    entry["single_profile"] = profile_single(side, args.single, Path(folder))
                    entry["drain_profile"] = profile_drain(
                        side, args.tasks, args.processes, Path(folder)
                    )
    finally:
        if not args.keep:
            with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
                for side in sides:
                    conn.execute(f'DROP DATABASE IF EXISTS "{side.database}" WITH (FORCE)')
    for side in sides:
        entry = results[side.name]
        entry["single"] = medians(entry["single_runs"])
        entry["drain"] = medians(entry["drain_runs"])
    if "binding_runs" in results.get("ours", {}):
        runs = results["ours"]["binding_runs"]
        results["ours"]["binding"] = {
            variant: medians([run[variant] for run in runs]) for variant in BINDINGS
        }
    meta["loadavg_end"] = os.getloadavg()
    report(results, names, meta, profiled=not args.no_profile)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"account-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
    progress(f"results: {path}")
    return 0


def report_again(path: Path, folder: Path | None) -> int:
    """The tables of an earlier run; with the raw profiles, grouped by today's LAYERS."""
    saved = json.loads(path.read_text())
    results, names = saved["results"], list(saved["results"])
    profiled = all("single_profile" in results[name] for name in names)
    if folder is not None and profiled:
        for name in names:
            profile = results[name]["single_profile"]
            profile["samples"] = dict(single_samples(folder, name))
            profile["coverage"] = coverage(profile["samples"], profile["run"])
            results[name]["drain_profile"]["samples"] = dict(drain_samples(folder, name))
    report(results, names, saved["meta"], profiled)
    return 0


def report(results: dict[str, Any], names: Sequence[str], meta: dict[str, Any], profiled: bool):
    single_rows = [
        ("wall per enqueue", {n: results[n]["single"]["wall_us"] for n in names}),
        ("client CPU", {n: results[n]["single"]["client_cpu_us"] for n in names}),
        ("PostgreSQL backend CPU", {n: results[n]["single"]["server_cpu_us"] for n in names}),
        (
            "rest of the wall (network, commit flush, scheduling)",
            {
                n: results[n]["single"]["wait_us"] - results[n]["single"]["server_cpu_us"]
                for n in names
            },
        ),
    ]
    drain_rows = [
        ("worker CPU per task (steady)", {n: results[n]["drain"]["worker_cpu_us"] for n in names}),
        (
            "PostgreSQL CPU per task (steady)",
            {n: results[n]["drain"]["server_cpu_us"] for n in names},
        ),
        ("autovacuum CPU per task", {n: results[n]["drain"]["autovacuum_cpu_us"] for n in names}),
        (
            "worker CPU per task, whole run",
            {n: results[n]["drain"]["whole_worker_cpu_us"] for n in names},
        ),
        (
            "PostgreSQL CPU, whole run",
            {n: results[n]["drain"]["whole_server_cpu_us"] for n in names},
        ),
        ("steady rate (tasks/s)", {n: results[n]["drain"]["steady_rate"] for n in names}),
    ]
    print(f"{meta['argv']}  load {meta['loadavg_start']} -> {meta['loadavg_end']}")
    if profiled:
        shares = {n: round(results[n]["single_profile"]["coverage"], 2) for n in names}
        print(f"enqueue profiles, on-CPU samples / measured CPU: {shares}")
    print(table("One enqueue (medians)", single_rows, names))
    if profiled:
        by_layer = breakdown(results, "single", "client_cpu_us", names)
        print(table("Client CPU by layer group", grouped(by_layer), names))
        print(table("Client CPU by layer", by_layer, names))
    if "binding" in results.get("ours", {}):
        rows = [
            (key, {v: results["ours"]["binding"][v][key] for v in BINDINGS})
            for key in ("wall_us", "client_cpu_us", "server_cpu_us")
        ]
        print(table("Our enqueue's statement from plain psycopg (medians)", rows, BINDINGS))
    print(table("One drained task (medians)", drain_rows, names))
    if profiled:
        by_layer = breakdown(results, "drain", "worker_cpu_us", names)
        print(table("Worker CPU by layer group", grouped(by_layer), names))
        print(table("Worker CPU by layer", by_layer, names))


def _internal() -> bool:
    """``account.py _bare-single`` and ``_bare-worker``: the bare side's own processes."""
    if len(sys.argv) < 2 or not sys.argv[1].startswith("_bare-"):
        return False
    parser = argparse.ArgumentParser()
    parser.add_argument("step")
    parser.add_argument("--dsn", default=os.environ.get("ACCOUNT_DSN", ""))
    parser.add_argument("--tasks", type=int, default=0)
    args = parser.parse_args()
    if args.step == "_bare-single":
        print(json.dumps(bare_single(args.dsn, args.tasks)))
    else:
        bare_worker(args.dsn)
    return True


if __name__ == "__main__":
    if not _internal():
        sys.exit(main())
