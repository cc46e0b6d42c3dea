#!/usr/bin/env bash
# Test a checkpoint on a Slurm cluster: one task per GPU, mmengine's slurm launcher.
#
#   GPUS=8 bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options...]
#
# GPUS (default 8), GPUS_PER_NODE (8), CPUS_PER_TASK (5), SRUN_ARGS (extra srun options),
# PYTHON (default python).
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG CHECKPOINT [tools/test.py options...]" >&2
    exit 2
fi
exec bash "$(dirname "$0")/slurm_launch.sh" "$1" "$2" test.py "$3" "$4" "${@:5}"
