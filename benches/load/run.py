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
- metering on a streamed chat (stages_metering.py): a 16-chunk OpenAI stream through `infer`
  (off) and `metered` (api = "openai", on), paired on one core; also counted under callgrind.
  ONLY=metering runs just that (and the servers it needs), for quick iterations on its cost.
- budgets with Redis on a chat (stages_budgets.py): two gateways of their own with [budgets] and
  [rate_limits] redis; a key with tokens_per_day (reserve + adjust scripts) and one with
  requests_per_day (reserve only) paired on one core with a key without budget, an A/A pair, both
  keys at BUDGET_RATE (5,000 req/s) with loadgen, and their instructions under callgrind.
  ONLY=budgets runs just that; knobs BUDGET_ROUNDS, BUDGET_SECONDS, BUDGET_RATE.
- routing (stages_routing.py): least_requests, round_robin and prefix_affinity on three
  simulated model servers with prefix caches, 200 conversations x 8 turns with shared system
  prompts and a few hot ones: cache hit rate (against one unbounded replica), TTFT, load spread.
  ONLY=routing runs just that; knob ROUTING_CLIENTS (conversations at a time, 24).
- scaling with the cores (stages_scaling.py): requests per second per busy proxy core at 1, 2,
  4, … worker threads, for the bare engine and Portcullis (access log off, to a file, and
  api = "openai" with a budgeted key), the proxy on cores 0..T−1 and the load and upstream on
  cores of their own, with perf's evidence of what the threads share. ONLY=scaling runs just
  that (no apt-get it cannot do without, no build when BIN is set); knobs SCALING_THREADS,
  SCALING_SECONDS, SCALING_WARMUP, SCALING_CONNECTIONS, SCALING_LOAD_CORES,
  SCALING_UPSTREAM_CORES, SCALING_LOAD, SCALING_UPSTREAM.

Binaries built elsewhere: BIN (the gateway), EX (the examples' folder: fast_upstream, loadgen,
bench_idp), FLOOR and CONFIG_BIN (gateway-config), relative to the repository's root; with BIN
set nothing is built. OUT=dir writes the report there instead of bench-results/.

This file is the run's flow: the knobs, the order of the stages, the report's facts. Beside it:
binaries.py (the binaries, their builds, the Debian tools), servers.py (the servers and targets),
stages_throughput.py (wrk: max req/s, paired rounds), stages_latency.py (loadgen: fixed-rate
latency, failover, SSE head, vision), stages_footprint.py (held streams' memory, instructions),
stages_metering.py (metering on vs off on a streamed chat), stages_budgets.py (budgets with Redis),
stages_scaling.py (per-core rate by worker threads; scaling_load.py, contention.py), configs.py,
report.py, callgrind.py and common.py.
"""

import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import BenchError, Log, Processes, exit_on_signals, status_kb
from binaries import ROOT, Tools, build, install_tools, prebuilt
from servers import CHAT_BODY, CLIENT_CPU, PROXY_CPU
from stages_footprint import Footprint
from stages_latency import Latency
from stages_budgets import Budgeting
from stages_metering import Metering
from stages_routing import Routing
from stages_scaling import Scaling
import report


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
    meter_rounds: int  # metering pairs: rounds, and seconds of each way of a pair
    meter_seconds: int
    stream_chunks: int  # events of the fast upstream's streamed chat
    budget_rounds: int  # budgets: paired rounds and fixed-rate rounds
    budget_seconds: int  # each way of a pair, and each fixed-rate run
    budget_rate: int  # req/s of the budgets' fixed-rate runs
    routing_clients: int  # routing: conversations at a time
    scaling_threads: str  # scaling: worker-thread counts, "1,2,4,8" ("": 1, 2, 4, … as cores allow)
    scaling_seconds: int  # each measured point, after scaling_warmup seconds of the same load
    scaling_warmup: int
    scaling_conns: int
    scaling_load_cores: int  # 0: 4 from 12 cores up, else a quarter of them
    scaling_upstream_cores: int
    scaling_load: str  # "wrk", "loadgen" ("": wrk where installed)
    scaling_upstream: str  # "nginx", "fast" ("": nginx where installed)
    only: str  # "metering", "budgets", "routing" or "scaling": only that stage
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
            meter_rounds=knob("METER_ROUNDS", 5),
            meter_seconds=knob("METER_SECONDS", 5),
            stream_chunks=knob("STREAM_CHUNKS", 16),
            budget_rounds=knob("BUDGET_ROUNDS", 5),
            budget_seconds=knob("BUDGET_SECONDS", 5),
            budget_rate=knob("BUDGET_RATE", 5000),
            routing_clients=knob("ROUTING_CLIENTS", 24),
            scaling_threads=os.environ.get("SCALING_THREADS", ""),
            scaling_seconds=knob("SCALING_SECONDS", 8),
            scaling_warmup=knob("SCALING_WARMUP", 2),
            scaling_conns=knob("SCALING_CONNECTIONS", 256),
            scaling_load_cores=knob("SCALING_LOAD_CORES", 0),
            scaling_upstream_cores=knob("SCALING_UPSTREAM_CORES", 0),
            scaling_load=os.environ.get("SCALING_LOAD", ""),
            scaling_upstream=os.environ.get("SCALING_UPSTREAM", ""),
            only=os.environ.get("ONLY", ""),
            keep_work=bool(os.environ.get("KEEP_WORK")),
        )


class Bench(Metering, Budgeting, Latency, Footprint, Routing, Scaling):
    """One run: starts everything, measures each stage into `raw`, writes the report. The servers
    and targets are in servers.py, the stages in stages_throughput.py, stages_latency.py,
    stages_footprint.py, stages_metering.py and stages_budgets.py."""

    def __init__(self, settings, tools, work, procs, log):
        self.s, self.tools, self.work, self.procs, self.log = settings, tools, work, procs, log
        self.raw = report.Raw(work / "raw.txt")
        self.facts = {}

    # ---- the whole run ----------------------------------------------------------------------
    def run(self, begin_wall, load_at_start):
        if self.s.only == "routing":
            # Servers of its own (stages_routing.py); nothing else is started.
            return self.routing()
        if self.s.only == "scaling":
            return self.run_scaling(begin_wall, load_at_start)
        # the servers and the targets through them (servers.py)
        self.raise_fd_limit()
        self.start_upstream_and_idp()
        self.start_redis()
        self.configure_gateway()
        if self.s.only == "metering":
            return self.run_metering(begin_wall, load_at_start)
        if self.s.only == "budgets":
            return self.run_budgets(begin_wall, load_at_start)
        self.start_nginx()
        self.gateway = self.start_gateway()
        time.sleep(1)
        self.check_targets()
        # req/s with wrk (stages_throughput.py)
        self.max_throughput()
        self.start_twin()
        self.floors()
        self.metering_pairs()  # stages_metering.py
        self.paired_features()
        # latency with loadgen (stages_latency.py); redis_check is in servers.py
        self.latency()
        self.failover()
        self.redis_check()
        self.sse_head()
        self.vision()
        self.budgets()  # stages_budgets.py: gateways of its own, after redis_check's count
        # memory and instructions (stages_footprint.py)
        self.loaded_rss = status_kb(self.gateway.pid, "VmRSS")
        self.loaded_hwm = status_kb(self.gateway.pid, "VmHWM")
        self.procs.stop(self.gateway)
        self.open_streams()
        self.instructions()
        self.metering_instructions()
        self.budget_instructions()
        self.scaling()  # stages_scaling.py: servers of its own
        self.routing()  # stages_routing.py: servers of its own
        return self.write_report(begin_wall, load_at_start)

    def run_metering(self, begin_wall, load_at_start):
        """ONLY=metering: the gateway, its twin, the metering pairs and their instructions."""
        self.gateway = self.start_gateway()
        self.lua = None  # the pairs bring their own scripts
        self.start_twin()
        self.metering_pairs()
        self.procs.stop(self.twin)
        self.metering_instructions()
        return self.write_report(begin_wall, load_at_start, report.render_metering)

    def run_budgets(self, begin_wall, load_at_start):
        """ONLY=budgets: the budget gateways, their pairs and latency, their instructions."""
        self.budgets()
        self.budget_instructions()
        return self.write_report(begin_wall, load_at_start, report.render_budgets)

    def run_scaling(self, begin_wall, load_at_start):
        """ONLY=scaling: servers of its own (stages_scaling.py), its report alone."""
        self.raise_fd_limit()
        text = self.scaling()
        header = (f"Portcullis scaling benchmark, {utc_now()}, {git_commit()}, {os.cpu_count()} cores "
                  f"({cpu_model()}), Linux {platform.release()}, load average at start {load_at_start}; "
                  f"whole run {int(time.time() - begin_wall)} s.\n\n")
        return self.keep_report(header + text)

    def keep_report(self, text):
        """The report and the raw figures into results_dir() (latest.md, latest-raw.txt)."""
        out = results_dir()
        out.mkdir(parents=True, exist_ok=True)
        (out / "latest.md").write_text(text)
        shutil.copyfile(self.raw.path, out / "latest-raw.txt")
        return text

    def write_report(self, begin_wall, load_at_start, render=report.render):
        s = self.s
        self.facts.update(
            date=utc_now(),
            commit=git_commit(), cores=os.cpu_count(), cpu_model=cpu_model(), kernel=platform.release(),
            load_at_start=load_at_start, proxy_cpu=PROXY_CPU, client_cpu=CLIENT_CPU,
            rounds=s.rounds, rate_rounds=s.rate_rounds, sse_rounds=s.sse_rounds, stream_rounds=s.stream_rounds,
            rate=s.rate, rate_seconds=s.rate_seconds, failover_rate=s.failover_rate,
            failover_rounds=s.failover_rounds, conns=s.conns, seconds_per_run=s.seconds_per_run,
            chat_body_bytes=len(CHAT_BODY), sse_count=s.sse_count, streams=s.streams,
            pair_rounds=s.pair_rounds, cg_requests=s.cg_requests, cg_warmup=s.cg_warmup,
            vision_rate=s.vision_rate, access_log=self.access_log, fd_limit=self.fd_limit,
            meter_rounds=s.meter_rounds, meter_seconds=s.meter_seconds,
            budget_rounds=s.budget_rounds, budget_seconds=s.budget_seconds, budget_rate=s.budget_rate,
            loaded_rss=getattr(self, "loaded_rss", 0), loaded_hwm=getattr(self, "loaded_hwm", 0),
            elapsed=int(time.time() - begin_wall),
        )
        text = render(self.raw, self.facts) + getattr(self, "scaling_text", "") + getattr(self, "routing_text", "")
        return self.keep_report(text)


def results_dir():
    """OUT when set (a machine that sends back what is written there), else bench-results/."""
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench-results"


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
        if settings.only not in ("routing", "scaling"):  # routing needs none; scaling tries its own
            install_tools(log)
        if not prebuilt():
            # ONLY=metering or budgets runs no floor; ONLY=scaling the patched one alone;
            # ONLY=routing no load tools either.
            build(log, unpatched_floor=not settings.only, floor=settings.only in ("", "scaling"),
                  examples=settings.only != "routing")
        text = Bench(settings, Tools.from_env(), work, procs, log).run(begin_wall, load_at_start)
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
