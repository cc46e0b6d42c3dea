#!/usr/bin/env bash
# Test a checkpoint on several GPUs (or CPU processes) of one or more machines with torchrun.
#
#   bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py options...]
#
# Multi-node: run it on every node with NNODES, NODE_RANK, MASTER_ADDR and PORT set
# (one node: torchrun picks a free port unless PORT is set).
# Without GPUs each process runs on CPU (gloo backend). PYTHON picks the interpreter
# (default: python; e.g. PYTHON=.venv/bin/python).
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 CONFIG CHECKPOINT NUM_PROCS [tools/test.py options...]" >&2
    exit 2
fi
exec bash "$(dirname "$0")/dist_launch.sh" "$3" test.py "$1" "$2" "${@:4}"
