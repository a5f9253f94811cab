#!/usr/bin/env bash
# Instructions per request (issue 13's regression guard): the bare-Pingora floor
# (benches/load/floor.rs) and the gateway, each under `valgrind --tool=callgrind`, each given
# the same fixed number of chat POSTs on one kept-alive connection after a warm-up. Counting
# instructions is deterministic where wall-clock rounds on a shared machine swing ±15%.
#
# Prints `name value` lines (stdout) that scripts/loadbench.sh records:
#   ir_floor, ir_key                       instructions per request, whole process
#   hook_<name>                            the gateway's own hooks, inclusive, per request
# and keeps the raw profiles under $OUT (default bench-results/callgrind/) for
# callgrind_annotate. Knobs: CG_REQUESTS (2000), CG_WARMUP (300); BIN and EX to reuse
# binaries already built (otherwise `cargo build --release --examples`).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
NAME=callgrind
. scripts/lib.sh

CG_REQUESTS=${CG_REQUESTS:-2000}
CG_WARMUP=${CG_WARMUP:-300}
OUT=${OUT:-$ROOT/bench-results/callgrind}
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

command -v valgrind >/dev/null 2>&1 || {
    say "installing valgrind with apt-get"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
}
if [ -z "${BIN:-}" ]; then
    cargo build --release --quiet
    cargo build --release --quiet --examples
fi
BIN=${BIN:-$ROOT/target/release/portcullis}
EX=${EX:-$ROOT/target/release/examples}

WORK=$(mktemp -d /tmp/portcullis-callgrind.XXXXXX)
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$OUT"

UP_PORT=$(free_port)
"$EX/fast_upstream" --port "$UP_PORT" --hosts 1 --tick-ms 5000 --max-life-s 900 >"$WORK/upstream.log" 2>&1 &
PIDS+=($!)
wait_line "$WORK/upstream.log" listening >/dev/null

GW_PORT=$(free_port)
cat >"$WORK/portcullis.toml" <<EOF
[server]
listen = ["127.0.0.1:$GW_PORT"]
threads = 1
upgrade_sock = "$WORK/upgrade.sock"
pid_file = "$WORK/portcullis.pid"
[access_log]
destination = "off"
[auth.api_keys]
database = "sqlite://$WORK/keys.db"
[metrics]
listen = "127.0.0.1:$(free_port)"
[services.infer]
upstream = "http://127.0.0.1:$UP_PORT"
scope = "infer"
EOF
KEY=$("$BIN" keys create --config "$WORK/portcullis.toml" --name callgrind --scopes infer | tail -n 1)
case $KEY in ak_*) ;; *) die "keys create printed no key" ;; esac
FLOOR_PORT=$(free_port)

BODY='{"model":"bench","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
drive() { # port count
    "$EX/loadgen" count --addr "127.0.0.1:$1" --method POST --path /v1/infer/v1/chat/completions \
        --header "authorization: Bearer $KEY" --header "content-type: application/json" \
        --body "$BODY" --count "$2" >/dev/null || die "requests through port $1 failed"
}

# profile NAME PORT CMD...: runs CMD under callgrind, warms it up, counts CG_REQUESTS requests,
# and leaves the profile at $OUT/NAME.out. Prints the instructions per request.
profile() {
    local name=$1 port=$2 pid dump
    shift 2
    valgrind --tool=callgrind --callgrind-out-file="$WORK/$name.%p" "$@" >"$WORK/$name.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_http "http://127.0.0.1:$port/healthz" 60 # under valgrind start-up takes seconds
    drive "$port" "$CG_WARMUP"
    callgrind_control -z "$pid" >/dev/null
    drive "$port" "$CG_REQUESTS"
    callgrind_control -d "$pid" >/dev/null
    dump=$(ls "$WORK/$name.$pid".* 2>/dev/null | head -n 1)
    [ -n "$dump" ] || die "callgrind wrote no profile for $name: $(tail -n 5 "$WORK/$name.log")"
    kill -KILL "$pid" 2>/dev/null || true
    mv "$dump" "$OUT/$name.out"
    awk -v n="$CG_REQUESTS" '/^summary:|^totals:/ { print int($2 / n); exit }' "$OUT/$name.out"
}

say "floor under callgrind ($CG_REQUESTS requests after $CG_WARMUP)" >&2
echo "ir_floor $(profile floor "$FLOOR_PORT" "$EX/floor" --listen "127.0.0.1:$FLOOR_PORT" \
    --upstream "127.0.0.1:$UP_PORT" --key "$KEY")"
say "gateway under callgrind ($CG_REQUESTS requests after $CG_WARMUP)" >&2
echo "ir_key $(profile gateway "$GW_PORT" "$BIN" serve --config "$WORK/portcullis.toml")"

# The gateway's hooks, inclusive of all they call: an async hook's cost is in its future's
# poll (`…::hook::{{closure}}`) plus the boxing in `…::hook`; sync hooks Pingora may inline.
callgrind_annotate --inclusive=yes --threshold=100 "$OUT/gateway.out" 2>/dev/null |
    awk -v n="$CG_REQUESTS" '
        /Gateway as pingora_proxy::proxy_trait::ProxyHttp>::/ {
            gsub(",", "", $1)
            name = $0
            sub(/.*ProxyHttp>::/, "", name)
            sub(/::\{\{closure\}\}.*/, "", name)
            sub(/[ (].*/, "", name)
            cost[name] += $1
        }
        END { for (h in cost) printf "hook_%s %d\n", h, cost[h] / n }' | sort
