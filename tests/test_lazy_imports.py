"""Features a project does not use cost a worker nothing at start: msgspec loads with the
first task that declares a schema (or the first outcome batch a PostgreSQL worker writes),
croniter (and dateutil) with the first cron schedule.

Checked in a fresh interpreter, set up as ``runtasks`` is (settings, apps, task-module
discovery, the worker engine and the admin), with no task module outside the apps (the
test suite's own tasks declare schemas and schedules).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys
import django
django.setup()
from django_tasks_plus.compat import task_backends
from django_tasks_plus.discovery import discover_task_modules
discover_task_modules(task_backends["default"].settings)
import django_tasks_plus.admin, django_tasks_plus.worker.engine
import django_tasks_plus.db.postgresql  # as an enqueuing process on PostgreSQL has it
before = {name: name in sys.modules for name in ("msgspec", "croniter", "dateutil")}
from django_tasks_plus import task
from django_tasks_plus.schedules.timing import as_spec
from dataclasses import dataclass
@dataclass
class Payload:
    n: int
@task(schema=Payload)
def with_schema(n: int) -> int:
    return n
as_spec("*/5 * * * *", "every-five-minutes")
after = {name: name in sys.modules for name in ("msgspec", "croniter")}
print(json.dumps({"before": before, "after": after}))
"""


def test_schema_and_cron_libraries_load_only_when_used() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "testproject")]),
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "EXTRA_TASK_MODULES": "",
        "DATABASE_URL": "sqlite:///:memory:",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == {"msgspec": False, "croniter": False, "dateutil": False}
    assert seen["after"] == {"msgspec": True, "croniter": True}
