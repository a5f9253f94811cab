#!/usr/bin/env bash
# Key-management API conformance (`make test` runs this after scripts/sdk-tests.sh).
#
# Installs, only when missing or when their pins changed:
#   tests/admin_api/.venv/   openapi-spec-validator, schemathesis, requests (tests/admin_api/requirements.txt)
#   tests/sdk/node_modules/  oidc-provider for the identity provider tests/sdk/idp.mjs (npm ci, lockfile)
# then runs tests/admin_api/run.py: validates src/admin/openapi.json, starts the demo upstream,
# the provider and target/debug/portcullis (built when missing; BIN= overrides) with an [admin]
# listener, checks its 401s against the data plane's and fuzzes it with schemathesis
# (ADMIN_API_MAX_EXAMPLES cases per operation, default 100; ADMIN_API_SEED to replay a run).
# Ends with the driver's `N passed, N failed` line; exits non-zero when any check failed.
# `scripts/admin-api-tests.sh --doc-only` only validates the document (no binary needed).
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=tests/admin_api
SDK=tests/sdk
VENV=$DIR/.venv
BIN=${BIN:-target/debug/portcullis}
RUN_TIMEOUT=${ADMIN_API_TESTS_TIMEOUT:-900}   # the driver stops itself at 600 s; this is the backstop

say() { echo "admin-api-tests: $*"; }
die() { echo "admin-api-tests: error: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found: $2"; }
hash_of() { sha256sum "$1" | cut -d' ' -f1; }

doc_only=0
[ "${1:-}" = "--doc-only" ] && doc_only=1

need python3 "the driver, openapi-spec-validator and schemathesis need Python 3"

# ---- Python: a virtualenv of its own with the pinned packages (as scripts/sdk-tests.sh does) ----
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
stamp="$VENV/.admin-api-requirements.sha256"
if [ "$(cat "$stamp" 2>/dev/null)" != "$(hash_of "$DIR/requirements.txt")" ] ||
    ! "$VENV/bin/python" -c 'import schemathesis, openapi_spec_validator, requests' >/dev/null 2>&1; then
    say "installing $DIR/requirements.txt into $VENV"
    pip_install -r "$DIR/requirements.txt" || die "pip install failed"
    hash_of "$DIR/requirements.txt" >"$stamp"
fi

if [ "$doc_only" = 1 ]; then
    exec "$VENV/bin/python" "$DIR/run.py" --doc-only
fi

# ---- Node: the identity provider's oidc-provider, from tests/sdk's committed lockfile ----
need node "the identity provider (tests/sdk/idp.mjs) needs Node.js"
need npm "the identity provider's packages are installed with npm"
stamp="$SDK/node_modules/.sdk-lock.sha256"   # the same stamp scripts/sdk-tests.sh keeps
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

say "running $DIR/run.py against $BIN"
timeout --kill-after=10 "$RUN_TIMEOUT" "$VENV/bin/python" "$DIR/run.py" --bin "$BIN"
