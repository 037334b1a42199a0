#!/usr/bin/env bash
# Run the demo: the test project on SQLite with an admin user, a batch of example
# tasks, a steady trickle of more (some retrying, some dead-lettered, some held by a
# circuit breaker), a worker in the background and the development server in the
# foreground. Ctrl-C stops all three: the worker finishes its running tasks (up to
# DEMO_SHUTDOWN_TIMEOUT seconds) and the script exits 0 (run through `make demo`, make
# itself dies of the SIGINT and reports 130 whatever the script does).
#
# Environment knobs:
#   PYTHON               interpreter for .venv when it has to be created (default python3)
#   DEMO_HOST, DEMO_PORT where runserver listens (default 127.0.0.1:8000)
#   DEMO_ADMIN_PASSWORD  password of the "admin" superuser (default "admin")
#   DEMO_ENQUEUE=0       do not enqueue the demo tasks (neither the batch nor the trickle)
#   DEMO_TRICKLE         seconds between two rounds of the trickle (default 2; 0: none)
#   DEMO_SHUTDOWN_TIMEOUT  the worker's --shutdown-timeout (default 10): how long Ctrl-C
#                        lets running tasks finish; the script waits that long plus 5 s
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$DTP_ROOT"

VENV="$DTP_ROOT/.venv"
HOST=${DEMO_HOST:-127.0.0.1}
PORT=${DEMO_PORT:-8000}
ADMIN_USER="admin"
ADMIN_PASSWORD=${DEMO_ADMIN_PASSWORD:-admin}
TRICKLE=${DEMO_TRICKLE:-2}
SHUTDOWN_TIMEOUT=${DEMO_SHUTDOWN_TIMEOUT:-10}
if ! [[ $SHUTDOWN_TIMEOUT =~ ^[0-9]+$ && $SHUTDOWN_TIMEOUT -gt 0 ]]; then
    echo "DEMO_SHUTDOWN_TIMEOUT must be a whole number of seconds > 0, got '$SHUTDOWN_TIMEOUT'." >&2
    exit 1
fi

# 1. The virtualenv (created if missing, reinstalled when pyproject.toml changed).
if [[ -x $VENV/bin/python ]] && "$VENV/bin/python" -c '' 2>/dev/null; then
    python=$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')
else
    python=${PYTHON:-python3}
    if ! command -v "$python" >/dev/null 2>&1 || ! dtp_py_version "$python" >/dev/null; then
        echo "$python cannot create a virtualenv (need Python >= 3.11 with venv)." >&2
        exit 1
    fi
fi
dtp_ensure_venv "$VENV" "$python" -e ".[postgres]" || exit 1
PY="$VENV/bin/python"

# 2. The database: always the project's SQLite file.
unset DATABASE_URL
cd "$DTP_ROOT/testproject"
"$PY" manage.py migrate --noinput

# 3. The superuser. If it already exists, reset its password so what we print is true.
export DJANGO_SUPERUSER_PASSWORD=$ADMIN_PASSWORD
if ! out=$("$PY" manage.py createsuperuser --noinput --username "$ADMIN_USER" \
    --email "$ADMIN_USER@example.com" 2>&1); then
    if grep -qi "already" <<<"$out"; then
        DEMO_ADMIN_USER=$ADMIN_USER "$PY" manage.py shell -c '
import os
from django.contrib.auth import get_user_model

user = get_user_model().objects.get(username=os.environ["DEMO_ADMIN_USER"])
user.set_password(os.environ["DJANGO_SUPERUSER_PASSWORD"])
user.is_staff = user.is_superuser = user.is_active = True
user.save()
'
    else
        echo "$out" >&2
        exit 1
    fi
fi

# 4. Something for the worker to do.
if [[ ${DEMO_ENQUEUE:-1} != 0 ]]; then
    "$PY" manage.py enqueue_demo
fi

# 5. The trickle and the worker, in the background; stopped when this script exits.
# The worker gets the same shutdown timeout the script waits for (plus a margin), so
# what it announces on Ctrl-C ("finishing running tasks (up to N s)") is what happens.
worker_pid=""
trickle_pid=""
stop_background() {
    # Signal first: if the terminal (or a pipe we write to) is gone, the messages
    # below may fail, but the processes must still be stopped.
    trap '' PIPE INT TERM
    if [[ -n $trickle_pid ]]; then
        kill -TERM "$trickle_pid" 2>/dev/null || true
    fi
    if [[ -n $worker_pid ]] && kill -TERM "$worker_pid" 2>/dev/null; then
        echo "Stopping the worker (pid $worker_pid): running tasks may finish for up to" \
            "$SHUTDOWN_TIMEOUT s..." 2>/dev/null || true
        local tenths=$(((SHUTDOWN_TIMEOUT + 5) * 10))
        for _ in $(seq 1 "$tenths"); do
            kill -0 "$worker_pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$worker_pid" 2>/dev/null; then
            echo "The worker did not stop within $((SHUTDOWN_TIMEOUT + 5)) s; killing it." \
                2>/dev/null || true
            kill -KILL "$worker_pid" 2>/dev/null || true
        fi
        wait "$worker_pid" 2>/dev/null || true
    fi
    [[ -z $trickle_pid ]] || wait "$trickle_pid" 2>/dev/null || true
    worker_pid=""
    trickle_pid=""
}
trap stop_background EXIT
# Ctrl-C is how the demo is meant to end: a clean stop, exit status 0.
trap 'exit 0' INT
trap 'exit 143' TERM

if [[ ${DEMO_ENQUEUE:-1} != 0 && $TRICKLE != 0 ]]; then
    "$PY" manage.py enqueue_demo --add 0 --flaky 0 --slow 0 --trickle "$TRICKLE" >/dev/null &
    trickle_pid=$!
fi

"$PY" manage.py runtasks --queue '*' --shutdown-timeout "$SHUTDOWN_TIMEOUT" &
worker_pid=$!
sleep 1
if ! kill -0 "$worker_pid" 2>/dev/null; then
    echo "WARNING: the worker (manage.py runtasks) exited at once; see its output above." >&2
fi

versions=$("$PY" -c 'import sys, django; print(f"Django {django.get_version()} on Python {sys.version.split()[0]}")')
trickle_text="no trickle (DEMO_TRICKLE=0 or DEMO_ENQUEUE=0)"
if [[ -n $trickle_pid ]]; then
    trickle_text="a few more every $TRICKLE s (manage.py enqueue_demo --trickle, pid $trickle_pid)"
fi

cat <<EOF

==============================================================================
  django-tasks-plus demo
    Admin:     http://$HOST:$PORT/admin/
    Username:  $ADMIN_USER
    Password:  $ADMIN_PASSWORD
    Worker:    pid $worker_pid (manage.py runtasks --queue '*'); its log below shows
               one line per task outcome (succeeded, retry, held, dead-lettered)
    Tasks:     $trickle_text
    Database:  $DTP_ROOT/testproject/db.sqlite3
    Runs:      $versions
  Press Ctrl-C to stop the server and the worker.
==============================================================================

EOF

"$PY" manage.py runserver "$HOST:$PORT"
