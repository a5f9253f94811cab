#!/usr/bin/env bash
# Draws a soak's CSV (tests/it/soak writes it; `make soak`, and a short run in `make test`) as a
# PNG: the serving gateway's RSS, file descriptors and TCP connections over time, each fault
# marked. Usage: scripts/soak-plot.sh CSV PNG [TITLE]
#
# Installs matplotlib (scripts/soak-requirements.txt) into target/soak-venv when missing or
# when its pin changed.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=soak-plot
. scripts/lib.sh

need python3 "the plot is drawn with matplotlib"
VENV=target/soak-venv
python_venv "$VENV" scripts/soak-requirements.txt matplotlib >&2
exec "$VENV/bin/python" scripts/soak_plot.py "$@"
