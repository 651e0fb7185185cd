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
nvidia-smi --query-gpu=index,name,uuid,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
  --format=csv > "$OUT/nvsmi_validate.txt" 2>&1
# MODEL BATCH MODE [validate flags]: torchvision classifiers first (the H100 logs' list, so the same
# sets line up across machines and GPUs), then gpurec's sequence models and bf16-mixed steps
# (training and held-out architectures alternating), each a set collection measured too.
SPECS=(
  "resnet50 32 inference" "densenet169 8 inference" "vit_b_16 32 training" "swin_s 64 inference"
  "mobilenet_v3_large 8 training" "efficientnet_b1 64 training" "convnext_tiny 8 inference"
  "resnext101_32x8d 8 training" "squeezenet1_1 64 inference" "regnet_x_800mf 8 training"
  "resnet50 32 training" "vit_b_16 32 inference"
  "gpt_d512 4 training --seq-len 512" "gpt_d768 8 inference --seq-len 256"
  "bert_d512_pre 8 inference --seq-len 128" "bert_d384_pre 16 training --seq-len 128"
  "lstm_lm_2x512 8 training --seq-len 128" "lstm_lm_3x768 8 inference --seq-len 96"
  "gru_cls_bi_2x384 8 training --seq-len 96"
  "resnet50 128 training --precision bf16-mixed" "gpt_d768 8 training --seq-len 256 --precision bf16-mixed"
  "bert_d512_pre 32 inference --seq-len 128 --precision bf16-mixed"
  "bert_d384_pre 16 inference --seq-len 384 --precision bf16-mixed"
  "lstm_lm_3x768 8 training --seq-len 96 --precision bf16-mixed"
)
for spec in "${SPECS[@]}"; do
  set -- $spec
  left=$(( BUDGET_S - ( $(date +%s) - START ) ))
  [ "$left" -lt 20 ] && { echo "budget reached"; break; }
  model=$1 batch=$2 mode=$3; shift 3
  timeout "$(( left < 120 ? left : 120 ))" python3 cli.py validate --model "$model" --batch-size "$batch" \
    --mode "$mode" "$@" --log "$LOG" 2>&1 | tail -4
done
wc -l "$LOG"
