# Shared by the scripts (sourced, not run): messages, installing pinned Python and Node
# packages only when missing or when their pins changed, and waiting for the servers they
# start. Set NAME before sourcing.

say() { echo "$NAME: $*"; }
die() { echo "$NAME: error: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found: $2"; }
hash_of() { sha256sum "$1" | cut -d' ' -f1; }

# python_venv VENV REQUIREMENTS MODULES: a virtualenv at VENV with REQUIREMENTS installed,
# reinstalled when the file changed or when `import MODULES` fails.
python_venv() {
    local venv=$1 requirements=$2 modules=$3 stamp=$1/.requirements.sha256
    if ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
        say "creating $venv"
        rm -rf "$venv"
        if ! python3 -m venv "$venv" >/dev/null 2>&1; then
            # Debian's python3 without python3-venv has no ensurepip: make the venv bare and
            # install into it with the system pip.
            rm -rf "$venv"
            python3 -m venv --without-pip "$venv" ||
                die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
        fi
    fi
    if [ "$(cat "$stamp" 2>/dev/null)" != "$(hash_of "$requirements")" ] ||
        ! "$venv/bin/python" -c "import $modules" >/dev/null 2>&1; then
        say "installing $requirements into $venv"
        if "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
            "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
        else
            python3 -m pip --python "$venv/bin/python" install --quiet --disable-pip-version-check -r "$requirements"
        fi || die "pip install failed"
        hash_of "$requirements" >"$stamp"
    fi
}

# npm_ci DIR: `npm ci` in DIR when its lockfile changed since the last install (no browser
# downloads: playwright-core uses Debian's Chromium).
npm_ci() {
    local dir=$1 stamp=$1/node_modules/.lock.sha256
    if [ "$(cat "$stamp" 2>/dev/null)" != "$(hash_of "$dir/package-lock.json")" ]; then
        say "npm ci in $dir"
        (cd "$dir" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error) ||
            die "npm ci in $dir failed"
        hash_of "$dir/package-lock.json" >"$stamp"
    fi
}

# The gateway binary (make test has just built it with cargo test).
gateway_binary() {
    if [ ! -x "$1" ]; then
        say "$1 missing: cargo build"
        cargo build
    fi
}

# Servers started by the scripts, all on loopback.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_http URL [SECONDS]: until anything answers at URL (default 20 s), else die.
wait_http() {
    local i
    for i in $(seq 1 $((${2:-20} * 10))); do
        curl -s -o /dev/null --max-time 1 "$1" && return 0
        sleep 0.1
    done
    die "nothing answers at $1"
}

# wait_line FILE PREFIX [SECONDS]: the rest of FILE's first line starting with PREFIX, waiting
# for it (default 20 s), else die.
wait_line() {
    local i line
    for i in $(seq 1 $((${3:-20} * 10))); do
        line=$(grep -m1 "^$2" "$1" 2>/dev/null || true)
        [ -n "$line" ] && { echo "${line#"$2" }"; return 0; }
        sleep 0.1
    done
    die "no '$2' line in $1: $(cat "$1")"
}
