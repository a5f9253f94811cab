"""The binaries the load benchmark runs: where they are, how they are built (the gateway, the
load tools as release examples, the floor twice) and the Debian tools installed when missing.
run.py and callgrind.py take the paths from here."""

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from common import BenchError, apt_install, require

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
# The test kit's gateway-config, which writes every gateway config of the run (configs.py); the
# first build makes it with the gateway (package testkit is a default member of the workspace).
CONFIG_WRITER = TARGET / "release" / "gateway-config"
BUILDS = [
    ["cargo", "build", "--release", "--quiet"],  # the gateway (and testkit's gateway-config)
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
    config_writer: Path

    @classmethod
    def built(cls, gateway=None, examples=None, floor=None, config_writer=None):
        """The binaries where the builds above leave them, or where the arguments say."""
        examples = Path(examples or EXAMPLES)
        return cls(
            gateway=Path(gateway or GATEWAY),
            fast_upstream=examples / FAST_UPSTREAM,
            bench_idp=examples / BENCH_IDP,
            loadgen=examples / LOADGEN,
            floor=Path(floor or FLOOR),
            floor_unpatched=FLOOR_UNPATCHED,
            config_writer=Path(config_writer or CONFIG_WRITER),
        )

    @classmethod
    def from_env(cls):
        """The binaries where BIN (the gateway), EX (the examples' folder), FLOOR and CONFIG_BIN
        (gateway-config) say, relative to the repository's root or absolute; each left out is
        where the builds above leave it. How a run uses binaries built elsewhere (another work
        tree, a machine with no toolchain)."""

        def env_path(name):
            value = os.environ.get(name)
            return ROOT / value if value else None

        return cls.built(env_path("BIN"), env_path("EX"), env_path("FLOOR"), env_path("CONFIG_BIN"))


def prebuilt():
    """Whether BIN names a gateway built elsewhere: then nothing is built."""
    return bool(os.environ.get("BIN"))


def build(log, unpatched_floor=True, floor=True, examples=True):
    """examples=False (ONLY=routing): the gateway alone, and no floor."""
    floors = "no floor" if not floor else "the floor twice" if unpatched_floor else "the floor"
    log(f"building (cargo build --release; the load tools as release examples; {floors})")
    for command in BUILDS if floor else BUILDS[:2] if examples else BUILDS[:1]:
        subprocess.run(command, cwd=ROOT, check=True)
    if unpatched_floor and floor:
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
