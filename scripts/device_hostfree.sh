#!/usr/bin/env bash
# Host-free collection (issue 12) on every GPU of the machine, one worker per board.
#   bash scripts/device_hostfree.sh BUDGET_S
#   GPUREC_PLAN=datasets/plans/targeted.json bash scripts/device_hostfree.sh BUDGET_S   (another plan)
# Output lives in ./out/hf_<tag>/ (git-ignored: a second call on the same warm machine
# resumes); earlier sessions' rows are seeded from datasets/<tag>/raw so nothing measured
# host-free is measured again.  Results come back packed in $OUT.
set -u
BUDGET_S="${1:-540}"
PLAN="${GPUREC_PLAN:-datasets/plans/main.json}"
export PYTHONPATH=. PYTHONUNBUFFERED=1
START=$(date +%s)
mkdir -p "$OUT"
TAG=$(python3 -c "import torch; n=torch.cuda.get_device_name(0); print('h200' if 'H200' in n else 'h100' if 'H100' in n else n.split()[-1].lower())")
COL="out/hf_$TAG"; mkdir -p "$COL"
LOG="$OUT/log_hostfree_$TAG.txt"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
say "host-free collection on $(nvidia-smi -L | tr '\n' ' ')"
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,power.draw,power.limit,temperature.gpu --format=csv >> "$LOG" 2>&1
if [ -d "datasets/$TAG/raw" ] && [ ! -e "$COL/.seeded" ]; then
  for f in datasets/$TAG/raw/rows-*.jsonl; do grep -q '"schema":2' "$f" && cp "$f" "$COL/seed-$(basename "$f")"; done
  touch "$COL/.seeded"
fi
NGPU=$(nvidia-smi -L | wc -l); DEVS=$(seq -s, 0 $((NGPU - 1)))
left=$(( BUDGET_S - ( $(date +%s) - START ) - 25 ))
say "collect on GPUs $DEVS for $left s"
python3 cli.py collect --out "$COL" --plan "$PLAN" --devices "$DEVS" --time-budget-s "$left" > "$OUT/collect_$TAG.txt" 2>&1
say "collection rc=$?; packing"
tar czf "$OUT/hf_$TAG.tar.gz" --exclude="seed-*" -C out "hf_$TAG"
python3 - "$COL" <<'PY' 2>&1 | tee -a "$LOG"
import collections, glob, json, statistics, sys
rows = [json.loads(l) for f in glob.glob(sys.argv[1] + "/rows-*.jsonl") for l in open(f) if l.strip()]
main = [r for r in rows if not r.get("repeat") and r.get("item") != "idle"]
print("rows", collections.Counter((r.get("item"), r.get("mode"), r.get("status"), r.get("captured")) for r in main))
ok = [r for r in main if r.get("status") == "ok"]
for item in ("op", "network"):
    rr = [r for r in ok if r["item"] == item and r.get("gpu_time_ms")]
    if rr:
        ratio = [r["time_ms"] / r["gpu_time_ms"] for r in rr if r["gpu_time_ms"] > 0]
        print(item, "eager/host-free median", round(statistics.median(ratio), 3), "n", len(rr),
              "power range", round(min(r["gpu_power_w"] for r in rr), 1), round(max(r["gpu_power_w"] for r in rr), 1),
              "out of range", sum(bool(r.get("gpu_power_out_of_range")) for r in rr),
              "retried", sum(bool(r.get("gpu_window_retried")) for r in rr),
              "wall s/row", round(statistics.mean(r["row_wall_ms"] for r in rr) / 1e3, 3))
print("capture errors", collections.Counter(r.get("capture_error", "")[:80] for r in ok if not r.get("captured")).most_common(8))
print("in-network errors", collections.Counter(r.get("in_network_error", "")[:120] for r in ok if r["item"] == "network" and "in_network" not in r).most_common(5))
nets = [r for r in ok if r["item"] == "network" and "in_network_kernel_sum_ms" in r]
for r in nets[:12]:
    print(r["id"], "eager", round(r["time_ms"], 3), "graph", round(r["gpu_time_ms"], 3), "cupti", round(r["in_network_kernel_sum_ms"], 3),
          "unattr", round(r["in_network_unattributed_kernel_ms"], 3), "host", round(r["host_ms"], 3))
print("failures", collections.Counter(r.get("error", "")[:100] for r in main if r.get("status") != "ok").most_common(6))
PY
tail -5 "$OUT/collect_$TAG.txt"
say "done"
