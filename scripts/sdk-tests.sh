#!/usr/bin/env bash
# SDK conformance and real-identity-provider tests (`make test` runs this after `cargo test`).
#
# Installs, only when missing or when their pins changed:
#   .venv/                   the official `openai` and `anthropic` Python SDKs (tests/sdk/requirements.txt)
#   tests/sdk/node_modules/  the official `openai` and `@anthropic-ai/sdk` Node SDKs and
#                            `oidc-provider` (npm ci, lockfile)
# then runs tests/sdk/run.py against target/debug/portcullis in front of the fake upstream's demo
# model, target/debug/fake-upstream, its config written by the test kit's
# target/debug/gateway-config (all three built by `cargo build` when missing; BIN=, UPSTREAM= and
# CONFIG_BIN= override).
# SDK_TESTS_ONLY=agents runs only the agent API checks (both stores).
# Runs the suite twice: with a SQLite key store, then with a PostgreSQL one (a throwaway server
# started here, or PORTCULLIS_TEST_POSTGRES_URL). Each run ends with the driver's
# `N passed, N failed` line; exits non-zero when any check failed.
set -euo pipefail
cd "$(dirname "$0")/.."

SDK=tests/sdk
VENV=.venv
BIN=${BIN:-target/debug/portcullis}
UPSTREAM=${UPSTREAM:-target/debug/fake-upstream}
CONFIG_BIN=${CONFIG_BIN:-target/debug/gateway-config}
RUN_TIMEOUT=${SDK_TESTS_TIMEOUT:-900}   # the driver stops itself at 600 s; this is the backstop
ONLY=${SDK_TESTS_ONLY:-all}             # agents: only the agent API checks (run.py --only)

NAME=sdk-tests
. scripts/lib.sh

need python3 "the driver and the Python SDK need Python 3"
need node "the Node SDK and the identity provider need Node.js"
need npm "the Node packages are installed with npm"

# ---- Python: a virtualenv with the pinned openai SDK; Node: openai and oidc-provider ----
python_venv "$VENV" "$SDK/requirements.txt" "openai, anthropic, requests"
npm_ci "$SDK"
gateway_binary "$BIN"
gateway_binary "$UPSTREAM"
gateway_binary "$CONFIG_BIN"

say "running $SDK/run.py against $BIN (SQLite key store)"
timeout --kill-after=10 "$RUN_TIMEOUT" "$VENV/bin/python" "$SDK/run.py" --bin "$BIN" --upstream "$UPSTREAM" \
    --config-bin "$CONFIG_BIN" --only "$ONLY"

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
timeout --kill-after=10 "$RUN_TIMEOUT" "$VENV/bin/python" "$SDK/run.py" --bin "$BIN" --upstream "$UPSTREAM" \
    --config-bin "$CONFIG_BIN" --key-store "$PG_URL" --only "$ONLY"
