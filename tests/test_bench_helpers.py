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
