#!/usr/bin/env bash
# Key-management API conformance (`make test` runs this after scripts/sdk-tests.sh).
#
# Installs, only when missing or when their pins changed:
#   tests/admin_api/.venv/   openapi-spec-validator, schemathesis, requests (tests/admin_api/requirements.txt)
#   tests/sdk/node_modules/  oidc-provider for the identity provider tests/sdk/idp.mjs (npm ci, lockfile)
# then runs tests/admin_api/run.py: validates src/admin/openapi.json, starts the fake upstream's
# demo model (target/debug/fake-upstream; UPSTREAM= overrides), the provider and
# target/debug/portcullis (BIN= overrides) with an [admin] listener, its config written by the
# test kit's target/debug/gateway-config (CONFIG_BIN= overrides; all three built when missing),
# checks its 401s against the data plane's and fuzzes it with schemathesis
# (ADMIN_API_MAX_EXAMPLES cases per operation, default 100; a fixed seed unless ADMIN_API_SEED
# names another or `random`, always printed).
# Ends with the driver's `N passed, N failed` line; exits non-zero when any check failed.
# `scripts/admin-api-tests.sh --doc-only` only validates the document (no binary needed).
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=tests/admin_api
SDK=tests/sdk
VENV=$DIR/.venv
BIN=${BIN:-target/debug/portcullis}
UPSTREAM=${UPSTREAM:-target/debug/fake-upstream}
CONFIG_BIN=${CONFIG_BIN:-target/debug/gateway-config}
RUN_TIMEOUT=${ADMIN_API_TESTS_TIMEOUT:-900}   # the driver stops itself at 600 s; this is the backstop

NAME=admin-api-tests
. scripts/lib.sh

doc_only=0
[ "${1:-}" = "--doc-only" ] && doc_only=1

need python3 "the driver, openapi-spec-validator and schemathesis need Python 3"

# ---- Python: a virtualenv of its own, so its packages cannot clash with the SDK suite's ----
python_venv "$VENV" "$DIR/requirements.txt" "schemathesis, openapi_spec_validator, requests"

if [ "$doc_only" = 1 ]; then
    exec "$VENV/bin/python" "$DIR/run.py" --doc-only
fi

# ---- Node: the identity provider's oidc-provider, from tests/sdk's committed lockfile ----
need node "the identity provider (tests/sdk/idp.mjs) needs Node.js"
need npm "the identity provider's packages are installed with npm"
npm_ci "$SDK"
gateway_binary "$BIN"
gateway_binary "$UPSTREAM"
gateway_binary "$CONFIG_BIN"

say "running $DIR/run.py against $BIN"
timeout --kill-after=10 "$RUN_TIMEOUT" "$VENV/bin/python" "$DIR/run.py" --bin "$BIN" --upstream "$UPSTREAM" \
    --config-bin "$CONFIG_BIN"
