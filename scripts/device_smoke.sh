#!/usr/bin/env bash
# First call on a GPU machine: environment facts, the window/instance probe, and a short
# balanced slice of the real collection plan (checks signatures agree across torch versions).
set -u
export PYTHONPATH=.
mkdir -p "$OUT/probe" "$OUT/smoke"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv
  python3 -V; python3 -c "import torch, torchvision, pynvml; print(torch.__version__, torchvision.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
  which ncu nvcc; ncu --version | tail -1; nvcc --version | tail -1; nproc
} > "$OUT/probe/env.txt" 2>&1
cat "$OUT/probe/env.txt"
timeout 200 python3 cli.py probe --out "$OUT/probe" 2>&1 | tail -30
timeout 150 python3 cli.py collect --out "$OUT/smoke" --plan datasets/plans/main.json --shard 1/40 --time-budget-s 110 2>&1 | tail -30
python3 - <<'PY'
import json, os, collections
rows=[json.loads(l) for l in open(os.environ["OUT"]+"/smoke/rows-1of40.jsonl")]
st=collections.Counter((r.get("item"), r.get("status")) for r in rows); print(st)
for r in rows:
    if r.get("status")=="failed": print("FAILED", r["id"], r["error"][:200])
ok=[r for r in rows if r.get("status")=="ok"]
import statistics
print("mean row wall ms", statistics.mean(r["row_wall_ms"] for r in ok))
for r in ok[:40]: print(r["op_kind"], r["mode"], r["set_key"], round(r["time_ms"],4), round(r["power_w"],1), round(r["energy_mj"],3), r["window_ticks"], round(r["row_wall_ms"]), r.get("instances"))
PY
