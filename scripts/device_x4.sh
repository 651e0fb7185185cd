#!/usr/bin/env bash
# One call on a 4-GPU machine; run phase 1 then phase 2 on the same warm machine.
#   phase 1: GPUs 0,1 collect; GPU 2 profiles (issue 7); GPU 3 calibrates (issue 4), then ncu counters
#   phase 2: GPUs 0,1,2 collect; GPU 3 ncu counters per operation
#   phase all: every GPU collects
# Collection output lives in ./out/<tag>/ (git-ignored, so it stays on the warm machine
# between calls and the run resumes); results come back packed in $OUT (<= 8 files).
set -u
PHASE="${1:-1}"
BUDGET_S="${2:-500}"
export PYTHONPATH=. PYTHONUNBUFFERED=1
START=$(date +%s)
TAG=$(python3 -c "import torch; n=torch.cuda.get_device_name(0); print('h200' if 'H200' in n else 'h100' if 'H100' in n else n.split()[-1].lower())")
COL="out/$TAG"; mkdir -p "$COL" out/counters_$TAG "$OUT"
LOG="$OUT/log_phase$PHASE.txt"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
say "phase $PHASE on $(nvidia-smi -L | tr '\n' ' ')"
nvidia-smi --query-gpu=index,name,clocks.sm,power.draw,temperature.gpu --format=csv >> "$LOG" 2>&1
# seed the output with what earlier sessions collected (resume across sessions)
if [ -d "datasets/$TAG/raw" ] && [ ! -e "$COL/.seeded" ]; then for f in datasets/$TAG/raw/rows-*.jsonl datasets/$TAG/raw/rows-*.jsonl.gz; do [ -e "$f" ] && cp "$f" "$COL/seed-$(basename "$f")"; done; touch "$COL/.seeded"; fi
if [ "$PHASE" = 1 ]; then
  python3 cli.py collect --out "$COL" --plan datasets/plans/main.json --devices 0,1 --time-budget-s "$BUDGET_S" > /tmp/collect_p1.txt 2>&1 &
  ( CUDA_VISIBLE_DEVICES=2 GPUREC_PROFILE_BUDGET_S=$((BUDGET_S - 60)) timeout $((BUDGET_S + 20)) bash scripts/device_profile.sh > /tmp/profile_stdout.txt 2>&1 ) &
  ( timeout 440 bash scripts/device_calibrate.sh 3 300 > /tmp/calib_stdout.txt 2>&1
    left=$(( BUDGET_S - ( $(date +%s) - START ) ))
    if [ $left -gt 60 ]; then CUDA_VISIBLE_DEVICES=3 timeout $((left + 10)) python3 cli.py counters --plan datasets/plans/main.json --out out/counters_$TAG --budget-s $left > /tmp/counters_p1.txt 2>&1; fi ) &
elif [ "$PHASE" = all ]; then
  NGPU=$(nvidia-smi -L | wc -l); DEVS=$(seq -s, 0 $((NGPU - 1)))
  python3 cli.py collect --out "$COL" --plan datasets/plans/main.json --devices "$DEVS" --time-budget-s "$BUDGET_S" > /tmp/collect_pall.txt 2>&1 &
else
  python3 cli.py collect --out "$COL" --plan datasets/plans/main.json --devices 0,1,2 --time-budget-s "$BUDGET_S" > /tmp/collect_p2.txt 2>&1 &
  ( CUDA_VISIBLE_DEVICES=3 timeout $((BUDGET_S + 10)) python3 cli.py counters --plan datasets/plans/main.json --out out/counters_$TAG --budget-s $((BUDGET_S - 10)) > /tmp/counters_p2.txt 2>&1 ) &
fi
wait
say "all done; packing"
tail -40 /tmp/collect_p*.txt >> "$LOG" 2>/dev/null; cat /tmp/counters_p*.txt >> "$LOG" 2>/dev/null; tail -5 /tmp/calib_stdout.txt >> "$LOG" 2>/dev/null; tail -5 /tmp/profile_stdout.txt >> "$LOG" 2>/dev/null
tar czf "$OUT/collect_$TAG.tar.gz" --exclude="seed-*" -C out "$TAG"
tar czf "$OUT/counters_$TAG.tar.gz" -C out "counters_$TAG"
python3 - <<PY >> "$LOG" 2>&1
import json, glob, collections
rows=[json.loads(l) for f in glob.glob("$COL/rows-*.jsonl") for l in open(f) if l.strip()]
print(collections.Counter((r.get("item"), r.get("status"), r.get("mode")) for r in rows if not r.get("repeat")))
PY
tail -25 "$LOG"
ls -la "$OUT" "$OUT"/* | head -40
