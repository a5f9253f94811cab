"""What the load benchmark and the instruction count share: messages, child processes that are
always cleaned up, free ports, waiting for servers, /proc readings and the parsing of the load
tools' output. Python 3 standard library only."""

import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time


class BenchError(Exception):
    """A benchmark stage that cannot go on: reported once, then everything started is stopped."""


class Log:
    """Progress on stderr, `[name  12s] message`, so stdout carries only the results."""

    def __init__(self, name):
        self.name = name
        self.begin = time.monotonic()

    def elapsed(self):
        return int(time.monotonic() - self.begin)

    def __call__(self, message):
        print(f"[{self.name} {self.elapsed():3d}s] {message}", file=sys.stderr, flush=True)


def exit_on_signals():
    """SIGINT and SIGTERM unwind through `finally` (exit status 130), so children get stopped."""

    def handler(signum, frame):
        raise SystemExit(130)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def pinned(cpu, argv):
    """argv run on the cores `cpu` names ("0", "0,1,2" or an int): through taskset, or where
    util-linux is missing, through Python setting the affinity and exec'ing argv."""
    if shutil.which("taskset"):
        return ["taskset", "-c", str(cpu), *argv]
    cores = ", ".join(str(c) for c in str(cpu).split(","))
    return [sys.executable, "-c", f"import os, sys; os.sched_setaffinity(0, {{{cores}}}); "
            "os.execvp(sys.argv[1], sys.argv[1:])", *argv]


class Processes:
    """Every child started here, stopped on close (INT, then KILL after a moment)."""

    def __init__(self):
        self.running = []

    def start(self, argv, *, cpu=None, stdout=None, stderr=None, env=None):
        """Starts argv (pinned to `cpu`, see pinned); stdout/stderr are paths (appended to),
        None for /dev/null, or subprocess.STDOUT for stderr."""
        if cpu is not None:
            argv = pinned(cpu, argv)
        files = []

        def open_out(where):
            if where is None:
                return subprocess.DEVNULL
            if where is subprocess.STDOUT or where is subprocess.PIPE:
                return where
            f = open(where, "ab")
            files.append(f)
            return f

        full_env = None if env is None else {**os.environ, **env}
        try:
            proc = subprocess.Popen(
                [str(a) for a in argv],
                stdin=subprocess.DEVNULL,
                stdout=open_out(stdout),
                stderr=open_out(stderr),
                env=full_env,
            )
        finally:
            for f in files:  # the child has its own copies
                f.close()
        self.running.append(proc)
        return proc

    def stop(self, proc, sig=signal.SIGINT, grace_s=5.0):
        """Signals proc, waits up to grace_s for it to leave, then kills it; forgets it, so that
        close() never signals a pid the system may have reused."""
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
                proc.wait(timeout=grace_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        if proc in self.running:
            self.running.remove(proc)

    def close(self):
        alive = [p for p in self.running if p.poll() is None]
        for p in alive:
            try:
                p.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass
        if alive:
            time.sleep(0.3)
        for p in alive:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.running.clear()


def sudo():
    return [] if os.geteuid() == 0 else ["sudo"]


def apt_install(packages, log):
    """Installs Debian packages (the benchmark's tools) quietly."""
    log(f"installing {' '.join(packages)} with apt-get")
    subprocess.run([*sudo(), "apt-get", "update", "-qq"], check=True)
    subprocess.run(
        [*sudo(), "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq", *packages],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def try_apt_install(packages, log, timeout_s=90):
    """apt_install for tools a stage can do without: gives up, saying so, when apt-get fails or
    takes over timeout_s in all (a machine offline, no apt, no sudo) → whether it installed."""
    deadline = time.monotonic() + timeout_s
    log(f"trying to install {' '.join(packages)} with apt-get (skipped if that fails)")
    as_root = [] if os.geteuid() == 0 else ["sudo", "-n"]  # -n: never wait for a password
    steps = [
        [*as_root, "apt-get", "update", "-qq", "-o", "Acquire::Retries=0"],
        [*as_root, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq",
         "-o", "Acquire::Retries=0", *packages],
    ]
    for command in steps:
        try:
            subprocess.run(command, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=max(1.0, deadline - time.monotonic()))
        except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            log(f"apt-get did not install {' '.join(packages)} ({type(e).__name__}): going on without")
            return False
    return True


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(host, port, path, *, method="GET", body=None, headers=None, timeout=5.0):
    """The status of one plain HTTP/1.1 request (the body is read and dropped)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def http_get_text(url, timeout=5.0):
    host, port, path = split_url(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode(errors="replace")
    finally:
        conn.close()


def split_url(url):
    """http://host:port/path → (host, port, /path)."""
    m = re.fullmatch(r"http://([^:/]+):(\d+)(/.*)?", url)
    if not m:
        raise ValueError(f"not an http://host:port URL: {url}")
    return m.group(1), int(m.group(2)), m.group(3) or "/"


def wait_http(url, seconds=20):
    """Until anything answers at url (any status), else BenchError."""
    host, port, path = split_url(url)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            http_status(host, port, path, timeout=1.0)
            return
        except (OSError, http.client.HTTPException):
            time.sleep(0.1)
    raise BenchError(f"nothing answers at {url}")


def wait_line(path, prefix, seconds=20):
    """The rest of path's first line starting with `prefix `, waiting for it, else BenchError."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    if line.startswith(prefix):
                        return line.rstrip("\n")[len(prefix):].lstrip(" ")
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    raise BenchError(f"no '{prefix}' line in {path}: {read_text(path)}")


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpu_ticks(pid):
    """User + system CPU time of pid in clock ticks (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces: count fields after its closing parenthesis.
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


CLK_TCK = os.sysconf("SC_CLK_TCK")


def status_kb(pid, field):
    """A `kB` field of /proc/PID/status (VmRSS, VmHWM), as an int."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name == field:
                return int(rest.split()[0])
    raise BenchError(f"no {field} in /proc/{pid}/status")


def child_pids(pid):
    """The pids whose parent is pid (nginx's workers under its master), lowest first."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            children.append(int(entry))
    return sorted(children)


def pairs(text):
    """loadgen's `key value key value …` output as a dict of strings."""
    words = text.split()
    return dict(zip(words[0::2], words[1::2]))


def median(values):
    """The median of numeric strings, printed as awk would print it: the middle value as it was
    written for an odd count, the mean of the middle two for an even one ("nan" for none)."""
    nums = sorted(values, key=float)
    if not nums:
        return "nan"
    mid = len(nums) // 2
    if len(nums) % 2:
        return nums[mid]
    return awk_number((float(nums[mid - 1]) + float(nums[mid])) / 2)


def awk_number(x):
    """A computed number as awk prints it: integral values whole, others as %.6g."""
    if x == x and x not in (float("inf"), float("-inf")) and x == int(x) and abs(x) < 1e16:
        return str(int(x))
    return "%.6g" % x


def require(command, hint):
    if shutil.which(command) is None:
        raise BenchError(f"{command} is needed ({hint})")
