#!/usr/bin/env bash
# Shared by tools/slurm_train.sh and tools/slurm_test.sh: run a tool as a Slurm job,
# one task per GPU, with mmengine's slurm launcher.
#
#   bash tools/slurm_launch.sh PARTITION JOB_NAME TOOL [tool arguments...]
#
# GPUS (default 8), GPUS_PER_NODE (8), CPUS_PER_TASK (5), SRUN_ARGS (extra srun options),
# PYTHON (default python).
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
TOOL=$3
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck disable=SC2086  # SRUN_ARGS holds several options
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="${GPUS:-8}" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="${CPUS_PER_TASK:-5}" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS:-} \
    "${PYTHON:-python}" -u "$ROOT/tools/$TOOL" "${@:4}" --launcher=slurm
