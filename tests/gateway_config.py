"""The gateway's config file for the suites outside Rust (tests/sdk/run.py, tests/admin_api/run.py,
benches/load/configs.py; tests/gateway_config.mjs does the same for Node): a description, a dict
of the TOML's shape (documented in testkit/src/bin/gateway-config.rs), written as TOML by the
test kit's typed config builder, the one the Rust tests use, through its `gateway-config`
binary. No suite writes gateway TOML by hand."""

import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "target", "debug", "gateway-config")  # `cargo build` builds it


def render(description, binary=BINARY):
    """The TOML for `description`; RuntimeError with the tool's message when it refuses it."""
    binary = str(binary)
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"{binary} missing: cargo build -p testkit --bin gateway-config")
    done = subprocess.run([binary], input=json.dumps(description), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{binary} refused the gateway's description: {done.stderr.strip()}")
    return done.stdout


def write(path, description, binary=BINARY):
    """render(description) written to `path`; returns `path`."""
    text = render(description, binary)
    with open(path, "w") as f:
        f.write(text)
    return path
