"""gpurec.dataset: raw shards -> Parquet tables -> load_dataset, on temp data and the shipped data."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import gpurec
from gpurec.dataset.build import build_all, build_gpu_dataset
from gpurec.dataset.load import DATASET_DIR_ENV, default_root, load_dataset
from gpurec.dataset.store import JsonlShard, atomic_write_json, json_safe, raw_row_files

ROOT = Path(__file__).resolve().parents[1]
GPU = "NVIDIA H100 80GB HBM3"
RUN = "20260101T000000-0of1-abcdef"

PROVENANCE = {
    "run_id": RUN, "torch": "2.11.0+cu130", "cuda_runtime": "13.0", "host_cpu": "Test CPU",
    "date": "2026-01-01T00:00:00+00:00", "cudnn_allow_tf32": True, "cuda_matmul_allow_tf32": False,
    "gpu": {"name": GPU, "driver_version": "580.00.00", "uuid": "GPU-fake-0000"},
}


def _measured(i: int, **kw: object) -> dict:
    row = {"run_id": RUN, "gpu": GPU, "gpu_uuid": "GPU-fake-0000", "t_unix": 1000.0 + i, "status": "ok",
           "time_ms": 1.0 + i, "power_w": 200.0, "energy_mj": 200.0 * (1.0 + i), "idle_power_w": 80.0,
           "dynamic_power_w": 120.0, "dynamic_energy_mj": 120.0 * (1.0 + i), "sm_clock_mhz": 1980.0,
           "mode": "inference"}
    row.update(kw)
    return row


def _op(i: int, sig: str, **kw: object) -> dict:
    base = {"id": f"op:{sig}:{kw.get('mode', 'inference')}", "item": "op", "op_signature": sig,
            "op_kind": "Conv2d", "set_key": "resnet18:b8:r224", "model_sets": ["resnet18:b8:r224", "resnet34:b8:r224"]}
    return _measured(i, **{**base, **kw})


def _net(i: int, key: str, **kw: object) -> dict:
    base = {"id": f"network:{key}:inference", "item": "network", "op_kind": "network", "set_key": key,
            "model_sets": [key]}
    return _measured(i, **{**base, **kw})


@pytest.fixture
def gpu_dir(tmp_path: Path) -> Path:
    d = tmp_path / "datasets" / "h100"
    raw = d / "raw"
    atomic_write_json(raw / f"provenance-{RUN}.json", PROVENANCE)
    with JsonlShard(raw / "rows-0of2.jsonl") as sh:
        sh.append({"id": f"idle:{RUN}:0", "item": "idle", "run_id": RUN, "repeat": True, "gpu": GPU,
                   "idle_power_w": 80.0, "t_s": 999.0})
        sh.append(_op(1, "aaaa000000000001"))
        sh.append(_op(2, "aaaa000000000001", mode="training", backward=True))
        sh.append(_op(3, "aaaa000000000002", status="failed", error="RuntimeError: boom", time_ms=None))
        sh.append(_net(4, "resnet18:b8:r224"))
        sh.append(_op(5, "aaaa000000000001", id="op:aaaa000000000001:inference:rep", repeat=True, time_ms=2.5))
    with JsonlShard(raw / "rows-1of2.jsonl") as sh:
        # re-measured: a later success replaces an earlier failure ...
        sh.append(_op(6, "aaaa000000000003", status="failed", error="OOM"))
        sh.append(_op(7, "aaaa000000000003", time_ms=3.0))
        # ... but a later failure never replaces a success
        sh.append(_op(8, "aaaa000000000004", time_ms=4.0))
        sh.append(_op(9, "aaaa000000000004", status="failed", error="flaky"))
        sh.append(_net(10, "resnet18:b8:r224", mode="training", id="network:resnet18:b8:r224:training"))
    with open(raw / "rows-1of2.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"id": "op:torn')  # a worker killed mid-row
    (raw / "log_x1.txt").write_text("not a shard\n")
    return d


TABLES = ("operations", "networks", "repeats", "idle")


def _tables(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k in TABLES}


def test_build_writes_the_four_tables(gpu_dir: Path) -> None:
    counts = build_gpu_dataset(gpu_dir)
    assert _tables(counts) == {"operations": 5, "networks": 2, "repeats": 1, "idle": 1}
    # the torn last line is not a row, and the summary says so
    assert counts["torn_last_lines"] == 1 and counts["corrupt_lines_skipped"] == 0
    assert counts["bad_lines"] == [f"{gpu_dir / 'raw' / 'rows-1of2.jsonl'}:6: torn_tail: "
                                   "unfinished last line (a crash while writing)"]
    ops = pd.read_parquet(gpu_dir / "operations.parquet")
    assert sorted(ops["id"]) == sorted([
        "op:aaaa000000000001:inference", "op:aaaa000000000001:training", "op:aaaa000000000002:inference",
        "op:aaaa000000000003:inference", "op:aaaa000000000004:inference"])
    by_id = ops.set_index("id")
    assert by_id.loc["op:aaaa000000000003:inference", "status"] == "ok"
    assert by_id.loc["op:aaaa000000000003:inference", "time_ms"] == 3.0
    assert by_id.loc["op:aaaa000000000004:inference", "status"] == "ok"  # success kept over later failure
    assert by_id.loc["op:aaaa000000000004:inference", "time_ms"] == 4.0
    assert by_id.loc["op:aaaa000000000002:inference", "error"] == "RuntimeError: boom"
    # provenance joined by run id
    assert set(ops["driver"]) == {"580.00.00"} and set(ops["torch"]) == {"2.11.0+cu130"}
    assert set(ops["host_cpu"]) == {"Test CPU"} and set(ops["cuda_runtime"]) == {"13.0"}
    assert set(ops["source_file"]) == {"rows-0of2.jsonl", "rows-1of2.jsonl"}
    assert json.loads(by_id.loc["op:aaaa000000000001:inference", "model_sets"]) == [
        "resnet18:b8:r224", "resnet34:b8:r224"]
    reps = pd.read_parquet(gpu_dir / "repeats.parquet")
    assert list(reps["id"]) == ["op:aaaa000000000001:inference:rep"] and reps["time_ms"].iloc[0] == 2.5
    idle = pd.read_parquet(gpu_dir / "idle.parquet")
    assert idle["idle_power_w"].tolist() == [80.0]
    nets = pd.read_parquet(gpu_dir / "networks.parquet")
    assert sorted(nets["mode"]) == ["inference", "training"]
    assert not list(gpu_dir.glob(".*.tmp*"))  # atomic writes leave nothing behind
    # rebuilding is idempotent and never touches raw files
    raw_before = {p.name: p.read_bytes() for p in (gpu_dir / "raw").iterdir()}
    assert build_gpu_dataset(gpu_dir) == counts
    assert {p.name: p.read_bytes() for p in (gpu_dir / "raw").iterdir()} == raw_before


def test_build_edge_cases(tmp_path: Path) -> None:
    assert build_gpu_dataset(tmp_path / "nothing") == {"corrupt_lines_skipped": 0, "torn_last_lines": 0,
                                                       "torn_fragments_kept_aside": 0, "orphaned_temp_files": {},
                                                       "invalid_rows_skipped": 0, "duplicate_rows_dropped": 0,
                                                       "rows_superseded": 0, "bad_lines": []}
    d = tmp_path / "only_idle"
    with JsonlShard(d / "raw" / "rows-0.jsonl") as sh:
        sh.append({"id": "idle:r:0", "item": "idle", "run_id": "r", "repeat": True, "gpu": GPU,
                   "idle_power_w": 70.0})
    assert _tables(build_gpu_dataset(d)) == {"operations": 0, "networks": 0, "repeats": 0, "idle": 1}


def test_build_all(gpu_dir: Path) -> None:
    out = build_all(gpu_dir.parent)
    assert list(out) == ["h100"] and _tables(out["h100"]) == {"operations": 5, "networks": 2, "repeats": 1, "idle": 1}


def test_load_dataset_columns_and_filters(gpu_dir: Path) -> None:
    build_gpu_dataset(gpu_dir)
    root = gpu_dir.parent
    df = load_dataset(root=root)
    assert len(df) == 4 and set(df["status"]) == {"ok"}  # failed rows dropped by default
    for col in ("gpu", "op_kind", "op_signature", "mode", "time_ms", "energy_mj", "dynamic_energy_mj", "power_w",
                "sm_clock_mhz", "model_sets", "driver", "torch", "host_cpu", "date", "run_id"):
        assert col in df.columns, col
    assert set(df["gpu"]) == {GPU}
    assert len(load_dataset(root=root, status=None)) == 5
    nets = load_dataset(root=root, table="networks")
    assert len(nets) == 2 and set(nets["set_key"]) == {"resnet18:b8:r224"}
    assert len(load_dataset("H100", root=root)) == 4  # any accepted spelling of the GPU
    assert len(gpurec.load_dataset(GPU, root=root)) == 4
    with pytest.raises(FileNotFoundError, match="no operations data for gpu='A100'"):
        load_dataset("A100", root=root)
    with pytest.raises(FileNotFoundError, match="no datasets directory"):
        load_dataset(root=root / "missing")


def test_dataset_root_from_environment(gpu_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_gpu_dataset(gpu_dir)
    monkeypatch.setenv(DATASET_DIR_ENV, str(gpu_dir.parent))
    assert default_root() == gpu_dir.parent
    assert len(load_dataset()) == 4


def test_run_worker_rows_build_and_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end on the CPU: fake board -> run_worker -> build -> load."""
    from fakes import FakeBoard, FakeNVML

    from gpurec.collect import CollectConfig, ModelInputSet, WindowConfig, build_plan, run_worker
    from gpurec.collect import measure as measure_mod
    from gpurec.collect import runner as runner_mod
    from gpurec.device import nvml

    monkeypatch.setattr(runner_mod, "measure_idle", lambda s, d=1.0: measure_mod.measure_idle(s, 0.1))
    monkeypatch.setattr(runner_mod, "tick_period_s", lambda s, d=1.0: measure_mod.tick_period_s(s, 0.1))
    nvml.set_backend(FakeNVML([FakeBoard(update_period_s=0.02)]))
    try:
        items = build_plan([ModelInputSet("resnet18", 2, 32)], modes=("inference",))
        items = [w for w in items if w.item == "network"] + [w for w in items if w.item == "op"][:2]
        gpu_dir = tmp_path / "h100"
        cfg = CollectConfig(window=WindowConfig(min_window_s=0.05, gpu_blocks=2, gpu_min_block_ms=1.0),
                            repeat_every=0, host_bench_blocks=2)
        run_worker(items, gpu_dir / "raw", cfg, shard_name="0of1", device="cpu", log=lambda m: None)
    finally:
        nvml.set_backend(None)
    assert _tables(build_gpu_dataset(gpu_dir)) == {"operations": 2, "networks": 1, "repeats": 0, "idle": 1}
    df = load_dataset(root=tmp_path)
    assert list(df["op_signature"]) == [w.key for w in items[1:]]
    assert set(df["torch"]) == {__import__("torch").__version__} and df["host_cpu"].notna().all()
    assert (df["time_ms"] > 0).all() and (df["gpu_energy_mj"] > 0).all() and (df["host_ms"] > 0).all()
    prov = json.loads(next((gpu_dir / "raw").glob("provenance-*.json")).read_text())
    assert prov["host_bench"]["dispatch_cpu_us"] and prov["host_bench_end"]["dispatch_cpu_us"]


# -- the shipped measurements ------------------------------------------------------------------

SHIPPED_GPU_DIRS = sorted(p.parent for p in (ROOT / "datasets").glob("*/raw") if raw_row_files(p))


def _raw_expectations(gpu_dir: Path) -> dict[str, int]:
    """Table sizes derived straight from the raw lines (plain json, not the builder): one row per
    measured id, counted as ok when any of its measurements succeeded."""
    status: dict[tuple[str, str], set[str]] = {}
    counts = {"repeats": 0, "idle": 0, "lines": 0}
    for shard in raw_row_files(gpu_dir / "raw"):
        text = gzip.open(shard, "rt").read() if shard.suffix == ".gz" else shard.read_text()
        for line in text.splitlines():
            if not line.strip():
                continue
            r = json.loads(line)  # a damaged shipped line fails here, loudly
            counts["lines"] += 1
            if r["item"] == "idle":
                counts["idle"] += 1
            elif r.get("repeat"):
                counts["repeats"] += 1
            else:
                status.setdefault((r["item"], r["id"]), set()).add(r.get("status", "ok"))
    for item, table in (("op", "operations"), ("network", "networks")):
        ids = {k: v for k, v in status.items() if k[0] == item}
        counts[table] = len(ids)
        counts[f"{table}_ok"] = sum("ok" in v for v in ids.values())
    return counts


def _assert_tables_match_raw(gpu_dir: Path) -> int:
    """Every measured row of the raw files is in the loaded tables (ok rows by default, all with
    status=None); returns the number of ok operations."""
    want = _raw_expectations(gpu_dir)
    root = gpu_dir.parent
    gpu = pd.read_parquet(gpu_dir / "operations.parquet", columns=["gpu"])["gpu"].iloc[0]
    assert len(load_dataset(gpu, root=root)) == want["operations_ok"] > 0, gpu_dir.name
    assert len(load_dataset(gpu, root=root, status=None)) == want["operations"], gpu_dir.name
    assert len(load_dataset(gpu, root=root, table="networks", status=None)) == want["networks"], gpu_dir.name
    assert len(load_dataset(gpu, root=root, table="networks")) == want["networks_ok"], gpu_dir.name
    assert len(pd.read_parquet(gpu_dir / "repeats.parquet")) == want["repeats"], gpu_dir.name
    assert len(pd.read_parquet(gpu_dir / "idle.parquet")) == want["idle"], gpu_dir.name
    return want["operations_ok"]


def test_shipped_datasets_load() -> None:
    assert default_root() == ROOT / "datasets" or default_root().exists()
    assert {d.name for d in SHIPPED_GPU_DIRS} >= {"h100", "h200"}
    ops = gpurec.load_dataset()
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} <= set(ops["gpu"])
    assert len(ops) == sum(_assert_tables_match_raw(d) for d in SHIPPED_GPU_DIRS)
    h100 = gpurec.load_dataset("H100")
    assert set(h100["gpu"]) == {"NVIDIA H100 80GB HBM3"}
    assert set(h100["mode"]) == {"inference", "training"}
    assert h100["op_signature"].str.len().eq(16).all()
    assert (h100["time_ms"] > 0).all()
    # every H100 operation is host-free now (issue 12), and every H200 one since session 13: the
    # eager-only rows of 2026-11-26 stay beside the host-free ones as v1_* figures
    assert (h100["schema"] == 2).all() and "energy_mj" not in h100
    h200 = gpurec.load_dataset("H200")
    assert (h200["schema"] == 2).all() and "energy_mj" not in h200 and len(h200) >= 10700
    assert h200["captured"].all() and (h200["gpu_time_ms"] > 0).all()
    assert (h200["gpu_energy_mj"] > 0).all() and h200["v1_energy_mj"].notna().sum() >= 3200
    host_free = h100
    assert len(host_free) >= 9000 and host_free["captured"].all()
    assert (host_free["gpu_time_ms"] > 0).all() and (host_free["gpu_energy_mj"] > 0).all()
    assert (host_free["host_ms"] > 0).all()
    assert h100["v1_energy_mj"].notna().sum() >= 6831  # eager-only figures kept beside host-free ones
    assert h100["torch"].str.startswith("2.11").all() and h100["driver"].notna().all()
    nets = gpurec.load_dataset("H100", table="networks")
    archs = {k.split(":")[0] for k in nets["set_key"]}
    assert {"resnet50", "vit_b_16", "swin_t", "efficientnet_b0"} <= archs
    assert set(nets["mode"]) == {"inference", "training"}


def test_the_shipped_check_notices_lost_rows(tmp_path: Path) -> None:
    """The check above can fail: the h100 tables with 90% of the operations gone no longer pass."""
    gpu_dir = shutil.copytree(ROOT / "datasets" / "h100", tmp_path / "h100",
                              ignore=shutil.ignore_patterns("calibration", "profile", "probe"))
    _assert_tables_match_raw(gpu_dir)
    ops = pd.read_parquet(gpu_dir / "operations.parquet")
    ops.iloc[: len(ops) // 10].to_parquet(gpu_dir / "operations.parquet", index=False)
    with pytest.raises(AssertionError):
        _assert_tables_match_raw(gpu_dir)


@pytest.mark.parametrize("gpu_dir", SHIPPED_GPU_DIRS, ids=lambda d: d.name)
def test_shipped_raw_rebuilds_to_the_shipped_tables(tmp_path: Path, gpu_dir: Path) -> None:
    """Raw shards are the source of truth: rebuilding them reproduces each GPU's Parquet exactly."""
    shutil.copytree(gpu_dir / "raw", tmp_path / "raw")
    summary = build_gpu_dataset(tmp_path)
    assert summary["corrupt_lines_skipped"] == 0 and summary["bad_lines"] == []
    for name in TABLES:
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / f"{name}.parquet"),
                                      pd.read_parquet(gpu_dir / f"{name}.parquet"), check_like=False)


def test_json_safe_gives_strict_json_for_numpy_pandas_and_paths() -> None:
    import numpy as np

    raw = {1: np.float32(0.5), "a": (np.int64(3), float("nan")), "arr": np.array([[1.0, np.inf]]),
           "na": pd.NA, "nat": pd.NaT, "p": Path("x/y"), "ok": [True, np.bool_(False), "s", None]}
    safe = json_safe(raw)
    assert safe == {"1": 0.5, "a": [3, None], "arr": [[1.0, None]], "na": None, "nat": None, "p": "x/y",
                    "ok": [True, False, "s", None]}
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe
    assert type(safe["a"][0]) is int and type(safe["ok"][1]) is bool


def test_compressed_raw_shards_read_build_and_merge_like_plain_ones(tmp_path: Path) -> None:
    import gzip

    from gpurec.dataset.build import build_gpu_dataset
    from gpurec.dataset.merge import merge_shards
    from gpurec.dataset.store import raw_row_files

    rows = [{"id": f"op:s{i}:inference", "item": "op", "mode": "inference", "status": "ok", "op_kind": "ReLU",
             "op_signature": f"s{i}", "time_ms": 0.1 + i, "run_id": "r", "t_unix": float(i),
             "gpu": "NVIDIA H100 80GB HBM3"} for i in range(3)]
    raw = tmp_path / "h100" / "raw"
    raw.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (raw / "rows-a.jsonl").write_text(text[: len(text) // 3 and text.index("\n") + 1])
    with gzip.open(raw / "rows-b.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows[1:]))
    assert [p.name for p in raw_row_files(raw)] == ["rows-a.jsonl", "rows-b.jsonl.gz"]
    counts = build_gpu_dataset(tmp_path / "h100")
    assert counts["operations"] == 3
    result = merge_shards([raw], tmp_path / "merged" / "h100")
    merged = tmp_path / "merged" / "h100" / "raw"
    assert sorted(p.name for p in merged.iterdir() if p.name.startswith("rows-")) == ["rows-a.jsonl", "rows-b.jsonl"]
    assert (merged / "rows-b.jsonl").read_text().count("\n") == 2 and result["tables"]["operations"] == 3


def test_board_repeats_pair_one_identity_across_two_boards_only(tmp_path: Path) -> None:
    """Rows of one identity on two boards pair up (earliest board first); a second row on the same
    board, failed rows, within-run repeats and other precisions do not."""
    from gpurec.dataset.load import board_repeats
    from gpurec.model.fitting.evaluate import board_noise

    raw = tmp_path / "h100" / "raw"
    raw.mkdir(parents=True)
    base = {"gpu": "NVIDIA H100 80GB HBM3", "item": "network", "mode": "inference", "status": "ok", "schema": 2}
    rows = [
        {**base, "id": "network:a:inference", "gpu_uuid": "GPU-1", "t_unix": 1.0, "gpu_time_ms": 10.0},
        {**base, "id": "network:a:inference", "gpu_uuid": "GPU-1", "t_unix": 2.0, "gpu_time_ms": 10.5},
        {**base, "id": "network:a:inference", "gpu_uuid": "GPU-2", "t_unix": 3.0, "gpu_time_ms": 11.0},
        {**base, "id": "network:a:inference", "gpu_uuid": "GPU-3", "t_unix": 4.0, "gpu_time_ms": 9.0, "repeat": True},
        {**base, "id": "network:b:inference", "gpu_uuid": "GPU-1", "t_unix": 1.0, "gpu_time_ms": 5.0},
        {**base, "id": "network:b:inference", "gpu_uuid": "GPU-2", "t_unix": 2.0, "status": "failed"},
        {**base, "id": "network:c:inference", "gpu_uuid": "GPU-1", "t_unix": 1.0, "gpu_time_ms": 4.0},
        {**base, "id": "network:c:inference", "gpu_uuid": "GPU-1", "t_unix": 3.0, "gpu_time_ms": 4.4},
        {**base, "id": "network:c:inference", "gpu_uuid": "GPU-2", "t_unix": 2.0, "gpu_time_ms": 4.0,
         "precision": "bf16-mixed"},
    ]
    with gzip.open(raw / "rows-x-0of1.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    pairs = board_repeats(tmp_path)
    assert len(pairs) == 1
    rec = pairs.iloc[0]
    assert (rec["id"], rec["first_gpu_uuid"], rec["second_gpu_uuid"]) == ("network:a:inference", "GPU-1", "GPU-2")
    assert (rec["first_gpu_time_ms"], rec["second_gpu_time_ms"]) == (10.0, 11.0)
    [noise] = [r for r in board_noise(pairs) if r["column"] == "gpu_time_ms"]
    assert noise["n"] == 1 and noise["mean_pct"] == pytest.approx(10.0)
