"""Scaling with the cores (`ONLY=scaling`, issue 33): requests per second per busy proxy core at
1, 2, 4, … worker threads, for the bare engine and for Portcullis three ways.

Why per busy core: req/s grows with the threads whatever they share, but what a request costs in
CPU stays flat only while the threads do not contend (a cache line written by every thread
bounces between cores; a lock makes the others wait). So the figure is requests ÷ the proxy's
CPU seconds (utime + stime from /proc/PID/stat over the measured window), which is req/s ÷ the
cores the proxy kept busy; a per-core rate that falls from 1 to T threads is sharing, and the
bare engine beside it says how much of that is Pingora's own.

Placement: with T threads the proxy runs on the first T cores this process may use (0..T−1 on
a whole machine; common.pinned; `[server] threads = T`, the floor `--threads T`); the load
generator and the upstream get cores of their own at the top (SCALING_LOAD_CORES and
SCALING_UPSTREAM_CORES: 4 and 4 from 12 cores up, else a quarter of the cores each, at least
one), so T goes up to the cores left (1, 2, 4, 8 on 16 cores). Where fewer than three cores
exist (the 2-core development machine), the load and the upstream share the last core and the
largest T overlaps it: the report says so, and the figure at that T is CPU per request under
sharing, not a clean scaling figure.

Targets, one process at a time on the same upstream, each answered 200 before its load:
- floor: benches/floor, the bare Pingora ProxyHttp on the patched engine Portcullis runs on;
- portcullis_log_off: service `infer` (an API key, nothing else), access log off;
- portcullis_log_file: the same with the access log written to a file;
- portcullis_openai_budget: service `governed` (api = "openai" with a model policy: the body
  read, validated and rewritten, the usage read) with [budgets] counted per process (no Redis),
  by a key with tokens_per_day: a reservation before forwarding and its adjustment after.

Per point: SCALING_WARMUP s of the load, then SCALING_SECONDS of it measured (the load and the
upstream: scaling_load.py). At 1 thread and at the largest count, for portcullis_log_off,
perf looks for what the threads share (contention.py). Figures go into the report as a markdown
table and as `name value` lines (scaling_rps_per_core_<target>_t<T>, scaling_ratio_<target>).
Knobs: SCALING_THREADS ("1,2,4,8"), SCALING_SECONDS (8), SCALING_WARMUP (2), SCALING_CONNECTIONS
(256), SCALING_LOAD_CORES, SCALING_UPSTREAM_CORES, SCALING_LOAD (wrk or loadgen; default wrk
where installed), SCALING_UPSTREAM (nginx or fast; default nginx where installed)."""

import http.client
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import CLK_TCK, BenchError, cpu_ticks, free_port, http_get_text, try_apt_install, wait_http, wait_line
from scaling_load import Request, choose_load, choose_upstream, cpu_list
from servers import CHAT_BODY
import callgrind
import configs
import contention

TARGETS = {
    "floor": "bare engine (benches/floor)",
    "portcullis_log_off": "Portcullis, access log off",
    "portcullis_log_file": "Portcullis, access log to a file",
    "portcullis_openai_budget": 'Portcullis, `api = "openai"` + a budgeted key',
}
PROFILED = "portcullis_log_off"
TOKENS_PER_DAY = 10**15  # never reached: every request is reserved and adjusted, none refused


class Skipped(Exception):
    """A point that cannot be measured on this machine or with these binaries: reported, and
    the stage goes on."""


# ---- where everything runs ------------------------------------------------------------------
@dataclass
class Placement:
    """Which cores each side gets, as ids from the cores this process may run on (a container's
    cpuset need not start at 0): the proxy the first T, the load the last, the upstream below."""
    usable: list
    load: list
    upstream: list

    @classmethod
    def for_machine(cls, usable, load_cores=0, upstream_cores=0):
        """0 load or upstream cores: the default count."""
        usable = sorted(usable)
        n = len(usable)
        default = 4 if n >= 12 else max(1, n // 4)
        n_load, n_up = load_cores or default, upstream_cores or default
        if n_load + n_up > n - 1:  # not enough cores: both on the last one
            return cls(usable, usable[-1:], usable[-1:])
        return cls(usable, usable[n - n_load:], usable[n - n_load - n_up:n - n_load])

    @property
    def cores(self):
        return len(self.usable)

    def helpers(self):
        return set(self.load) | set(self.upstream)

    def max_threads(self):
        """The most proxy threads with cores of their own."""
        return self.cores - len(self.helpers())

    def proxy(self, threads):
        return self.usable[:threads]

    def overlap(self, threads):
        """The proxy's cores at `threads` that the load or the upstream also run on."""
        return sorted(set(self.proxy(threads)) & self.helpers())

    def thread_counts(self, asked):
        """SCALING_THREADS as a list, or 1, 2, 4, … up to max_threads (and 2 where that is 1:
        a comparison, overlapping the helpers' core); counts above the machine's cores dropped."""
        if asked:
            counts = sorted({int(t) for t in asked.replace(" ", "").split(",") if t})
        else:
            counts, t = [], 1
            while t <= max(self.max_threads(), 2):
                counts.append(t)
                t *= 2
        return [t for t in counts if 1 <= t <= self.cores]

    def describe(self, largest):
        lines = [f"Proxy on the first T of cores {cpu_list(self.usable)}; load on cores {cpu_list(self.load)}, "
                 f"upstream on cores {cpu_list(self.upstream)}"
                 + (" (the same core: too few cores for each its own)" if self.load == self.upstream else "") + "."]
        shared = self.overlap(largest)
        if shared:
            lines.append(f"At {largest} threads the proxy shares core(s) {cpu_list(shared)} with the load and the "
                         "upstream (this machine has too few cores to keep them apart): the figure at that count is "
                         "CPU per request under sharing, not a clean scaling figure.")
        siblings = smt_siblings(self.proxy(largest)) - set(self.proxy(largest))
        if siblings:
            running = " (running the load or the upstream)" if siblings & self.helpers() else ""
            lines.append(f"SMT: the proxy's cores at {largest} threads have hyperthread siblings "
                         f"{cpu_list(siblings)} outside them{running}.")
        return lines


def smt_siblings(cores):
    """Every core's hyperthread siblings (itself included), from /sys; empty where unknown."""
    siblings = set()
    for core in cores:
        try:
            text = Path(f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            continue
        for part in text.split(","):
            low, _, high = part.partition("-")
            siblings.update(range(int(low), int(high or low) + 1))
    return siblings


# ---- one measured point ---------------------------------------------------------------------
@dataclass
class Point:
    target: str
    threads: int
    rps: float = 0.0
    busy: float = 0.0  # proxy cores kept busy
    upstream_busy: float = 0.0
    load_busy: float = 0.0
    notes: list = field(default_factory=list)

    def per_core(self):
        return self.rps / self.busy if self.busy > 0 else 0.0

    def measured(self):
        return self.busy > 0


class Scaling:
    """The scaling stage (part of run.Bench): its own upstream, proxies and keys."""

    def scaling(self):
        s = self.s
        placement = Placement.for_machine(os.sched_getaffinity(0), s.scaling_load_cores, s.scaling_upstream_cores)
        counts = placement.thread_counts(s.scaling_threads)
        if placement.cores < 2:
            raise BenchError("the scaling stage needs two cores: the proxy on one, the load on the other")
        if not counts:
            raise BenchError(f"SCALING_THREADS={s.scaling_threads}: no count from 1 to {placement.cores}")
        self.scaling_tools()
        self.sc_work = self.work / "scaling"
        self.sc_work.mkdir()
        self.sc_upstream = choose_upstream(s.scaling_upstream, self.tools, placement.upstream)
        self.sc_upstream.start(self.procs, self.sc_work, getattr(self, "fd_limit", 1024))
        self.sc_load = choose_load(s.scaling_load, self.tools, placement.load, s.scaling_conns, self.sc_work)
        self.sc_placement = placement
        self.scaling_keys()
        self.perf_unusable = contention.perf_usable()
        self.log(f"scaling: {', '.join(map(str, counts))} threads x {len(TARGETS)} targets, "
                 f"{s.scaling_warmup} s warm-up + {s.scaling_seconds} s each; {self.sc_load.describe()}; "
                 f"{self.sc_upstream.describe()}")
        points, self.profiles = [], {}
        for threads in counts:
            for target in TARGETS:
                points.append(self.scaling_point(target, threads, counts))
        self.procs.stop(self.sc_upstream.proc)
        self.scaling_text = self.render_scaling(points, counts)
        return self.scaling_text

    def scaling_tools(self):
        """wrk (the load) and perf (the evidence) when missing, if apt-get can: the stage runs
        without either (loadgen; no perf figures)."""
        wanted = [("linux-perf", "perf")] + ([("wrk", "wrk")] if self.s.scaling_load != "loadgen" else [])
        missing = [pkg for pkg, tool in wanted if not shutil.which(tool)]
        if missing:
            try_apt_install(missing, self.log, timeout_s=45)

    def scaling_keys(self):
        """The keys every Portcullis target uses, in a key store all the stage's configs share."""
        config = self.scaling_config("portcullis_log_off", 1, free_port(), free_port())
        self.sc_keys = {
            "plain": callgrind.create_key(self.tools.gateway, config, "scaling"),
            "budget": callgrind.create_key(self.tools.gateway, config, "scaling-tokens-per-day",
                                           "--tokens-per-day", str(TOKENS_PER_DAY)),
        }

    def scaling_config(self, target, threads, port, metrics_port):
        access_log = str(self.sc_work / f"access-t{threads}.log") if target == "portcullis_log_file" else "off"
        path = self.sc_work / f"{target}-t{threads}.toml"
        path.write_text(configs.scaling(self.tools.config_writer, self.sc_work, port, metrics_port,
                                        self.sc_upstream.port, threads, access_log,
                                        governed=target == "portcullis_openai_budget"))
        return path

    def scaling_point(self, target, threads, counts):
        """One target at one thread count, measured (and profiled at the ends of `counts`); a
        point that cannot be measured says why and the stage goes on."""
        point = Point(target, threads)
        proc = None
        try:
            proc, request = self.start_target(target, threads)
            self.check_target(target, request)
            self.measure_point(point, proc, request)
            self.log(f"scaling: {target} at {threads} thread(s): {point.rps:.0f} req/s on {point.busy:.2f} busy "
                     f"cores = {point.per_core():.0f} per core" + "".join(f"; {n}" for n in point.notes))
            if target == "portcullis_log_file":
                self.check_access_log(point)
            if target == PROFILED and threads in (counts[0], counts[-1]) and not self.perf_unusable:
                self.profiles[threads] = self.profile_safely(proc, request, threads, largest=threads == counts[-1])
        except (Skipped, BenchError, subprocess.CalledProcessError, OSError, http.client.HTTPException) as e:
            point.notes.append(f"not measured: {e}")
            self.log(f"scaling: {target} at {threads} thread(s) not measured: {e}")
        finally:
            if proc is not None:
                self.procs.stop(proc)
            Path(self.sc_work / f"access-t{threads}.log").unlink(missing_ok=True)
        for name, value in point_figures(point).items():
            self.raw.record(name, value)
        return point

    def start_target(self, target, threads):
        """The target's proxy on cores 0..threads−1 → (its process, the Request to load it with)."""
        cores = cpu_list(self.sc_placement.proxy(threads))
        port = free_port()
        if target == "floor":
            log = self.sc_work / f"floor-t{threads}.log"
            proc = self.procs.start(
                [self.tools.floor, "--listen", f"127.0.0.1:{port}",
                 "--upstream", f"127.0.0.1:{self.sc_upstream.port}", "--key", self.sc_keys["plain"],
                 "--threads", threads],
                cpu=cores, stdout=log, stderr=subprocess.STDOUT)
            line = wait_line(log, "listening")
            if threads > 1 and not line.endswith(f"threads {threads}"):
                self.procs.stop(proc)
                raise Skipped(f"{self.tools.floor} predates --threads (one thread whatever it is given): "
                              "rebuild it, cargo build --release -p portcullis-floor")
            wait_http(f"http://127.0.0.1:{port}/")
            return proc, Request(port, "/v1/infer/v1/chat/completions", self.sc_keys["plain"], CHAT_BODY)
        self.sc_metrics_port = free_port()
        config = self.scaling_config(target, threads, port, self.sc_metrics_port)
        proc = self.procs.start([self.tools.gateway, "serve", "--config", config], cpu=cores,
                                stderr=self.sc_work / f"{target}-t{threads}.log", env={"RUST_LOG": "warn"})
        wait_http(f"http://127.0.0.1:{port}/healthz")
        if target == "portcullis_openai_budget":
            return proc, Request(port, "/v1/governed/v1/chat/completions", self.sc_keys["budget"], CHAT_BODY)
        return proc, Request(port, "/v1/infer/v1/chat/completions", self.sc_keys["plain"], CHAT_BODY)

    def check_target(self, target, request):
        """A 200 with the upstream's answer; the budgeted key's answer carries its budget."""
        conn = http.client.HTTPConnection("127.0.0.1", request.port, timeout=5)
        try:
            conn.request("POST", request.path, body=request.body,
                         headers={"authorization": f"Bearer {request.token}", "content-type": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        if resp.status != 200 or b"chat.completion" not in body:
            raise BenchError(f"{target}: a chat answered {resp.status}: {body[:200]!r}")
        if target == "portcullis_openai_budget" and resp.getheader("x-ratelimit-limit-tokens") != str(TOKENS_PER_DAY):
            raise BenchError(f"{target}: the answer carries no token budget: {resp.getheaders()}")

    def measure_point(self, point, proc, request):
        """Warm-up, then the measured run: req/s and the CPU the proxy, the upstream and the
        load took over it."""
        s = self.s
        self.sc_load.warm(request, s.scaling_warmup, point.threads)
        proxy0, up0 = cpu_ticks(proc.pid), self.upstream_ticks()
        run = self.sc_load.run(request, s.scaling_seconds)
        proxy_s = (cpu_ticks(proc.pid) - proxy0) / CLK_TCK
        upstream_s = (self.upstream_ticks() - up0) / CLK_TCK
        point.rps = run.rps()
        point.busy = proxy_s / run.wall_s
        point.upstream_busy = upstream_s / run.wall_s
        point.load_busy = run.load_cpu_s / run.wall_s
        if run.errors:
            point.notes.append(f"{run.errors} requests failed or not 200")
        if not run.saturated:
            point.notes.append("not saturated: the load kept its schedule")
        upstream_cores = len(getattr(self.sc_upstream, "cores", [])) or 1
        if self.sc_upstream.name == "fast_upstream" and point.upstream_busy > 0.9 * upstream_cores:
            point.notes.append(f"upstream-bound: fast_upstream {point.upstream_busy:.2f} cores busy")
        if point.busy < 0.8 * point.threads and not self.sc_placement.overlap(point.threads):
            point.notes.append(f"proxy {point.busy / point.threads:.0%} busy: held back by the load, the upstream "
                               "or the machine")

    def upstream_ticks(self):
        total = 0
        for pid in self.sc_upstream.pids():
            try:
                total += cpu_ticks(pid)
            except OSError:
                pass
        return total

    def check_access_log(self, point):
        """Lines the writer dropped make the log look cheaper than it is: counted, reported."""
        text = http_get_text(f"http://127.0.0.1:{self.sc_metrics_port}/metrics")
        dropped = sum(float(line.split()[-1]) for line in text.splitlines()
                      if line.startswith("portcullis_access_log_dropped_total"))
        if dropped:
            point.notes.append(f"{dropped:.0f} access-log lines dropped")

    # ---- contention evidence ----------------------------------------------------------------
    def profile_safely(self, proc, request, threads, largest):
        """profile_point, whose failure (perf refused, or gone) is reported, never raised."""
        try:
            return self.profile_point(proc, request, threads, largest)
        except Exception as e:  # noqa: BLE001: the evidence is optional, the figures are not
            return {"error": f"{type(e).__name__}: {e}"}

    def profile_point(self, proc, request, threads, largest):
        """perf on the proxy while the same load runs again → {per_request: stat counts per
        request, symbols: {symbol: CPU ns per request}, error; c2c: report lines, at the
        largest count}."""
        prof = contention.Profile(self.sc_work, f"t{threads}", self.sc_placement.load)
        ran = {}
        cpu0 = cpu_ticks(proc.pid)
        loading = threading.Thread(target=self.keep_loading, args=(request, contention.PERF_SECONDS + 1.5, ran))
        loading.start()
        time.sleep(0.5)
        prof.start(proc.pid)
        counts, error = prof.finish()
        loading.join()
        cpu_s = (cpu_ticks(proc.pid) - cpu0) / CLK_TCK
        run = ran.get("run")
        if run is None or not run.requests:
            return {"error": f"the load under perf failed: {ran.get('error')}"}
        window_requests = run.rps() * contention.PERF_SECONDS
        ns_per_request = cpu_s * 1e9 / run.requests
        found = {
            "per_request": contention.per_request(counts, window_requests),
            "symbols": {sym: share * ns_per_request for sym, share in prof.symbols().items()},
            "ns_per_request": ns_per_request,
            "error": error,
        }
        if largest:
            found["c2c"] = self.c2c_point(proc, request)
        return found

    def keep_loading(self, request, seconds, into):
        try:
            into["run"] = self.sc_load.run(request, seconds)
        except BenchError as e:
            into["error"] = str(e)

    def c2c_point(self, proc, request):
        """perf c2c under the same load, if this machine samples memory accesses (a quick
        probe first: where it does not, no load is spent on it)."""
        probe = subprocess.run(["perf", "c2c", "record", "-o", self.sc_work / "perf-c2c-probe.data", "--", "true"],
                               capture_output=True, text=True)
        said = probe.stdout + probe.stderr
        if probe.returncode != 0 or "failed" in said.lower():
            return [f"perf c2c: unavailable here ({contention.last_line(said)})."]
        ran = {}
        loading = threading.Thread(target=self.keep_loading, args=(request, contention.PERF_SECONDS + 1.5, ran))
        loading.start()
        time.sleep(0.5)
        lines = contention.c2c(self.sc_work, proc.pid, self.sc_placement.load)
        loading.join()
        return lines

    # ---- the report -------------------------------------------------------------------------
    def render_scaling(self, points, counts):
        s = self.s
        by = {(p.target, p.threads): p for p in points}
        largest, first = counts[-1], counts[0]
        lines = [
            "### Scaling with the cores",
            "",
            f"{self.sc_placement.cores} cores; {s.scaling_warmup} s warm-up then {s.scaling_seconds} s per point. "
            f"Load: {self.sc_load.describe()}. Upstream: {self.sc_upstream.describe()}.",
            *self.sc_placement.describe(largest),
            "",
            "Requests per second per busy proxy core (requests ÷ the proxy's user + system CPU seconds):",
            "",
            "| worker threads | " + " | ".join(TARGETS.values()) + " |",
            "|---:|" + "---:|" * len(TARGETS),
        ]
        for t in counts:
            lines.append(f"| {t} | " + " | ".join(kilo(by[(target, t)]) for target in TARGETS) + " |")
        if largest != first:
            lines.append(f"| {largest} ÷ {first} | "
                         + " | ".join(scaling_ratio(by[(target, first)], by[(target, largest)]) for target in TARGETS)
                         + " |")
        lines += ["", "| target | threads | req/s | proxy busy cores | req/s per busy core | upstream busy cores "
                      "| load busy cores | notes |", "|---|---:|---:|---:|---:|---:|---:|---|"]
        for p in points:
            lines.append(f"| {p.target} | {p.threads} | {p.rps:.0f} | {p.busy:.2f} | {p.per_core():.0f} "
                         f"| {p.upstream_busy:.2f} | {p.load_busy:.2f} | {'; '.join(p.notes)} |")
        lines += ["", *self.contention_lines(counts), "", "```"]
        for p in points:
            lines += [f"{name} {value}" for name, value in point_figures(p).items()]
        if largest != first:
            for target in TARGETS:
                ratio = scaling_ratio(by[(target, first)], by[(target, largest)], suffix="")
                lines.append(f"scaling_ratio_{target} {ratio}")
        lines.append("```")
        return "\n".join(lines) + "\n"

    def contention_lines(self, counts):
        largest, first = counts[-1], counts[0]
        head = (f"Contention, {PROFILED} at {first} and {largest} threads (perf attached for "
                f"{contention.PERF_SECONDS} s, the same load on):")
        if self.perf_unusable:
            return [f"Contention: perf unavailable: {self.perf_unusable}."]
        if largest == first or first not in self.profiles or largest not in self.profiles:
            return [f"Contention: not profiled (one thread count, or {PROFILED} not measured at both ends)."]
        a, b = self.profiles[first], self.profiles[largest]
        errors = [x["error"] for x in (a, b) if x.get("error")]
        if errors:
            return [f"Contention: perf failed: {errors[0]}."]
        cpu = (f"CPU per request under perf: {a['ns_per_request'] / 1000:.1f} µs at {first} thread(s), "
               f"{b['ns_per_request'] / 1000:.1f} µs at {largest}.")
        return [head, "", cpu, "", *contention.stat_lines(a["per_request"], b["per_request"], first, largest), "",
                *contention.growth_lines(a["symbols"], b["symbols"], first, largest), "", *b.get("c2c", [])]


def kilo(point):
    return f"{point.per_core() / 1000:.1f}k" if point.measured() else "n/a"


def scaling_ratio(low, high, suffix="×"):
    if not (low.measured() and high.measured()):
        return "n/a"
    return f"{high.per_core() / low.per_core():.3f}{suffix}"


def point_figures(point):
    """A point's `name value` lines (empty when it was not measured)."""
    if not point.measured():
        return {}
    tag = f"{point.target}_t{point.threads}"
    return {
        f"scaling_rps_per_core_{tag}": f"{point.per_core():.0f}",
        f"scaling_rps_{tag}": f"{point.rps:.0f}",
        f"scaling_busy_cores_{tag}": f"{point.busy:.3f}",
        f"scaling_upstream_busy_cores_{tag}": f"{point.upstream_busy:.3f}",
        f"scaling_load_busy_cores_{tag}": f"{point.load_busy:.3f}",
    }
