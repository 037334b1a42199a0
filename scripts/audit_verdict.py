"""Read pip-audit's JSON report and decide what CI does with it.

Exit status:
  0  every dependency was audited and none has a known vulnerability with a fix
  1  at least one dependency has a known vulnerability that a newer release fixes
  2  the audit could not be done (no report, or no dependency could be looked up,
     which is what an unreachable vulnerability service looks like)

Vulnerabilities without a fixed release are listed but do not fail the build: there is
nothing to upgrade to. Kept apart from the shell script so its decisions are testable.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CLEAN, FIXABLE, NOT_AUDITED = 0, 1, 2


def verdict(report: dict[str, Any]) -> tuple[int, list[str]]:
    """The exit status for ``report`` and the lines to print about it."""
    dependencies = report.get("dependencies")
    if not isinstance(dependencies, list) or not dependencies:
        return NOT_AUDITED, ["pip-audit produced no dependency list"]
    lines: list[str] = []
    skipped = [dep for dep in dependencies if dep.get("skip_reason")]
    fixable = 0
    for dep in dependencies:
        for vuln in dep.get("vulns") or []:
            fixes = vuln.get("fix_versions") or []
            label = f"{dep.get('name')} {dep.get('version')}: {vuln.get('id')}"
            if fixes:
                fixable += 1
                lines.append(f"VULNERABLE {label}, fixed in {', '.join(fixes)}")
            else:
                lines.append(f"known, no fix yet: {label}")
    if len(skipped) == len(dependencies) and not fixable:
        reason = skipped[0].get("skip_reason")
        return NOT_AUDITED, [
            f"none of {len(dependencies)} dependencies could be looked up ({reason})"
        ]
    for dep in skipped:
        lines.append(f"not audited: {dep.get('name')} ({dep.get('skip_reason')})")
    if fixable:
        return FIXABLE, lines
    audited = len(dependencies) - len(skipped)
    return CLEAN, [*lines, f"{audited} dependencies audited, none with a fixable vulnerability"]


def main(argv: list[str]) -> int:
    path = Path(argv[1])
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"audit: no usable report at {path}: {exc}")
        return NOT_AUDITED
    status, lines = verdict(report)
    for line in lines:
        print(f"audit: {line}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
