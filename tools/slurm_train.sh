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
exec bash "$(dirname "$0")/slurm_launch.sh" "$1" "$2" train.py "$3" --work-dir="$4" "${@:5}"
