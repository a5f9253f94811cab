"""Evidence of what worker threads share, from perf, for the scaling stage (stages_scaling.py):
so the cause of a per-core rate that falls with the threads is shown, not guessed.

Three readings, each taken where the machine allows it and otherwise reported as unavailable
(a container or a VM often has perf but no hardware counters; perf may be missing altogether);
none of them ever fails the stage:

- `perf c2c record/report` at the largest thread count: the cache lines written by one core and
  read by another (HITM), and the symbols touching them. Needs the CPU's memory-sampling
  events (Intel PEBS load latency, AMD IBS).
- `perf stat` of cache misses and references per request, at 1 thread and at the largest count:
  a line bouncing between cores shows as misses per request that grow with the threads.
- `perf record -e cpu-clock` (a software clock: works where hardware counters do not), at 1
  thread and at the largest count: each symbol's CPU nanoseconds per request at both, the ones
  that grew the most first. A contended atomic or lock costs more per request on more threads,
  so the code that touches shared state rises in this list.

perf runs on the load's cores, attached to the proxy's pid for PERF_SECONDS while the
stage keeps the load on."""

import re
import shutil
import subprocess

from common import pinned
from scaling_load import cpu_list

PERF_SECONDS = 3
STAT_EVENTS = ["cache-misses", "cache-references", "LLC-load-misses", "instructions", "cycles"]
TOP_SYMBOLS = 15
SYMBOL_WIDTH = 90


def perf_usable():
    """None when perf can attach a software clock here, else why not."""
    if not shutil.which("perf"):
        return "perf is not installed (apt-get install linux-perf was tried, or skipped offline)"
    done = subprocess.run(["perf", "stat", "-e", "task-clock", "true"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"perf cannot count here: {last_line(done.stderr)}"
    return None


def last_line(text):
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


class Profile:
    """One profiling window on the proxy: perf stat and perf record at once → per request."""

    def __init__(self, work, name, cores):
        self.work, self.name, self.cores = work, name, cores
        self.samples = work / f"perf-{name}.data"

    def start(self, pid):
        """perf stat and perf record attached to pid for PERF_SECONDS, on the load's cores."""
        cores = cpu_list(self.cores)
        window = ["--", "sleep", str(PERF_SECONDS)]
        self.stat = subprocess.Popen(
            pinned(cores, ["perf", "stat", "-x", ",", "-e", ",".join(STAT_EVENTS), "-p", str(pid), *window]),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.record = subprocess.Popen(
            pinned(cores, ["perf", "record", "-q", "-e", "cpu-clock", "-F", "997", "-p", str(pid),
                           "-o", str(self.samples), *window]),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def finish(self):
        """Waits for both → (stat counts by event or None where unsupported, record's error)."""
        stat_err = self.stat.communicate()[1]
        record_err = self.record.communicate()[1]
        counts = {}
        for line in stat_err.splitlines():
            fields = line.split(",")
            if len(fields) >= 3 and fields[2] in STAT_EVENTS:
                counts[fields[2]] = float(fields[0]) if re.fullmatch(r"[\d.]+", fields[0]) else None
        record_error = None if self.record.returncode == 0 else last_line(record_err)
        return counts, record_error

    def symbols(self):
        """{symbol: share of the samples, 0..1} from the recording."""
        done = subprocess.run(["perf", "report", "-i", self.samples, "--stdio", "--sort", "sym"],
                              capture_output=True, text=True)
        shares = {}
        for line in done.stdout.splitlines():
            m = re.match(r"\s*([\d.]+)%\s+(\[[.k]\]\s+.*\S)", line)
            if m:
                symbol = m.group(2)[:SYMBOL_WIDTH]  # two long names may share a prefix: summed
                shares[symbol] = shares.get(symbol, 0.0) + float(m.group(1)) / 100
        return shares


def c2c(work, pid, cores):
    """perf c2c record on pid for PERF_SECONDS, then its report's shared cache lines → lines of
    text for the report (or one saying why there are none)."""
    data = work / "perf-c2c.data"
    done = subprocess.run(pinned(cpu_list(cores), ["perf", "c2c", "record", "-o", str(data), "-p", str(pid),
                                                   "--", "sleep", str(PERF_SECONDS)]), capture_output=True, text=True)
    said = (done.stdout + done.stderr).strip()
    if done.returncode != 0 or "failed" in said.lower() or not data.exists():
        return [f"perf c2c: unavailable here ({last_line(said)})."]
    report = subprocess.run(["perf", "c2c", "report", "-i", data, "--stdio", "-N", "--full-symbols"],
                            capture_output=True, text=True).stdout
    return ["perf c2c, the most contended cache lines (HITM: a line another core had modified):", "", "```",
            *section(report, "Shared Data Cache Line Table", 25),
            *section(report, "Shared Cache Line Distribution Pareto", 60), "```"]


def section(report, title, lines):
    """The first `lines` lines of a perf c2c report's section, from its title on."""
    text = report.splitlines()
    for i, line in enumerate(text):
        if title in line:
            return text[i:i + lines]
    return text[:lines] if title.startswith("Shared Data") else []


def per_request(counts, requests):
    return {event: (value / requests if value is not None and requests else None) for event, value in counts.items()}


def stat_lines(first, last, low, high):
    """perf stat's events per request at `low` and `high` threads → lines for the report."""
    supported = [e for e in STAT_EVENTS if first.get(e) is not None and last.get(e) is not None]
    if not supported:
        return ["perf stat: hardware cache events are not supported here (a VM or container without the PMU)."]
    lines = [f"| perf stat, per request | {low} thread(s) | {high} threads | ratio |", "|---|---:|---:|---:|"]
    for event in supported:
        a, b = first[event], last[event]
        grew = f"{b / a:.2f}×" if a else ""
        lines.append(f"| {event} | {a:.1f} | {b:.1f} | {grew} |")
    return lines


def growth_lines(first, last, low, high):
    """The symbols whose CPU ns per request grew the most from `low` threads to `high`: two
    {symbol: ns per request} → lines for the report."""
    grown = sorted(set(first) | set(last), key=lambda s: last.get(s, 0) - first.get(s, 0), reverse=True)
    lines = [f"| symbol (cpu-clock samples) | ns/request, {low} thread(s) | ns/request, {high} threads | grew by |",
             "|---|---:|---:|---:|"]
    for symbol in grown[:TOP_SYMBOLS]:
        a, b = first.get(symbol, 0.0), last.get(symbol, 0.0)
        lines.append(f"| `{symbol.replace('|', '/')}` | {a:.0f} | {b:.0f} | {b - a:+.0f} |")
    return lines
