#!/usr/bin/env bash
# Train on several GPUs (or CPU processes) of one or more machines with torchrun.
#
#   bash tools/dist_train.sh CONFIG NUM_PROCS [train.py options...]
#
# Multi-node: run it on every node with NNODES, NODE_RANK, MASTER_ADDR and PORT set
# (one node: torchrun picks a free port unless PORT is set).
# Without GPUs each process trains on CPU (gloo backend). PYTHON picks the interpreter
# (default: python; e.g. PYTHON=.venv/bin/python).
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 CONFIG NUM_PROCS [tools/train.py options...]" >&2
    exit 2
fi
exec bash "$(dirname "$0")/dist_launch.sh" "$2" train.py "$1" "${@:3}"
