"""Settings for the django-tasks-plus test/demo project.

Configuration comes from environment variables only (no ``.env`` file is read):

``DEBUG``            default ``True``
``SECRET_KEY``       default: an insecure development key
``ALLOWED_HOSTS``    comma-separated; default ``*`` when DEBUG, else empty
``DATABASE_URL``     default: SQLite file ``testproject/db.sqlite3``
``TEST_SQLITE_NAME`` SQLite test database file (default ``testproject/test_db.sqlite3``)
``TASKS_LOG_LEVEL``  level of the ``django_tasks_plus`` logger (default ``INFO``)
``TASKS_METRICS``    ``false`` turns OPTIONS["METRICS"] off (default ``true``)
``TASKS_RETENTION``  ``false`` keeps finished tasks for ever (OPTIONS["RETENTION"];
                     default ``true``: the package's defaults)
``DTP_DB_POOL``      ``true`` puts a PostgreSQL database behind Django's connection pool
                     (``OPTIONS["pool"]``; the ``pgpool`` test environment)
``DTP_DB_POOL_MAX_SIZE`` that pool's ``max_size`` per process (default 40;
                     ``bench/fleet_sessions.py --pool-size``)
``DTP_PREPARE_THRESHOLD`` sets a PostgreSQL database's ``OPTIONS["prepare_threshold"]``
                     (psycopg prepares statements run that often; default unset)
``EXTRA_TASK_MODULES`` comma-separated task modules outside installed apps to import at
                     startup (default: see ``_task_modules_outside_apps``)
``DTP_TEST_DB_PREFIX`` prefix of the PostgreSQL test database's name (default none)
"""

import re
import sys
from pathlib import Path

import django
import environ
from django.core.exceptions import ImproperlyConfigured

# The folder holding manage.py.
BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str(
    "SECRET_KEY",
    default="django-insecure-dev-only-key-for-the-django-tasks-plus-testproject",
)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["*"] if DEBUG else [])

# --------------------------------------------------------------------------------------
# Database
# --------------------------------------------------------------------------------------

DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}

# DTP_TEST_DB_PREFIX prefixes the PostgreSQL *test* database's name ("test_" + NAME by
# default), so that two checkouts testing against one server never share (and drop) each
# other's test databases (docs/development.md).
TEST_DB_PREFIX = env.str("DTP_TEST_DB_PREFIX", default="")
if TEST_DB_PREFIX and DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3":
    if not re.fullmatch(r"[A-Za-z0-9_]{1,30}", TEST_DB_PREFIX):
        raise ImproperlyConfigured(
            f"DTP_TEST_DB_PREFIX={TEST_DB_PREFIX!r}: use 1 to 30 letters, digits or underscores."
        )
    DATABASES["default"]["TEST"] = {
        **DATABASES["default"].get("TEST", {}),
        "NAME": f"{TEST_DB_PREFIX}test_{DATABASES['default']['NAME']}",
    }

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets readers proceed while a worker holds the write lock; IMMEDIATE
        # transactions take that lock up front instead of failing on upgrade.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        **DATABASES["default"].get("OPTIONS", {}),
    }
    # Tests start worker subprocesses that must open the same test database, so the
    # test database is always a file, never in-memory.
    DATABASES["default"]["TEST"] = {
        "NAME": env.str("TEST_SQLITE_NAME", default=str(BASE_DIR / "test_db.sqlite3")),
    }

if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env.bool(
    "DTP_DB_POOL", default=False
):
    # Django's connection pool (psycopg_pool): a task thread takes a pooled session that
    # other threads used before it. Large enough for every worker a test starts in this
    # process; min_size 1 so that a returned session is the next one handed out.
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "pool": {
            "min_size": 1,
            "max_size": env.int("DTP_DB_POOL_MAX_SIZE", default=40),
            "timeout": 20,
        },
    }

if (
    DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
    and (prepare_threshold := env.int("DTP_PREPARE_THRESHOLD", default=None)) is not None
):
    # psycopg prepares a statement once it has run this many times on a session: the
    # enqueue INSERT, the claim and the outcome writes (docs/performance.md).
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "prepare_threshold": prepare_threshold,
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --------------------------------------------------------------------------------------
# Applications
# --------------------------------------------------------------------------------------

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
if django.VERSION < (6, 0):
    # Django 5.2 has no django.tasks; the django-tasks backport provides it.
    INSTALLED_APPS.append("django_tasks")
INSTALLED_APPS += [
    "django_tasks_plus",
    "example",
]


def _task_modules_outside_apps() -> list[str]:
    """Task modules that live outside installed apps and are on the path of this process.

    A worker runs a task only if its module is already imported or belongs to an installed
    app (docs/tasks.md#where-tasks-live). The test suite's tasks (``tests/tasks.py``) and
    the chaos and benchmark tasks (``bench/``) are not in an app, so the example app
    imports them at startup, as a project would from its own ``AppConfig.ready()``. The
    ``tests`` package stays outside INSTALLED_APPS on purpose: its ``exits_on_import``
    module must never be importable by a worker.
    """
    repo = BASE_DIR.parent
    on_path = {Path(entry).resolve() for entry in sys.path if entry}
    if repo / "bench" in on_path:  # bench/chaos processes: bench tasks only
        return ["benchtasks", "chaostasks"]
    if repo in on_path and (repo / "tests" / "tasks.py").is_file():
        return ["tests.tasks"]
    return []


EXTRA_TASK_MODULES = env.list("EXTRA_TASK_MODULES", default=_task_modules_outside_apps())

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"
WSGI_APPLICATION = "testproject.wsgi.application"
ASGI_APPLICATION = "testproject.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------

# TASKS_METRICS=false turns the metrics off (the benchmark compares both).
TASKS_OPTIONS: dict[str, object] = {
    "METRICS": {"ENABLED": env.bool("TASKS_METRICS", default=True)},
}
# TASKS_RETENTION=false: the leader prunes no finished task (the benchmark compares both).
if not env.bool("TASKS_RETENTION", default=True):
    TASKS_OPTIONS["RETENTION"] = {"SUCCESSFUL": None, "FAILED": None}
TASKS = {
    "default": {
        "BACKEND": "django_tasks_plus.backend.DatabaseBackend",
        "QUEUES": ["default", "emails", "slow", "other"],
        "OPTIONS": TASKS_OPTIONS,
    },
}

# --------------------------------------------------------------------------------------
# Internationalisation, static files
# --------------------------------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

# --------------------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------------------

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "console": {
            "format": "%(asctime)s %(levelname)-7s %(name)s [pid %(process)d] %(message)s",
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "console",
        },
    },
    "loggers": {
        # Records still propagate to the root logger (pytest's caplog listens there).
        "django_tasks_plus": {
            "handlers": ["console"],
            "level": env.str("TASKS_LOG_LEVEL", default="INFO").upper(),
        },
    },
}
