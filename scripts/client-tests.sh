#!/usr/bin/env bash
# The real agent CLIs through the dialect bridge (`make test-clients`; optional, not part of
# `make test`: it downloads @anthropic-ai/claude-code and @openai/codex from npm into
# target/clients, pinned below). Runs tests/clients/run.py against target/debug/portcullis in
# front of the fake upstream's demo model (both built by `cargo build` when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

CLIENTS=target/clients
CLAUDE_CODE=${CLAUDE_CODE_VERSION:-2.1.197}
CODEX=${CODEX_VERSION:-0.171.0}

NAME=client-tests
. scripts/lib.sh

need node "the agent CLIs run on Node.js"
need npm "the agent CLIs are installed with npm"
need python3 "the driver is Python"

mkdir -p "$CLIENTS"
if ! "$CLIENTS/node_modules/.bin/claude" --version 2>/dev/null | grep -q "^$CLAUDE_CODE " ||
   ! "$CLIENTS/node_modules/.bin/codex" --version 2>/dev/null | grep -q " $CODEX$"; then
    say "installing @anthropic-ai/claude-code@$CLAUDE_CODE and @openai/codex@$CODEX into $CLIENTS"
    (cd "$CLIENTS" && npm install --no-audit --no-fund --silent \
        "@anthropic-ai/claude-code@$CLAUDE_CODE" "@openai/codex@$CODEX" >/dev/null)
fi
gateway_binary target/debug/portcullis
gateway_binary target/debug/fake-upstream
gateway_binary target/debug/gateway-config

python3 tests/clients/run.py --clients "$CLIENTS"
