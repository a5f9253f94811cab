#!/usr/bin/env bash
# The key console in a real browser (`make test` runs this last): Debian's Chromium driven by
# playwright-core through tests/browser/console.test.mjs, against target/debug/portcullis, the
# real OpenID provider (tests/sdk/idp.mjs) and a recording upstream. See that file for the steps.
#
# Installs, only when missing or when their lockfiles changed:
#   tests/sdk/node_modules/      oidc-provider for the identity provider (npm ci, lockfile)
#   tests/browser/node_modules/  playwright-core, which downloads no browser (npm ci, lockfile)
# Chromium itself is Debian's /usr/bin/chromium (make test-deps installs it; CHROMIUM= overrides).
# Screenshots of every step: PORTCULLIS_BROWSER_OUT (default: a temp directory, printed).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/debug/portcullis}
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
RUN_TIMEOUT=${BROWSER_TESTS_TIMEOUT:-300}

say() { echo "browser-tests: $*"; }
die() { echo "browser-tests: error: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found: $2"; }
hash_of() { sha256sum "$1" | cut -d' ' -f1; }

need node "the test and the identity provider need Node.js"
need npm "the Node packages are installed with npm"
[ -x "$CHROMIUM" ] || die "$CHROMIUM missing (make test-deps installs Debian's chromium)"

# npm ci in DIR when its lockfile changed since the last install (the stamp is the one
# scripts/sdk-tests.sh keeps for tests/sdk, so the two scripts agree).
npm_ci() {
    local dir=$1 stamp=$1/node_modules/.sdk-lock.sha256
    if [ "$(cat "$stamp" 2>/dev/null)" != "$(hash_of "$dir/package-lock.json")" ]; then
        say "npm ci in $dir"
        (cd "$dir" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error) ||
            die "npm ci in $dir failed"
        hash_of "$dir/package-lock.json" >"$stamp"
    fi
}
npm_ci tests/sdk
npm_ci tests/browser

if [ ! -x "$BIN" ]; then
    say "$BIN missing: cargo build"
    cargo build
fi

say "running tests/browser/console.test.mjs against $BIN with $CHROMIUM"
BIN=$BIN CHROMIUM=$CHROMIUM timeout --kill-after=10 "$RUN_TIMEOUT" \
    node --test tests/browser/console.test.mjs
