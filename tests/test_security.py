"""Static guarantees about the package's own code: nothing deserializes or evaluates code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "django_tasks_plus"
FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def _violations(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")[0]]
        else:
            names = []
        found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n in FORBIDDEN_MODULES]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_CALLS
        ):
            found.append(f"{path.name}:{node.lineno} calls {node.func.id}()")
    return found


def test_the_scan_sees_the_package():
    assert len(_sources()) > 20


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_pickle_and_no_eval(path):
    assert _violations(path) == []


def test_the_scanner_catches_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle\nfrom marshal import loads\neval('1')\nexec('x = 1')\n")
    assert _violations(bad) == [
        "bad.py:1 imports pickle",
        "bad.py:2 imports marshal",
        "bad.py:3 calls eval()",
        "bad.py:4 calls exec()",
    ]
