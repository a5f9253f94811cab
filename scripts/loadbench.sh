#!/usr/bin/env bash
# Load benchmark (`make bench`): Portcullis against the same upstream hit directly and behind
# nginx with a static bearer check, all on loopback, in one invocation.
#
# Placement: the proxy under test (Portcullis or nginx) runs alone on core 0 (taskset -c 0);
# the load generator and the fast upstream share core 1. "direct" is the same client and
# upstream with no proxy: the ceiling this machine's other core can drive.
#
# Reports a markdown table (stdout and bench-results/latest.md; raw rounds in
# bench-results/latest-raw.txt). Knobs (environment): ROUNDS (5), SECONDS_PER_RUN (5),
# PAIR_ROUNDS (5), FAILOVER_RATE (200 req/s), FAILOVER_ROUNDS (5), CONNS (wrk connections, 64), RATE (fixed-rate test, 2000 req/s), RATE_SECONDS (5),
# SSE_COUNT (2000), STREAMS (10000; capped by the open-file hard limit), STREAM_ROUNDS (3),
# VISION_RATE (20 req/s of a 2 MB vision body), VISION_SECONDS (5).
#
# The model policy's cost: target "policy" is the same upstream behind a service with
# api = "openai" and a model policy (validation, default model, usage accounting), "key" the
# same without it.
#
# Fleet rate limits' cost: target "redis" is the same upstream behind a service with
# rate_limit_per_minute (set so high nothing is refused) shared through a local redis-server
# ([rate_limits] redis: one EVALSHA round trip per request), "key" the same without a limit.
#
# Replicas' cost: target "replicas" is a service over three replicas (the same fast upstream
# listening on 127.0.0.1-3, least_requests), "key" the same with one. Failover: target
# "failover" lists a dead replica (connects refused) before the live one, and one stream held
# on the live replica keeps least_requests choosing the dead one first, so every request fails
# over; its latency at RATE is compared with "key".
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
NAME=loadbench
. scripts/lib.sh # free_port, wait_http, wait_line (their die is the one defined below)

ROUNDS=${ROUNDS:-5}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
CONNS=${CONNS:-64}
RATE=${RATE:-2000}
RATE_SECONDS=${RATE_SECONDS:-5}
RATE_ROUNDS=${RATE_ROUNDS:-3}
PAIR_ROUNDS=${PAIR_ROUNDS:-5}
FAILOVER_RATE=${FAILOVER_RATE:-200}
FAILOVER_ROUNDS=${FAILOVER_ROUNDS:-5}
SSE_COUNT=${SSE_COUNT:-2000}
SSE_ROUNDS=${SSE_ROUNDS:-3}
STREAMS=${STREAMS:-10000}
STREAM_ROUNDS=${STREAM_ROUNDS:-3}
VISION_RATE=${VISION_RATE:-20}
VISION_SECONDS=${VISION_SECONDS:-5}
PROXY_CPU=0
CLIENT_CPU=1

SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
BEGIN=$(date +%s)
LOAD_AT_START=$(cut -d" " -f1-3 /proc/loadavg)
log() { printf '[loadbench %3ds] %s\n' "$(($(date +%s) - BEGIN))" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---- tools ---------------------------------------------------------------------------------
missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} with apt-get"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
command -v taskset >/dev/null || die "taskset (util-linux) is needed"
[ "$(nproc)" -ge 2 ] || die "needs two cores: the proxy on one, the load on the other"

log "building (cargo build --release; the load tools as release examples)"
cargo build --release --quiet
cargo build --release --quiet --examples
# The floor on crates.io's Pingora, without vendor/patches (benches/floor/Cargo.toml).
cargo build --release --quiet --manifest-path benches/floor/Cargo.toml --target-dir "$ROOT/target/floor-unpatched"
BIN=$ROOT/target/release/portcullis
EX=$ROOT/target/release/examples
FLOOR_UNPATCHED=$ROOT/target/floor-unpatched/release/floor

# ---- processes, all killed on exit ---------------------------------------------------------
WORK=$(mktemp -d /tmp/portcullis-bench.XXXXXX)
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
    sleep 0.3
    for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [ -n "${KEEP_WORK:-}" ] && log "kept $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
FD_LIMIT=$(ulimit -n)
# Each stream through the gateway holds two sockets (client side and upstream side).
MAX_STREAMS=$(((FD_LIMIT - 100) / 2))
[ "$STREAMS" -le "$MAX_STREAMS" ] || { log "open-file limit $FD_LIMIT: $MAX_STREAMS streams, not $STREAMS"; STREAMS=$MAX_STREAMS; }

UP_PORT=$(free_port)
taskset -c $CLIENT_CPU "$EX/fast_upstream" --port "$UP_PORT" --hosts 3 --tick-ms 5000 --max-life-s 1800 >"$WORK/upstream.log" 2>&1 &
PIDS+=($!)
UP_PID=$!
wait_line "$WORK/upstream.log" listening >/dev/null

taskset -c $CLIENT_CPU "$EX/bench_idp" --max-life-s 1800 >"$WORK/idp.log" 2>&1 &
PIDS+=($!)
ISSUER=$(wait_line "$WORK/idp.log" issuer)
JWT=$(wait_line "$WORK/idp.log" token)

# Redis for target "redis": on the client core, like any service the gateway calls; no persistence.
REDIS_PORT=$(free_port)
taskset -c $CLIENT_CPU redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for i in $(seq 1 100); do
    [ "$(redis-cli -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ] && break
    sleep 0.1
done
[ "$(redis-cli -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ] || die "redis-server did not start: $(cat "$WORK/redis.log")"

# ---- the gateway ---------------------------------------------------------------------------
GW_PORT=$(free_port)
DEAD_PORT=$(free_port) # nothing listens there: connects are refused at once
METRICS_PORT=$(free_port)
write_gateway_config() { # $1: with an [access_log] off section (1) or without (0)
    {
        cat <<EOF
[server]
listen = ["127.0.0.1:$GW_PORT"]
threads = 1
grace_period_seconds = 1
graceful_shutdown_timeout_seconds = 1
upgrade_sock = "$WORK/upgrade.sock"
pid_file = "$WORK/portcullis.pid"
EOF
        [ "$1" = 1 ] && printf '[access_log]\ndestination = "off"\n'
        cat <<EOF
[auth.api_keys]
database = "sqlite://$WORK/keys.db"
[auth.jwt]
issuer = "$ISSUER"
audience = "portcullis"
algorithms = ["RS256"]
[metrics]
listen = "127.0.0.1:$METRICS_PORT"
[services.infer]
upstream = "http://127.0.0.1:$UP_PORT"
scope = "infer"
[services.policy]
upstream = "http://127.0.0.1:$UP_PORT"
scope = "infer"
api = "openai"
[services.policy.models]
default = "bench-default"
aliases = { bench = "bench-1" }
[services.limited]
upstream = "http://127.0.0.1:$UP_PORT"
scope = "infer"
rate_limit_per_minute = 100000000
[rate_limits]
redis = "redis://127.0.0.1:$REDIS_PORT"
[services.replicas]
upstream = ["http://127.0.0.1:$UP_PORT", "http://127.0.0.2:$UP_PORT", "http://127.0.0.3:$UP_PORT"]
scope = "infer"
[services.failover]
upstream = ["http://127.0.0.1:$DEAD_PORT", "http://127.0.0.1:$UP_PORT"]
scope = "infer"
# Never ejected: every request pays the failed connect.
eject_after_connect_failures = 4000000000
EOF
    } >"$WORK/portcullis.toml"
}
ACCESS_LOG="off"
write_gateway_config 1
if ! "$BIN" serve --config "$WORK/portcullis.toml" -t >/dev/null 2>&1; then
    ACCESS_LOG="not switchable in this build (stdout to /dev/null)"
    write_gateway_config 0
    "$BIN" serve --config "$WORK/portcullis.toml" -t >/dev/null || die "generated gateway config refused"
fi
KEY=$("$BIN" keys create --config "$WORK/portcullis.toml" --name bench --scopes infer | tail -n 1)
case $KEY in ak_*) ;; *) die "keys create printed no key" ;; esac

GW_PID=
start_gateway() {
    RUST_LOG=warn taskset -c $PROXY_CPU "$BIN" serve --config "$WORK/portcullis.toml" >/dev/null 2>>"$WORK/gateway.log" &
    GW_PID=$!
    PIDS+=("$GW_PID")
    wait_http "http://127.0.0.1:$GW_PORT/healthz"
}
stop_gateway() {
    kill -INT "$GW_PID" 2>/dev/null || true
    local i p keep=()
    for i in $(seq 1 50); do kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$GW_PID" 2>/dev/null || true
    wait "$GW_PID" 2>/dev/null || true
    # Forget it, so that the exit trap never signals a pid the system may have reused.
    for p in "${PIDS[@]}"; do [ "$p" = "$GW_PID" ] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}
status_kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }

# ---- nginx: a plain reverse proxy with a static bearer check ------------------------------
NGX_PORT=$(free_port)
mkdir -p "$WORK/nginx/tmp"
cat >"$WORK/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
worker_rlimit_nofile $FD_LIMIT;
events { worker_connections 16384; }
http {
    access_log off;
    client_body_temp_path $WORK/nginx/tmp/body;
    proxy_temp_path $WORK/nginx/tmp/proxy;
    fastcgi_temp_path $WORK/nginx/tmp/fastcgi;
    uwsgi_temp_path $WORK/nginx/tmp/uwsgi;
    scgi_temp_path $WORK/nginx/tmp/scgi;
    keepalive_requests 1000000;
    map_hash_bucket_size 128;  # the key is longer than the default bucket
    upstream fast {
        server 127.0.0.1:$UP_PORT;
        keepalive 128;
        keepalive_requests 1000000;
    }
    map \$http_authorization \$ok {
        "Bearer $KEY" 1;
        default 0;
    }
    server {
        listen 127.0.0.1:$NGX_PORT;
        location /v1/infer/ {
            if (\$ok = 0) { return 401; }
            proxy_pass http://fast/;
            proxy_http_version 1.1;
            # What the gateway does too: no client credential upstream, forwarding headers,
            # a request id both ways, no upstream cookies, and no response buffering (SSE).
            proxy_set_header Connection "";
            proxy_set_header Authorization "";
            proxy_set_header Cookie "";
            proxy_set_header X-Forwarded-For \$remote_addr;
            proxy_set_header X-Forwarded-Proto http;
            proxy_set_header X-Request-Id \$request_id;
            proxy_hide_header Set-Cookie;
            add_header X-Request-Id \$request_id always;
            proxy_buffering off;
        }
    }
}
EOF
"$NGINX" -t -q -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log" ||
    die "nginx refused its config: $(cat "$WORK/nginx/error.log")"
taskset -c $PROXY_CPU "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/error.log" >/dev/null 2>&1 &
NGX_PID=$!
PIDS+=("$NGX_PID")
wait_http "http://127.0.0.1:$NGX_PORT/"

start_gateway
sleep 1
IDLE_RSS=$(status_kb "$GW_PID" VmRSS)
IDLE_HWM=$(status_kb "$GW_PID" VmHWM)

# ---- targets -------------------------------------------------------------------------------
CHAT_BODY='{"model":"bench","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
url() { # target → base URL of the chat endpoint
    case $1 in
        direct) echo "http://127.0.0.1:$UP_PORT/v1" ;;
        nginx) echo "http://127.0.0.1:$NGX_PORT/v1/infer/v1" ;;
        key | jwt) echo "http://127.0.0.1:$GW_PORT/v1/infer/v1" ;;
        policy) echo "http://127.0.0.1:$GW_PORT/v1/policy/v1" ;;
        redis) echo "http://127.0.0.1:$GW_PORT/v1/limited/v1" ;;
        replicas) echo "http://127.0.0.1:$GW_PORT/v1/replicas/v1" ;;
        failover) echo "http://127.0.0.1:$GW_PORT/v1/failover/v1" ;;
        floor) echo "http://127.0.0.1:$FLOOR_PORT/v1/infer/v1" ;;
        pfloor) echo "http://127.0.0.1:$PFLOOR_PORT/v1/infer/v1" ;;
    esac
}
port() { case $1 in direct) echo "$UP_PORT" ;; nginx) echo "$NGX_PORT" ;; *) echo "$GW_PORT" ;; esac; }
token() { case $1 in jwt) echo "$JWT" ;; *) echo "$KEY" ;; esac; }
path() { local u; u=$(url "$1"); echo "/${u#http://*/}"; }
# The process doing the proxying, for CPU per request: nginx's worker, the gateway, the upstream.
server_pid() {
    case $1 in
        direct) echo "$UP_PID" ;;
        nginx) pgrep -P "$NGX_PID" | head -n 1 ;;
        *) echo "$GW_PID" ;;
    esac
}
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

TARGETS="direct nginx key jwt policy redis replicas"
# Every response must be a 200: a proxy answering 401s fast would win otherwise.
for t in $TARGETS; do
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "authorization: Bearer $(token $t)" \
        -H 'content-type: application/json' -d "$CHAT_BODY" "$(url $t)/chat/completions")
    [ "$code" = 200 ] || die "$t: chat request answered $code"
done
code=$(curl -s -o /dev/null -w '%{http_code}' -H "authorization: Bearer nope" -d "$CHAT_BODY" "$(url nginx)/chat/completions")
[ "$code" = 401 ] || die "nginx static bearer check does not refuse a wrong token ($code)"

cat >"$WORK/post.lua" <<EOF
wrk.method = "POST"
wrk.body = '$CHAT_BODY'
wrk.headers["Content-Type"] = "application/json"
EOF

RAW=$WORK/raw.txt
: >"$RAW"
record() { echo "$*" >>"$RAW"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
values() { awk -v k="$1" '$1 == k { print $2 }' "$RAW"; }

run_wrk() { # target seconds → "rps cpu_us_per_request"
    local t=$1 secs=$2 pid before after out rps non2xx
    pid=$(server_pid "$t")
    before=$(cpu_ticks "$pid")
    out=$(taskset -c $CLIENT_CPU wrk -t1 -c"$CONNS" -d"${secs}s" -s "$WORK/post.lua" \
        -H "Authorization: Bearer $(token "$t")" "$(url "$t")/chat/completions")
    after=$(cpu_ticks "$pid")
    non2xx=$(echo "$out" | awk '/Non-2xx/ { print $NF }')
    [ -z "$non2xx" ] || die "$t: $non2xx non-2xx responses under load"
    echo "$out" | grep -q 'Socket errors' && log "$t: $(echo "$out" | grep 'Socket errors')"
    rps=$(echo "$out" | awk '/^Requests\/sec/ { print $2 }')
    awk -v r="$rps" -v s="$secs" -v c="$((after - before))" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%.0f %.2f\n", r, (c / hz) * 1e6 / (r * s) }'
}

log "warming up (each target, 2 s)"
for t in $TARGETS; do run_wrk "$t" 2 >/dev/null; done

log "max throughput: $ROUNDS rounds x ${SECONDS_PER_RUN}s per target, wrk -t1 -c$CONNS"
for r in $(seq 1 "$ROUNDS"); do
    for t in $TARGETS; do
        out=$(run_wrk "$t" "$SECONDS_PER_RUN")
        read -r rps cpu <<<"$out"
        record "rps_$t $rps"
        record "cpu_$t $cpu"
    done
    log "round $r: $(awk -v r="$r" '/^rps_/ { a[$1] = $2 } END { for (k in a) printf "%s=%s ", k, a[k] }' "$RAW")"
done

# target prefix rate conns seconds body-flag body: a fixed-rate loadgen run of chat POSTs,
# recording <prefix>50_<target>, <prefix>99_<target> and <prefix>lag_<target> (µs).
run_rate() {
    local t=$1 prefix=$2 rate=$3 conns=$4 secs=$5 out
    out=$(taskset -c $CLIENT_CPU "$EX/loadgen" rate --addr "127.0.0.1:$(port "$t")" \
        --method POST --path "$(path "$t")/chat/completions" "$6" "$7" \
        --header "authorization: Bearer $(token "$t")" --header "content-type: application/json" \
        --rate "$rate" --conns "$conns" --seconds "$secs" --warmup-s 1)
    set -- $out
    declare -A f=()
    while [ $# -ge 2 ]; do f[$1]=$2; shift 2; done
    [ "${f[errors]}" = 0 ] || die "$t: ${f[errors]} failed requests at $rate req/s"
    record "${prefix}50_$t ${f[p50]}"
    record "${prefix}99_$t ${f[p99]}"
    record "${prefix}lag_$t ${f[lag_p99]}"
}

# Paired rounds: a feature's cost as a ratio that the machine's drift cannot skew. A twin
# gateway (same config, other ports) runs on the same core; one wrk loads "key" on the first,
# another the feature's service on the twin, at the same moment. Each process's CPU time over
# its requests is its cost per request; their ratio is the feature's req/s per core relative
# to "key". (Two loads on one process would not do: a closed-loop client gets its share of
# turns whatever a request costs.)
TWIN_PORT=$(free_port)
sed -e "s/127.0.0.1:$GW_PORT/127.0.0.1:$TWIN_PORT/" -e "s/127.0.0.1:$METRICS_PORT/127.0.0.1:$(free_port)/" \
    -e "s#$WORK/upgrade.sock#$WORK/twin-upgrade.sock#" -e "s#$WORK/portcullis.pid#$WORK/twin.pid#" \
    "$WORK/portcullis.toml" >"$WORK/twin.toml"
RUST_LOG=warn taskset -c $PROXY_CPU "$BIN" serve --config "$WORK/twin.toml" >/dev/null 2>>"$WORK/twin.log" &
TWIN_PID=$!
PIDS+=("$TWIN_PID")
wait_http "http://127.0.0.1:$TWIN_PORT/healthz"
# One paired run: base on process A, target on process B (pids and ports) → the target's
# req/s per core ÷ the base's, from each process's CPU time per request.
pair_once() { # base target seconds pid_a port_a pid_b port_b
    local a b ca0 cb0 ca1 cb1 na nb
    a=$(mktemp) b=$(mktemp)
    ca0=$(cpu_ticks "$4") cb0=$(cpu_ticks "$6")
    taskset -c $CLIENT_CPU wrk -t1 -c32 -d"${3}s" -s "$WORK/post.lua" \
        -H "Authorization: Bearer $(token "$1")" "$(url "$1" | sed "s/:$GW_PORT\//:$5\//")/chat/completions" >"$a" &
    local pa=$!
    taskset -c $CLIENT_CPU wrk -t1 -c32 -d"${3}s" -s "$WORK/post.lua" \
        -H "Authorization: Bearer $(token "$2")" "$(url "$2" | sed "s/:$GW_PORT\//:$7\//")/chat/completions" >"$b"
    wait "$pa"
    ca1=$(cpu_ticks "$4") cb1=$(cpu_ticks "$6")
    for f in "$a" "$b"; do
        ! grep -q Non-2xx "$f" || die "paired run: non-2xx responses: $(grep Non-2xx "$f")"
    done
    na=$(awk '/requests in/ { print $1 }' "$a") nb=$(awk '/requests in/ { print $1 }' "$b")
    rm -f "$a" "$b"
    # (cpu_a / n_a) / (cpu_b / n_b): above 1, the target costs less per request than the base.
    awk -v ca=$((ca1 - ca0)) -v cb=$((cb1 - cb0)) -v na="$na" -v nb="$nb" \
        'BEGIN { if (ca > 0 && cb > 0 && na > 0 && nb > 0) printf "%.4f", (ca / na) / (cb / nb); else print "nan" }'
}
# Both ways round (base on the gateway and the feature on the twin, then the reverse), so a
# difference between the two processes cancels out: the geometric mean of the two.
run_pair() { # base target seconds
    local x y
    x=$(pair_once "$1" "$2" "$3" "$GW_PID" "$GW_PORT" "$TWIN_PID" "$TWIN_PORT")
    y=$(pair_once "$1" "$2" "$3" "$TWIN_PID" "$TWIN_PORT" "$GW_PID" "$GW_PORT")
    awk -v x="$x" -v y="$y" 'BEGIN { printf "%.3f", sqrt(x * y) }'
}
# The engine's floor (issue 13): a bare Pingora ProxyHttp (benches/load/floor.rs) that only
# compares a static bearer, strips the prefix and drops Set-Cookie, on the gateway's core. The
# gateway (engine patches included) is paired with the floor on crates.io's unpatched Pingora;
# the same floor built with the patches, paired with the unpatched one, is what they gain.
FLOOR_PORT=$(free_port) PFLOOR_PORT=$(free_port)
taskset -c $PROXY_CPU "$FLOOR_UNPATCHED" --listen "127.0.0.1:$FLOOR_PORT" --upstream "127.0.0.1:$UP_PORT" \
    --key "$KEY" >"$WORK/floor.log" 2>&1 &
FLOOR_PID=$!
PIDS+=("$FLOOR_PID")
taskset -c $PROXY_CPU "$EX/floor" --listen "127.0.0.1:$PFLOOR_PORT" --upstream "127.0.0.1:$UP_PORT" \
    --key "$KEY" >"$WORK/pfloor.log" 2>&1 &
PFLOOR_PID=$!
PIDS+=("$PFLOOR_PID")
wait_http "http://127.0.0.1:$FLOOR_PORT/"
wait_http "http://127.0.0.1:$PFLOOR_PORT/"
log "paired with the floor: $PAIR_ROUNDS rounds x ${SECONDS_PER_RUN}s, unpatched bare Pingora and Portcullis (key) at once, then the patched floor"
for r in $(seq 1 "$PAIR_ROUNDS"); do
    record "pair_floor $(pair_once floor key "$SECONDS_PER_RUN" "$FLOOR_PID" "$FLOOR_PORT" "$GW_PID" "$GW_PORT")"
    record "pair_engine $(pair_once floor pfloor "$SECONDS_PER_RUN" "$FLOOR_PID" "$FLOOR_PORT" "$PFLOOR_PID" "$PFLOOR_PORT")"
done
log "Portcullis ÷ unpatched floor, req/s per core: $(values pair_floor | tr '\n' ' ')"
log "patched ÷ unpatched floor, req/s per core: $(values pair_engine | tr '\n' ' ')"
kill "$FLOOR_PID" "$PFLOOR_PID" 2>/dev/null || true

PAIRED="replicas redis policy"
log "paired: $PAIR_ROUNDS rounds x ${SECONDS_PER_RUN}s of key and each of $PAIRED at once"
for r in $(seq 1 "$PAIR_ROUNDS"); do
    for t in $PAIRED; do
        record "pair_$t $(run_pair key "$t" "$SECONDS_PER_RUN")"
    done
    log "paired round $r: $(for t in $PAIRED; do printf '%s=%s ' "$t" "$(values "pair_$t" | tail -n 1)"; done)"
done
kill -INT "$TWIN_PID" 2>/dev/null || true

log "latency at $RATE req/s: $RATE_ROUNDS rounds x ${RATE_SECONDS}s per target (loadgen rate, 16 connections)"
for r in $(seq 1 "$RATE_ROUNDS"); do
    for t in $TARGETS; do
        run_rate "$t" p "$RATE" 16 "$RATE_SECONDS" --body "$CHAT_BODY"
    done
done

# Failover: one stream held on the live replica, so least_requests always tries the dead one
# first; portcullis_upstream_connect_failures_total counts the failovers. At a low rate, so
# the figure is the failover's own latency, not the queueing of a loaded core.
connect_failures() {
    curl -s "http://127.0.0.1:$METRICS_PORT/metrics" |
        awk '/^portcullis_upstream_connect_failures_total\{.*service="failover"/ { n += $2 } END { print n + 0 }'
}
curl -sN -H "authorization: Bearer $KEY" -H 'content-type: application/json' -d "$CHAT_BODY" \
    "$(url failover)/sse" >/dev/null &
HELD=$!
PIDS+=("$HELD")
sleep 0.5
FAILURES_BEFORE=$(connect_failures)
log "failover latency at $FAILOVER_RATE req/s: $FAILOVER_ROUNDS rounds x ${RATE_SECONDS}s, one replica vs a dead one first"
for r in $(seq 1 "$FAILOVER_ROUNDS"); do
    for t in key failover; do
        run_rate "$t" f "$FAILOVER_RATE" 4 "$RATE_SECONDS" --body "$CHAT_BODY"
    done
done
FAILOVERS=$(($(connect_failures) - FAILURES_BEFORE))
kill "$HELD" 2>/dev/null || true

# Target "redis" must really have been decided by Redis, never by the per-process fallback.
EVALSHA_CALLS=$(redis-cli -p "$REDIS_PORT" info commandstats | awk -F'[:=,]' '$1 == "cmdstat_evalsha" { print $3 }')
REDIS_FALLBACKS=$(grep -c 'rate limits: Redis at .* unavailable' "$WORK/gateway.log" || true)
[ "${REDIS_FALLBACKS:-0}" = 0 ] || log "warning: the gateway fell back to per-process limits $REDIS_FALLBACKS time(s)"

log "SSE response head: $SSE_ROUNDS rounds x $SSE_COUNT sequential streams per target"
for r in $(seq 1 "$SSE_ROUNDS"); do
    for t in direct nginx key; do
        out=$(taskset -c $CLIENT_CPU "$EX/loadgen" sse-head --addr "127.0.0.1:$(port "$t")" \
            --method POST --path "$(path "$t")/sse?ticks=3" --body "$CHAT_BODY" \
            --header "authorization: Bearer $(token "$t")" --header "content-type: application/json" \
            --count "$SSE_COUNT" --warmup 200)
        record "ssehead_$t $(echo "$out" | awk '{ for (i = 1; i < NF; i++) if ($i == "p50") print $(i + 1) }')"
    done
done

# A 2 MB vision request (one base64 PNG-sized image part) with and without the model policy:
# the policy reads the whole body before sending it on, so its cost shows in the latency.
python3 - "$WORK/vision.json" <<'PY'
import base64, json, os, sys
image = base64.b64encode(os.urandom(1536 * 1024)).decode()
body = {"model": "bench", "max_tokens": 16, "messages": [{"role": "user", "content": [
    {"type": "text", "text": "What is in this image?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}}]}]}
open(sys.argv[1], "w").write(json.dumps(body))
PY
VISION_BYTES=$(stat -c %s "$WORK/vision.json")
log "2 MB vision body ($VISION_BYTES bytes) at $VISION_RATE req/s: $RATE_ROUNDS rounds x ${VISION_SECONDS}s, policy off and on"
for r in $(seq 1 "$RATE_ROUNDS"); do
    for t in key policy; do
        run_rate "$t" vision "$VISION_RATE" 4 "$VISION_SECONDS" --body-file "$WORK/vision.json"
    done
done

LOADED_RSS=$(status_kb "$GW_PID" VmRSS)
LOADED_HWM=$(status_kb "$GW_PID" VmHWM)
stop_gateway

log "open streams: $STREAM_ROUNDS rounds of $STREAMS held SSE streams, each on a fresh gateway"
for r in $(seq 1 "$STREAM_ROUNDS"); do
    start_gateway
    sleep 1
    record "idle_rss $(status_kb "$GW_PID" VmRSS)"
    record "idle_hwm $(status_kb "$GW_PID" VmHWM)"
    out=$(taskset -c $CLIENT_CPU "$EX/loadgen" streams --addr "127.0.0.1:$GW_PORT" \
        --method POST --path "/v1/infer/v1/sse" --body "$CHAT_BODY" \
        --header "authorization: Bearer $KEY" --header "content-type: application/json" \
        --count "$STREAMS" --pid "$GW_PID" --hold-s 2)
    set -- $out
    declare -A f=()
    while [ $# -ge 2 ]; do f[$1]=$2; shift 2; done
    [ "${f[failed]}" = 0 ] || log "round $r: ${f[failed]} of $STREAMS streams failed to open"
    record "streams_open ${f[opened]}"
    record "streams_rss ${f[rss_kb]}"
    record "streams_hwm ${f[hwm_kb]}"
    record "streams_open_s ${f[open_s]}"
    unset f
    stop_gateway
    sleep 1
done

# Instructions per request (deterministic where the rounds above drift): the floor (same
# engine as the gateway) and the gateway under callgrind, and the gateway's hooks.
log "instructions per request: scripts/callgrind.sh"
BIN=$BIN EX=$EX OUT=$ROOT/bench-results/callgrind scripts/callgrind.sh >"$WORK/callgrind.txt" ||
    die "scripts/callgrind.sh failed"
while read -r k v; do record "$k $v"; done <"$WORK/callgrind.txt"

# ---- report --------------------------------------------------------------------------------
m() { values "$1" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
ms() { awk -v u="$1" 'BEGIN { printf "%.3f", u / 1000 }'; }
mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
int() { awk -v v="$1" 'BEGIN { printf "%.0f", v }'; }
ok() { if awk "BEGIN { exit !($1) }"; then echo met; else echo "**missed**"; fi; }

D=$(m rps_direct) N=$(m rps_nginx) K=$(m rps_key) J=$(m rps_jwt) P=$(m rps_policy) R=$(m rps_redis)
RR=$(m rps_replicas)
PR=$(m pair_replicas) PD=$(m pair_redis) PP=$(m pair_policy) PF=$(m pair_floor) PE=$(m pair_engine)
IRF=$(m ir_floor) IRK=$(m ir_key)
HOOKS=$(awk '$1 ~ /^hook_/ && $2 > 0 { sub(/^hook_/, "", $1); printf "%s%s %d", sep, $1, $2; sep = ", " }' "$WORK/callgrind.txt")
F0=$(m f50_key) F1=$(m f50_failover)
FADD=$(awk -v a="$F1" -v b="$F0" 'BEGIN { printf "%.0f", a - b }')
V0=$(m vision50_key) V1=$(m vision50_policy)
VADD=$(awk -v a="$V1" -v b="$V0" 'BEGIN { printf "%.0f", a - b }')
SH=$(m ssehead_key)
IH=$(m idle_hwm) SR=$(m streams_hwm) SO=$(m streams_open)
# Memory per held stream: what the streams added over the idle gateway, per stream opened.
PERSTREAM=$(awk -v s="$SR" -v i="$IH" -v n="$SO" 'BEGIN { if (n > 0) printf "%.1f", (s - i) / n; else print 0 }')
# Per-stream cost from the measured count, scaled to 10,000 when the fd limit forced fewer.
S10K=$(awk -v s="$SR" -v i="$IH" -v n="$SO" 'BEGIN { if (n > 0) printf "%.0f", i + (s - i) * 10000 / n; else print 0 }')
ELAPSED=$(($(date +%s) - BEGIN))
OUT=$ROOT/bench-results
mkdir -p "$OUT"
{
    echo "Portcullis load benchmark, $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo '+dirty'),"
    echo "$(nproc) cores ($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), Linux $(uname -r), load average at start $LOAD_AT_START."
    echo "Proxy under test on core $PROXY_CPU; wrk/loadgen and the upstream on core $CLIENT_CPU. Medians of"
    echo "$ROUNDS rounds (throughput), $RATE_ROUNDS (fixed rate), $SSE_ROUNDS (SSE head), $STREAM_ROUNDS (RSS)."
    echo
    echo "| measure | direct | nginx (static key) | Portcullis | ÷ direct | ÷ nginx | target | |"
    echo "|---|---:|---:|---:|---:|---:|---|---|"
    echo "| max req/s, chat POST, API key | $(int "$D") | $(int "$N") | $(int "$K") | $(ratio "$K" "$D") | $(ratio "$K" "$N") | ≥ 0.6× direct, ≥ 1.0× nginx | $(ok "$K >= 0.6 * $D") / $(ok "$K >= $N") |"
    echo "| max req/s, chat POST, JWT (RS256) | | | $(int "$J") | $(ratio "$J" "$D") | $(ratio "$J" "$N") | ≥ 0.9× API key ($(ratio "$J" "$K")×) | $(ok "$J >= 0.9 * $K") |"
    echo "| max req/s, chat POST, api = \"openai\" + model policy | | | $(int "$P") | $(ratio "$P" "$D") | $(ratio "$P" "$N") | ≥ 0.9× without ($(ratio "$P" "$K")×) | $(ok "$P >= 0.9 * $K") |"
    echo "| max req/s, chat POST, rate limit shared through Redis | | | $(int "$R") | $(ratio "$R" "$D") | $(ratio "$R" "$N") | ≥ 0.8× without ($(ratio "$R" "$K")×) | $(ok "$R >= 0.8 * $K") |"
    echo "| max req/s, chat POST, three replicas (least_requests) | | | $(int "$RR") | $(ratio "$RR" "$D") | $(ratio "$RR" "$N") | | |"
    echo "| paired req/s per core ÷ the bare-Pingora floor (unpatched), API key | | | ${PF}× | | | ≥ 1.0× (issue 13) | $(ok "$PF >= 1.0") |"
    echo "| … the floor with vendor/patches ÷ without (the engine patches' gain) | | | ${PE}× | | | | |"
    echo "| instructions per request (callgrind): floor $(int "$IRF"), Portcullis | | | $(int "$IRK") | | | $(ratio "$IRK" "$IRF")× the floor | |"
    echo "| paired req/s ÷ one replica, three replicas | | | ${PR}× | | | within 5% | $(ok "$PR >= 0.95") |"
    echo "| paired req/s ÷ without, Redis rate limit | | | ${PD}× | | | ≥ 0.8× | $(ok "$PD >= 0.8") |"
    echo "| paired req/s ÷ without, model policy | | | ${PP}× | | | ≥ 0.9× | $(ok "$PP >= 0.9") |"
    echo "| p50 at $FAILOVER_RATE req/s, dead replica first, one failover each (ms) | | | $(ms "$F1") | | | added ≤ 1 ms ($(ms "$FADD") over $(ms "$F0")) | $(ok "$FADD <= 1000") |"
    echo "| proxy CPU per request, API key (µs) | $(m cpu_direct) | $(m cpu_nginx) | $(m cpu_key) | $(ratio "$(m cpu_key)" "$(m cpu_direct)") | $(ratio "$(m cpu_key)" "$(m cpu_nginx)") | | |"
    echo "| proxy CPU per request, JWT (µs) | | | $(m cpu_jwt) | $(ratio "$(m cpu_jwt)" "$(m cpu_direct)") | $(ratio "$(m cpu_jwt)" "$(m cpu_nginx)") | | |"
    echo "| p50 at $RATE req/s, API key (ms) | $(ms "$(m p50_direct)") | $(ms "$(m p50_nginx)") | $(ms "$(m p50_key)") | $(ratio "$(m p50_key)" "$(m p50_direct)") | $(ratio "$(m p50_key)" "$(m p50_nginx)") | | |"
    echo "| p99 at $RATE req/s, API key (ms) | $(ms "$(m p99_direct)") | $(ms "$(m p99_nginx)") | $(ms "$(m p99_key)") | $(ratio "$(m p99_key)" "$(m p99_direct)") | $(ratio "$(m p99_key)" "$(m p99_nginx)") | | |"
    echo "| p50 / p99 at $RATE req/s, JWT (ms) | | | $(ms "$(m p50_jwt)") / $(ms "$(m p99_jwt)") | | | | |"
    echo "| p50 / p99 at $RATE req/s, model policy (ms) | | | $(ms "$(m p50_policy)") / $(ms "$(m p99_policy)") | | | | |"
    echo "| p50 / p99 at $RATE req/s, Redis rate limit (ms) | | | $(ms "$(m p50_redis)") / $(ms "$(m p99_redis)") | | | | |"
    echo "| proxy CPU per request, Redis rate limit (µs) | | | $(m cpu_redis) | | | ($(ratio "$(m cpu_redis)" "$(m cpu_key)")× without) | |"
    echo "| 2 MB vision body p50, policy off / on (ms) | | | $(ms "$V0") / $(ms "$V1") | | | added ≤ 2 ms ($(ms "$VADD")) | $(ok "$VADD <= 2000") |"
    echo "| SSE response head p50 (ms) | $(ms "$(m ssehead_direct)") | $(ms "$(m ssehead_nginx)") | $(ms "$SH") | $(ratio "$SH" "$(m ssehead_direct)") | $(ratio "$SH" "$(m ssehead_nginx)") | ≤ 0.2 ms | $(ok "$SH <= 200") |"
    echo "| memory per held SSE stream (KB) | | | $PERSTREAM | | | ≤ 30 KB (issue 13) | $(ok "$PERSTREAM <= 30") |"
    echo "| gateway peak RSS idle (MB) | | | $(mb "$IH") | | | ≤ 30 MB | $(ok "$IH <= 30 * 1024") |"
    if [ "$SO" -ge 10000 ] 2>/dev/null; then
        echo "| gateway peak RSS, 10,000 open SSE streams (MB) | | | $(mb "$SR") | | | ≤ 150 MB | $(ok "$SR <= 150 * 1024") |"
    else
        echo "| gateway peak RSS, $SO open SSE streams (MB) | | | $(mb "$SR") | | | | |"
        echo "| … scaled to 10,000 streams (MB) | | | $(mb "$S10K") | | | ≤ 150 MB | $(ok "$S10K <= 150 * 1024") |"
    fi
    echo
    echo "Ratios are Portcullis ÷ the column: above 1 is better for req/s, worse for CPU and latency."
    echo
    echo "Method: max req/s is wrk 4.1 (\`-t1 -c$CONNS\`, ${SECONDS_PER_RUN} s runs, after a warm-up), POST of a"
    echo "${#CHAT_BODY}-byte chat body answered by a ~300-byte JSON; every response checked to be 200. Proxy CPU"
    echo "is the proxy process's user+system time over the run divided by its requests (direct: the"
    echo "upstream's). p50/p99 come from \`loadgen rate\` (benches/load/loadgen.rs): 16 kept-alive connections"
    echo "on an open-loop schedule totalling $RATE req/s for ${RATE_SECONDS} s after 1 s of warm-up, each latency from"
    echo "the request's write to the response's last byte. SSE head: sequential streaming requests on one"
    echo "kept-alive connection, time from the write to the complete response head, $SSE_COUNT per round."
    echo "RSS: VmHWM from /proc of a fresh gateway 1 s after start (idle), and with all streams open"
    echo "(each held by the upstream, one event every 5 s), $STREAMS requested per round."
    echo "Model policy: service \`policy\` (api = \"openai\", a default and an alias; the bench body names"
    echo "the alias, so every request is validated and rewritten and its usage read) on the same upstream"
    echo "as \`infer\`. Redis rate limit: service \`limited\` (rate_limit_per_minute = 100000000, nothing"
    echo "refused) with [rate_limits] redis, a redis-server $(redis-server --version | awk '{ print $3 }' | tr -d v=) on the client core; it answered"
    echo "${EVALSHA_CALLS:-0} EVALSHA calls, and the gateway fell back to per-process limits ${REDIS_FALLBACKS:-0} time(s)."
    echo "Paired: the gateway and a twin (same config) on the same core, two \`wrk -t1 -c32\` at once for"
    echo "${SECONDS_PER_RUN} s, one on \`infer\` of one process, one on the feature's service of the other, then the"
    echo "reverse; each process's CPU time per request, their ratio as req/s per core (geometric mean of the"
    echo "two ways round), median of $PAIR_ROUNDS rounds (sequential rounds drift ±15% here)."
    echo "Floor: benches/load/floor.rs, a bare Pingora \`ProxyHttp\` (static bearer compare, prefix strip,"
    echo "Set-Cookie dropped, one worker thread) on crates.io's Pingora (benches/floor/), paired with the"
    echo "gateway's \`infer\` on the same core; the same floor built with vendor/patches paired with it gives"
    echo "the patches' gain. Instructions: scripts/callgrind.sh, ${CG_REQUESTS:-2000} sequential chat POSTs on one"
    echo "connection after 300, each process under valgrind --tool=callgrind (valgrind hides SHA-NI, so the"
    echo "API key's SHA-256 counts as the software version, ~3,500 of the gateway's instructions). Our hooks"
    echo "(inclusive, per request): $HOOKS. Memory per stream: (peak RSS with the streams − idle) ÷ streams."
    echo "Replicas: service \`replicas\` lists the fast upstream on 127.0.0.1, .2 and .3 (one process)."
    echo "Failover: service \`failover\` lists a port where nothing listens before the live upstream;"
    echo "with one stream held on the live one, least_requests tries the dead one first: $FAILOVERS failed"
    echo "connects counted for $(awk -v r="$FAILOVER_RATE" -v s="$RATE_SECONDS" -v n="$FAILOVER_ROUNDS" 'BEGIN { printf "%.0f", r * (s + 1) * n }') requests (4 connections, $FAILOVER_RATE req/s)."
    echo "Vision: \`loadgen rate\` at $VISION_RATE req/s on 4 connections, a $VISION_BYTES-byte chat body."
    echo "Gateway: \`threads = 1\`, access log $ACCESS_LOG, RUST_LOG=warn; nginx 1.22:"
    echo "\`worker_processes 1\`, upstream keepalive 128, access_log off, proxy_buffering off."
    [ "$FD_LIMIT" -ge 20200 ] || echo "Open-file hard limit here: $FD_LIMIT (two sockets per proxied stream)."
    echo "Gateway RSS after the load rounds: $(mb "$LOADED_RSS") MB (peak $(mb "$LOADED_HWM") MB). Whole run: ${ELAPSED} s."
} >"$OUT/latest.md"
cp "$RAW" "$OUT/latest-raw.txt"
cat "$OUT/latest.md"
