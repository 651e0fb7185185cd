#!/usr/bin/env bash
# Live `gpurec validate` on the GPU at hand for a spread of measured and unseen sets.
# The GPU machines have no xgboost: records are measured there with the prediction pending;
# complete them here with `gpurec validate --complete datasets/validation/live_<gpu>.jsonl`.
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
TAG=$(python3 -c "import torch; n=torch.cuda.get_device_name(0); print('h200' if 'H200' in n else 'h100' if 'H100' in n else n.split()[-1].lower())")
LOG="$OUT/live_$TAG.jsonl"
for spec in "resnet50 32" "vit_b_16 32" "mobilenet_v3_large 8" "convnext_tiny 8" "densenet169 8" "swin_s 64" \
            "efficientnet_b1 64" "resnext101_32x8d 8" "squeezenet1_1 64" "regnet_x_800mf 8"; do
  set -- $spec
  for mode in inference training; do
    timeout 120 python3 cli.py validate --model "$1" --batch-size "$2" --mode "$mode" --log "$LOG" 2>&1 | tail -4
  done
done
