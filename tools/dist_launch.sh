#!/usr/bin/env bash
# Shared by tools/dist_train.sh and tools/dist_test.sh: run a tool on NUM_PROCS processes
# per node with torchrun.
#
#   bash tools/dist_launch.sh NUM_PROCS TOOL [tool arguments...]
#
# NNODES, NODE_RANK, MASTER_ADDR, PORT for several nodes; PYTHON picks the interpreter.
# On one node without PORT, torchrun's standalone rendezvous listens on a port the system
# picks, so two runs on one machine never collide; PORT fixes the port.
set -euo pipefail
NPROC=$1
TOOL=$2
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${PORT:-}" ] && [ "${NNODES:-1}" = 1 ]; then
    RENDEZVOUS=(--standalone --nnodes=1)
else
    RENDEZVOUS=(--nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}"
                --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}")
fi
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
"${PYTHON:-python}" -m torch.distributed.run \
    "${RENDEZVOUS[@]}" \
    --nproc_per_node="$NPROC" \
    "$ROOT/tools/$TOOL" "${@:3}" --launcher pytorch
