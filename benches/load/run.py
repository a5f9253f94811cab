#!/usr/bin/env python3
"""Load benchmark (`make bench`): Portcullis against the same upstream hit directly and behind
nginx with a static bearer check, all on loopback, in one invocation.

Placement: the proxy under test (Portcullis or nginx) runs alone on core 0 (taskset -c 0); the
load generator and the fast upstream share core 1. "direct" is the same client and upstream
with no proxy: the ceiling this machine's other core can drive.

Reports a markdown table (stdout and bench-results/latest.md; raw rounds in
bench-results/latest-raw.txt). Knobs (environment): see Settings below; KEEP_WORK=1 keeps the
temporary directory (configs, logs) after the run.

Targets besides "direct", "nginx", "key" (API key) and "jwt" (RS256):
- "policy": the same upstream behind a service with api = "openai" and a model policy
  (validation, default model, usage accounting); its cost is measured against "key".
- "redis": a service with rate_limit_per_minute (set so high nothing is refused) shared through
  a local redis-server ([rate_limits] redis: one EVALSHA round trip per request).
- "replicas": a service over three replicas (the fast upstream listening on 127.0.0.1-3,
  least_requests). "failover" lists a dead replica (connects refused) before the live one, and
  one stream held on the live replica keeps least_requests choosing the dead one first, so every
  request fails over; its latency at FAILOVER_RATE is compared with "key".
- "floor" / "pfloor": a bare Pingora ProxyHttp on crates.io's Pingora and on the patched engine,
  paired with the gateway on the same core (the engine's floor, and what the patches gain).
"""

import base64
import datetime
import json
import math
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import (
    CLK_TCK,
    BenchError,
    Log,
    Processes,
    apt_install,
    child_pids,
    cpu_ticks,
    exit_on_signals,
    free_port,
    http_get_text,
    http_status,
    pairs,
    read_text,
    require,
    split_url,
    status_kb,
    wait_http,
    wait_line,
)
import callgrind
import configs
import report

ROOT = Path(__file__).resolve().parents[2]

# ---- the binaries and how they are built: the one place to change when a tool moves ----------
TARGET = ROOT / "target"
GATEWAY = TARGET / "release" / "portcullis"
EXAMPLES = TARGET / "release" / "examples"
FAST_UPSTREAM = "fast_upstream"
BENCH_IDP = "bench_idp"
LOADGEN = "loadgen"
FLOOR = TARGET / "release" / "floor"  # benches/floor, a workspace member: the patched engine
FLOOR_SOURCE = ROOT / "benches" / "floor"
FLOOR_UNPATCHED_TARGET = TARGET / "floor-unpatched"
FLOOR_UNPATCHED = FLOOR_UNPATCHED_TARGET / "release" / "floor"
BUILDS = [
    ["cargo", "build", "--release", "--quiet"],  # the gateway
    ["cargo", "build", "--release", "--quiet", "--examples"],  # fast_upstream, bench_idp, loadgen
    ["cargo", "build", "--release", "--quiet", "-p", "portcullis-floor"],
]


@dataclass
class Tools:
    gateway: Path
    fast_upstream: Path
    bench_idp: Path
    loadgen: Path
    floor: Path
    floor_unpatched: Path

    @classmethod
    def built(cls, gateway=None, examples=None, floor=None):
        """The binaries where the builds above leave them, or where the arguments say."""
        examples = Path(examples or EXAMPLES)
        return cls(
            gateway=Path(gateway or GATEWAY),
            fast_upstream=examples / FAST_UPSTREAM,
            bench_idp=examples / BENCH_IDP,
            loadgen=examples / LOADGEN,
            floor=Path(floor or FLOOR),
            floor_unpatched=FLOOR_UNPATCHED,
        )


def build(log, unpatched_floor=True):
    floors = "the floor twice" if unpatched_floor else "the floor"
    log(f"building (cargo build --release; the load tools as release examples; {floors})")
    for command in BUILDS:
        subprocess.run(command, cwd=ROOT, check=True)
    if unpatched_floor:
        build_unpatched_floor()


def build_unpatched_floor():
    """The floor on crates.io's Pingora, without vendor/patches: a copy of benches/floor made its
    own workspace, so the root's [patch.crates-io] does not apply, pinned by the root Cargo.lock
    and built with the root's release profile (the one the gateway and the patched floor get).
    The copy lives at a fixed place and is rewritten only where it changed, so that cargo's
    incremental build still holds."""
    copy = FLOOR_UNPATCHED_TARGET / "workspace"
    (copy / "src").mkdir(parents=True, exist_ok=True)
    for src in (FLOOR_SOURCE / "src").rglob("*"):
        dst = copy / "src" / src.relative_to(FLOOR_SOURCE / "src")
        if src.is_dir():
            dst.mkdir(exist_ok=True)
        elif not dst.exists() or dst.read_bytes() != src.read_bytes():
            shutil.copy2(src, dst)
    manifest = (FLOOR_SOURCE / "Cargo.toml").read_text()
    manifest += "\n[workspace]\n\n" + toml_table((ROOT / "Cargo.toml").read_text(), "profile.release")
    write_if_changed(copy / "Cargo.toml", manifest)
    shutil.copyfile(ROOT / "Cargo.lock", copy / "Cargo.lock")
    # The root lock holds pingora-core as the vendored path crate: let cargo add crates.io's copy
    # (the other versions stay as locked), then pin it to the vendored version, so that the two
    # floors differ by vendor/patches only.
    subprocess.run(["cargo", "update", "--quiet", "--workspace"], cwd=copy, check=True)
    version = toml_value((ROOT / "vendor" / "pingora-core" / "Cargo.toml").read_text(), "package", "version")
    subprocess.run(
        ["cargo", "update", "--quiet", "-p", "pingora-core", "--precise", version], cwd=copy, check=True
    )
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "--target-dir", str(FLOOR_UNPATCHED_TARGET)],
        cwd=copy,
        check=True,
    )


def toml_table(text, name):
    """The `[name]` table of a TOML file as text (header included), "" when absent."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("["):
            inside = line.strip() == f"[{name}]"
        if inside:
            lines.append(line)
    while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith("#")):
        lines.pop()  # blank lines and the next table's comment
    return "\n".join(lines) + "\n" if lines else ""


def toml_value(text, table, key):
    m = re.search(rf'^{key}\s*=\s*"([^"]*)"', toml_table(text, table), re.M)
    if not m:
        raise BenchError(f"no {key} in [{table}]")
    return m.group(1)


def write_if_changed(path, text):
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


# ---- knobs ----------------------------------------------------------------------------------
def knob(name, default):
    return int(os.environ.get(name) or default)


@dataclass
class Settings:
    rounds: int  # max-throughput rounds
    seconds_per_run: int  # each wrk run, paired runs too
    conns: int  # wrk connections
    rate: int  # fixed-rate latency test, req/s
    rate_seconds: int
    rate_rounds: int  # also the vision rounds
    pair_rounds: int
    failover_rate: int
    failover_rounds: int
    sse_count: int
    sse_rounds: int
    streams: int  # capped by the open-file hard limit
    stream_rounds: int
    vision_rate: int  # req/s of a 2 MB vision body
    vision_seconds: int
    cg_requests: int  # callgrind: counted requests
    cg_warmup: int
    keep_work: bool

    @classmethod
    def from_env(cls):
        return cls(
            rounds=knob("ROUNDS", 5),
            seconds_per_run=knob("SECONDS_PER_RUN", 5),
            conns=knob("CONNS", 64),
            rate=knob("RATE", 2000),
            rate_seconds=knob("RATE_SECONDS", 5),
            rate_rounds=knob("RATE_ROUNDS", 3),
            pair_rounds=knob("PAIR_ROUNDS", 5),
            failover_rate=knob("FAILOVER_RATE", 200),
            failover_rounds=knob("FAILOVER_ROUNDS", 5),
            sse_count=knob("SSE_COUNT", 2000),
            sse_rounds=knob("SSE_ROUNDS", 3),
            streams=knob("STREAMS", 10000),
            stream_rounds=knob("STREAM_ROUNDS", 3),
            vision_rate=knob("VISION_RATE", 20),
            vision_seconds=knob("VISION_SECONDS", 5),
            cg_requests=knob("CG_REQUESTS", 2000),
            cg_warmup=knob("CG_WARMUP", 300),
            keep_work=bool(os.environ.get("KEEP_WORK")),
        )


PROXY_CPU = 0
CLIENT_CPU = 1
CHAT_BODY = '{"model":"bench","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
TARGETS = ["direct", "nginx", "key", "jwt", "policy", "redis", "replicas"]
PAIRED = ["replicas", "redis", "policy"]
# The gateway's service behind each target.
SERVICES = {
    "key": "infer", "jwt": "infer", "policy": "policy", "redis": "limited",
    "replicas": "replicas", "failover": "failover",
}


# ---- output of the load tools -------------------------------------------------------------
def parse_wrk(out):
    """wrk's text → {rps, requests, non2xx, socket_errors} (the last two None when absent)."""

    def find(pattern):
        m = re.search(pattern, out, re.M)
        return m.group(1) if m else None

    return {
        "rps": find(r"^Requests/sec:\s+(\S+)"),
        "requests": find(r"^\s*(\d+) requests in"),
        "non2xx": find(r"Non-2xx or 3xx responses:\s*(\d+)"),
        "socket_errors": find(r"^\s*(Socket errors:.*)$"),
    }


def wrk_command(url, token, seconds, conns, script):
    return [
        "taskset", "-c", str(CLIENT_CPU), "wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "-s", str(script),
        "-H", f"Authorization: Bearer {token}", f"{url}/chat/completions",
    ]


def json_headers(token):
    return ["--header", f"authorization: Bearer {token}", "--header", "content-type: application/json"]


class Bench:
    """One run: starts everything, measures each stage into `raw`, writes the report."""

    def __init__(self, settings, tools, work, procs, log):
        self.s, self.tools, self.work, self.procs, self.log = settings, tools, work, procs, log
        self.raw = report.Raw(work / "raw.txt")
        self.facts = {}

    # ---- the servers ----------------------------------------------------------------------
    def raise_fd_limit(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by the children
        except (ValueError, OSError):
            pass
        self.fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        # Each stream through the gateway holds two sockets (client side and upstream side).
        max_streams = (self.fd_limit - 100) // 2
        if self.s.streams > max_streams:
            self.log(f"open-file limit {self.fd_limit}: {max_streams} streams, not {self.s.streams}")
            self.s.streams = max_streams

    def start_upstream_and_idp(self):
        self.up_port = free_port()
        self.upstream = self.procs.start(
            [self.tools.fast_upstream, "--port", self.up_port, "--hosts", "3",
             "--tick-ms", "5000", "--max-life-s", "1800"],
            cpu=CLIENT_CPU, stdout=self.work / "upstream.log", stderr=subprocess.STDOUT,
        )
        wait_line(self.work / "upstream.log", "listening")
        self.procs.start([self.tools.bench_idp, "--max-life-s", "1800"], cpu=CLIENT_CPU,
                         stdout=self.work / "idp.log", stderr=subprocess.STDOUT)
        self.issuer = wait_line(self.work / "idp.log", "issuer")
        self.jwt = wait_line(self.work / "idp.log", "token")

    def start_redis(self):
        """Redis for target "redis": on the client core, like any service the gateway calls;
        no persistence."""
        self.redis_port = free_port()
        self.procs.start(
            ["redis-server", "--port", self.redis_port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.work],
            cpu=CLIENT_CPU, stdout=self.work / "redis.log", stderr=subprocess.STDOUT,
        )
        for _ in range(100):
            if self.redis_cli("ping").strip() == "PONG":
                return
            time.sleep(0.1)
        raise BenchError(f"redis-server did not start: {read_text(self.work / 'redis.log')}")

    def redis_cli(self, *args):
        done = subprocess.run(["redis-cli", "-p", str(self.redis_port), *args], capture_output=True, text=True)
        return done.stdout

    def gateway_config(self, access_log_off):
        return configs.gateway(self.work, self.gw_port, self.metrics_port, self.up_port, self.dead_port,
                               self.redis_port, self.issuer, access_log_off)

    def configure_gateway(self):
        self.gw_port = free_port()
        self.dead_port = free_port()  # nothing listens there: connects are refused at once
        self.metrics_port = free_port()
        self.config = self.work / "portcullis.toml"
        self.config.write_text(self.gateway_config(access_log_off=True))
        self.access_log = "off"
        if not self.config_ok():
            self.access_log = "not switchable in this build (stdout to /dev/null)"
            self.config.write_text(self.gateway_config(access_log_off=False))
            if not self.config_ok():
                raise BenchError("generated gateway config refused")
        self.key = callgrind.create_key(self.tools.gateway, self.config, "bench")

    def config_ok(self):
        done = subprocess.run([str(self.tools.gateway), "serve", "--config", str(self.config), "-t"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return done.returncode == 0

    def start_gateway(self, config=None, port=None, log_name="gateway.log"):
        proc = self.procs.start(
            [self.tools.gateway, "serve", "--config", config or self.config],
            cpu=PROXY_CPU, stderr=self.work / log_name, env={"RUST_LOG": "warn"},
        )
        wait_http(f"http://127.0.0.1:{port or self.gw_port}/healthz")
        return proc

    def start_nginx(self):
        """nginx: a plain reverse proxy with a static bearer check and the gateway's rewriting."""
        self.nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.ngx_port = free_port()
        d = self.work / "nginx"
        (d / "tmp").mkdir(parents=True)
        conf = d / "nginx.conf"
        conf.write_text(configs.nginx(d, self.fd_limit, self.up_port, self.ngx_port, self.key))
        args = [self.nginx, "-p", d, "-c", conf, "-e", d / "error.log"]
        if subprocess.run([str(a) for a in [args[0], "-t", "-q", *args[1:]]]).returncode != 0:
            raise BenchError(f"nginx refused its config: {read_text(d / 'error.log')}")
        self.ngx = self.procs.start(args, cpu=PROXY_CPU)
        wait_http(f"http://127.0.0.1:{self.ngx_port}/")
        version = subprocess.run([self.nginx, "-v"], capture_output=True, text=True).stderr
        m = re.search(r"nginx/(\d+\.\d+)", version)
        self.facts["nginx_version"] = m.group(1) if m else "(version unknown)"

    # ---- targets --------------------------------------------------------------------------
    def url(self, target, gw_port=None):
        """The chat endpoint's base URL of a target; gw_port picks the gateway or its twin."""
        if target == "direct":
            return f"http://127.0.0.1:{self.up_port}/v1"
        if target == "nginx":
            return f"http://127.0.0.1:{self.ngx_port}/v1/infer/v1"
        if target == "floor":
            return f"http://127.0.0.1:{self.floor_port}/v1/infer/v1"
        if target == "pfloor":
            return f"http://127.0.0.1:{self.pfloor_port}/v1/infer/v1"
        return f"http://127.0.0.1:{gw_port or self.gw_port}/v1/{SERVICES[target]}/v1"

    def port(self, target):
        return split_url(self.url(target))[1]

    def path(self, target):
        return split_url(self.url(target))[2]

    def token(self, target):
        return self.jwt if target == "jwt" else self.key

    def server_pid(self, target):
        """The process doing the proxying, for CPU per request: nginx's worker, the gateway,
        the upstream."""
        if target == "direct":
            return self.upstream.pid
        if target == "nginx":
            workers = child_pids(self.ngx.pid)
            if not workers:
                raise BenchError("nginx has no worker process")
            return workers[0]
        return self.gateway.pid

    def check_targets(self):
        """Every response must be a 200: a proxy answering 401s fast would win otherwise."""
        for t in TARGETS:
            code = self.post_status(t, self.token(t))
            if code != 200:
                raise BenchError(f"{t}: chat request answered {code}")
        code = self.post_status("nginx", "nope")
        if code != 401:
            raise BenchError(f"nginx static bearer check does not refuse a wrong token ({code})")

    def post_status(self, target, token):
        host, port, path = split_url(self.url(target))
        return http_status(host, port, f"{path}/chat/completions", method="POST", body=CHAT_BODY,
                           headers={"authorization": f"Bearer {token}", "content-type": "application/json"})

    # ---- max throughput (wrk) --------------------------------------------------------------
    def run_wrk(self, target, seconds):
        """One wrk run → (req/s, the proxy's CPU µs per request), both as printed."""
        pid = self.server_pid(target)
        before = cpu_ticks(pid)
        out = subprocess.run(
            wrk_command(self.url(target), self.token(target), seconds, self.s.conns, self.lua),
            capture_output=True, text=True, check=True,
        ).stdout
        after = cpu_ticks(pid)
        w = parse_wrk(out)
        if w["non2xx"]:
            raise BenchError(f"{target}: {w['non2xx']} non-2xx responses under load")
        if w["socket_errors"]:
            self.log(f"{target}: {w['socket_errors']}")
        if not w["rps"]:
            raise BenchError(f"{target}: no Requests/sec in wrk's output: {out}")
        rps = float(w["rps"])
        cpu_us = (after - before) / CLK_TCK * 1e6 / (rps * seconds) if rps > 0 else math.nan
        return "%.0f" % rps, "%.2f" % cpu_us

    def max_throughput(self):
        self.lua = self.work / "post.lua"
        self.lua.write_text(
            f'wrk.method = "POST"\nwrk.body = \'{CHAT_BODY}\'\nwrk.headers["Content-Type"] = "application/json"\n'
        )
        self.log("warming up (each target, 2 s)")
        for t in TARGETS:
            self.run_wrk(t, 2)
        s = self.s
        self.log(f"max throughput: {s.rounds} rounds x {s.seconds_per_run}s per target, wrk -t1 -c{s.conns}")
        for r in range(1, s.rounds + 1):
            for t in TARGETS:
                rps, cpu = self.run_wrk(t, s.seconds_per_run)
                self.raw.record(f"rps_{t}", rps)
                self.raw.record(f"cpu_{t}", cpu)
            self.log(f"round {r}: " + " ".join(f"rps_{t}={self.raw.values(f'rps_{t}')[-1]}" for t in TARGETS))

    # ---- paired rounds ----------------------------------------------------------------------
    # A feature's cost as a ratio that the machine's drift cannot skew. A twin gateway (same
    # config, other ports) runs on the same core; one wrk loads "key" on the first, another the
    # feature's service on the twin, at the same moment. Each process's CPU time over its
    # requests is its cost per request; their ratio is the feature's req/s per core relative to
    # "key". (Two loads on one process would not do: a closed-loop client gets its share of
    # turns whatever a request costs.)
    def start_twin(self):
        self.twin_port = free_port()
        w = self.work
        text = (self.config.read_text()
                .replace(f"127.0.0.1:{self.gw_port}", f"127.0.0.1:{self.twin_port}")
                .replace(f"127.0.0.1:{self.metrics_port}", f"127.0.0.1:{free_port()}")
                .replace(f"{w}/upgrade.sock", f"{w}/twin-upgrade.sock")
                .replace(f"{w}/portcullis.pid", f"{w}/twin.pid"))
        twin_config = w / "twin.toml"
        twin_config.write_text(text)
        self.twin = self.start_gateway(twin_config, self.twin_port, "twin.log")

    def pair_once(self, base, target, seconds, a, port_a, b, port_b):
        """base on process a and target on process b at once → the target's req/s per core ÷
        the base's, from each process's CPU time per request ("nan" if either did nothing)."""
        ca0, cb0 = cpu_ticks(a.pid), cpu_ticks(b.pid)
        first = subprocess.Popen(wrk_command(self.url(base, port_a), self.token(base), seconds, 32, self.lua),
                                 stdout=subprocess.PIPE, text=True)
        try:
            out_b = subprocess.run(wrk_command(self.url(target, port_b), self.token(target), seconds, 32, self.lua),
                                   capture_output=True, text=True).stdout
            out_a = first.communicate()[0]
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        ca, cb = cpu_ticks(a.pid) - ca0, cpu_ticks(b.pid) - cb0
        wa, wb = parse_wrk(out_a), parse_wrk(out_b)
        for w in (wa, wb):
            if w["non2xx"]:
                raise BenchError(f"paired run: non-2xx responses: Non-2xx or 3xx responses: {w['non2xx']}")
        na, nb = int(wa["requests"] or 0), int(wb["requests"] or 0)
        # (cpu_a / n_a) / (cpu_b / n_b): above 1, the target costs less per request than the base.
        if ca > 0 and cb > 0 and na > 0 and nb > 0:
            return "%.4f" % ((ca / na) / (cb / nb))
        return "nan"

    def run_pair(self, base, target, seconds):
        """Both ways round (base on the gateway and the feature on the twin, then the reverse),
        so a difference between the two processes cancels out: their geometric mean."""
        gw, twin = (self.gateway, self.gw_port), (self.twin, self.twin_port)
        x = float(self.pair_once(base, target, seconds, *gw, *twin))
        y = float(self.pair_once(base, target, seconds, *twin, *gw))
        return "%.3f" % math.sqrt(x * y)

    def floors(self):
        """The engine's floor: a bare Pingora ProxyHttp that only compares a static bearer,
        strips the prefix and drops Set-Cookie, on the gateway's core. The gateway (engine
        patches included) is paired with the floor on crates.io's unpatched Pingora; the same
        floor built with the patches, paired with the unpatched one, is what they gain."""
        s = self.s
        self.floor_port, self.pfloor_port = free_port(), free_port()
        common = ["--upstream", f"127.0.0.1:{self.up_port}", "--key", self.key]
        floor = self.procs.start([self.tools.floor_unpatched, "--listen", f"127.0.0.1:{self.floor_port}", *common],
                                 cpu=PROXY_CPU, stdout=self.work / "floor.log", stderr=subprocess.STDOUT)
        pfloor = self.procs.start([self.tools.floor, "--listen", f"127.0.0.1:{self.pfloor_port}", *common],
                                  cpu=PROXY_CPU, stdout=self.work / "pfloor.log", stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{self.floor_port}/")
        wait_http(f"http://127.0.0.1:{self.pfloor_port}/")
        self.log(f"paired with the floor: {s.pair_rounds} rounds x {s.seconds_per_run}s, unpatched bare Pingora "
                 "and Portcullis (key) at once, then the patched floor")
        for _ in range(s.pair_rounds):
            self.raw.record("pair_floor", self.pair_once(
                "floor", "key", s.seconds_per_run, floor, self.floor_port, self.gateway, self.gw_port))
            self.raw.record("pair_engine", self.pair_once(
                "floor", "pfloor", s.seconds_per_run, floor, self.floor_port, pfloor, self.pfloor_port))
        self.log(f"Portcullis ÷ unpatched floor, req/s per core: {' '.join(self.raw.values('pair_floor'))}")
        self.log(f"patched ÷ unpatched floor, req/s per core: {' '.join(self.raw.values('pair_engine'))}")
        self.procs.stop(floor)
        self.procs.stop(pfloor)

    def paired_features(self):
        s = self.s
        self.log(f"paired: {s.pair_rounds} rounds x {s.seconds_per_run}s of key and each of {' '.join(PAIRED)} at once")
        for r in range(1, s.pair_rounds + 1):
            for t in PAIRED:
                self.raw.record(f"pair_{t}", self.run_pair("key", t, s.seconds_per_run))
            self.log(f"paired round {r}: " + " ".join(f"{t}={self.raw.values(f'pair_{t}')[-1]}" for t in PAIRED))
        self.procs.stop(self.twin)

    # ---- fixed-rate latency (loadgen) -------------------------------------------------------
    def run_rate(self, target, prefix, rate, conns, seconds, body_args):
        """A fixed-rate loadgen run of chat POSTs, recording <prefix>50_<target>,
        <prefix>99_<target> and <prefix>lag_<target> (µs)."""
        out = subprocess.run(
            ["taskset", "-c", str(CLIENT_CPU), str(self.tools.loadgen), "rate",
             "--addr", f"127.0.0.1:{self.port(target)}", "--method", "POST",
             "--path", f"{self.path(target)}/chat/completions", *body_args, *json_headers(self.token(target)),
             "--rate", str(rate), "--conns", str(conns), "--seconds", str(seconds), "--warmup-s", "1"],
            capture_output=True, text=True, check=True,
        ).stdout
        f = pairs(out)
        if f.get("errors") != "0":
            raise BenchError(f"{target}: {f.get('errors')} failed requests at {rate} req/s")
        self.raw.record(f"{prefix}50_{target}", f["p50"])
        self.raw.record(f"{prefix}99_{target}", f["p99"])
        self.raw.record(f"{prefix}lag_{target}", f["lag_p99"])

    def latency(self):
        s = self.s
        self.log(f"latency at {s.rate} req/s: {s.rate_rounds} rounds x {s.rate_seconds}s per target "
                 "(loadgen rate, 16 connections)")
        for _ in range(s.rate_rounds):
            for t in TARGETS:
                self.run_rate(t, "p", s.rate, 16, s.rate_seconds, ["--body", CHAT_BODY])

    def connect_failures(self):
        """portcullis_upstream_connect_failures_total of service "failover", from /metrics."""
        text = http_get_text(f"http://127.0.0.1:{self.metrics_port}/metrics")
        total = 0.0
        for line in text.splitlines():
            if re.match(r'portcullis_upstream_connect_failures_total\{.*service="failover"', line):
                total += float(line.split()[-1])
        return int(total)

    def hold_stream(self, target):
        """An SSE stream left open through target (the upstream sends an event at once)."""
        host, port, path = split_url(self.url(target))
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(
            (f"POST {path}/sse HTTP/1.1\r\nhost: {host}:{port}\r\nauthorization: Bearer {self.key}\r\n"
             f"content-type: application/json\r\ncontent-length: {len(CHAT_BODY)}\r\n\r\n{CHAT_BODY}").encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
        if not head.startswith(b"HTTP/1.1 200"):
            sock.close()
            raise BenchError(f"{target}: the held stream was answered {head[:40]!r}")
        return sock

    def failover(self):
        """One stream held on the live replica, so least_requests always tries the dead one
        first. At a low rate, so the figure is the failover's own latency, not the queueing of
        a loaded core."""
        s = self.s
        held = self.hold_stream("failover")
        try:
            time.sleep(0.5)
            before = self.connect_failures()
            self.log(f"failover latency at {s.failover_rate} req/s: {s.failover_rounds} rounds x {s.rate_seconds}s, "
                     "one replica vs a dead one first")
            for _ in range(s.failover_rounds):
                for t in ("key", "failover"):
                    self.run_rate(t, "f", s.failover_rate, 4, s.rate_seconds, ["--body", CHAT_BODY])
            self.facts["failovers"] = self.connect_failures() - before
        finally:
            held.close()

    def redis_check(self):
        """Target "redis" must really have been decided by Redis, never by the per-process
        fallback."""
        calls = 0
        for line in self.redis_cli("info", "commandstats").splitlines():
            if line.startswith("cmdstat_evalsha:"):
                calls = int(re.search(r"calls=(\d+)", line).group(1))
        fallbacks = len(re.findall(r"rate limits: Redis at .* unavailable", read_text(self.work / "gateway.log")))
        if fallbacks:
            self.log(f"warning: the gateway fell back to per-process limits {fallbacks} time(s)")
        version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
        m = re.search(r"v=(\S+)", version)
        self.facts.update(evalsha_calls=calls, redis_fallbacks=fallbacks, redis_version=m.group(1) if m else "")

    def sse_head(self):
        s = self.s
        self.log(f"SSE response head: {s.sse_rounds} rounds x {s.sse_count} sequential streams per target")
        for _ in range(s.sse_rounds):
            for t in ("direct", "nginx", "key"):
                out = subprocess.run(
                    ["taskset", "-c", str(CLIENT_CPU), str(self.tools.loadgen), "sse-head",
                     "--addr", f"127.0.0.1:{self.port(t)}", "--method", "POST",
                     "--path", f"{self.path(t)}/sse?ticks=3", "--body", CHAT_BODY, *json_headers(self.token(t)),
                     "--count", str(s.sse_count), "--warmup", "200"],
                    capture_output=True, text=True, check=True,
                ).stdout
                self.raw.record(f"ssehead_{t}", pairs(out).get("p50", ""))

    def vision(self):
        """A 2 MB vision request (one base64 PNG-sized image part) with and without the model
        policy: the policy reads the whole body before sending it on, so its cost shows in the
        latency."""
        s = self.s
        image = base64.b64encode(os.urandom(1536 * 1024)).decode()
        body = {"model": "bench", "max_tokens": 16, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}}]}]}
        path = self.work / "vision.json"
        path.write_text(json.dumps(body))
        self.facts["vision_bytes"] = path.stat().st_size
        self.log(f"2 MB vision body ({self.facts['vision_bytes']} bytes) at {s.vision_rate} req/s: "
                 f"{s.rate_rounds} rounds x {s.vision_seconds}s, policy off and on")
        for _ in range(s.rate_rounds):
            for t in ("key", "policy"):
                self.run_rate(t, "vision", s.vision_rate, 4, s.vision_seconds, ["--body-file", str(path)])

    # ---- memory with held streams -------------------------------------------------------
    def open_streams(self):
        s = self.s
        self.log(f"open streams: {s.stream_rounds} rounds of {s.streams} held SSE streams, each on a fresh gateway")
        for r in range(1, s.stream_rounds + 1):
            gw = self.start_gateway()
            time.sleep(1)
            self.raw.record("idle_rss", status_kb(gw.pid, "VmRSS"))
            self.raw.record("idle_hwm", status_kb(gw.pid, "VmHWM"))
            out = subprocess.run(
                ["taskset", "-c", str(CLIENT_CPU), str(self.tools.loadgen), "streams",
                 "--addr", f"127.0.0.1:{self.gw_port}", "--method", "POST", "--path", "/v1/infer/v1/sse",
                 "--body", CHAT_BODY, *json_headers(self.key),
                 "--count", str(s.streams), "--pid", str(gw.pid), "--hold-s", "2"],
                capture_output=True, text=True, check=True,
            ).stdout
            f = pairs(out)
            if f.get("failed") != "0":
                self.log(f"round {r}: {f.get('failed')} of {s.streams} streams failed to open")
            self.raw.record("streams_open", f["opened"])
            self.raw.record("streams_rss", f["rss_kb"])
            self.raw.record("streams_hwm", f["hwm_kb"])
            self.raw.record("streams_open_s", f["open_s"])
            self.procs.stop(gw)
            time.sleep(1)

    def instructions(self):
        """Instructions per request (deterministic where the rounds above drift): the floor
        (same engine as the gateway) and the gateway under callgrind, and the gateway's hooks."""
        self.log("instructions per request: benches/load/callgrind.py")
        callgrind.ensure_valgrind(self.log)
        figures = callgrind.measure(self.tools, ROOT / "bench-results" / "callgrind",
                                    self.s.cg_requests, self.s.cg_warmup, self.log)
        for name, value in figures.items():
            self.raw.record(name, value)

    # ---- the whole run ----------------------------------------------------------------------
    def run(self, begin_wall, load_at_start):
        self.raise_fd_limit()
        self.start_upstream_and_idp()
        self.start_redis()
        self.configure_gateway()
        self.start_nginx()
        self.gateway = self.start_gateway()
        time.sleep(1)
        self.check_targets()
        self.max_throughput()
        self.start_twin()
        self.floors()
        self.paired_features()
        self.latency()
        self.failover()
        self.redis_check()
        self.sse_head()
        self.vision()
        self.loaded_rss = status_kb(self.gateway.pid, "VmRSS")
        self.loaded_hwm = status_kb(self.gateway.pid, "VmHWM")
        self.procs.stop(self.gateway)
        self.open_streams()
        self.instructions()
        return self.write_report(begin_wall, load_at_start)

    def write_report(self, begin_wall, load_at_start):
        s = self.s
        self.facts.update(
            date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            commit=git_commit(), cores=os.cpu_count(), cpu_model=cpu_model(), kernel=platform.release(),
            load_at_start=load_at_start, proxy_cpu=PROXY_CPU, client_cpu=CLIENT_CPU,
            rounds=s.rounds, rate_rounds=s.rate_rounds, sse_rounds=s.sse_rounds, stream_rounds=s.stream_rounds,
            rate=s.rate, rate_seconds=s.rate_seconds, failover_rate=s.failover_rate,
            failover_rounds=s.failover_rounds, conns=s.conns, seconds_per_run=s.seconds_per_run,
            chat_body_bytes=len(CHAT_BODY), sse_count=s.sse_count, streams=s.streams,
            pair_rounds=s.pair_rounds, cg_requests=s.cg_requests, cg_warmup=s.cg_warmup,
            vision_rate=s.vision_rate, access_log=self.access_log, fd_limit=self.fd_limit,
            loaded_rss=self.loaded_rss, loaded_hwm=self.loaded_hwm,
            elapsed=int(time.time() - begin_wall),
        )
        text = report.render(self.raw, self.facts)
        out = ROOT / "bench-results"
        out.mkdir(exist_ok=True)
        (out / "latest.md").write_text(text)
        shutil.copyfile(self.raw.path, out / "latest-raw.txt")
        return text


def git_commit():
    """The short commit, with +dirty when the work tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet"], cwd=ROOT, capture_output=True).returncode != 0
    return head.stdout.strip() + ("+dirty" if dirty else "")


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(": ", 1)[1].strip()
    return platform.machine()


def install_tools(log):
    """wrk, nginx and redis-server from Debian when missing (valgrind: callgrind.py)."""
    missing = [pkg for pkg, found in [
        ("wrk", shutil.which("wrk")),
        ("nginx-light", shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK)),
        ("redis-server", shutil.which("redis-server")),
    ] if not found]
    if missing:
        apt_install(missing, log)
    require("taskset", "util-linux")
    if (os.cpu_count() or 1) < 2:
        raise BenchError("needs two cores: the proxy on one, the load on the other")


def main():
    exit_on_signals()
    os.chdir(ROOT)
    begin_wall = time.time()
    with open("/proc/loadavg") as f:
        load_at_start = " ".join(f.read().split()[:3])
    log = Log("loadbench")
    settings = Settings.from_env()
    procs = Processes()
    work = Path(tempfile.mkdtemp(prefix="portcullis-bench."))
    try:
        install_tools(log)
        build(log)
        text = Bench(settings, Tools.built(), work, procs, log).run(begin_wall, load_at_start)
        sys.stdout.write(text)
        return 0
    except BenchError as e:
        log(f"error: {e}")
        return 1
    except subprocess.CalledProcessError as e:
        log(f"error: {' '.join(map(str, e.cmd))} exited with {e.returncode}")
        return 1
    finally:
        procs.close()
        if settings.keep_work:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
