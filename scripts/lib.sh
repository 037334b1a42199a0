# Shared helpers for the scripts in this folder. Source it; do not run it.
# shellcheck shell=bash

# Repository root (the folder holding pyproject.toml).
DTP_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)

dtp_is_ci() {
    [[ ${CI:-} == true || ${CI:-} == 1 ]]
}

# Print "MAJOR.MINOR" of interpreter $1 if it runs and can create venvs with pip
# (Debian's python3 without python3-venv has no ensurepip); fail otherwise.
dtp_py_version() {
    "$1" -c 'import sys, venv, ensurepip; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

# The real path of interpreter $1 (resolves pyenv shims).
dtp_py_executable() {
    "$1" -c 'import sys; print(sys.executable)'
}

# Print the pyenv root, if there is one.
dtp_pyenv_root() {
    local root=""
    if command -v pyenv >/dev/null 2>&1; then
        root=$(pyenv root 2>/dev/null) || root=""
    fi
    if [[ -z $root ]]; then
        local home=${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}
        root=${PYENV_ROOT:-$home/.pyenv}
    fi
    [[ -d $root/versions ]] && printf '%s\n' "$root"
}

# Print pyenv interpreters whose version matches the glob $1 (e.g. '3.1[23]*'), newest
# first. Only plain releases (3.12.1), not 3.13.0t or 3.14-dev.
dtp_pyenv_pythons() {
    local root dir name
    root=$(dtp_pyenv_root) || return 0
    for dir in "$root"/versions/$1; do
        name=${dir##*/}
        [[ $name =~ ^3\.[0-9]+\.[0-9]+$ && -x $dir/bin/python3 ]] || continue
        printf '%s\n' "$name"
    done | sort -r -V | while read -r name; do
        printf '%s\n' "$root/versions/$name/bin/python3"
    done
}

# dtp_find_python REGEX CANDIDATE...
# Print the real path of the first candidate (a command name or a path) whose
# "MAJOR.MINOR" matches REGEX and which can create venvs.
dtp_find_python() {
    local want=$1 cand ver
    shift
    for cand in "$@"; do
        if [[ $cand != */* ]]; then
            command -v "$cand" >/dev/null 2>&1 || continue
        fi
        ver=$(dtp_py_version "$cand") || continue
        [[ $ver =~ $want ]] || continue
        dtp_py_executable "$cand"
        return 0
    done
    return 1
}

# sha256 of stdin, using interpreter $1.
dtp_sha256() {
    "$1" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}

# dtp_ensure_venv VENV PYTHON PIP_INSTALL_ARGS...
# Make VENV a virtualenv of PYTHON with `pip install PIP_INSTALL_ARGS...` done. It is
# (re)installed only when pyproject.toml, the install arguments or the interpreter
# changed since the last successful install (recorded in VENV/.dtp-stamp). The venv is
# recreated when it is broken or was made from another Python version.
dtp_ensure_venv() {
    local venv=$1 python=$2
    shift 2
    local stamp="$venv/.dtp-stamp" log="$venv/install.log" want base_version venv_version
    want=$(
        {
            "$python" -c 'import sys; print(sys.version)'
            printf '%s\n' "$@"
            cat "$DTP_ROOT/pyproject.toml"
        } | dtp_sha256 "$python"
    )
    if [[ -f $stamp && $(<"$stamp") == "$want" ]] && "$venv/bin/python" -c '' 2>/dev/null; then
        echo "$venv is up to date"
        return 0
    fi

    base_version=$("$python" -c 'import sys; print(sys.version)')
    venv_version=$("$venv/bin/python" -c 'import sys; print(sys.version)' 2>/dev/null || true)
    if [[ $venv_version != "$base_version" ]]; then
        if [[ -e $venv ]]; then
            echo "Recreating $venv (missing, broken or made with another Python)"
            rm -rf -- "$venv"
        fi
        echo "Creating $venv with $python ($("$python" -V 2>&1))"
        "$python" -m venv "$venv" || return 1
    fi
    rm -f -- "$stamp"

    echo "Installing into $venv: pip install $* (log: $log)"
    {
        "$venv/bin/python" -m pip install --disable-pip-version-check --upgrade pip \
            || echo "(pip upgrade failed; continuing with the bundled pip)"
        (cd "$DTP_ROOT" && "$venv/bin/python" -m pip install --disable-pip-version-check \
            --progress-bar off "$@")
    } >"$log" 2>&1
    local rc=$?
    if ((rc != 0)); then
        echo "pip install failed (exit $rc); the end of $log:" >&2
        tail -n 40 "$log" >&2
        return 1
    fi
    printf '%s\n' "$want" >"$stamp"
}
