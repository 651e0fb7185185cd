#!/usr/bin/env bash
# Activation checkpointing measured: training steps of named training architectures, each plain
# and with every repeated block inside torch.utils.checkpoint (`gpurec validate --checkpoint-blocks`,
# gpurec.ops.checkpointing), one after the other on the same card, so the measured cost of the
# recomputation (time, energy) and the memory it saves stand beside what `predict
# --checkpoint-blocks` says.  Held-out architectures stay out.  Records go to their own log,
# $OUT/checkpoint_<gpu>.jsonl (docs/validation.md, "Activation checkpointing, measured"); without xgboost on the
# GPU machine they are completed here: `gpurec validate --complete datasets/validation/checkpoint_<gpu>.jsonl`.
# Usage (repository root, GPU machine): [CHECKPOINT_SPECS="MODEL BATCH [flags];..."] bash scripts/device_checkpoint.sh [BUDGET_S]
set -u
BUDGET_S="${1:-500}"
export PYTHONPATH=. PYTHONUNBUFFERED=1
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=.:/tmp/site
fi
TAG=$(python3 -c "import torch; n=torch.cuda.get_device_name(0); print('h200' if 'H200' in n else 'h100' if 'H100' in n else n.split()[-1].lower())")
LOG="$OUT/checkpoint_$TAG.jsonl"
START=$(date +%s)
nvidia-smi --query-gpu=index,name,uuid,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
  --format=csv > "$OUT/nvsmi_checkpoint.txt" 2>&1
# MODEL BATCH [flags]: each runs plain, then checkpointed; transformers first (where users checkpoint).
SPECS=(
  "gpt_d512 8 --seq-len 512" "bert_d512_pre 16 --seq-len 256" "vit_b_16 32" "resnet50 64"
  "gpt_d1024 8 --seq-len 512 --precision bf16-mixed" "bert_d1024_pre 8 --seq-len 256" "swin_t 32"
  "mobilenet_v2 64" "densenet121 32" "gpt_d1024 4 --seq-len 512" "resnet50 128 --precision bf16-mixed"
  "convnext_tiny 32"
)
# CHECKPOINT_SPECS="spec;spec": measure those alone (session 53: the two whose checkpointed run failed)
if [ -n "${CHECKPOINT_SPECS:-}" ]; then IFS=';' read -r -a SPECS <<< "$CHECKPOINT_SPECS"; fi
for spec in "${SPECS[@]}"; do
  for ckpt in "" "--checkpoint-blocks"; do
    set -- $spec
    left=$(( BUDGET_S - ( $(date +%s) - START ) ))
    [ "$left" -lt 30 ] && { echo "budget reached"; break 2; }
    model=$1 batch=$2; shift 2
    timeout "$(( left < 150 ? left : 150 ))" python3 cli.py validate --model "$model" --batch-size "$batch" \
      --mode training "$@" $ckpt --log "$LOG" 2>&1 | tail -6
  done
done
wc -l "$LOG"
