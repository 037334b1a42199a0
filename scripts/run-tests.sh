#!/usr/bin/env bash
# Run the whole pytest suite for each supported Django/Python combination, on SQLite
# and, when it is reachable, on PostgreSQL. Needs only Python and git: each
# combination gets its own virtualenv, (re)installed when pyproject.toml changes.
#
#   combo     Python           venv             installs
#   django61  3.12+ (3.12 first) .venv-django61  -e .[test]          django>=6.1,<6.2
#   django52  3.11             .venv-django52   -e .[test,backport] django>=5.2,<5.3
#
# Environment knobs:
#   TEST_COMBOS      combinations to run, default "django61 django52"
#   TEST_DBS         databases, default "sqlite postgres"
#   PYTEST_ARGS      extra pytest arguments (shell-quoted), e.g. PYTEST_ARGS='-x -k "retry"'
#   DATABASE_URL     a postgres:// URL for the PostgreSQL runs; otherwise
#                    postgres://${PGUSER:-$(id -un)}@127.0.0.1:5432/${PGDATABASE:-test}
#                    is used when 127.0.0.1:5432 accepts connections
#   PYTHON_DJANGO61, PYTHON_DJANGO52
#                    interpreter to use for that combination (skips the search)
#   REQUIRE_POSTGRES=1  an unreachable PostgreSQL is an error rather than a skip
#   ALLOW_NO_TESTS=1    a run that collects no tests (pytest exit 5) counts as passed
#   CI=true          a combination whose Python cannot be found is an error
set -uo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$DTP_ROOT" || exit 1

ALL_COMBOS="django61 django52"
read -r -a COMBOS <<<"${TEST_COMBOS:-$ALL_COMBOS}"
read -r -a DBS <<<"${TEST_DBS:-sqlite postgres}"
# PYTEST_ARGS is the user's own shell-quoted text; eval keeps its quoting.
eval "EXTRA_ARGS=(${PYTEST_ARGS:-})"
LOG_DIR="$DTP_ROOT/.test-logs"

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
    sqlite | postgres) ;;
    *)
        echo "Unknown database '$db' in TEST_DBS (known: sqlite postgres)" >&2
        exit 2
        ;;
    esac
done

# ---------------------------------------------------------------------------------
# Combinations
# ---------------------------------------------------------------------------------

# Set PYTHON to the interpreter for combination $1; fail if there is none.
find_combo_python() {
    local combo=$1 override_var
    override_var="PYTHON_${combo^^}"
    if [[ -n ${!override_var:-} ]]; then
        PYTHON=$(dtp_find_python '^3\.[0-9]+$' "${!override_var}") && return 0
        echo "$override_var=${!override_var} is not a usable Python (needs venv + ensurepip)"
        return 1
    fi
    local -a candidates
    case $combo in
    django61)
        # Django 6.1 supports Python 3.12-3.14; CI's reference is 3.12, so prefer it.
        mapfile -t candidates < <(dtp_pyenv_pythons '3.12*'; dtp_pyenv_pythons '3.1[34]*')
        PYTHON=$(dtp_find_python '^3\.1[234]$' \
            python3.12 python3.13 python3.14 python3 "${candidates[@]}")
        ;;
    django52)
        mapfile -t candidates < <(dtp_pyenv_pythons '3.11*')
        PYTHON=$(dtp_find_python '^3\.11$' python3.11 python3 "${candidates[@]}")
        ;;
    esac
}

set_install_args() {
    case $1 in
    django61) INSTALL_ARGS=(-e ".[test]" "django>=6.1,<6.2") ;;
    django52) INSTALL_ARGS=(-e ".[test,backport]" "django>=5.2,<5.3") ;;
    esac
}

# ---------------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------------

tcp_open() { # host port
    local py
    for py in python3 python; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -c '' 2>/dev/null; then
            "$py" - "$1" "$2" <<'EOF'
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
except OSError:
    sys.exit(1)
EOF
            return
        fi
    done
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

redact_url() { sed -E 's#(://[^:/@]*):[^@/]*@#\1:***@#' <<<"$1"; }

PG_URL=""
want_postgres=0
for db in "${DBS[@]}"; do [[ $db == postgres ]] && want_postgres=1; done
if ((want_postgres)); then
    if [[ ${DATABASE_URL:-} =~ ^(postgres|postgresql|pgsql|psql|postgis):// ]]; then
        PG_URL=$DATABASE_URL
    elif tcp_open 127.0.0.1 5432; then
        PG_URL="postgres://${PGUSER:-$(id -un)}@127.0.0.1:5432/${PGDATABASE:-test}"
    else
        echo "PostgreSQL not reachable: skipping the PostgreSQL run" \
            "(no postgres DATABASE_URL and nothing listening on 127.0.0.1:5432)"
    fi
fi

# ---------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------

declare -a ROWS=()
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

run_pytest() { # combo db venv pyver djver
    local combo=$1 db=$2 venv=$3 pyver=$4 djver=$5
    local log="$LOG_DIR/$combo-$db.log" start rc summary status detail
    local -a cmd=("$venv/bin/python" -m pytest)
    [[ -t 1 ]] && cmd+=(--color=yes)
    cmd+=("${EXTRA_ARGS[@]}")

    echo
    hr
    if [[ $db == postgres ]]; then
        echo "== $combo / postgres ($(redact_url "$PG_URL")): Python $pyver, Django $djver"
    else
        echo "== $combo / sqlite: Python $pyver, Django $djver"
    fi
    echo "== ${cmd[*]}"
    hr
    mkdir -p "$LOG_DIR"
    start=$SECONDS
    (
        if [[ $db == postgres ]]; then
            export DATABASE_URL=$PG_URL
        else
            unset DATABASE_URL
        fi
        export PYTHONUNBUFFERED=1
        exec "${cmd[@]}"
    ) 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    RAN=$((RAN + 1))

    summary=$(sed -E 's/\x1b\[[0-9;]*m//g' "$log" \
        | grep -E '([0-9]+ (passed|failed|errors?|skipped)|no tests ran).* in [0-9.]+ ?s' \
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
        else
            status="FAIL"
            detail="no tests collected (pytest exit 5)"
            FAILED=$((FAILED + 1))
        fi
        ;;
    *)
        status=FAIL
        detail="$detail (pytest exit $rc)"
        FAILED=$((FAILED + 1))
        ;;
    esac
    add_row "$combo" "$db" "$pyver" "$djver" "$status" "$((SECONDS - start))s" "$detail"
}

for combo in "${COMBOS[@]}"; do
    echo
    hr '#'
    echo "## $combo"
    hr '#'
    PYTHON=""
    if ! find_combo_python "$combo" || [[ -z $PYTHON ]]; then
        if dtp_is_ci; then
            echo "ERROR: no suitable Python found for $combo (CI=true makes this an error)"
            add_row "$combo" "-" "-" "-" "FAIL" "-" "no suitable Python found"
            FAILED=$((FAILED + 1))
        else
            echo "No suitable Python found for $combo: skipping it" \
                "(set PYTHON_${combo^^}=/path/to/python to choose one)"
            add_row "$combo" "-" "-" "-" "SKIP" "-" "no suitable Python found"
        fi
        continue
    fi
    echo "Python for $combo: $PYTHON"

    set_install_args "$combo"
    venv=".venv-$combo"
    if ! dtp_ensure_venv "$venv" "$PYTHON" "${INSTALL_ARGS[@]}"; then
        add_row "$combo" "-" "-" "-" "FAIL" "-" "pip install failed (see $venv/install.log)"
        FAILED=$((FAILED + 1))
        continue
    fi
    pyver=$("$venv/bin/python" -c 'import platform; print(platform.python_version())')
    djver=$("$venv/bin/python" -c 'import django; print(django.get_version())' 2>/dev/null \
        || echo "?")

    for db in "${DBS[@]}"; do
        if [[ $db == postgres && -z $PG_URL ]]; then
            echo
            echo "PostgreSQL not reachable: skipping the PostgreSQL run for $combo"
            if [[ ${REQUIRE_POSTGRES:-} == 1 ]]; then
                add_row "$combo" postgres "$pyver" "$djver" FAIL "-" \
                    "PostgreSQL not reachable (REQUIRE_POSTGRES=1)"
                FAILED=$((FAILED + 1))
            else
                add_row "$combo" postgres "$pyver" "$djver" SKIP "-" "PostgreSQL not reachable"
            fi
            continue
        fi
        run_pytest "$combo" "$db" "$venv" "$pyver" "$djver"
    done
done

# ---------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------

echo
hr
echo "Summary (logs in ${LOG_DIR#"$DTP_ROOT"/}/)"
hr '-'
fmt='%-9s %-9s %-8s %-8s %-5s %6s  %s\n'
# shellcheck disable=SC2059
printf "$fmt" combo database python django result time details
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
