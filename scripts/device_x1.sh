#!/usr/bin/env bash
# One-GPU call: calibration first (issue 4), then collection (networks first, then operations)
# for the rest of the budget.  Usage: bash scripts/device_x1.sh TOTAL_S CALIB_BUDGET_S
set -u
TOTAL_S="${1:-560}"; CALIB_S="${2:-240}"
export PYTHONPATH=. PYTHONUNBUFFERED=1
START=$(date +%s)
TAG=$(python3 -c "import torch; n=torch.cuda.get_device_name(0); print('h200' if 'H200' in n else 'h100' if 'H100' in n else n.split()[-1].lower())")
COL="out/$TAG"; mkdir -p "$COL" "$OUT"
LOG="$OUT/log_x1.txt"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
say "x1 on $(nvidia-smi -L)"
if [ -d "datasets/$TAG/raw" ] && [ ! -e "$COL/.seeded" ]; then for f in datasets/$TAG/raw/rows-*.jsonl datasets/$TAG/raw/rows-*.jsonl.gz; do [ -e "$f" ] && cp "$f" "$COL/seed-$(basename "$f")"; done; touch "$COL/.seeded"; fi
if [ "$CALIB_S" -gt 0 ]; then timeout $((CALIB_S + 120)) bash scripts/device_calibrate.sh 0 "$CALIB_S" > /tmp/calib_stdout.txt 2>&1; say "calibration rc=$?"; fi
left=$(( TOTAL_S - ( $(date +%s) - START ) - 15 ))
say "collect for $left s"
python3 cli.py collect --out "$COL" --plan datasets/plans/main.json --devices 0 --time-budget-s "$left" > /tmp/collect_x1.txt 2>&1
tail -8 /tmp/collect_x1.txt >> "$LOG"
tar czf "$OUT/collect_$TAG.tar.gz" --exclude="seed-*" -C out "$TAG"
say "done"; tail -12 "$LOG"
