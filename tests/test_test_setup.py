"""The test setup itself: a PostgreSQL test database name of the checkout's own
(``DTP_TEST_DB_PREFIX``), and a fast password hasher for test runs only."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings

from tests.conftest import REPO

TEST_DB_NAME = "from django.db import connection; print(connection.creation._get_test_db_name())"


def settings_of(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with testproject's settings and ``env``."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DTP_TEST_DB_PREFIX", "DATABASE_URL")
    }
    environ.update(
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "testproject")]),
        DJANGO_SETTINGS_MODULE="testproject.settings",
        **env,
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_prefix_names_the_postgresql_test_database():
    server = "postgres://127.0.0.1:5432/tasks"
    plain = settings_of(TEST_DB_NAME, DATABASE_URL=server)
    assert plain.stdout.strip() == "test_tasks", plain.stderr
    prefixed = settings_of(TEST_DB_NAME, DATABASE_URL=server, DTP_TEST_DB_PREFIX="wt2_")
    assert prefixed.stdout.strip() == "wt2_test_tasks", prefixed.stderr


def test_a_prefix_that_is_not_a_plain_name_is_refused():
    bad = settings_of(
        TEST_DB_NAME, DATABASE_URL="postgres://127.0.0.1:5432/tasks", DTP_TEST_DB_PREFIX="a b;"
    )
    assert bad.returncode != 0
    assert "DTP_TEST_DB_PREFIX='a b;': use 1 to 30 letters, digits or underscores." in bad.stderr


def test_tests_hash_passwords_fast_and_the_demo_keeps_django_defaults():
    assert settings.PASSWORD_HASHERS == ["django.contrib.auth.hashers.MD5PasswordHasher"]
    demo = settings_of("from django.conf import settings; print(settings.PASSWORD_HASHERS[0])")
    assert demo.stdout.strip() == "django.contrib.auth.hashers.PBKDF2PasswordHasher", demo.stderr
