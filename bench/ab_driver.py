"""One measurement of one checkout for ``ab.py``, printed as a JSON line.

``ab.py`` runs this script with the checkout under test first on ``PYTHONPATH`` (its
package and its ``testproject``), so the same measuring code drives today's package and
an older commit alike. It touches only what both sides have: ``add.enqueue``,
``enqueue_many``, the task and worker models and ``manage.py runtasks``.

    python bench/ab_driver.py {setup,single,bulk,drain,memory,idle,wal} --manage PATH [options]

``drain`` samples every process of the worker tree (the supervisor and its forked
children) with ``psutil`` every few milliseconds, then reads the tasks' own timestamps,
so it can split a run in two: start-up (process start to the first claim, per process)
and steady state (worker CPU between the 10th and the 90th percentile of finish times,
divided by the tasks finished in between). ``memory`` drains again, reading each
process's PSS and USS instead (``TreeMemorySampler``). ``wal`` counts the bytes of
write-ahead log a bulk enqueue and a drain write per task.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import django

django.setup()

import psutil  # noqa: E402
from benchenv import BackgroundSampler  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import Count, Q  # noqa: E402

from django_tasks_plus import enqueue_many  # noqa: E402
from django_tasks_plus.models import TaskRecord, WorkerRecord  # noqa: E402
from example.tasks import add  # noqa: E402

STEADY_FROM, STEADY_TO = 0.10, 0.90  # the steady window, as fractions of finished tasks


def empty_tables() -> None:
    tables = ", ".join(
        connection.ops.quote_name(model._meta.db_table) for model in (TaskRecord, WorkerRecord)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables}")
    vacuum_tasks()


def vacuum_tasks() -> None:
    """``VACUUM ANALYZE`` the task table: fresh statistics and visibility before a run."""
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {connection.ops.quote_name(TaskRecord._meta.db_table)}")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class TreeCpuSampler(BackgroundSampler):
    """CPU seconds of every process in a tree, sampled on a short period.

    ``at(pid, t)`` interpolates a process's CPU at wall time ``t`` (seconds since the
    epoch) between the samples around it. /proc counts in clock ticks (10 ms), so a
    figure is good to about a tick per process.
    """

    def __init__(self, root: int, interval: float = 0.01) -> None:
        self.root = psutil.Process(root)
        self.interval = interval
        self.samples: dict[int, tuple[list[float], list[float]]] = {}
        self.created: dict[int, float] = {}
        self._known: dict[int, psutil.Process] = {root: self.root}
        super().__init__()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                for child in self.root.children(recursive=True):
                    self._known.setdefault(child.pid, child)
            except psutil.Error:
                pass
            for pid, process in list(self._known.items()):
                try:
                    times = process.cpu_times()
                    if pid not in self.created:
                        self.created[pid] = process.create_time()
                except psutil.Error:
                    continue
                stamps, values = self.samples.setdefault(pid, ([], []))
                stamps.append(time.time())
                values.append(times.user + times.system)
            self._stop.wait(self.interval)

    def at(self, pid: int, moment: float) -> float:
        stamps, values = self.samples[pid]
        index = bisect.bisect_left(stamps, moment)
        if index == 0:
            return values[0]
        if index >= len(stamps):
            return values[-1]
        before, after = stamps[index - 1], stamps[index]
        share = (moment - before) / (after - before) if after > before else 0.0
        return values[index - 1] + share * (values[index] - values[index - 1])

    def last(self, pid: int) -> float:
        return self.samples[pid][1][-1]


def burst_worker(args: argparse.Namespace) -> subprocess.Popen[bytes]:
    """The side's ``runtasks --burst --processes N``, started (stderr kept for errors)."""
    command = [sys.executable, args.manage, "runtasks", "-v", "0", "--burst"]
    command += ["--processes", str(args.processes)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run_worker(args: argparse.Namespace) -> tuple[float, float, TreeCpuSampler]:
    """``runtasks --burst`` to exit: wall seconds, CPU of the tree (rusage), the samples."""
    cpu_before = children_cpu()
    started = time.perf_counter()
    process = burst_worker(args)
    with TreeCpuSampler(process.pid) as sampler:
        _, stderr = process.communicate()
    wall = time.perf_counter() - started
    if process.returncode:
        raise RuntimeError(f"worker exited {process.returncode}: {stderr.decode()[-2000:]}")
    return wall, children_cpu() - cpu_before, sampler


def setup(_: argparse.Namespace) -> dict[str, Any]:
    call_command("migrate", verbosity=0)
    return {}


def single(args: argparse.Namespace) -> dict[str, Any]:
    empty_tables()
    with _cpu_per_task(args.tasks) as figures:
        started = time.perf_counter()
        for i in range(args.tasks):
            add.enqueue(i, i)
        figures["rate"] = args.tasks / (time.perf_counter() - started)
    return figures


def bulk(args: argparse.Namespace) -> dict[str, Any]:
    empty_tables()
    calls = [((i, i), {}) for i in range(args.tasks)]
    with _cpu_per_task(args.tasks) as figures:
        started = time.perf_counter()
        enqueue_many(add, calls)
        figures["rate"] = args.tasks / (time.perf_counter() - started)
    return figures


@contextlib.contextmanager
def _cpu_per_task(tasks: int) -> Iterator[dict[str, Any]]:
    """CPU per task of this process (``client_cpu_us``) and of its PostgreSQL backend
    (``server_cpu_us``, both on this host): figures a loaded machine moves far less than
    a rate, since waiting for a core is not counted."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = psutil.Process(cursor.fetchone()[0])
    client = psutil.Process()
    before = (client.cpu_times(), backend.cpu_times())
    figures: dict[str, Any] = {}
    yield figures
    after = (client.cpu_times(), backend.cpu_times())
    for name, start, end in (
        ("client_cpu_us", before[0], after[0]),
        ("server_cpu_us", before[1], after[1]),
    ):
        used = (end.user - start.user) + (end.system - start.system)
        figures[name] = used * 1e6 / tasks


def idle(args: argparse.Namespace) -> dict[str, Any]:
    """A burst worker over an empty queue: the whole cost of starting and stopping."""
    empty_tables()
    connection.close()
    wall, cpu, _ = run_worker(args)
    return {"idle_wall_s": wall, "idle_cpu_s": cpu}


def _startup(sampler: TreeCpuSampler, rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Per process: CPU and wall from the supervisor's start to that child's first claim.

    Children are numbered in fork order (their worker ids end in ``-<index>``); the
    supervisor is charged up to the first claim of any child.
    """
    root = sampler.root.pid
    children = sorted((pid for pid in sampler.created if pid != root), key=sampler.created.get)
    first: dict[int, float] = {}
    for started, _, worker_ids in rows:
        index = int(worker_ids[-1].rsplit("-", 1)[1])
        moment = started.timestamp()
        first[index] = min(first.get(index, moment), moment)
    origin = sampler.created[root]
    earliest = min(first.values())
    result: dict[str, Any] = {
        "start_supervisor_cpu_s": sampler.at(root, earliest),
        "start_first_claim_s": earliest - origin,
    }
    child_cpu, child_wall = [], []
    for index, pid in enumerate(children):
        if index in first:
            child_cpu.append(sampler.at(pid, first[index]))
            child_wall.append(first[index] - origin)
    result["start_child_cpu_s"] = sum(child_cpu) / len(child_cpu)
    result["start_child_wall_s"] = sum(child_wall) / len(child_wall)
    result["start_total_cpu_s"] = result["start_supervisor_cpu_s"] + sum(child_cpu)
    return result


def _steady(sampler: TreeCpuSampler, rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Tree CPU per task between the 10th and the 90th percentile of finish times."""
    finished = sorted(row[1].timestamp() for row in rows)
    low = finished[int(STEADY_FROM * (len(finished) - 1))]
    high = finished[int(STEADY_TO * (len(finished) - 1))]
    tasks = sum(1 for moment in finished if low < moment <= high)
    cpu = sum(sampler.at(pid, high) - sampler.at(pid, low) for pid in sampler.samples)
    return {
        "steady_cpu_ms_per_task": cpu * 1000 / tasks,
        "steady_rate": tasks / (high - low),
        "steady_cpu_cores": cpu / (high - low),
    }


def check_drained(tasks: int, what: str) -> None:
    """Raise unless the table holds exactly ``tasks`` rows, every one SUCCESSFUL: a side
    that lost or failed tasks must not report a figure."""
    counts = TaskRecord.objects.aggregate(
        rows=Count("pk"), done=Count("pk", filter=Q(status="SUCCESSFUL"))
    )
    if counts["done"] != tasks or counts["rows"] != tasks:
        raise RuntimeError(f"{what} check failed: {counts['done']} of {tasks} successful")


def drain(args: argparse.Namespace) -> dict[str, Any]:
    empty_tables()
    enqueue_many(add, [((i, i), {}) for i in range(args.tasks)])
    vacuum_tasks()
    connection.close()  # the worker should not compete with an idle session
    wall, cpu, sampler = run_worker(args)
    check_drained(args.tasks, "drain")
    rows = list(TaskRecord.objects.values_list("started_at", "finished_at", "worker_ids"))
    first = min(row[0] for row in rows)
    last = max(row[1] for row in rows)
    result = {
        "rate": args.tasks / (last - first).total_seconds(),
        "rate_with_start": args.tasks / wall,
        "worker_cpu_s": cpu,
        "worker_cpu_ms_per_task": cpu * 1000 / args.tasks,
    }
    result.update(_startup(sampler, rows))
    result.update(_steady(sampler, rows))
    return result


def _wal_position() -> int:
    """Where the server's write-ahead log ends now, in bytes."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def _wal_start() -> int:
    """A ``CHECKPOINT``, then the log's end: after a checkpoint the first change to each
    page logs the whole page, so without one a side's figure would depend on where the
    server's own checkpoints fell."""
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")
    return _wal_position()


def wal(args: argparse.Namespace) -> dict[str, Any]:
    """WAL bytes per task of an ``enqueue_many`` and of a ``runtasks --burst`` drain: the
    database's writes (heap, every index entry, commits), a figure that the machine's
    load does not move (two runs of one commit agree within 0.5 %, where rates and CPU
    per task can differ by a fifth). The log is the whole server's: nothing else may
    write meanwhile (autovacuum is off on the bench server)."""
    empty_tables()
    calls = [((i, i), {}) for i in range(args.tasks)]
    before = _wal_start()
    enqueue_many(add, calls)
    bulk_bytes = _wal_position() - before
    vacuum_tasks()
    before = _wal_start()
    connection.close()  # the worker should not compete with an idle session
    run_worker(args)
    drain_bytes = _wal_position() - before
    check_drained(args.tasks, "wal drain")
    return {
        "bulk_wal_bytes_per_task": bulk_bytes / args.tasks,
        "drain_wal_bytes_per_task": drain_bytes / args.tasks,
    }


class TreeMemorySampler(BackgroundSampler):
    """Each process's PSS and USS in a worker tree (the supervisor and its forked workers),
    kept for the moment their summed PSS peaked with every process up. PSS splits the
    pages the workers share with the supervisor; USS is what a process holds alone."""

    def __init__(self, root: int, processes: int, interval: float = 0.2) -> None:
        self.root = psutil.Process(root)
        self.processes = processes
        self.interval = interval
        self.peak: list[tuple[int, int]] = []  # (pss, uss) per process, supervisor first
        super().__init__()

    def _loop(self) -> None:
        while not self._stop.is_set():
            readings = []
            with contextlib.suppress(psutil.Error):
                for process in [self.root, *self.root.children()]:
                    memory = process.memory_full_info()
                    readings.append((memory.pss, memory.uss))
            full = len(readings) == self.processes + 1
            if full and sum(r[0] for r in readings) > sum(r[0] for r in self.peak):
                self.peak = readings
            self._stop.wait(self.interval)


def memory(args: argparse.Namespace) -> dict[str, Any]:
    """A drain's memory at its peak: summed PSS, the supervisor's, the workers' average.
    Apart from ``drain``: walking page tables every 0.2 s would disturb its timings."""
    empty_tables()
    enqueue_many(add, [((i, i), {}) for i in range(args.tasks)])
    connection.close()
    process = burst_worker(args)
    with TreeMemorySampler(process.pid, args.processes) as sampler:
        _, stderr = process.communicate()
    if process.returncode or not sampler.peak:
        raise RuntimeError(f"worker exited {process.returncode}: {stderr.decode()[-2000:]}")
    mib = 1024 * 1024
    (supervisor_pss, supervisor_uss), *workers = sampler.peak
    return {
        "sum_pss_mb": sum(r[0] for r in sampler.peak) / mib,
        "supervisor_pss_mb": supervisor_pss / mib,
        "supervisor_uss_mb": supervisor_uss / mib,
        "worker_pss_mb": sum(r[0] for r in workers) / len(workers) / mib,
        "worker_uss_mb": sum(r[1] for r in workers) / len(workers) / mib,
    }


WORKLOADS = {
    "setup": setup,
    "single": single,
    "bulk": bulk,
    "drain": drain,
    "memory": memory,
    "idle": idle,
    "wal": wal,
}


def main() -> None:
    parser = argparse.ArgumentParser(description="One A/B measurement of one checkout.")
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--manage", required=True, help="the checkout's testproject/manage.py")
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(WORKLOADS[args.workload](args)))


if __name__ == "__main__":
    main()
