#!/usr/bin/env bash
# The key console in a real browser (`make test` runs this last): Debian's Chromium driven by
# playwright-core through tests/browser/console.test.mjs, against target/debug/portcullis, the
# real OpenID provider (tests/sdk/idp.mjs), a recording upstream and, for the usage view, the
# test kit's fake upstream (target/debug/fake-upstream), the gateways' configs written by the test
# kit's target/debug/gateway-config (all three built by `cargo build` when missing; BIN=,
# UPSTREAM= and CONFIG_BIN= override). See that file for the steps.
#
# Installs, only when missing or when their lockfiles changed:
#   tests/sdk/node_modules/      oidc-provider for the identity provider (npm ci, lockfile)
#   tests/browser/node_modules/  playwright-core, which downloads no browser (npm ci, lockfile)
# Chromium itself is Debian's /usr/bin/chromium (make test-deps installs it; CHROMIUM= overrides).
# Screenshots of every step: PORTCULLIS_BROWSER_OUT (default: a temp directory, printed).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/debug/portcullis}
UPSTREAM=${UPSTREAM:-target/debug/fake-upstream}
CONFIG_BIN=${CONFIG_BIN:-target/debug/gateway-config}
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
RUN_TIMEOUT=${BROWSER_TESTS_TIMEOUT:-300}

NAME=browser-tests
. scripts/lib.sh

need node "the test and the identity provider need Node.js"
need npm "the Node packages are installed with npm"
[ -x "$CHROMIUM" ] || die "$CHROMIUM missing (make test-deps installs Debian's chromium)"

npm_ci tests/sdk
npm_ci tests/browser

gateway_binary "$BIN"
gateway_binary "$UPSTREAM"
gateway_binary "$CONFIG_BIN"

say "running tests/browser/console.test.mjs against $BIN with $CHROMIUM"
BIN=$BIN UPSTREAM=$UPSTREAM CONFIG_BIN=$CONFIG_BIN CHROMIUM=$CHROMIUM timeout --kill-after=10 "$RUN_TIMEOUT" \
    node --test tests/browser/console.test.mjs
