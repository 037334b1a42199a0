#!/usr/bin/env bash
# ruff check + ruff format --check on the project's Python code, then mypy on the package.
#   scripts/lint.sh          check only (what CI runs)
#   scripts/lint.sh --fix    apply ruff's fixes and reformat (no type check)
# Both tools come from .venv-lint, which holds the package with its "test" extra: the ruff,
# mypy and django-stubs versions pyproject.toml asks for, and Django itself, which the
# django-stubs plugin loads (with testproject.settings) to type the models. RUFF=/path/to/ruff
# runs another ruff.
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

python=$(dtp_find_python '^3\.(1[1-9]|[2-9][0-9])$' python3 python3.13 python3.12 python3.11) || {
    echo "No Python >= 3.11 with venv support found to install the linters" >&2
    exit 1
}
dtp_ensure_venv .venv-lint "$python" -e ".[test]" >/dev/null || exit 1
ruff=${RUFF:-.venv-lint/bin/ruff}

echo "Linting ${paths[*]} with $("$ruff" --version)"
if ((fix)); then
    "$ruff" check --fix "${paths[@]}"
    "$ruff" format "${paths[@]}"
    exit 0
fi
status=0
"$ruff" check "${paths[@]}" || status=1
"$ruff" format --check "${paths[@]}" || status=1
# The settings in [tool.mypy] of pyproject.toml: the package only.
echo "Type-checking django_tasks_plus with $(.venv-lint/bin/mypy --version)"
.venv-lint/bin/mypy || status=1
exit $status
