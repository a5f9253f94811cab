#!/usr/bin/env python3
"""Instructions per request: the bare-Pingora floor (benches/floor/) and the gateway, each under
`valgrind --tool=callgrind`, each given the same fixed number of chat POSTs on one kept-alive
connection after a warm-up. Counting instructions is deterministic where wall-clock rounds on a
shared machine swing ±15%.

Run on its own (`python3 benches/load/callgrind.py`), it prints `name value` lines on stdout:
  ir_floor, ir_key     instructions per request, whole process
  hook_<name>          the gateway's own hooks, inclusive, per request
With the argument `streams` it counts a streamed chat (the fast upstream's 16-chunk OpenAI
stream) through one gateway instead, metering off (`infer`), on (`metered`, api = "openai", the
client sending no stream_options) and asked (`metered`, the client asking include_usage):
  ir_stream_off, ir_stream_on, ir_stream_asked   instructions per request, whole process
(profiles stream-off.out, stream-on.out, stream-asked.out). With the argument `budgets` it counts
the chat POST through one gateway with [budgets] and [rate_limits] redis (a redis-server of its
own), by a key without budget and by a budgeted one (stages_budgets.py):
  ir_budget_plain, ir_budget_tokens   service `metered` (api = "openai"): no budget, and
                                      tokens_per_day (a reserve and an adjust script through Redis)
  ir_budget_infer, ir_budget_rpd      service `infer` (no api): no budget, and requests_per_day
                                      (a reserve script only)
(profiles budget-*.out). With the argument `translate` it counts the same upstream chat stream
(metering on, usage asked, as the bridge asks) passed through to a chat client and translated for
a Messages client (`translate = { messages = "chat" }`) and a Responses one (`{ responses =
"chat" }`): ir_translate_chat, ir_translate_messages, ir_translate_responses, and their ratios
to the passed-through stream, translate_ratio_messages and translate_ratio_responses (target ≤ 1.25).
Either way it keeps the raw profiles under $OUT (default bench-results/callgrind/) for
callgrind_annotate. Knobs: CG_REQUESTS (2000), CG_WARMUP (300), CG_ACCESS_LOG (off; "file"
writes the access log to a file, to count what a line costs); BIN, EX, FLOOR and CONFIG_BIN
(the test kit's gateway-config, which writes the gateway's TOML) to reuse binaries already built
(otherwise it builds them). The load benchmark (run.py) uses measure() and create_key().
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    BenchError,
    Processes,
    apt_install,
    exit_on_signals,
    free_port,
    read_text,
    wait_http,
    wait_line,
)
import binaries  # the binaries' paths and how to build them live in one place
import configs

BODY = '{"model":"bench","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}'
STREAM_BODY = BODY[:-1] + ',"stream":true}'
STREAM_USAGE_BODY = BODY[:-1] + ',"stream":true,"stream_options":{"include_usage":true}}'
# (name, service, body): the streamed chats counted by measure_streams.
STREAM_RUNS = [("off", "infer", STREAM_BODY), ("on", "metered", STREAM_BODY), ("asked", "metered", STREAM_USAGE_BODY)]
MESSAGES_STREAM_BODY = ('{"model":"bench","max_tokens":16,"stream":true,'
                        '"messages":[{"role":"user","content":"Say hello."}]}')
RESPONSES_STREAM_BODY = '{"model":"bench","max_output_tokens":16,"stream":true,"input":"Say hello."}'
# (name, service, body, path): the streams counted by measure_translate.
TRANSLATE_RUNS = [
    ("chat", "metered", STREAM_USAGE_BODY, "/v1/metered/v1/chat/completions"),
    ("messages", "bridge_messages", MESSAGES_STREAM_BODY, "/v1/bridge_messages/v1/messages"),
    ("responses", "bridge_responses", RESPONSES_STREAM_BODY, "/v1/bridge_responses/v1/responses"),
]
# (name, service, the key's budget flags): the chats counted by measure_budgets. The limits are
# far above anything the count can use: never refused.
BUDGET_RUNS = [
    ("plain", "metered", []),
    ("tokens", "metered", ["--tokens-per-day", "1000000000000000"]),
    ("infer", "infer", []),
    ("rpd", "infer", ["--requests-per-day", "1000000000000"]),
]
# An async hook's cost is in its future's poll (`…::hook::{{closure}}`) plus the boxing in
# `…::hook`; both are summed under the hook's name.
HOOK = re.compile(r"Gateway as pingora_proxy::proxy_trait::ProxyHttp>::")


def ensure_valgrind(log):
    if shutil.which("valgrind") is None:
        apt_install(["valgrind"], log)


def measure(tools, out_dir, requests, warmup, log, streams=False, budgets=False, translate=False):
    """{ir_floor, ir_key, hook_<name>…}: instructions per request of the patched floor and the
    gateway, and of each of the gateway's hooks; profiles left in out_dir. With streams:
    {ir_stream_off, ir_stream_on, ir_stream_asked} instead (Session.run_streams); with budgets:
    {ir_budget_<name>} of BUDGET_RUNS (Session.run_budgets)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="portcullis-callgrind.") as work:
        procs = Processes()
        try:
            session = Session(tools, Path(work), out_dir, requests, warmup, procs, log)
            if budgets:
                return session.run_budgets()
            if translate:
                return session.run_translate()
            return session.run_streams() if streams else session.run()
        finally:
            procs.close()


class Session:
    def __init__(self, tools, work, out_dir, requests, warmup, procs, log):
        self.tools, self.work, self.out = tools, work, out_dir
        self.requests, self.warmup = requests, warmup
        self.procs, self.log = procs, log

    def start_upstream(self):
        up_port = free_port()
        self.procs.start(
            [self.tools.fast_upstream, "--port", up_port, "--hosts", "1",
             "--tick-ms", "5000", "--max-life-s", "900", "--stream-chunks", os.environ.get("STREAM_CHUNKS") or 16],
            stdout=self.work / "upstream.log",
            stderr=subprocess.STDOUT,
        )
        wait_line(self.work / "upstream.log", "listening")
        return up_port

    def run(self):
        up_port = self.start_upstream()
        gw_port = free_port()
        config = self.work / "portcullis.toml"
        config.write_text(self.gateway_config(gw_port, up_port))
        self.key = create_key(self.tools.gateway, config, "callgrind")
        floor_port = free_port()

        figures = {}
        self.log(f"floor under callgrind ({self.requests} requests after {self.warmup})")
        figures["ir_floor"] = self.profile(
            "floor",
            floor_port,
            [self.tools.floor, "--listen", f"127.0.0.1:{floor_port}",
             "--upstream", f"127.0.0.1:{up_port}", "--key", self.key],
        )
        self.log(f"gateway under callgrind ({self.requests} requests after {self.warmup})")
        figures["ir_key"] = self.profile("gateway", gw_port, [self.tools.gateway, "serve", "--config", config])
        figures.update(self.hooks(self.out / "gateway.out"))
        return figures

    def run_streams(self):
        """One gateway under callgrind; each of STREAM_RUNS warmed up, then counted alone
        between a zeroing and a dump of the counters."""
        up_port = self.start_upstream()
        gw_port = free_port()
        config = self.work / "portcullis.toml"
        config.write_text(self.gateway_config(gw_port, up_port, metered=True))
        self.key = create_key(self.tools.gateway, config, "callgrind")
        self.log(f"gateway under callgrind, streamed chats off / on / asked ({self.requests} each after {self.warmup})")
        runs = [(name, service, body, self.key, None) for name, service, body in STREAM_RUNS]
        return self.count_runs("stream", config, gw_port, runs)

    def run_translate(self):
        """One gateway under callgrind with the bridge's services; each of TRANSLATE_RUNS
        warmed up, then counted alone; the ratios to the stream passed through."""
        up_port = self.start_upstream()
        gw_port = free_port()
        config = self.work / "portcullis.toml"
        config.write_text(self.gateway_config(gw_port, up_port, metered=True, bridge=True))
        self.key = create_key(self.tools.gateway, config, "callgrind")
        self.log(f"gateway under callgrind, one chat stream passed through and translated ({self.requests} each after {self.warmup})")
        runs = [(name, service, body, self.key, path) for name, service, body, path in TRANSLATE_RUNS]
        figures = self.count_runs("translate", config, gw_port, runs)
        for name in ("messages", "responses"):
            ratio = figures[f"ir_translate_{name}"] / figures["ir_translate_chat"]
            figures[f"translate_ratio_{name}"] = f"{ratio:.3f}"
        return figures

    def run_budgets(self):
        """One gateway with [budgets] and [rate_limits] redis under callgrind (a redis-server
        of its own, not under it); each of BUDGET_RUNS by its own key, warmed up, then counted
        alone. The Redis client's work is in the gateway's count, Redis's own is not."""
        up_port = self.start_upstream()
        redis_port = free_port()
        self.procs.start(["redis-server", "--port", redis_port, "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", self.work],
                         stdout=self.work / "redis.log", stderr=subprocess.STDOUT)
        for _ in range(100):
            ping = subprocess.run(["redis-cli", "-p", str(redis_port), "ping"], capture_output=True, text=True)
            if ping.stdout.strip() == "PONG":
                break
            time.sleep(0.1)
        else:
            raise BenchError(f"redis-server did not start: {read_text(self.work / 'redis.log')}")
        gw_port = free_port()
        config = self.work / "portcullis.toml"
        config.write_text(self.gateway_config(gw_port, up_port, metered=True, redis_port=redis_port))
        runs = [(name, service, BODY, create_key(self.tools.gateway, config, f"callgrind-{name}", *flags), None)
                for name, service, flags in BUDGET_RUNS]
        self.log(f"gateway under callgrind, chats without and with budgets ({self.requests} each after {self.warmup})")
        return self.count_runs("budget", config, gw_port, runs)

    def count_runs(self, kind, config, gw_port, runs):
        """The gateway under callgrind; each run (name, service, body, key, path or None for
        the service's chat path) warmed up, then
        counted alone between a zeroing and a dump of the counters → {ir_<kind>_<name>}, the
        profiles in OUT/<kind>-<name>.out."""
        proc = self.procs.start(
            # Each dump its own whole profile: names not compressed against an earlier dump.
            ["valgrind", "--tool=callgrind", "--compress-strings=no", f"--callgrind-out-file={self.work}/{kind}.%p",
             self.tools.gateway, "serve", "--config", config],
            stdout=self.work / f"{kind}.log",
            stderr=subprocess.STDOUT,
        )
        wait_http(f"http://127.0.0.1:{gw_port}/healthz", 60)
        for _, service, body, key, path in runs:
            self.drive(gw_port, self.warmup, service, body, key, path)
        figures = {}
        for name, service, body, key, path in runs:
            control("-z", proc.pid)
            self.drive(gw_port, self.requests, service, body, key, path)
            control("-d", proc.pid)
            dumps = sorted(self.work.glob(f"{kind}.{proc.pid}*"))
            if not dumps:
                raise BenchError(f"callgrind wrote no profile for the {kind} run {name}")
            target = self.out / f"{kind}-{name}.out"
            shutil.move(dumps[-1], target)
            for old in dumps[:-1]:
                old.unlink()
            figures[f"ir_{kind}_{name}"] = total_instructions(target) // self.requests
        self.procs.stop(proc, sig=signal.SIGKILL, grace_s=5)
        return figures

    def gateway_config(self, gw_port, up_port, metered=False, redis_port=None, bridge=False):
        """configs.callgrind: `infer` alone; `metered`: and the service `metered`; `redis_port`:
        with [budgets] and [rate_limits] on that Redis; `bridge`: and the translated services."""
        return configs.callgrind(self.tools.config_writer, self.work, gw_port, free_port(), up_port,
                                 metered, redis_port, bridge, os.environ.get("CG_ACCESS_LOG", "off"))

    def drive(self, port, count, service="infer", body=BODY, key=None, path=None):
        """count sequential chat POSTs through port (by the session's key unless `key`; to
        `path` rather than the service's chat path), each checked to be a 200 by loadgen."""
        done = subprocess.run(
            [
                str(self.tools.loadgen), "count", "--addr", f"127.0.0.1:{port}", "--method", "POST",
                "--path", path or f"/v1/{service}/v1/chat/completions",
                "--header", f"authorization: Bearer {key or self.key}", "--header", "content-type: application/json",
                "--body", body, "--count", str(count),
            ],
            stdout=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            raise BenchError(f"requests through port {port} failed")

    def profile(self, name, port, argv):
        """Runs argv under callgrind, warms it up, zeroes the counters, counts `requests`
        requests and dumps: the profile goes to OUT/name.out, instructions per request back."""
        proc = self.procs.start(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.work}/{name}.%p", *argv],
            stdout=self.work / f"{name}.log",
            stderr=subprocess.STDOUT,
        )
        wait_http(f"http://127.0.0.1:{port}/healthz", 60)  # start-up under valgrind takes seconds
        self.drive(port, self.warmup)
        control("-z", proc.pid)  # zero the counters: the warm-up is not counted
        self.drive(port, self.requests)
        control("-d", proc.pid)  # dump the profile
        dumps = sorted(self.work.glob(f"{name}.{proc.pid}.*"))
        if not dumps:
            tail = "\n".join(read_text(self.work / f"{name}.log").splitlines()[-5:])
            raise BenchError(f"callgrind wrote no profile for {name}: {tail}")
        self.procs.stop(proc, sig=signal.SIGKILL, grace_s=5)
        target = self.out / f"{name}.out"
        shutil.move(dumps[0], target)
        return total_instructions(target) // self.requests

    def hooks(self, profile):
        """hook_<name>: each of the gateway's ProxyHttp hooks, inclusive, per request."""
        annotated = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(profile)],
            capture_output=True,
            text=True,
        ).stdout
        cost = {}
        for line in annotated.splitlines():
            if not HOOK.search(line):
                continue
            count = line.split()[0].replace(",", "")
            name = line.split("ProxyHttp>::")[-1]
            name = re.sub(r"::\{\{closure\}\}.*", "", name)
            name = re.split(r"[ (]", name, maxsplit=1)[0]
            cost[name] = cost.get(name, 0) + int(count)
        return {f"hook_{h}": cost[h] // self.requests for h in sorted(cost)}


def control(command, pid):
    """callgrind_control COMMAND PID, its chatter shown only when it fails."""
    done = subprocess.run(["callgrind_control", command, str(pid)], capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"callgrind_control {command} {pid} failed: {done.stdout}{done.stderr}")


def total_instructions(profile):
    """The event total on a callgrind profile's `summary:` (or `totals:`) line."""
    with open(profile, errors="replace") as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise BenchError(f"no summary line in {profile}")


def create_key(gateway, config, name, *flags):
    """A new API key with scope `infer` from `portcullis keys create` (its last line); flags:
    more of its arguments (a budget's limits)."""
    out = subprocess.run(
        [str(gateway), "keys", "create", "--config", str(config), "--name", name, "--scopes", "infer", *flags],
        capture_output=True,
        text=True,
    ).stdout.strip().splitlines()
    key = out[-1] if out else ""
    if not key.startswith("ak_"):
        raise BenchError("keys create printed no key")
    return key


def main():
    exit_on_signals()
    os.chdir(binaries.ROOT)

    def log(message):
        print(f"callgrind: {message}", file=sys.stderr, flush=True)

    streams = sys.argv[1:] == ["streams"]
    budgets = sys.argv[1:] == ["budgets"]
    translate = sys.argv[1:] == ["translate"]
    try:
        ensure_valgrind(log)
        if not binaries.prebuilt():
            binaries.build(log, unpatched_floor=False, floor=not (streams or budgets or translate))
        tools = binaries.Tools.from_env()
        figures = measure(
            tools,
            os.environ.get("OUT") or binaries.ROOT / "bench-results" / "callgrind",
            int(os.environ.get("CG_REQUESTS", "2000")),
            int(os.environ.get("CG_WARMUP", "300")),
            log,
            streams=streams,
            budgets=budgets,
            translate=translate,
        )
    except BenchError as e:
        print(f"callgrind: error: {e}", file=sys.stderr)
        return 1
    for name, value in figures.items():
        print(name, value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
