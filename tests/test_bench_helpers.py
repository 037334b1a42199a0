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
