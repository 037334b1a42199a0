#!/usr/bin/env bash
# ruff check + ruff format --check on the project's Python code.
#   scripts/lint.sh          check only (what CI runs)
#   scripts/lint.sh --fix    apply fixes and reformat
# ruff comes from $RUFF if set, else from .venv-lint, a small venv holding the ruff
# version that pyproject.toml's "test" extra asks for.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
cd "$DTP_ROOT"

fix=0
if [[ ${1:-} == --fix ]]; then
    fix=1
fi

paths=()
for p in django_tasks_plus tests testproject bench scripts; do
    [[ -d $p ]] && paths+=("$p")
done

if [[ -n ${RUFF:-} ]]; then
    ruff=$RUFF
else
    python=$(dtp_find_python '^3\.(1[1-9]|[2-9][0-9])$' python3 python3.13 python3.12 python3.11) || {
        echo "No Python >= 3.11 with venv support found to install ruff; set RUFF=/path/to/ruff" >&2
        exit 1
    }
    spec=$("$python" - <<'PY'
import tomllib

with open("pyproject.toml", "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
print(next(r for r in extras["test"] if r.replace(" ", "").startswith("ruff")))
PY
    )
    dtp_ensure_venv .venv-lint "$python" "$spec" >/dev/null || exit 1
    ruff=.venv-lint/bin/ruff
fi

echo "Linting ${paths[*]} with $("$ruff" --version)"
if ((fix)); then
    "$ruff" check --fix "${paths[@]}"
    "$ruff" format "${paths[@]}"
else
    status=0
    "$ruff" check "${paths[@]}" || status=1
    "$ruff" format --check "${paths[@]}" || status=1
    exit $status
fi
