#!/usr/bin/env bash
# Multi-level utilization profiles (GitHub issue 7) of 12 runs on the GPU at hand:
# resnet50, vit_b_16, convnext_tiny x batch 8 and 64 x inference and training.
#
# Run from the repository root on the GPU machine:
#     PYTHONPATH=. bash scripts/device_profile.sh
# Writes at most two files into "$OUT/profile/":
#     profile_results.tar.gz  per run: result.json, table.txt, plots, ncu.csv, logs;
#                             fixture/real/: trace.json.gz + ncu.csv + meta.json of one
#                             small run (resnet50 bs8 training) for tests/fixtures/profile/real/
#     profile_log.txt         this script's timestamped log
# Whole script stays under ~8 minutes: a global deadline shrinks each run's ncu time and
# skips counters (trace only) when time runs short; every run has its own timeout and a
# failure moves on to the next run. ncu always runs with --clock-control none.
set -u

OUT="${OUT:-/tmp/out}"
DEST="$OUT/profile"
WORK="${GPUREC_PROFILE_WORK:-/tmp/gpurec_profile_runs}"
BUDGET_S="${GPUREC_PROFILE_BUDGET_S:-450}"   # for the runs; packing comes after
# per-config: ncu profiles one launch per (kernel, grid, block) and the repeats are imputed
# (several times less ncu time; checked against a full profile in tests/test_profile.py).
SAMPLING="${GPUREC_PROFILE_SAMPLING:-per-config}"
NCU_MAX_S="${GPUREC_PROFILE_NCU_MAX_S:-180}"   # most ncu time one run may take (raise it for --sampling all)
PY="${PYTHON:-python3}"
mkdir -p "$DEST" "$WORK"
LOG="$DEST/profile_log.txt"
: > "$LOG"
export PYTHONUNBUFFERED=1
export PYTHONPATH="${PYTHONPATH:-.}"
START=$(date +%s)

log() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
elapsed() { echo $(( $(date +%s) - START )); }

log "preflight"
{
  nvidia-smi -L 2>&1 | head -4
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv 2>&1 | head -3
  "$PY" -c 'import sys, torch, torchvision; print("python", sys.version.split()[0], "torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available() and torch.cuda.get_device_name(0))' 2>&1
  "$PY" -c 'from gpurec.device.ncu import find_ncu, NcuNotFound
try: print("ncu at", find_ncu())
except NcuNotFound as e: print("ncu:", e)' 2>&1
} | tee -a "$LOG"
NCU_BIN=$("$PY" -c 'from gpurec.device.ncu import find_ncu; print(find_ncu())' 2>/dev/null || true)
HAVE_NCU=0
if [ -n "$NCU_BIN" ]; then
  HAVE_NCU=1
  "$NCU_BIN" --version 2>&1 | tail -2 | tee -a "$LOG"
  # Ask once which metrics exist (cached for the runs in ~/.cache/gpurec) and show what will be collected.
  timeout 120 "$PY" - <<'PYEOF' 2>&1 | tee -a "$LOG"
from gpurec.profile import ncu_io
from gpurec.device.ncu import find_ncu
ncu = find_ncu()
avail = ncu_io.query_available_metrics(ncu)
print("metrics known to ncu:", "query failed" if avail is None else len(avail))
print("collecting:", ",".join(ncu_io.select_metrics(avail)))
PYEOF
else
  log "ncu not found: all runs trace-only"
fi

# Cheapest first, so every model and mode is covered before the big training runs.
RUNS=(
  "resnet50 8 training"
  "resnet50 8 inference"
  "vit_b_16 8 inference"
  "convnext_tiny 8 inference"
  "vit_b_16 8 training"
  "convnext_tiny 8 training"
  "resnet50 64 inference"
  "vit_b_16 64 inference"
  "convnext_tiny 64 inference"
  "resnet50 64 training"
  "convnext_tiny 64 training"
  "vit_b_16 64 training"
)
# Local dry run of this script without a GPU: GPUREC_PROFILE_DEVICE=cpu and
# GPUREC_PROFILE_RUNS="resnet18 2 training;resnet18 2 inference" (and GPUREC_PROFILE_RES=64).
if [ -n "${GPUREC_PROFILE_RUNS:-}" ]; then IFS=';' read -r -a RUNS <<< "$GPUREC_PROFILE_RUNS"; fi
EXTRA=()
if [ -n "${GPUREC_PROFILE_DEVICE:-}" ]; then EXTRA+=(--device "$GPUREC_PROFILE_DEVICE"); HAVE_NCU=0; fi
[ -n "${GPUREC_PROFILE_RES:-}" ] && EXTRA+=(--resolution "$GPUREC_PROFILE_RES")
N=${#RUNS[@]}
i=0
for spec in "${RUNS[@]}"; do
  i=$((i + 1))
  read -r model bs mode <<< "$spec"
  tag="${model}_bs${bs}_${mode}"
  dir="$WORK/$tag"
  rm -rf "$dir"; mkdir -p "$dir"
  now=$(elapsed)
  remaining=$(( BUDGET_S - now ))
  left=$(( N - i + 1 ))
  if [ "$remaining" -lt 35 ]; then
    log "[$i/$N] $tag: SKIPPED (only ${remaining}s left)"
    continue
  fi
  # Fair share of what is left, at least 60 s and at most NCU_MAX_S of ncu per run.
  share=$(( remaining * 5 / (2 * left) ))
  ncu_t=$(( share < 60 ? 60 : (share > NCU_MAX_S ? NCU_MAX_S : share) ))
  [ "$ncu_t" -gt $(( remaining - 45 )) ] && ncu_t=$(( remaining - 45 ))
  ncu_flag=""
  if [ "$HAVE_NCU" -eq 0 ] || [ "$ncu_t" -lt 40 ]; then
    ncu_flag="--no-ncu"; ncu_t=0
  fi
  trace_t=$(( remaining - ncu_t - 15 )); [ "$trace_t" -gt 150 ] && trace_t=150
  hard=$(( remaining - 3 ))
  log "[$i/$N] $tag: start (ncu ${ncu_flag:-on, ${ncu_t}s}; trace <= ${trace_t}s; hard stop ${hard}s)"
  timeout --kill-after=10 "$hard" "$PY" cli.py profile --model "$model" --batch-size "$bs" --mode "$mode" \
      --out "$dir" --ncu-timeout-s "$ncu_t" --trace-timeout-s "$trace_t" --max-warmup-s 10 \
      --ncu-sampling "$SAMPLING" $ncu_flag "${EXTRA[@]}" \
      > "$dir/stdout.txt" 2>&1
  rc=$?
  if [ -f "$dir/result.json" ]; then
    "$PY" cli.py profile-summary "$dir/result.json" 2>&1 | tail -1 | tee -a "$LOG"
    sed -n '1,30p' "$dir/table.txt" >> "$LOG"
  fi
  if [ "$rc" -ne 0 ]; then
    log "[$i/$N] $tag: FAILED rc=$rc; last lines:"
    tail -15 "$dir/stdout.txt" 2>/dev/null | tee -a "$LOG"
    tail -15 "$dir/worker_trace.log" 2>/dev/null | tee -a "$LOG"
  fi
  if [ -f "$dir/ncu.log" ]; then
    echo "  ncu passes per kernel (count x passes):" $(grep -oE "[0-9]+ pass(es)?" "$dir/ncu.log" | sort | uniq -c | tr -s ' ') >> "$LOG"
    grep -E "==(ERROR|WARNING)==" "$dir/ncu.log" | sort | uniq -c | sort -rn | head -5 >> "$LOG"
  fi
  log "[$i/$N] $tag: done rc=$rc"
done

log "summary (SM/TC columns: % of iteration time)"
"$PY" cli.py profile-summary "$WORK"/*/result.json 2>&1 | tee -a "$LOG"

# Test fixture: the small training run (backward + optimizer covered); else inference.
FIX="$WORK/fixture/real"
rm -rf "$WORK/fixture"; mkdir -p "$FIX"
for cand in resnet50_bs8_training resnet50_bs8_inference; do
  if [ -f "$WORK/$cand/ncu.csv" ] && [ -f "$WORK/$cand/trace.json.gz" ]; then
    cp "$WORK/$cand/trace.json.gz" "$WORK/$cand/ncu.csv" "$FIX/"
    cp "$WORK/$cand/worker_trace.json" "$FIX/meta.json"
    echo "$cand" > "$FIX/SOURCE.txt"
    log "fixture from $cand: $(du -sh "$FIX" | cut -f1)"
    break
  fi
done

# Pack: everything but model pickles and ncu binary reports; drop the big traces if needed.
cd "$WORK" || exit 1
tar -czf "$DEST/profile_results.tar.gz" --exclude='*.ncu-rep' --exclude='model.pt' . 2>>"$LOG"
size=$(stat -c %s "$DEST/profile_results.tar.gz" 2>/dev/null || echo 0)
if [ "$size" -gt 15000000 ]; then
  log "tarball ${size} B too big: repacking without per-run traces (fixture trace kept)"
  tar -czf "$DEST/profile_results.tar.gz" --exclude='*.ncu-rep' --exclude='model.pt' \
      --exclude='./*_bs*/trace.json.gz' . 2>>"$LOG"
fi
log "packed $(stat -c %s "$DEST/profile_results.tar.gz") B into $DEST; total $(elapsed)s"
ls -la "$DEST" | tee -a "$LOG"
