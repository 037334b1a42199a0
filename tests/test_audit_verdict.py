"""The CI dependency audit's decisions (scripts/audit_verdict.py) on pip-audit reports."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "audit_verdict.py"
spec = importlib.util.spec_from_file_location("audit_verdict", SCRIPT)
assert spec is not None and spec.loader is not None
audit_verdict = importlib.util.module_from_spec(spec)
spec.loader.exec_module(audit_verdict)


def dep(name: str, *vulns: tuple[str, list[str]], skip: str | None = None) -> dict:
    entry: dict = {"name": name, "version": "1.0"}
    if skip:
        entry["skip_reason"] = skip
    else:
        entry["vulns"] = [{"id": vid, "fix_versions": fixes} for vid, fixes in vulns]
    return entry


def test_a_vulnerability_with_a_fix_fails():
    status, lines = audit_verdict.verdict(
        {"dependencies": [dep("django", ("PYSEC-1", ["1.1"])), dep("croniter")]}
    )
    assert status == audit_verdict.FIXABLE
    assert "VULNERABLE django 1.0: PYSEC-1, fixed in 1.1" in lines


def test_a_vulnerability_without_a_fix_is_listed_but_passes():
    status, lines = audit_verdict.verdict({"dependencies": [dep("django", ("GHSA-2", []))]})
    assert status == audit_verdict.CLEAN
    assert "known, no fix yet: django 1.0: GHSA-2" in lines


def test_clean_report_passes():
    status, lines = audit_verdict.verdict({"dependencies": [dep("django"), dep("psycopg")]})
    assert status == audit_verdict.CLEAN
    assert lines[-1] == "2 dependencies audited, none with a fixable vulnerability"


def test_nothing_looked_up_means_not_audited():
    report = {"dependencies": [dep("django", skip="Dependency not found on PyPI")] * 3}
    status, lines = audit_verdict.verdict(report)
    assert status == audit_verdict.NOT_AUDITED
    assert lines == ["none of 3 dependencies could be looked up (Dependency not found on PyPI)"]


@pytest.mark.parametrize("text", ["", "{", json.dumps({"dependencies": []})])
def test_missing_or_empty_report_means_not_audited(tmp_path, text, capsys):
    report = tmp_path / "report.json"
    report.write_text(text)
    assert audit_verdict.main(["audit_verdict.py", str(report)]) == audit_verdict.NOT_AUDITED
    assert capsys.readouterr().out.startswith("audit: ")
