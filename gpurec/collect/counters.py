"""Nsight Compute counters per operation (memory traffic per level, SMSP and tensor-core use).

The driver runs chunks of operations under ``ncu --clock-control none --profile-from-start
off``; the child process materialises each operation, warms it up outside the profiled
region, then profiles exactly one step between ``cudaProfilerStart``/``Stop`` (process-wide,
so backward kernels launched from autograd's worker thread are included), preceded by a
marker kernel (``torch.cuda._sleep`` -> ``spin_kernel``).  The driver splits ncu's kernel
list at the markers and sums each segment's counters into one row per (operation, mode).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from gpurec.dataset.store import JsonlShard, read_jsonl
from gpurec.ops.precision import DEFAULT_PRECISION

MARKER = "spin_kernel"
# Counters summed over an operation's kernels (the rates are recomputed from the sums).
SUM_PREFIXES = ("dram__", "lts__t_sectors", "l1tex__t_sectors", "l1tex__data", "smsp__", "sm__",
                "gpu__time_duration")


def _load_items(plan: Path) -> list[Any]:
    from gpurec.collect.plan import WorkItem

    data = json.loads(plan.read_text())
    return [WorkItem(**d) for d in data["items"] if d["item"] == "op"]


def child(plan: Path, ids_file: Path, order_file: Path, deadline_unix: float) -> int:
    """Runs under ncu: profile one step of each listed operation."""
    import torch

    from gpurec.collect.runner import OperationSource

    ids = json.loads(Path(ids_file).read_text())
    items = {w.id: w for w in _load_items(Path(plan))}
    source = OperationSource()
    dev = torch.device("cuda", 0)
    with JsonlShard(order_file) as order:
        for seq, item_id in enumerate(ids):
            if time.time() > deadline_unix:
                break
            w = items[item_id]
            t0 = time.perf_counter()
            try:
                op = (source.get(w.set_key, w.mode, w.key) if w.precision == DEFAULT_PRECISION
                      else source.get(w.set_key, w.mode, w.key, precision=w.precision))
                unit = op.materialize(device=dev, instances=1)
                ctx = torch.inference_mode() if w.mode == "inference" else torch.enable_grad()
                # autocast around the steps, as collection measures a mixed-precision operation
                scope = unit.scope() if hasattr(unit, "scope") else contextlib.nullcontext()
                with ctx, scope:
                    unit.step()
                    unit.step()
                    torch.cuda.synchronize()
                    torch.cuda.profiler.start()
                    torch.cuda._sleep(100)
                    unit.step()
                    torch.cuda.synchronize()
                    torch.cuda.profiler.stop()
                del unit
                order.append({"seq": seq, "id": item_id, "status": "ok", "wall_s": time.perf_counter() - t0})
            except Exception as exc:  # an op that cannot run is recorded and skipped
                torch.cuda.profiler.stop()
                order.append({"seq": seq, "id": item_id, "status": "failed", "error": f"{type(exc).__name__}: {exc}"[:300]})
    return 0


def segment(df: Any, order_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Split ncu's kernel rows at marker kernels and sum each operation's counters."""
    import pandas as pd

    ok = [r for r in order_rows if r.get("status") == "ok"]
    is_marker = df["kernel_name"].str.contains(MARKER, regex=False)
    seg = is_marker.cumsum() - 1
    # Only ".sum" counters add up over kernels; rates, percentages and per-SM device
    # attributes (e.g. sm__maximum_warps_per_active_cycle_pct) must not be summed.
    cols = [c for c in df.columns if "__" in c and c.startswith(SUM_PREFIXES)
            and c.endswith(".sum") and pd.api.types.is_float_dtype(df[c])]
    out = []
    body = df[~is_marker]
    for k, grp in body.groupby(seg[~is_marker]):
        if k < 0 or k >= len(ok):
            continue
        row = {"id": ok[int(k)]["id"], "kernels": int(len(grp)), "ncu_wall_s": ok[int(k)].get("wall_s")}
        for c in cols:
            row[c] = float(grp[c].sum(min_count=1)) if grp[c].notna().any() else None
        row["kernel_names"] = ";".join(sorted(set(grp["kernel_name"].str.slice(0, 60))))[:500]
        out.append(row)
    # operations whose step launched no kernel (views) still get a row
    seen = {r["id"] for r in out}
    for r in ok:
        if r["id"] not in seen:
            out.append({"id": r["id"], "kernels": 0, "ncu_wall_s": r.get("wall_s")})
    return out


def pending(plan: Path, done: set[str], shard: tuple[int, int] = (0, 1), kinds: set[str] | None = None) -> list[Any]:
    """The plan's operation items still to profile: this shard's, not done, of ``kinds`` (None: all)."""
    from gpurec.collect.plan import shard_items

    return [w for w in shard_items(_load_items(plan), *shard) if w.id not in done and (kinds is None or w.kind in kinds)]


def _next_chunk_index(out: Path) -> int:
    """One past the highest chunk number any earlier run left in ``out``."""
    used = [int(m.group(1)) for f in out.glob("chunk_*") if (m := re.match(r"chunk_(?:order_)?(\d+)\.", f.name))]
    return max(used, default=-1) + 1


def drive(plan: Path, out: Path, budget_s: float, chunk: int = 80, shard: tuple[int, int] = (0, 1),
          log: Any = print, kinds: set[str] | None = None) -> dict[str, Any]:
    """Profile as many planned operations as ``budget_s`` allows, resumably (``gpurec counters``).

    ``kinds``: only operations of these kinds (e.g. the matrix products of a plan), in plan order.
    ``log`` receives progress lines (the CLI sends them to stderr)."""
    from gpurec.calibrate.features import METRICS
    from gpurec.device.ncu import NcuError, query_metrics, run_ncu, split_available

    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "counters.jsonl"
    done = {r["id"] for r in read_jsonl(rows_path)}
    items = pending(plan, done, shard, kinds)
    try:
        metrics, missing = split_available(METRICS, query_metrics())
    except Exception as exc:  # querying is a convenience; fall back to the full list
        log(f"could not query ncu metrics ({exc}); using all")
        metrics, missing = list(METRICS), []
    log(f"counters: {len(items)} operations to profile; metrics {len(metrics)} (missing {missing})")
    t_end = time.time() + budget_s
    summary = {"profiled": 0, "failed": 0, "chunks": 0, "missing_metrics": missing}
    # chunk files of earlier runs stay as provenance; this run numbers its own after them, since
    # the child appends to its order file and a stale one would pair counters with the wrong ids
    first = _next_chunk_index(out)
    pos = 0
    with JsonlShard(rows_path) as rows_out:
        while pos < len(items) and time.time() < t_end - 20:
            batch = items[pos:pos + chunk]
            pos += chunk
            ids_file = out / "chunk_ids.json"
            ids_file.write_text(json.dumps([w.id for w in batch]))
            order_file = out / f"chunk_order_{first + summary['chunks']}.jsonl"
            csv_path = out / f"chunk_{first + summary['chunks']}.csv"
            spec_file = out / "chunk_spec.json"
            spec_file.write_text(json.dumps({"plan": str(plan), "ids": str(ids_file), "order": str(order_file),
                                             "deadline_unix": t_end - 15}))
            cmd = [sys.executable, "-m", "gpurec.collect.counters", str(spec_file)]
            t0 = time.time()
            try:
                df = run_ncu(cmd, metrics, csv_path, extra=["--profile-from-start", "off"],
                             timeout_s=max(30.0, t_end - time.time()), env=dict(os.environ))
            except NcuError as exc:
                log(f"ncu chunk failed: {str(exc)[-800:]}")
                summary["failed"] += len(batch)
                summary["chunks"] += 1
                continue
            order_rows = list(read_jsonl(order_file))
            for r in segment(df, order_rows):
                w = next(x for x in batch if x.id == r["id"])
                rows_out.append({**r, "op_signature": w.key, "mode": w.mode, "op_kind": w.kind,
                                 "precision": w.precision, "set_key": w.set_key})
                summary["profiled"] += 1
            summary["failed"] += sum(1 for r in order_rows if r.get("status") != "ok")
            summary["chunks"] += 1
            log(f"chunk {summary['chunks']}: {len(order_rows)} ops in {time.time() - t0:.0f} s "
                f"({summary['profiled']} profiled so far)")
            if csv_path.exists() and summary["chunks"] > 1:
                csv_path.unlink()  # keep only the first chunk's raw CSV (a fixture); rows keep the sums
    return summary


def child_from_spec(spec_file: Path) -> int:
    """The process ncu profiles: :func:`child` with the arguments of a spec file that
    :func:`drive` writes (``{"plan", "ids", "order", "deadline_unix"}``)."""
    spec = json.loads(Path(spec_file).read_text())
    return child(Path(spec["plan"]), Path(spec["ids"]), Path(spec["order"]), float(spec["deadline_unix"]))


if __name__ == "__main__":
    sys.exit(child_from_spec(Path(sys.argv[1])))  # one spec file, no argument parser
