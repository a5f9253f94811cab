#!/usr/bin/env bash
# SDK conformance and real-identity-provider tests (`make test` runs this after `cargo test`).
#
# Installs, only when missing or when their pins changed:
#   .venv/                   the official `openai` Python SDK (tests/sdk/requirements.txt)
#   tests/sdk/node_modules/  the official `openai` Node SDK and `oidc-provider` (npm ci, lockfile)
# then runs tests/sdk/run.py against target/debug/portcullis (built when missing; BIN= overrides).
# Runs the suite twice: with a SQLite key store, then with a PostgreSQL one (a throwaway server
# started here, or PORTCULLIS_TEST_POSTGRES_URL). Each run ends with the driver's
# `N passed, N failed` line; exits non-zero when any check failed.
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

say "running $SDK/run.py against $BIN (SQLite key store)"
timeout --kill-after=10 "$RUN_TIMEOUT" "$VENV/bin/python" "$SDK/run.py" --bin "$BIN"

# ---- once more with the fleet key store: a throwaway PostgreSQL server (or the given one) ----
PG_URL=${PORTCULLIS_TEST_POSTGRES_URL:-}
if [ -z "$PG_URL" ]; then
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -n 1)
    [ -x "$PG_BIN/initdb" ] || die "PostgreSQL server binaries missing (make test installs postgresql)"
    PG_DIR=$(mktemp -d /tmp/portcullis-sdk-pg.XXXXXX)
    PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    PG_PASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(12))')
    as_pg=()
    if [ "$(id -u)" = 0 ]; then chown postgres: "$PG_DIR"; as_pg=(runuser -u postgres --); fi
    echo "$PG_PASSWORD" >"$PG_DIR/pw"
    [ ${#as_pg[@]} -eq 0 ] || chown postgres: "$PG_DIR/pw"
    pg_stop() { "${as_pg[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null 2>&1 || true; rm -rf "$PG_DIR"; }
    trap pg_stop EXIT
    "${as_pg[@]}" "$PG_BIN/initdb" -D "$PG_DIR/data" -U portcullis --auth=scram-sha-256 \
        --pwfile="$PG_DIR/pw" --no-sync >"$PG_DIR/initdb.log" 2>&1 || die "initdb failed: $(tail -5 "$PG_DIR/initdb.log")"
    "${as_pg[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w \
        -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null ||
        die "postgres did not start: $(tail -5 "$PG_DIR/server.log")"
    PG_URL="postgres://portcullis:$PG_PASSWORD@127.0.0.1:$PG_PORT/postgres"
fi
say "running $SDK/run.py against $BIN (Postgres key store)"
timeout --kill-after=10 "$RUN_TIMEOUT" "$VENV/bin/python" "$SDK/run.py" --bin "$BIN" --key-store "$PG_URL"
