#!/usr/bin/env bash
# Run the test matrix of tox.ini (one environment after another, or TEST_JOBS side by side)
# and print a summary.
# tox.ini owns the combinations (Python, Django, extras, databases, environment
# variables); this script does only what tox cannot:
#   - install tox (into .venv-tox; needs only Python and git),
#   - find the interpreters, pyenv installs included, and put them on tox's PATH,
#   - check that PostgreSQL is reachable (skip, or fail with REQUIRE_POSTGRES=1),
#   - turn the knobs below into `tox -e ENV -- PYTEST_ARGS`, and summarise the runs.
#
#   combo     tox environments                          Python
#   django61  py312-django61-sqlite, -postgres, -pgpool 3.12
#   django52  py311-django52-sqlite, -postgres          3.11
#
# pgpool runs the worker and fault tests on PostgreSQL behind Django's connection pool
# (a selection, see tox.ini); Django 6.1 only.
#
# Environment knobs:
#   TEST_COMBOS      combinations to run, default "django61 django52"
#   TEST_DBS         databases, default "sqlite postgres pgpool"
#   PYTEST_ARGS      extra pytest arguments (shell-quoted), e.g. PYTEST_ARGS='-x -k "retry"'
#   DATABASE_URL     a postgres:// URL naming the server for the PostgreSQL runs (its
#                    database name is replaced by each environment's own: test_django61,
#                    test_django52, test_django61pool); otherwise postgres://127.0.0.1:5432 is used when it
#                    accepts connections (user: PGUSER or the login name)
#   PYTHON_DJANGO61, PYTHON_DJANGO52
#                    interpreter to use for that combination (skips the search)
#   DTP_TEST_DB_PREFIX  a prefix for the PostgreSQL test databases' names (alice_ →
#                    alice_test_test_django61), so that two checkouts can test against
#                    one server; tox passes it on (passenv DTP_*)
#   REQUIRE_POSTGRES=1  an unreachable PostgreSQL is an error rather than a skip
#   ALLOW_NO_TESTS=1    a run that collects no tests (pytest exit 5) counts as passed
#   CI=true          a combination whose Python cannot be found is an error
#   TEST_JOBS        environments run side by side (default 1: one after another). With
#                    2, every environment is installed first, one after another, then
#                    the runs share two lanes, longest first; each run's output goes to
#                    its log only, and a failed run's log tail is printed at the end.
#                    Environments never share a database (tox.ini), so only the machine
#                    is shared: timing tests must hold on a loaded machine anyway.
set -uo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$DTP_ROOT" || exit 1

ALL_COMBOS="django61 django52"
read -r -a COMBOS <<<"${TEST_COMBOS:-$ALL_COMBOS}"
read -r -a DBS <<<"${TEST_DBS:-sqlite postgres pgpool}"
# PYTEST_ARGS is the user's own shell-quoted text; eval keeps its quoting.
eval "EXTRA_ARGS=(${PYTEST_ARGS:-})"
LOG_DIR="$DTP_ROOT/.test-logs"
TOX_VENV=.venv-tox

trap 'echo; echo "Interrupted."; exit 130' INT TERM

hr() { printf '%*s\n' 78 '' | tr ' ' "${1:-=}"; }

# ---------------------------------------------------------------------------------
# Validate the knobs
# ---------------------------------------------------------------------------------

if ((${#COMBOS[@]} == 0 || ${#DBS[@]} == 0)); then
    echo "TEST_COMBOS and TEST_DBS must not be empty" >&2
    exit 2
fi
for combo in "${COMBOS[@]}"; do
    case $combo in
    django61 | django52) ;;
    *)
        echo "Unknown combination '$combo' in TEST_COMBOS (known: $ALL_COMBOS)" >&2
        exit 2
        ;;
    esac
done
for db in "${DBS[@]}"; do
    case $db in
    sqlite | postgres | pgpool) ;;
    *)
        echo "Unknown database '$db' in TEST_DBS (known: sqlite postgres pgpool)" >&2
        exit 2
        ;;
    esac
done

# ---------------------------------------------------------------------------------
# tox
# ---------------------------------------------------------------------------------

tox_python=$(dtp_find_python '^3\.([89]|[1-9][0-9])$' python3 python3.12 python3.11) || {
    echo "No Python >= 3.8 with venv support found to install tox" >&2
    exit 1
}
# The requirement is part of the stamp: change it here and .venv-tox is reinstalled.
dtp_ensure_venv "$TOX_VENV" "$tox_python" "tox>=4" >/dev/null || exit 1
TOX=("$TOX_VENV/bin/tox")

# ---------------------------------------------------------------------------------
# Combinations: tox environment prefix and interpreter
# ---------------------------------------------------------------------------------

tox_prefix() {
    case $1 in
    django61) echo py312-django61 ;;
    django52) echo py311-django52 ;;
    esac
}

# Whether tox.ini has an environment for combination $1 on database $2 (pgpool: 6.1 only).
has_env() { [[ $2 != pgpool || $1 == django61 ]]; }

# Set PYTHON to the interpreter for combination $1; fail if there is none. The tox
# environment name fixes the Python version (py312, py311).
find_combo_python() {
    local combo=$1 override_var want
    local -a candidates
    case $combo in
    django61)
        want='^3\.12$'
        mapfile -t candidates < <(dtp_pyenv_pythons '3.12*')
        candidates=(python3.12 python3 "${candidates[@]}")
        ;;
    django52)
        want='^3\.11$'
        mapfile -t candidates < <(dtp_pyenv_pythons '3.11*')
        candidates=(python3.11 python3 "${candidates[@]}")
        ;;
    esac
    override_var="PYTHON_${combo^^}"
    if [[ -n ${!override_var:-} ]]; then
        PYTHON=$(dtp_find_python "$want" "${!override_var}") && return 0
        echo "$override_var=${!override_var} is not a usable Python ${want//[^0-9.]/}" \
            "(needs venv + ensurepip)"
        return 1
    fi
    PYTHON=$(dtp_find_python "$want" "${candidates[@]}")
}

# ---------------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------------

tcp_open() { # host port
    "$tox_python" - "$1" "$2" <<'EOF_PY'
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
except OSError:
    sys.exit(1)
EOF_PY
}

redact_url() { sed -E 's#(://[^:/@]*):[^@/]*@#\1:***@#' <<<"$1"; }

# tox.ini builds each postgres environment's DATABASE_URL from PG_SERVER_URL (scheme,
# credentials, host, port) + its own database name + PG_URL_QUERY.
PG_OK=0
want_postgres=0
for db in "${DBS[@]}"; do [[ $db == postgres || $db == pgpool ]] && want_postgres=1; done
if ((want_postgres)); then
    url_re='^((postgres|postgresql|pgsql|psql|postgis)://[^/?]*)(/[^?]*)?(\?.*)?$'
    if [[ ${DATABASE_URL:-} =~ $url_re ]]; then
        export PG_SERVER_URL=${BASH_REMATCH[1]}
        export PG_URL_QUERY=${BASH_REMATCH[4]}
        PG_OK=1
    elif tcp_open 127.0.0.1 5432; then
        export PG_SERVER_URL=postgres://127.0.0.1:5432
        export PG_URL_QUERY=""
        PG_OK=1
    else
        echo "PostgreSQL not reachable: skipping the PostgreSQL runs" \
            "(no postgres DATABASE_URL and nothing listening on 127.0.0.1:5432)"
    fi
    ((PG_OK)) && echo "PostgreSQL server: $(redact_url "$PG_SERVER_URL")$PG_URL_QUERY"
fi
# tox.ini never passes DATABASE_URL on; keep it out of tox's own environment too.
unset DATABASE_URL

# ---------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------

declare -a ROWS=()
declare -a FAILED_LOGS=()
FAILED=0
RAN=0
TOTAL_PASSED=0
TOTAL_FAILED=0
TOTAL_SKIPPED=0

add_row() { ROWS+=("$(printf '%s|' "$@")"); }

# Count "N <word>" in a pytest summary line $1.
summary_count() {
    if [[ $1 =~ ([0-9]+)\ $2 ]]; then echo "${BASH_REMATCH[1]}"; else echo 0; fi
}

run_env() { # env
    local env=$1
    local log="$LOG_DIR/$env.log" start rc
    local -a cmd=("${TOX[@]}" run -e "$env" --)
    [[ -t 1 ]] && cmd+=(--color=yes)
    cmd+=("${EXTRA_ARGS[@]}")

    echo
    hr
    echo "== $env"
    echo "== ${cmd[*]}"
    hr
    mkdir -p "$LOG_DIR"
    start=$SECONDS
    "${cmd[@]}" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    record_run "$env" "$rc" "$((SECONDS - start))"
}

# One lane of TEST_JOBS: its environments one after another, already installed, output
# to their logs; each writes "rc seconds" to its .rc file for record_run.
run_lane() { # env...
    local env start rc
    for env in "$@"; do
        start=$SECONDS
        "${TOX[@]}" run -e "$env" --skip-pkg-install -- "${EXTRA_ARGS[@]}" \
            >"$LOG_DIR/$env.log" 2>&1
        rc=$?
        echo "$rc $((SECONDS - start))" >"$LOG_DIR/$env.rc"
        echo "   $env finished: exit $rc after $((SECONDS - start)) s"
    done
}

# The usual duration of an environment, to balance the lanes (longest first).
env_weight() {
    case $1 in
    *-postgres) echo 700 ;;
    *-sqlite) echo 450 ;;
    *) echo 120 ;;
    esac
}

record_run() { # env rc seconds
    local env=$1 rc=$2 seconds=$3
    local log="$LOG_DIR/$env.log" summary status detail pyver djver
    RAN=$((RAN + 1))

    pyver=$(".tox/$env/bin/python" -c 'import platform; print(platform.python_version())' \
        2>/dev/null || echo "?")
    djver=$(".tox/$env/bin/python" -c 'import django; print(django.get_version())' \
        2>/dev/null || echo "?")
    summary=$(sed -E 's/\x1b\[[0-9;]*m//g' "$log" \
        | grep -E '([0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran).* in [0-9.]+ ?s' \
        | tail -n 1)
    local passed failed errors skipped
    passed=$(summary_count "$summary" passed)
    failed=$(summary_count "$summary" failed)
    errors=$(summary_count "$summary" error)
    skipped=$(summary_count "$summary" skipped)
    TOTAL_PASSED=$((TOTAL_PASSED + passed))
    TOTAL_FAILED=$((TOTAL_FAILED + failed + errors))
    TOTAL_SKIPPED=$((TOTAL_SKIPPED + skipped))
    detail="$passed passed, $failed failed, $errors errors, $skipped skipped"

    case $rc in
    0) status=PASS ;;
    5)
        if [[ ${ALLOW_NO_TESTS:-} == 1 ]]; then
            status=PASS
            detail="no tests collected (pytest exit 5, ALLOW_NO_TESTS=1)"
        else
            status=FAIL
            detail="no tests collected (pytest exit 5)"
            FAILED=$((FAILED + 1))
        fi
        ;;
    *)
        status=FAIL
        if [[ -z $summary ]]; then
            detail="exit $rc, no pytest summary (see ${log#"$DTP_ROOT"/})"
        else
            detail="$detail (exit $rc)"
        fi
        FAILED=$((FAILED + 1))
        ;;
    esac
    add_row "$env" "$pyver" "$djver" "$status" "${seconds}s" "$detail"
    if [[ $status == FAIL ]]; then FAILED_LOGS+=("$log"); fi
}

# Find every interpreter first, so that tox sees all of them on PATH. PLAN keeps the
# summary in matrix order: "ENV" to run, or "ENV|RESULT|DETAILS" for a run that cannot.
declare -a PLAN=()
for combo in "${COMBOS[@]}"; do
    prefix=$(tox_prefix "$combo")
    PYTHON=""
    if ! find_combo_python "$combo" || [[ -z $PYTHON ]]; then
        if dtp_is_ci; then
            echo "ERROR: no suitable Python found for $combo (CI=true makes this an error)"
            result=FAIL
        else
            echo "No suitable Python found for $combo: skipping it" \
                "(set PYTHON_${combo^^}=/path/to/python to choose one)"
            result=SKIP
        fi
        for db in "${DBS[@]}"; do
            has_env "$combo" "$db" && PLAN+=("$prefix-$db|$result|no suitable Python found")
        done
        continue
    fi
    echo "Python for $combo: $PYTHON"
    # virtualenv (tox's interpreter discovery) searches PATH: put the found interpreter's
    # folder first, so that pyenv installs are found without pyenv shims or `pyenv shell`.
    bindir=$(dirname -- "$PYTHON")
    [[ ${PATH%%:*} == "$bindir" ]] || PATH="$bindir:$PATH"
    for db in "${DBS[@]}"; do
        has_env "$combo" "$db" || continue
        if [[ $db != sqlite ]] && ((!PG_OK)); then
            if [[ ${REQUIRE_POSTGRES:-} == 1 ]]; then
                PLAN+=("$prefix-$db|FAIL|PostgreSQL not reachable (REQUIRE_POSTGRES=1)")
            else
                PLAN+=("$prefix-$db|SKIP|PostgreSQL not reachable")
            fi
            continue
        fi
        PLAN+=("$prefix-$db")
    done
done
export PATH

JOBS=${TEST_JOBS:-1}
if ! [[ $JOBS =~ ^[1-9][0-9]*$ ]]; then
    echo "TEST_JOBS must be a whole number of 1 or more, not '$JOBS'" >&2
    exit 2
fi
declare -a RUNNABLE=()
for entry in "${PLAN[@]}"; do
    IFS='|' read -r env result detail <<<"$entry"
    if [[ -z $result ]]; then
        RUNNABLE+=("$env")
        continue
    fi
    [[ $result == FAIL ]] && FAILED=$((FAILED + 1))
    add_row "$env" "-" "-" "$result" "-" "$detail"
done

if ((JOBS == 1 || ${#RUNNABLE[@]} < 2)); then
    for env in "${RUNNABLE[@]}"; do
        run_env "$env"
    done
else
    mkdir -p "$LOG_DIR"
    echo
    hr
    echo "== installing ${RUNNABLE[*]} (one after another: they share tox's package build)"
    hr
    for env in "${RUNNABLE[@]}"; do
        if ! "${TOX[@]}" run -e "$env" --notest >"$LOG_DIR/$env.install.log" 2>&1; then
            echo "   $env could not be installed: see ${LOG_DIR#"$DTP_ROOT"/}/$env.install.log"
            tail -n 30 "$LOG_DIR/$env.install.log"
        fi
    done
    # Longest first, each to the lane with the least work so far.
    declare -a LANES=() LOADS=()
    for ((i = 0; i < JOBS; i++)); do LANES[i]=""; LOADS[i]=0; done
    while read -r _weight env; do
        best=0
        for ((i = 1; i < JOBS; i++)); do ((LOADS[i] < LOADS[best])) && best=$i; done
        LANES[best]+=" $env"
        LOADS[best]=$((LOADS[best] + $(env_weight "$env")))
    done < <(for env in "${RUNNABLE[@]}"; do echo "$(env_weight "$env") $env"; done | sort -rn)
    echo
    hr
    echo "== running in $JOBS lanes (logs in ${LOG_DIR#"$DTP_ROOT"/}/):"
    for ((i = 0; i < JOBS; i++)); do [[ -n ${LANES[i]} ]] && echo "   lane $((i + 1)):${LANES[i]}"; done
    hr
    declare -a LANE_PIDS=()
    for ((i = 0; i < JOBS; i++)); do
        [[ -n ${LANES[i]} ]] || continue
        # shellcheck disable=SC2086  # the lane's names are words
        run_lane ${LANES[i]} &
        LANE_PIDS+=($!)
    done
    trap 'kill "${LANE_PIDS[@]}" 2>/dev/null; echo; echo "Interrupted."; exit 130' INT TERM
    wait "${LANE_PIDS[@]}"
    trap 'echo; echo "Interrupted."; exit 130' INT TERM
    for env in "${RUNNABLE[@]}"; do
        if [[ -f $LOG_DIR/$env.rc ]]; then
            read -r rc seconds <"$LOG_DIR/$env.rc"
            rm -f "$LOG_DIR/$env.rc"
        else
            rc=1 seconds=0
        fi
        record_run "$env" "$rc" "$seconds"
    done
    for log in "${FAILED_LOGS[@]}"; do
        echo
        hr
        echo "== the end of ${log#"$DTP_ROOT"/}"
        hr
        tail -n 80 "$log"
    done
fi

# ---------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------

echo
hr
echo "Summary (logs in ${LOG_DIR#"$DTP_ROOT"/}/)"
hr '-'
fmt='%-24s %-8s %-8s %-5s %6s  %s\n'
# shellcheck disable=SC2059
printf "$fmt" "tox environment" python django result time details
hr '-'
for row in "${ROWS[@]}"; do
    IFS='|' read -r -a cols <<<"$row"
    # shellcheck disable=SC2059
    printf "$fmt" "${cols[@]}"
done
hr

status=0
if ((RAN == 0)); then
    echo "ERROR: no test run could be started."
    status=1
fi
if ((FAILED > 0)); then
    echo "FAILED: $FAILED of the runs above did not pass."
    status=1
elif ((RAN > 0)); then
    echo "All $RAN test runs passed."
fi
echo "Total: $TOTAL_PASSED passed, $TOTAL_FAILED failed, $TOTAL_SKIPPED skipped"
exit $status
