#!/usr/bin/env bash
# Instructions per request under callgrind: benches/load/callgrind.py (same knobs and output).
exec python3 "$(dirname "$0")/../benches/load/callgrind.py" "$@"
