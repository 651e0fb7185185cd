#!/usr/bin/env bash
# Live `gpurec validate` on the GPU at hand for a spread of measured and unseen sets.
# Usage (repository root, GPU machine): bash scripts/device_validate.sh [BUDGET_S]
# The runs alternate training and unseen architectures, so a budget cut still leaves a spread.
# The GPU machines have no xgboost: records are measured there with the prediction pending;
# complete them here with `gpurec validate --complete datasets/validation/live_<gpu>.jsonl`
# (or carry an xgboost-cpu wheel in .whl/, see DEVELOPERS.md, and they complete in place).
set -u
BUDGET_S="${1:-300}"
export PYTHONPATH=. PYTHONUNBUFFERED=1
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=.:/tmp/site
fi
TAG=$(python3 -c "import torch; n=torch.cuda.get_device_name(0); print('h200' if 'H200' in n else 'h100' if 'H100' in n else n.split()[-1].lower())")
LOG="$OUT/live_$TAG.jsonl"
START=$(date +%s)
for spec in "resnet50 32 inference" "densenet169 8 inference" "vit_b_16 32 training" "swin_s 64 inference" \
            "mobilenet_v3_large 8 training" "efficientnet_b1 64 training" "convnext_tiny 8 inference" \
            "resnext101_32x8d 8 training" "squeezenet1_1 64 inference" "regnet_x_800mf 8 training" \
            "resnet50 32 training" "vit_b_16 32 inference"; do
  set -- $spec
  left=$(( BUDGET_S - ( $(date +%s) - START ) ))
  [ "$left" -lt 20 ] && { echo "budget reached"; break; }
  timeout "$(( left < 120 ? left : 120 ))" python3 cli.py validate --model "$1" --batch-size "$2" --mode "$3" \
    --log "$LOG" 2>&1 | tail -4
done
wc -l "$LOG"
