#!/usr/bin/env bash
# The main job on the embedded demo data: `make demo` (Mask R-CNN, COCO metrics) and
# `make demo-seg` (Semantic FPN, mIoU). Generates the shapes dataset into data/ (once),
# trains with the time-budgeted demo config, validates, and draws the pictures.
#
# Knobs (environment): DEMO_TRAIN / DEMO_VAL images (700 / 100), DEMO_BUDGET_S seconds
# of training (the config's), DEMO_MIN_ITERS iterations trained even when the budget
# ends sooner (1), DEMO_VAL_INTERVAL, DEMO_WORK_DIR (work_dirs/demo_<mode>), DEMO_DATA_DIR;
# STACK=onedl runs it in .venv-onedl/ (`make demo STACK=onedl`), PY any other interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${STACK:-official}" in onedl) VENV=.venv-onedl ;; *) VENV=.venv ;; esac
PY=${PY:-$VENV/bin/python}
MODE=${1:-det}
case "$MODE" in
    det) CONFIG=configs/demo/mask-rcnn_inline-pvt-t_fpn_shapes-demo.py; FORMAT=coco ;;
    seg) CONFIG=configs/demo/fpn_inline-pvt-t_shapes-demo.py; FORMAT=ade ;;
    *) echo "usage: $0 det|seg" >&2; exit 2 ;;
esac
TRAIN=${DEMO_TRAIN:-700}
VAL=${DEMO_VAL:-100}
DATA=${DEMO_DATA_DIR:-data/shapes_demo}
WORK=${DEMO_WORK_DIR:-work_dirs/demo_$MODE}
START=$(date +%s)

$PY -m mmplugin_inline.utils.env_check > /dev/null || $PY -m mmplugin_inline.utils.env_check
STAMP="$DATA/.demo-$TRAIN-$VAL"
if [ ! -f "$STAMP" ]; then
    echo "[demo] generating the shapes dataset ($TRAIN train / $VAL val images) in $DATA/"
    rm -rf "$DATA"
    $PY tools/misc/make_shapes_dataset.py "$DATA" --train "$TRAIN" --val "$VAL" \
        --min-size 192 --max-size 320 --min-shapes 1 --max-shapes 4 --noisy 0.5 --seed 0
    touch "$STAMP"
else
    echo "[demo] using the shapes dataset in $DATA/"
fi

OPTS=(train_dataloader.dataset.data_root="$DATA/" val_dataloader.dataset.data_root="$DATA/"
      test_dataloader.dataset.data_root="$DATA/")
if [ "$MODE" = det ]; then
    OPTS+=(val_evaluator.ann_file="$DATA/annotations/instances_validation.json"
           test_evaluator.ann_file="$DATA/annotations/instances_validation.json")
fi
[ -n "${DEMO_BUDGET_S:-}" ] && OPTS+=(custom_hooks.0.budget_s="$DEMO_BUDGET_S")
[ -n "${DEMO_MIN_ITERS:-}" ] && OPTS+=(custom_hooks.0.min_iters="$DEMO_MIN_ITERS")
[ -n "${DEMO_VAL_INTERVAL:-}" ] && OPTS+=(train_cfg.val_interval="$DEMO_VAL_INTERVAL")

echo "[demo] training $CONFIG (work dir $WORK)"
rm -rf "$WORK"
$PY tools/train.py "$CONFIG" --work-dir "$WORK" --cfg-options "${OPTS[@]}"

CKPT=$(cat "$WORK/last_checkpoint")
echo "[demo] drawing predictions and curves"
$PY tools/misc/demo_report.py "$CONFIG" "$CKPT" "$WORK" --out-dir "$WORK/report" \
    --cfg-options "${OPTS[@]}"
echo "[demo] done in $(( $(date +%s) - START )) s; metrics in $WORK/report/metrics.json"
