#!/usr/bin/env bash
# Calibrate the memory-energy model on a GPU machine; finishes in <= 7 minutes even on failure.
#
#   PYTHONPATH=. bash scripts/device_calibrate.sh [GPU_INDEX=0] [BUDGET_S=300] [extra args...]
#
# Extra args go to `python3 cli.py calibrate` (e.g. --threads 32,4,1 --levels l1,l2 --no-div
# --window-s 0.5 --quick --no-ncu), so several runs can cover more of the sweep.
# Run from the repository root.  Results go to "$OUT/calibration/" (OUT defaults to ./out):
#   calibration.json     the calibration (always written; on failure it says why)
#   calib_extra.tar.gz   plots/, ncu/ raw CSVs, fixture/ncu_raw_real.csv (a small real
#                        `ncu --csv --page raw` export for CPU tests), membench smoke output
#   calibrate.log        this script's log with timestamps
# Clocks are never locked or changed; ncu always runs with --clock-control none.
set -uo pipefail

GPU_INDEX="${1:-0}"
BUDGET_S="${2:-300}"
shift $(( $# < 2 ? $# : 2 ))
EXTRA_ARGS=("$@")
TOTAL_S=420                       # hard wall-clock limit of the whole script
START=$(date +%s)
OUT="${OUT:-$PWD/out}"
DEST="$OUT/calibration"
WORK="$(mktemp -d /tmp/gpurec-calib.XXXXXX)"
LOG="$DEST/calibrate.log"
mkdir -p "$DEST" "$WORK"
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
export PYTHONPATH="${PYTHONPATH:-.}"
PY="${PYTHON:-python3}"

say() { echo "[$(date -u +%H:%M:%S)] $*"; }
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( TOTAL_S - $(elapsed) )); }

say "device_calibrate: gpu=$GPU_INDEX budget=${BUDGET_S}s extra=[${EXTRA_ARGS[*]-}] out=$DEST work=$WORK"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv 2>&1 | sed 's/^/  nvidia-smi: /' || true
command -v nvcc >/dev/null && nvcc --version | tail -2 | sed 's/^/  /'
command -v ncu >/dev/null && ncu --version | tail -1 | sed 's/^/  /' || say "ncu not on PATH (checks will be marked failed)"
"$PY" -c 'import sys, numpy, pandas, matplotlib; print("  python", sys.version.split()[0], "numpy", numpy.__version__, "pandas", pandas.__version__)' || true

# 1. build (library + standalone CLI), cached in cuda/bin/
say "build"
timeout -k 5 150 "$PY" cli.py calibrate-build --arch sm_90 --exe > "$WORK/build.txt" 2>&1
BUILD_RC=$?
cat "$WORK/build.txt"
say "build rc=$BUILD_RC ($(elapsed) s)"

# 2. membench smoke test: one short run per level (diagnostics if the Python side fails)
EXE="$(grep -m1 '/membench-' "$WORK/build.txt" || true)"
if [ "$BUILD_RC" -eq 0 ] && [ -n "$EXE" ] && [ -x "$EXE" ]; then
    say "membench smoke"
    printf '%s\n' "shared 49152 100 132 1024 0" "l1 131072 100 132 1024 0" "l2 114688 100 132 1024 0" \
        "dram 3145728 5 132 1024 0" "l1 131072 100 132 1024 0 0 1" \
        | CUDA_VISIBLE_DEVICES="$GPU_INDEX" timeout -k 5 60 "$EXE" - > "$WORK/membench_smoke.jsonl" 2>&1
    say "smoke rc=$?"; cat "$WORK/membench_smoke.jsonl"
fi

# 3. calibration, inside what is left of the 7 minutes (SIGTERM lets Python write partial results)
CAL_TIMEOUT=$(( $(left) - 35 ))
PY_BUDGET=$BUDGET_S
if [ "$PY_BUDGET" -gt $(( CAL_TIMEOUT - 25 )) ]; then PY_BUDGET=$(( CAL_TIMEOUT - 25 )); fi
if [ "$PY_BUDGET" -lt 30 ]; then PY_BUDGET=30; fi
say "calibrate: budget ${PY_BUDGET}s, timeout ${CAL_TIMEOUT}s"
timeout -s TERM -k 15 "$CAL_TIMEOUT" "$PY" cli.py calibrate --out "$WORK/result" \
    --gpu-index "$GPU_INDEX" --budget-s "$PY_BUDGET" --arch sm_90 ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"}
CAL_RC=$?
say "calibrate rc=$CAL_RC ($(elapsed) s)"

# 4. results: calibration.json always exists afterwards
if [ -s "$WORK/result/calibration.json" ]; then
    cp "$WORK/result/calibration.json" "$DEST/calibration.json"
else
    say "no calibration.json from Python: writing a failure record"
    CAL_RC="$CAL_RC" BUILD_RC="$BUILD_RC" "$PY" - "$DEST/calibration.json" <<'EOF' || echo '{"error": "calibration failed"}' > "$DEST/calibration.json"
import json, os, sys, datetime
err = f"calibration did not produce JSON (build rc={os.environ['BUILD_RC']}, calibrate rc={os.environ['CAL_RC']}); see calibrate.log"
json.dump({"gpu": None, "levels": {k: {"pj_per_sector": None, "offset_mj": None, "r2": None, "threads_per_block": None}
                                   for k in ("shared", "l1", "l2", "dram")},
           "div_nj": None, "ncu_checks": {"passed": False, "error": err}, "points": [],
           "provenance": {"error": err, "clocks": "default (not locked; lent GPU)",
                          "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}},
          open(sys.argv[1], "w"), indent=1)
EOF
fi

mkdir -p "$WORK/extra/fixture"
[ -d "$WORK/result/plots" ] && cp -r "$WORK/result/plots" "$WORK/extra/"
[ -d "$WORK/result/ncu" ] && cp -r "$WORK/result/ncu" "$WORK/extra/"
[ -s "$WORK/result/ncu/ncu_checks.csv" ] && cp "$WORK/result/ncu/ncu_checks.csv" "$WORK/extra/fixture/ncu_raw_real.csv"
[ -s "$WORK/result/calibrate.log" ] && cp "$WORK/result/calibrate.log" "$WORK/extra/python.log"
[ -s "$WORK/membench_smoke.jsonl" ] && cp "$WORK/membench_smoke.jsonl" "$WORK/extra/"
tar -czf "$DEST/calib_extra.tar.gz" -C "$WORK/extra" . 2>/dev/null || say "tar failed"
"$PY" - "$DEST/calibration.json" <<'EOF' || true
import json, sys
d = json.load(open(sys.argv[1]))
print("  levels:", {k: v.get("pj_per_sector") for k, v in (d.get("levels") or {}).items()})
print("  div_nj:", d.get("div_nj"), " ncu passed:", (d.get("ncu_checks") or {}).get("passed"),
      " points:", len(d.get("points") or []))
EOF
ls -la "$DEST"
say "done in $(elapsed) s (calibrate rc=$CAL_RC)"
rm -rf "$WORK"
exit 0
