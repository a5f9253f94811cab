#!/usr/bin/env bash
# SDK conformance and real-identity-provider tests (`make test` runs this after `cargo test`).
#
# Installs, only when missing or when their pins changed:
#   .venv/                   the official `openai` Python SDK (tests/sdk/requirements.txt)
#   tests/sdk/node_modules/  the official `openai` Node SDK and `oidc-provider` (npm ci, lockfile)
# then runs tests/sdk/run.py against target/debug/portcullis (built when missing; BIN= overrides).
# Ends with the driver's `N passed, N failed` line; exits non-zero when any check failed.
set -euo pipefail
cd "$(dirname "$0")/.."

SDK=tests/sdk
VENV=.venv
BIN=${BIN:-target/debug/portcullis}
RUN_TIMEOUT=${SDK_TESTS_TIMEOUT:-900}   # the driver stops itself at 600 s; this is the backstop

say() { echo "sdk-tests: $*"; }
die() { echo "sdk-tests: error: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found: $2"; }
hash_of() { sha256sum "$1" | cut -d' ' -f1; }

need python3 "the driver and the Python SDK need Python 3"
need node "the Node SDK and the identity provider need Node.js"
need npm "the Node packages are installed with npm"

# ---- Python: a virtualenv with the pinned openai SDK ----
if ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    say "creating $VENV"
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
        # Debian's python3 without python3-venv has no ensurepip: make the venv bare and
        # install into it with the system pip.
        rm -rf "$VENV"
        python3 -m venv --without-pip "$VENV" ||
            die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
    fi
fi
pip_install() {
    if "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
    else
        python3 -m pip --python "$VENV/bin/python" install --quiet --disable-pip-version-check "$@"
    fi
}
stamp="$VENV/.sdk-requirements.sha256"
if [ "$(cat "$stamp" 2>/dev/null)" != "$(hash_of "$SDK/requirements.txt")" ] ||
    ! "$VENV/bin/python" -c 'import openai' >/dev/null 2>&1; then
    say "installing $SDK/requirements.txt into $VENV"
    pip_install -r "$SDK/requirements.txt" || die "pip install failed"
    hash_of "$SDK/requirements.txt" >"$stamp"
fi

# ---- Node: openai and oidc-provider from the committed lockfile ----
stamp="$SDK/node_modules/.sdk-lock.sha256"
if [ "$(cat "$stamp" 2>/dev/null)" != "$(hash_of "$SDK/package-lock.json")" ]; then
    say "npm ci in $SDK"
    (cd "$SDK" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci failed"
    hash_of "$SDK/package-lock.json" >"$stamp"
fi

# ---- the gateway binary (make test has just built it with cargo test) ----
if [ ! -x "$BIN" ]; then
    say "$BIN missing: cargo build"
    cargo build
fi

say "running $SDK/run.py against $BIN"
exec timeout --kill-after=10 "$RUN_TIMEOUT" "$VENV/bin/python" "$SDK/run.py" --bin "$BIN"
