#!/usr/bin/env bash
# Measure the fp32 networks of datasets/plans/recard_fp32.json again on the card at hand, in a
# fresh output folder (never seeded: every item is measured again), host-free method.  Why: the
# same networks of both families on one card tell card from family in the H200/H100 energy-ratio
# error (datasets/h200/cards/README.md, datasets/h100/cards/README.md).  On an
# H200 the language-model head sweep (datasets/plans/lm_heads.json, which the H200 has not measured:
# the wide half-precision product model is fitted on the H100's rows alone) runs first, through
# scripts/device_round2.sh (resumable; a finished plan returns at once), and the re-card gets the rest.
# On an H100 (every round-2 H100 plan complete since session 53) the re-card gets the whole budget
# (the two checkpointed steps that failed in session 53 were measured in session 54).
#   bash scripts/device_recard.sh BUDGET_S
set -u
BUDGET_S="${1:-440}"
export PYTHONPATH=. PYTHONUNBUFFERED=1
mkdir -p "$OUT"
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$NAME" in
  *H100*) ;;  # every H100 plan is complete: the re-card plan below, so H100 cards are told apart too
  *H200*)
    START=$(date +%s)
    PLANS_H200="datasets/plans/lm_heads.json" bash scripts/device_round2.sh "$BUDGET_S"
    BUDGET_S=$(( BUDGET_S - ( $(date +%s) - START ) - 20 ))
    [ "$BUDGET_S" -lt 120 ] && { ls -la "$OUT"; exit 0; } ;;
esac
COL="out/recard-$(date -u +%Y%m%dT%H%M%S)"; mkdir -p "$COL"
nvidia-smi --query-gpu=index,name,uuid,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > "$OUT/nvsmi.txt" 2>&1
python3 cli.py collect --out "$COL" --plan datasets/plans/recard_fp32.json --devices 0 --what networks \
  --no-in-network --time-budget-s "$BUDGET_S" > "$OUT/collect.txt" 2>&1
echo "collect rc=$?" >> "$OUT/collect.txt"
for f in "$COL"/rows-*.jsonl; do gzip -c "$f" > "$OUT/$(basename "$f").gz"; done
cp "$COL"/provenance-*.json "$OUT"/ 2>/dev/null
gzip -f "$OUT/collect.txt"
ls -la "$OUT"
