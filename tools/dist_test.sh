#!/usr/bin/env bash
# Test a checkpoint on several GPUs (or CPU processes) of one or more machines with torchrun.
#
#   bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py options...]
#
# Multi-node: run it on every node with NNODES, NODE_RANK, MASTER_ADDR and PORT set.
# Without GPUs each process runs on CPU (gloo backend). PYTHON picks the interpreter
# (default: python; e.g. PYTHON=.venv/bin/python).
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 CONFIG CHECKPOINT NUM_PROCS [tools/test.py options...]" >&2
    exit 2
fi
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
PYTHON=${PYTHON:-python}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --master_port="$PORT" \
    --nproc_per_node="$NPROC" \
    "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
