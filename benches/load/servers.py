"""The servers of a run (upstream, IdP, Redis, the gateway, nginx) and the targets through them:
what every stage of run.py measures against. Servers is the base of the stage classes; run.Bench
sets settings, tools, work, procs, log, raw and facts."""

import http.client
import re
import resource
import shutil
import subprocess
import time

from common import (
    BenchError,
    child_pids,
    free_port,
    http_get_text,
    http_status,
    read_text,
    split_url,
    wait_http,
    wait_line,
)
import callgrind
import configs

PROXY_CPU = 0
CLIENT_CPU = 1
CHAT_BODY = '{"model":"bench","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
# A streamed chat as the OpenAI SDKs send it (no stream_options), and one that asks for its usage.
STREAM_BODY = CHAT_BODY[:-1] + ',"stream":true}'
STREAM_USAGE_BODY = CHAT_BODY[:-1] + ',"stream":true,"stream_options":{"include_usage":true}}'
TARGETS = ["direct", "nginx", "key", "jwt", "policy", "redis", "replicas"]
PAIRED = ["replicas", "redis", "policy"]
# The gateway's service behind each target. "metered" (api = "openai", no model policy) and
# "infer" differ only in metering: the streamed-chat pairs compare them.
SERVICES = {
    "key": "infer", "jwt": "infer", "policy": "policy", "redis": "limited",
    "replicas": "replicas", "failover": "failover", "meter_off": "infer", "meter_on": "metered",
    # The budgets stage (stages_budgets.py), on gateways of its own with [budgets]: the same
    # services, each target by its own key (Servers.token).
    "bud_plain": "metered", "bud_tokens": "metered", "bud_infer": "infer", "bud_rpd": "infer",
}


def json_headers(token):
    return ["--header", f"authorization: Bearer {token}", "--header", "content-type: application/json"]


class Servers:
    """Starting the servers and reaching the targets (part of run.Bench)."""

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
             "--tick-ms", "5000", "--max-life-s", "1800", "--stream-chunks", self.s.stream_chunks],
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

    def gateway_config(self, access_log_off, port=None, metrics_port=None, name=None, budgets=False):
        """The run's gateway config (configs.gateway); `port`, `metrics_port` and `name` (its
        upgrade socket and pid file) for a second gateway on it, `budgets`: with [budgets]."""
        return configs.gateway(self.tools.config_writer, self.work, port or self.gw_port,
                               metrics_port or self.metrics_port, self.up_port, self.dead_port, self.redis_port,
                               self.issuer, access_log_off, name, budgets)

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
        """The bearer a target is called with: the JWT, a stage's own key (target_keys), or the
        run's key."""
        if target == "jwt":
            return self.jwt
        return getattr(self, "target_keys", {}).get(target, self.key)

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

    def streamed_chat(self, target, body):
        """(status, content type, body) of one streamed chat through target."""
        host, port, path = split_url(self.url(target))
        conn = http.client.HTTPConnection(host, port, timeout=5)
        try:
            conn.request("POST", f"{path}/chat/completions", body=body,
                         headers={"authorization": f"Bearer {self.key}", "content-type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.getheader("content-type", ""), resp.read()
        finally:
            conn.close()

    def check_streams(self):
        """The metering pairs compare like with like: with metering on, the client must get the
        very bytes it gets with metering off (the gateway's include_usage taken back out), and
        the usage must have been asked for and read (portcullis_tokens_total moves)."""
        before = self.tokens("metered")
        plain = self.streamed_chat("meter_off", STREAM_BODY)
        if plain[0] != 200 or not plain[1].startswith("text/event-stream") or b'"usage"' in plain[2]:
            raise BenchError(f"streamed chat through infer: {plain[0]} {plain[1]} {plain[2][:200]!r}")
        on = self.streamed_chat("meter_on", STREAM_BODY)
        if on != plain:
            raise BenchError(f"metering on changed the client's stream: {on[2][:300]!r}")
        asked = self.streamed_chat("meter_on", STREAM_USAGE_BODY)
        if asked != self.streamed_chat("meter_off", STREAM_USAGE_BODY) or b'"choices":[],"usage"' not in asked[2]:
            raise BenchError(f"a stream that asked for its usage did not get it as sent: {asked[2][-400:]!r}")
        # Exactly the upstream's 25 tokens twice: an estimate (no usage read) would count otherwise.
        if self.tokens("metered") - before != 2 * 25:
            raise BenchError("the metered streams' usage was not read (portcullis_tokens_total)")
        self.facts["stream_events"] = plain[2].count(b"data: {")
        self.facts["stream_bytes"] = len(plain[2])

    def tokens(self, service):
        """portcullis_tokens_total of a service, all kinds, from /metrics."""
        text = http_get_text(f"http://127.0.0.1:{self.metrics_port}/metrics")
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("portcullis_tokens_total{") and f'service="{service}"' in line)
