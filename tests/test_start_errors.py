"""A worker that cannot start says why in one line, not a traceback (docs/worker.md:
"Mistakes are reported before any work starts"): a database that refuses connections,
or one whose tables were never created. Real ``runtasks`` processes."""

from __future__ import annotations

import subprocess

# Nothing listens on port 1; psycopg is installed in every test environment, so this
# runs beside SQLite too.
REFUSED = "postgres://root@127.0.0.1:1/nowhere"


def _refusal(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if "cannot start" in line]
    return line


def test_a_database_that_refuses_connections_is_one_line(run_worker):
    line = _refusal(run_worker("--burst", "-v", "0", timeout=60, env={"DATABASE_URL": REFUSED}))
    assert line.startswith("CommandError: Worker ")
    assert "database 'default' failed (OperationalError: " in line
    assert "Connection refused" in line


def test_a_database_never_migrated_is_one_line_that_says_to_migrate(run_worker, tmp_path):
    empty = {"DATABASE_URL": f"sqlite:///{tmp_path / 'never-migrated.sqlite3'}"}
    line = _refusal(run_worker("--burst", "-v", "0", timeout=60, env=empty))
    assert "no such table: django_tasks_plus_workerrecord" in line
    assert line.endswith("and migrated (manage.py migrate).")
