#!/usr/bin/env bash
# Train on a Slurm cluster: one task per GPU, mmengine's slurm launcher.
#
#   GPUS=16 bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py options...]
#
# GPUS (default 8), GPUS_PER_NODE (8), CPUS_PER_TASK (5), SRUN_ARGS (extra srun options),
# PYTHON (default python).
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [tools/train.py options...]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
PYTHON=${PYTHON:-python}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

# shellcheck disable=SC2086  # SRUN_ARGS holds several options
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    $SRUN_ARGS \
    "$PYTHON" -u "$ROOT/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "${@:5}"
