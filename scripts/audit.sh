#!/usr/bin/env bash
# Audit the exact dependency sets the test runs installed (pip freeze of each
# combination's tox environment, so the versions CI tested are the versions audited)
# with pip-audit.
#
# Fails when a dependency has a known vulnerability that a newer release fixes. When the
# vulnerability service cannot be reached (a machine without internet access), the audit
# cannot be done: that is reported loudly and fails only with REQUIRE_AUDIT=1.
# Run `make test` first; combinations without a tox environment are skipped.
set -uo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$DTP_ROOT" || exit 1

AUDIT_VENV=.venv-audit
OUT=.test-logs
mkdir -p "$OUT"

if [[ ! -x $AUDIT_VENV/bin/pip-audit ]]; then
    python3 -m venv "$AUDIT_VENV" \
        && "$AUDIT_VENV/bin/pip" install -q pip-audit >"$OUT/audit-install.log" 2>&1 \
        || { echo "audit: could not install pip-audit (see $OUT/audit-install.log)"; exit 1; }
fi

status=0
audited=0
for combo in django61 django52; do
    # A combination's sqlite and postgres environments install the same set (tox.ini).
    venv=""
    for env in .tox/*-"$combo"-sqlite .tox/*-"$combo"-postgres; do
        [[ -x $env/bin/python ]] && { venv=$env; break; }
    done
    [[ -n $venv ]] || continue
    lock="$OUT/$combo.lock.txt"
    report="$OUT/$combo.audit.json"
    "$venv/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check >"$lock"
    echo "== pip-audit: $(wc -l <"$lock") pinned packages of $venv ($lock)"
    rm -f "$report"
    "$AUDIT_VENV/bin/pip-audit" --requirement "$lock" --no-deps --disable-pip \
        --progress-spinner off --format json --output "$report" 2>"$OUT/audit.err" >/dev/null
    "$AUDIT_VENV/bin/python" scripts/audit_verdict.py "$report"
    case $? in
    0) audited=$((audited + 1)) ;;
    1) status=1 ;;
    *)
        tail -n 3 "$OUT/audit.err" | sed 's/^/audit: pip-audit: /'
        echo "audit: WARNING: the dependency audit of $venv was NOT performed" \
            "(no vulnerability data could be fetched)."
        [[ ${REQUIRE_AUDIT:-} == 1 ]] && status=1
        ;;
    esac
done

if ((status == 0 && audited == 0)); then
    echo "audit: no dependency set was audited."
fi
exit $status
