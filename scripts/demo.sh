#!/usr/bin/env bash
# Run the demo: the test project on SQLite with an admin user, a batch of example
# tasks, a worker in the background and the development server in the foreground.
# Ctrl-C stops both.
#
# Environment knobs:
#   PYTHON               interpreter for .venv when it has to be created (default python3)
#   DEMO_HOST, DEMO_PORT where runserver listens (default 127.0.0.1:8000)
#   DEMO_ADMIN_PASSWORD  password of the "admin" superuser (default "admin")
#   DEMO_ENQUEUE=0       do not enqueue the demo tasks
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$DTP_ROOT"

VENV="$DTP_ROOT/.venv"
HOST=${DEMO_HOST:-127.0.0.1}
PORT=${DEMO_PORT:-8000}
ADMIN_USER="admin"
ADMIN_PASSWORD=${DEMO_ADMIN_PASSWORD:-admin}

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

# 5. The worker, in the background; stopped when this script exits.
worker_pid=""
stop_worker() {
    [[ -n $worker_pid ]] || return 0
    # Signal first: if the terminal (or a pipe we write to) is gone, the messages
    # below may fail, but the worker must still be stopped.
    trap '' PIPE INT
    kill -TERM "$worker_pid" 2>/dev/null || {
        worker_pid=""
        return 0
    }
    echo "Stopping the worker (pid $worker_pid)..." 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$worker_pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$worker_pid" 2>/dev/null; then
        echo "The worker did not stop within 10 s; killing it." 2>/dev/null || true
        kill -KILL "$worker_pid" 2>/dev/null || true
    fi
    wait "$worker_pid" 2>/dev/null || true
    worker_pid=""
}
trap stop_worker EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$PY" manage.py runtasks --queue '*' &
worker_pid=$!
sleep 1
if ! kill -0 "$worker_pid" 2>/dev/null; then
    echo "WARNING: the worker (manage.py runtasks) exited at once; see its output above." >&2
fi

cat <<EOF

==============================================================================
  django-tasks-plus demo
    Admin:     http://$HOST:$PORT/admin/
    Username:  $ADMIN_USER
    Password:  $ADMIN_PASSWORD
    Worker:    pid $worker_pid (manage.py runtasks --queue '*')
    Database:  $DTP_ROOT/testproject/db.sqlite3
  Press Ctrl-C to stop the server and the worker.
==============================================================================

EOF

"$PY" manage.py runserver "$HOST:$PORT"
