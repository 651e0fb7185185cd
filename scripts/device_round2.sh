#!/usr/bin/env bash
# One resumable collection over several plans, in priority order, on every GPU of the machine.
#   PLANS_H100="datasets/plans/peaks.json,datasets/plans/seq.json@0.5" \
#   PLANS_H200="datasets/plans/main.json" bash scripts/device_round2.sh BUDGET_S
# The card NVML reports picks the list (PLANS_<TAG>); each plan gets its share of what is left
# (PATH@FRACTION, default: an equal share of the rest), and time a plan does not use rolls over
# to the next.  Output lives in ./out/r2_<tag>/ (git-ignored), so a second call on the same warm
# machine resumes; rows already in datasets/<tag>/raw measured by the current method (schema 2)
# are seeded so they are never measured again.  Results come back packed in $OUT.
set -u
BUDGET_S="${1:-540}"
export PYTHONPATH=. PYTHONUNBUFFERED=1
START=$(date +%s)
mkdir -p "$OUT"
TAG=$(python3 -c "import torch; n=torch.cuda.get_device_name(0); print('h200' if 'H200' in n else 'h100' if 'H100' in n else n.split()[-1].lower())")
COL="out/r2_$TAG"; mkdir -p "$COL"
LOG="$OUT/log_round2_$TAG.txt"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
say "round-2 collection on $(nvidia-smi -L | tr '\n' ' ')"
nvidia-smi --query-gpu=index,name,uuid,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv >> "$LOG" 2>&1
if [ -d "datasets/$TAG/raw" ] && [ ! -e "$COL/.seeded" ]; then
  for f in datasets/$TAG/raw/rows-*.jsonl datasets/$TAG/raw/rows-*.jsonl.gz; do [ -e "$f" ] && zgrep -q '"schema":2' "$f" && cp "$f" "$COL/seed-$(basename "$f")"; done
  touch "$COL/.seeded"
fi
VAR="PLANS_$(echo "$TAG" | tr a-z A-Z)"
PLANS="${!VAR:-}"
[ -z "$PLANS" ] && { say "no plans for $TAG (set $VAR)"; exit 0; }
NGPU=$(nvidia-smi -L | wc -l); DEVS=$(seq -s, 0 $((NGPU - 1)))
IFS=',' read -ra LIST <<< "$PLANS"
n=${#LIST[@]}; i=0
for entry in "${LIST[@]}"; do
  plan="${entry%@*}"; frac=""; [ "$entry" != "$plan" ] && frac="${entry#*@}"
  left=$(( BUDGET_S - ( $(date +%s) - START ) - 30 ))
  [ "$left" -lt 30 ] && { say "no time left for $plan"; break; }
  if [ -n "$frac" ]; then share=$(python3 -c "print(int($left * $frac))"); else share=$(( left / (n - i) )); fi
  [ "$share" -lt 30 ] && share=30
  say "plan $plan on GPUs $DEVS for $share s"
  python3 cli.py collect --out "$COL" --plan "$plan" --devices "$DEVS" --time-budget-s "$share" >> "$OUT/collect_$TAG.txt" 2>&1
  say "plan $plan rc=$?"
  i=$((i + 1))
done
say "packing"
tar czf "$OUT/r2_$TAG.tar.gz" --exclude="seed-*" -C out "r2_$TAG"
python3 - "$COL" <<'PY' 2>&1 | tee -a "$LOG"
import collections, glob, json, sys
rows = [json.loads(l) for f in glob.glob(sys.argv[1] + "/rows-*.jsonl") for l in open(f) if l.strip()]
main = [r for r in rows if not r.get("repeat") and r.get("item") != "idle"]
print("rows", sorted(collections.Counter((r.get("item"), r.get("mode"), r.get("precision", "fp32"), r.get("status")) for r in main).items()))
print("failures", collections.Counter(r.get("error", "")[:120] for r in main if r.get("status") != "ok").most_common(8))
ok = [r for r in main if r.get("status") == "ok"]
print("capture errors", collections.Counter(r.get("capture_error", "")[:80] for r in ok if r.get("captured") is False).most_common(5))
print("wall s/row", {k: round(sum(r["row_wall_ms"] for r in ok if r["item"] == k) / max(1, sum(r["item"] == k for r in ok)) / 1e3, 3) for k in ("op", "network", "peak")})
PY
tail -5 "$OUT/collect_$TAG.txt"
say "done"
