"""The load and the upstream of the scaling stage (stages_scaling.py), each on cores of its own,
each in two kinds so the stage runs on a machine with nothing installed:

- load: wrk (`-t<load cores> -c<connections>`), or, where wrk is missing, the repository's
  loadgen driven past what the proxy serves. loadgen has no closed-loop mode: its `rate` mode
  sends on a fixed schedule, so asked for more than the proxy serves, every connection falls
  behind and sends its next request as soon as the last is answered, which is closed loop. The
  rate asked is OVERSHOOT times what the warm-up measured, for SECONDS / OVERSHOOT of schedule,
  so the run lasts about SECONDS; a run that kept to its schedule was not saturated, and says so.
- upstream: nginx (one worker per upstream core, a static chat completion) where installed,
  else the repository's fast_upstream with a thread per upstream core (`--threads`); its busy
  cores are reported beside the proxy's, so a point it bounds shows.

What a load run gives back (Run): requests answered, wall seconds, the load generator's own
CPU seconds, and whether the proxy was saturated."""

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass

from common import BenchError, child_pids, free_port, pairs, pinned, wait_http, wait_line
import configs

# fast_upstream's answer to a chat POST (benches/load/fast_upstream.rs, CHAT), served by nginx too.
CHAT_ANSWER = ('{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench",'
               '"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},'
               '"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}')


def cpu_list(cores):
    """A list of cores as taskset writes it: "0,1,2"."""
    return ",".join(str(c) for c in sorted(set(cores)))


@dataclass
class Request:
    """The chat POST of one target: where it goes and with which bearer."""
    port: int
    path: str
    token: str
    body: str

    def url(self):
        return f"http://127.0.0.1:{self.port}{self.path}"


@dataclass
class Run:
    requests: int
    wall_s: float
    load_cpu_s: float
    saturated: bool = True
    errors: int = 0

    def rps(self):
        return self.requests / self.wall_s if self.wall_s > 0 else 0.0


def run_accounted(argv):
    """Runs argv to its end → (its stdout and stderr, exit status, its CPU seconds, user +
    system, from the kernel's accounting of the child)."""
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()  # until it exits
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return out, proc.returncode, usage.ru_utime + usage.ru_stime


# ---- the load --------------------------------------------------------------------------------
class WrkLoad:
    """wrk, one thread per load core: a closed loop of `conns` kept-alive connections."""

    name = "wrk"

    def __init__(self, cores, conns, work):
        self.cores, self.conns = cores, conns
        self.script = work / "scaling-post.lua"

    def describe(self):
        return f"wrk -t{len(self.cores)} -c{self.conns} on cores {cpu_list(self.cores)}"

    def warm(self, request, seconds, threads):
        self.run(request, seconds)

    def run(self, request, seconds):
        self.script.write_text(f'wrk.method = "POST"\nwrk.body = \'{request.body}\'\n'
                               'wrk.headers["Content-Type"] = "application/json"\n')
        argv = pinned(cpu_list(self.cores), [
            "wrk", f"-t{len(self.cores)}", f"-c{self.conns}", f"-d{max(1, round(seconds))}s", "-s", self.script,
            "-H", f"Authorization: Bearer {request.token}", request.url()])
        begin = time.monotonic()
        out, status, cpu = run_accounted(argv)
        wall = time.monotonic() - begin
        done = re.search(r"^\s*(\d+) requests in ([\d.]+)(m?s)", out, re.M)
        if status != 0 or not done:
            raise BenchError(f"wrk exited with {status}: {out[-400:]}")
        failed = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
        seconds_run = float(done.group(2)) / (1000 if done.group(3) == "ms" else 1)
        return Run(int(done.group(1)), seconds_run or wall, cpu, errors=int(failed.group(1)) if failed else 0)


class LoadgenLoad:
    """loadgen rate asked for more than the proxy serves (closed loop in effect, see above)."""

    name = "loadgen"
    OVERSHOOT = 1.5
    # The first probe of a target asks this many req/s per proxy thread: more than any target
    # serves, for PROBE_S of schedule.
    PROBE_PER_THREAD = 50_000
    PROBE_S = 0.1
    START_DELAY_S = 0.2  # loadgen's own, before its first send

    def __init__(self, tool, cores, conns, why):
        self.tool, self.cores, self.conns, self.why = tool, cores, conns, why
        self.estimate = None

    def describe(self):
        return (f"loadgen rate -c{self.conns} on cores {cpu_list(self.cores)}, asked {self.OVERSHOOT}× "
                f"what the warm-up served ({self.why})")

    def warm(self, request, seconds, threads):
        """A short probe far above the target's rate, then steps of about a second at OVERSHOOT
        times the last step's rate until the warm-up's time is spent: a step that kept its
        schedule served all it was asked, so the next asks OVERSHOOT times more."""
        begin = time.monotonic()
        self.estimate = self.once(request, threads * self.PROBE_PER_THREAD, self.PROBE_S).rps()
        while (rest := seconds - (time.monotonic() - begin)) > 0.3:
            self.estimate = self.once(request, self.OVERSHOOT * self.estimate, min(rest, 1.0) / self.OVERSHOOT).rps()

    def run(self, request, seconds):
        """OVERSHOOT times the estimate for seconds / OVERSHOOT of schedule; once more from what
        it served if the proxy kept up (then it was not saturated)."""
        if not self.estimate:
            raise BenchError("loadgen: no warm-up estimate to ask a rate from")
        for _ in range(2):
            scheduled = seconds / self.OVERSHOOT
            result = self.once(request, self.OVERSHOOT * self.estimate, scheduled)
            # A proxy that kept up let loadgen keep its schedule: then the load was open, not closed.
            result.saturated = result.wall_s > 1.1 * scheduled
            self.estimate = max(self.estimate, result.rps())
            if result.saturated:
                break
        return result

    def once(self, request, rate, scheduled_s):
        argv = pinned(cpu_list(self.cores), [
            self.tool, "rate", "--addr", f"127.0.0.1:{request.port}", "--path", request.path, "--method", "POST",
            "--header", f"authorization: Bearer {request.token}", "--header", "content-type: application/json",
            "--body", request.body, "--rate", "%.0f" % max(rate, 1), "--conns", self.conns,
            "--seconds", "%.3f" % scheduled_s, "--warmup-s", "0"])
        begin = time.monotonic()
        out, status, cpu = run_accounted(argv)
        wall = time.monotonic() - begin - self.START_DELAY_S
        figures = pairs(out)
        if status != 0 or "count" not in figures:
            raise BenchError(f"loadgen exited with {status}: {out[-400:]}")
        return Run(int(figures["count"]), max(wall, 1e-3), cpu, errors=int(figures.get("errors", 0)))


def choose_load(kind, tools, cores, conns, work):
    """SCALING_LOAD: "wrk", "loadgen", or "" for wrk where installed."""
    if kind == "wrk" or (not kind and shutil.which("wrk")):
        if not shutil.which("wrk"):
            raise BenchError("SCALING_LOAD=wrk but wrk is not installed")
        return WrkLoad(cores, conns, work)
    return LoadgenLoad(tools.loadgen, cores, conns, "SCALING_LOAD=loadgen" if kind else "wrk is not installed")


# ---- the upstream ----------------------------------------------------------------------------
class FastUpstream:
    """benches/load/fast_upstream.rs: a thread per upstream core (`--threads`), on those cores."""

    name = "fast_upstream"

    def __init__(self, tool, cores):
        self.tool, self.cores = tool, cores

    def describe(self):
        return f"fast_upstream ({len(self.cores)} threads) on cores {cpu_list(self.cores)}"

    def start(self, procs, work, fd_limit):
        self.port = free_port()
        log = work / "scaling-upstream.log"
        threads = str(len(self.cores))
        self.proc = procs.start([self.tool, "--port", self.port, "--max-life-s", "3600",
                                 "--threads", threads],
                                cpu=cpu_list(self.cores), stdout=log, stderr=subprocess.STDOUT)
        wait_line(log, "listening")

    def pids(self):
        return [self.proc.pid]


class NginxUpstream:
    """nginx answering the chat completion itself, one worker per upstream core."""

    name = "nginx"

    def __init__(self, binary, cores):
        self.binary, self.cores = binary, cores

    def describe(self):
        return f"nginx ({len(self.cores)} workers, a static chat completion) on cores {cpu_list(self.cores)}"

    def start(self, procs, work, fd_limit):
        self.port = free_port()
        d = work / "scaling-nginx"
        (d / "tmp").mkdir(parents=True, exist_ok=True)
        conf = d / "nginx.conf"
        conf.write_text(configs.nginx_upstream(d, fd_limit, self.port, len(self.cores), CHAT_ANSWER))
        self.proc = procs.start([self.binary, "-p", d, "-c", conf, "-e", d / "error.log"],
                                cpu=cpu_list(self.cores), stderr=d / "stderr.log")
        wait_http(f"http://127.0.0.1:{self.port}/")

    def pids(self):
        return child_pids(self.proc.pid)


def nginx_binary():
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    return found if os.access(found, os.X_OK) else None


def choose_upstream(kind, tools, cores):
    """SCALING_UPSTREAM: "nginx", "fast", or "" for nginx where installed."""
    nginx = nginx_binary()
    if kind == "nginx" or (not kind and nginx):
        if not nginx:
            raise BenchError("SCALING_UPSTREAM=nginx but nginx is not installed")
        return NginxUpstream(nginx, cores)
    return FastUpstream(tools.fast_upstream, cores)
