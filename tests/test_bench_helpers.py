"""The benchmark's pure helpers (``bench/benchenv.py``), which its figures rest on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from benchenv import phase_gaps


def test_phase_gaps_counts_events_and_the_longest_gap_per_phase():
    stamps = [0.5, 1.0, 1.5, 4.5, 5.0, 5.5]
    figures = phase_gaps(stamps, {"before": (0.0, 2.0), "during": (2.0, 4.0), "after": (4.0, 6.0)})
    assert figures["before"]["enqueues"] == 3
    assert figures["before"]["rate"] == pytest.approx(1.5)
    # The 3 s stall spans the whole "during" phase and both its edges: no event ends in
    # it, yet it is that phase's gap, and its neighbours' too.
    assert figures["during"]["enqueues"] == 0
    assert figures["during"]["longest_gap_ms"] == pytest.approx(3000)
    assert figures["before"]["longest_gap_ms"] == pytest.approx(3000)
    assert figures["after"]["longest_gap_ms"] == pytest.approx(3000)


def test_phase_gaps_without_events():
    assert phase_gaps([], {"only": (0.0, 1.0)})["only"] == {
        "seconds": 1.0,
        "enqueues": 0,
        "rate": 0.0,
        "longest_gap_ms": 0.0,
    }


def test_run_for_json_returns_the_last_json_line_among_other_output():
    from benchenv import run_for_json

    script = "print('py-spy: sampling'); print('{\"a\": 1}'); print('{\"rate\": 2.5}')"
    assert run_for_json([sys.executable, "-c", script], what="probe") == {"rate": 2.5}


def test_run_for_json_names_a_failed_step_with_its_stderr():
    from benchenv import run_for_json

    failing = "import sys; sys.stderr.write('no connection slot'); sys.exit(3)"
    with pytest.raises(RuntimeError, match=r"probe failed:\n.*no connection slot"):
        run_for_json([sys.executable, "-c", failing], what="probe")
    with pytest.raises(RuntimeError, match="probe printed no JSON result"):
        run_for_json([sys.executable, "-c", "print('done')"], what="probe")


def _top_level_names(path: Path) -> set[str]:
    """What a module defines or imports at its top level (functions, classes, names
    assigned, names imported)."""
    import ast

    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def test_every_name_a_bench_script_imports_from_another_still_exists():
    """The scripts import each other's helpers by name (``from claim_backlog import
    env_for``); a helper renamed or moved in one left another unable to start (found in
    ``fleet_sessions.py``). Read statically: the scripts' own dependencies (psutil, the
    peers' libraries) need not be installed here."""
    import ast

    bench = Path(__file__).resolve().parent.parent / "bench"
    scripts = {path.stem: path for path in bench.glob("*.py")}
    missing = []
    for path in scripts.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in scripts and not node.level:
                defined = _top_level_names(scripts[node.module])
                missing += [
                    f"{path.name}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name not in defined
                ]
    assert len(scripts) > 20
    assert missing == []


def _peer_run(
    ours: dict[str, dict[str, float]],
    peers: dict[str, dict[str, dict[str, float]]],
    *,
    failed: dict[str, str] | None = None,
) -> dict:  # type: ignore[type-arg]
    """A result file as ``run.py --peers`` writes it (our series, each peer's results and
    the comparisons ``peers.attach_comparisons`` stores), with only what the verdict reads;
    a figure named ``bare`` is the workload's baseline."""
    from peers import attach_comparisons
    from report import Series

    series = {
        name: Series(
            runs=[{key: value for key, value in figures.items() if key != "bare"}],
            baseline=[{"rate": figures["bare"]}] if "bare" in figures else [],
        )
        for name, figures in ours.items()
    }
    peer_runs = [
        {
            "name": name,
            "available": True,
            "results": results,
            "errors": (failed or {}) if name == "pgqueuer" else {},
        }
        for name, results in peers.items()
    ]
    attach_comparisons(peer_runs, series)
    return {
        "meta": {"commit": "abc1234def"},
        "postgresql": {name: entry.to_json() for name, entry in series.items()},
        "peers": peer_runs,
    }


def test_peerset_takes_each_run_against_its_own_peers_and_medians_the_ratios():
    from peerset import verdicts

    def run(drain: float, pgqueuer_drain: float, p50: float, celery_p50: float) -> dict:  # type: ignore[type-arg]
        return _peer_run(
            {
                "W1a": {"rate": 1000.0},
                "W2": {"rate": drain, "bare": 40_000.0, "peak_pss_mb": 78.0},
                "W3": {"p50_ms": p50, "p99_ms": 5.0},
            },
            {
                "pgqueuer": {
                    "enqueue-single": {"rate": 1250.0},
                    "drain": {"rate": pgqueuer_drain, "peak_pss_mb": 80.0},
                    "latency": {"p50_ms": 3.5, "p99_ms": 6.0},
                },
                "celery": {
                    "enqueue-single": {"rate": 800.0},
                    "latency": {"p50_ms": celery_p50, "p99_ms": 4.0},
                },
            },
        )

    # The second run is slower for everyone: its own ratio, not a mix of runs, counts.
    runs = [
        run(15_000, 5_000, 3.0, 2.5),
        run(10_000, 4_000, 4.0, 5.0),
        run(16_000, 8_000, 3.0, 3.3),
    ]
    found = {verdict.label: verdict for verdict in verdicts(runs)}
    drain = found["drain vs pgqueuer"]
    assert drain.median == pytest.approx(2.5)  # 3.0, 2.5, 2.0
    assert drain.met is True
    assert drain.per_run == ("3.00 (pgqueuer)", "2.50 (pgqueuer)", "2.00 (pgqueuer)")
    assert found["drain / bare loop"].median == pytest.approx(15_000 / 40_000)
    # Latency against the lowest peer of each run: celery, pgqueuer, celery.
    p50 = found["p50 at 50/s vs best peer"]
    assert p50.per_run == ("1.20 (celery)", "1.14 (pgqueuer)", "0.91 (celery)")
    assert p50.met is False
    assert found["p99 at 50/s vs best peer"].median == pytest.approx(1.25)  # against celery's 4.0
    single = found["single enqueue() vs best peer"]  # the fastest peer: pgqueuer's 1,250/s
    assert single.median == pytest.approx(0.8)
    assert single.met is False
    assert found["summed worker PSS vs pgqueuer"].met is True


def test_peerset_leaves_out_a_run_whose_peer_failed_and_says_when_nothing_is_left():
    from peerset import verdicts

    failed = _peer_run(
        {"W2": {"rate": 10_000.0, "bare": 30_000.0}},
        {"pgqueuer": {"drain": {"rate": 2_000.0}}},
        failed={"drain": "worker crashed"},
    )
    found = {verdict.label: verdict for verdict in verdicts([failed])}
    assert found["drain vs pgqueuer"].median is None
    assert found["drain vs pgqueuer"].met is None
    assert found["drain / bare loop"].per_run == ("0.33 (bare loop)",)
