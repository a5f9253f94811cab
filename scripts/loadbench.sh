#!/usr/bin/env bash
# The load benchmark (`make bench`) is benches/load/run.py; its knobs are environment variables.
exec python3 "$(dirname "$0")/../benches/load/run.py" "$@"
