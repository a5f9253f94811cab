"""What the Python test drivers (tests/sdk/run.py, tests/admin_api/run.py) share: checks and
their results; child processes started in their own process group, ready when they print
`LISTENING <port>`, always stopped."""

import os
import re
import shutil
import selectors
import signal
import socket
import subprocess
import threading
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_TIMEOUT = 30      # seconds for any child to say it is ready


class CheckFailed(Exception):
    """An expectation not met: reported by its message alone."""


def expect(cond, message):
    if not cond:
        raise CheckFailed(message)


def expect_eq(got, want, what):
    if got != want:
        raise CheckFailed(f"{what}: expected {want!r}, got {got!r}")


class Results:
    """Counts checks; a failed check never stops the others. `quiet`: exception types reported
    by their message alone, like CheckFailed (others also get a short traceback)."""

    def __init__(self, quiet=()):
        self.passed = self.failed = 0
        self.quiet = (CheckFailed, *quiet)

    def check(self, name, fn, *args):
        try:
            detail = fn(*args)
        except Exception as e:  # a failed check never stops the others
            self.failed += 1
            msg = str(e) if isinstance(e, CheckFailed) else f"{type(e).__name__}: {e}"
            print(f"FAIL  {name}: {msg}", flush=True)
            if not isinstance(e, self.quiet):
                traceback.print_exc(limit=3, file=sys.stdout)
            return False
        self.passed += 1
        print(f"ok    {name}" + (f"  [{detail}]" if detail else ""), flush=True)
        return True

    def record(self, name, ok, detail=""):
        """Counts a result decided elsewhere (a Node test, an aborted step)."""
        def outcome():
            expect(ok, detail or "failed")
            return detail
        self.check(name, outcome)

    def skip(self, name, why):
        print(f"skip  {name}: {why}", flush=True)


class Child:
    """A child process in its own process group, stopped (TERM, then KILL) by stop().
    Every child ever started is in Child.all, so cleanup reaches even one whose start was
    interrupted."""
    all = []

    def __init__(self, name, argv, log_path, wait_listening, env=None):
        self.name, self.log_path = name, log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if wait_listening else self.log, stderr=self.log,
            start_new_session=True)
        Child.all.append(self)
        self.port = self._read_listening() if wait_listening else None

    def _read_listening(self):
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline, buf = time.monotonic() + START_TIMEOUT, b""
        try:
            while time.monotonic() < deadline:
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    break
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                m = re.search(rb"^LISTENING (\d+)\r?\n", buf, re.M)
                if m:
                    threading.Thread(target=self._drain, args=(buf[m.end():],), daemon=True).start()
                    return int(m.group(1))
        finally:
            sel.close()
        self.stop()
        raise RuntimeError(f"{self.name} did not print LISTENING within {START_TIMEOUT}s "
                           f"(exit code {self.proc.poll()}); log:\n{tail(self.log_path)}")

    def _drain(self, first):
        # Keep the pipe empty so the child can never block on a full stdout.
        self.log.write(first)
        for chunk in iter(lambda: self.proc.stdout.read1(4096), b""):
            self.log.write(chunk)
            self.log.flush()

    def stop(self):
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.log.flush()


def tail(path, lines=25):
    try:
        with open(path, "rb") as f:
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finish(res, tmp, keep, started):
    """The end of a driver's run: stop every child (a second signal must not cut this short),
    show the logs' tails and keep them when anything failed, report, and give the exit code."""
    signal.alarm(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for child in reversed(Child.all):
        child.stop()
    if res.failed:
        for name in ("gateway", "idp", "upstream"):
            print(f"---- {name}.log (tail) ----\n{tail(os.path.join(tmp, name + '.log'))}")
    if keep or res.failed:
        print(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"(took {time.monotonic() - started:.1f} s)")
    print(f"{res.passed} passed, {res.failed} failed", flush=True)
    return 1 if res.failed else 0
