"""scripts/dataset_report.py on a tiny, fake (test-only) dataset in a temp dir."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_report():
    spec = importlib.util.spec_from_file_location("dataset_report", ROOT / "scripts" / "dataset_report.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


report = _load_report()

RUN = "20990101T000000-0of1-fake00"
# Fake network "fakenet": batch 1 has ops s1 (twice) and s2; batch 8 has s3 and s4.
FAKE_OPS = {("fakenet", 1, "inference"): [("s1", 10.0), ("s1", 10.0), ("s2", 5.0)],
            ("fakenet", 8, "inference"): [("s3", 80.0), ("s4", 40.0)]}


def fake_extract(arch, shape, mode):
    return FAKE_OPS[(arch, shape[0], mode)]


def _op(sig, set_key, t_ms, power, **kw):
    row = {"id": f"op:{sig}:inference", "item": "op", "mode": "inference", "op_kind": "Conv2d",
           "op_signature": sig, "set_key": set_key, "model_sets": [set_key], "t_unix": 1.0, "instances": 1,
           "time_ms": t_ms, "power_w": power, "energy_mj": power * t_ms, "idle_power_w": 100.0,
           "dynamic_energy_mj": (power - 100.0) * t_ms, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
           "temperature_c": 50, "throttle_reasons": "", "tick_power_cv": 0.01, "row_wall_ms": 500.0,
           "status": "ok", "run_id": RUN, "gpu": "NVIDIA H100 80GB HBM3"}
    row.update(kw)
    return row


def make_dataset(root: Path, drop: tuple[str, ...] = ()) -> Path:
    """A fake GPU directory (raw shard, provenance, probe) and plan; Parquet built by gpurec's builder."""
    from gpurec.dataset.build import build_gpu_dataset

    gpu = root / "fakegpu"
    (gpu / "raw").mkdir(parents=True)
    rows = [
        {"id": f"idle:{RUN}:0", "item": "idle", "run_id": RUN, "repeat": True, "gpu": "NVIDIA H100 80GB HBM3",
         "idle_power_w": 100.0, "idle_window_s": 1.0, "idle_sm_clock_mhz": 1980, "idle_temperature_c": 40},
        _op("s1", "fakenet:b1:r224", 0.010, 150.0),
        _op("s2", "fakenet:b1:r224", 0.030, 300.0),
        _op("s3", "fakenet:b8:r224", 0.200, 720.0, throttle_reasons="sw_power_cap"),
        _op("s4", "fakenet:b8:r224", float("nan"), float("nan"), status="failed",
            error="RuntimeError: fake failure for the test"),
        _op("s1", "fakenet:b1:r224", 0.011, 155.0, id="op:s1:inference:rep", repeat=True),
        _op("s3", "fakenet:b8:r224", 0.200, 700.0, id="op:s3:inference:rep", repeat=True),
    ]
    for b, t in ((1, 0.06), (8, 0.5)):
        rows.append(_op("", f"fakenet:b{b}:r224", t, 400.0, id=f"network:fakenet:b{b}:r224:inference",
                        item="network", op_kind="network", op_signature=None))
    rows = [{k: v for k, v in r.items() if k not in drop} for r in rows]
    with open(gpu / "raw" / "rows-fake.jsonl", "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    prov = {"run_id": RUN, "date": "2099-01-01T00:00:00+00:00", "torch": "2.11.0+cu130", "cuda_runtime": "13.0",
            "host_cpu": "Fake CPU", "host_cores": 4,
            "gpu": {"name": "NVIDIA H100 80GB HBM3", "driver_version": "999.1", "power_limit_w": 700.0,
                    "max_sm_clock_mhz": 1980},
            "settings": {"max_instances": 4, "window": {"min_window_s": 0.39, "min_run_time_s": 0.05}}}
    (gpu / "raw" / f"provenance-{RUN}.json").write_text(json.dumps(prov))
    (gpu / "probe").mkdir()
    op = ["fakenet", 1, "inference", "Conv2d", 0]
    probe = {"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "tick_period_s": 0.1, "idle": {"idle_power_w": 100.0},
             "window_sweep": [{"op": op, "min_window_s": w, "repeat": r, "energy_mj": 1.0 + 0.01 * r / w,
                               "time_ms": 0.01, "gpu_time_s": 0.5 + w, "window_s": w + 0.05}
                              for w in (0.1, 0.5) for r in range(3)],
             "instance_sweep": [{"op": op, "instances": n, "time_ms": 0.01, "energy_mj": 1.0, "param_bytes": 4096}
                                for n in (1, 2, 4, 8)]}
    (gpu / "probe" / "probe.json").write_text(json.dumps(probe))
    build_gpu_dataset(gpu)
    plan = {"items": [
        {"item": "network", "key": f"fakenet:b{b}:r224", "mode": "inference", "kind": "network",
         "set_key": f"fakenet:b{b}:r224", "model_sets": [f"fakenet:b{b}:r224"]} for b in (1, 8)] + [
        {"item": "op", "key": s, "mode": "inference", "kind": "Conv2d", "set_key": k, "model_sets": [k]}
        for s, k in (("s1", "fakenet:b1:r224"), ("s2", "fakenet:b1:r224"), ("s3", "fakenet:b8:r224"),
                     ("s4", "fakenet:b8:r224"))]}
    (root / "plans").mkdir()
    (root / "plans" / "main.json").write_text(json.dumps(plan))
    return gpu


def test_report_on_fake_dataset(tmp_path: Path) -> None:
    make_dataset(tmp_path)
    now = dt.datetime(2099, 1, 2, tzinfo=dt.timezone.utc)
    text = report.generate(tmp_path, extract=fake_extract, now=now)
    out = tmp_path / "README.md"
    assert out.read_text() == text
    assert "Generated by `python scripts/dataset_report.py` on 2099-01-02" in text
    for heading in ("## What this is", "## File layout", "## Columns", "## Loading", "## Provenance",
                    "## Rows, coverage and GPU time", "### Coverage of the plan", "### GPU time spent",
                    "### Failures", "## Repeatability", "## Why these collection settings (probe)",
                    "## First validation", "### Fully covered sets", "## Power, clocks and throttling"):
        assert heading in text, heading
    assert "RuntimeError" in text  # the failed row's reason
    assert "999.1" in text and "Fake CPU" in text  # provenance
    assert "3 / 4" in text  # 3 of 4 planned op rows measured
    # fakenet:b1 is fully covered: s1 counted twice -> sum time 0.010*2 + 0.030 = 0.05 ms vs 0.06 ms network
    assert "| `fakegpu` | fakenet:b1:r224 | inference | 3 (2) | 0.05 | 0.06 | 0.83 |" in text
    # b8 misses its failed op s4, so it is not in the fully covered table
    assert "| `fakegpu` | fakenet:b8:r224 | inference | 2 (2)" not in text
    assert "| `fakegpu` | all | 2 |" in text  # two repeat pairs
    assert "| `fakegpu` | operations | 3 | " in text  # power table rows
    for name in ("coverage.png", "repeatability.png", "probe.png", "sum_vs_network.png", "power_clocks.png"):
        png = tmp_path / "img" / name
        assert png.exists(), name
        assert png.stat().st_size < 150_000
        assert f"(img/{name})" in text


def test_report_survives_missing_columns(tmp_path: Path) -> None:
    make_dataset(tmp_path, drop=("power_w", "energy_mj", "dynamic_energy_mj", "sm_clock_mhz", "throttle_reasons",
                                 "row_wall_ms", "tick_power_cv", "error"))
    text = report.generate(tmp_path, extract=fake_extract)
    assert "## Power, clocks and throttling" in text
    assert "## Repeatability" in text


@pytest.mark.parametrize("make_plan", [False, True])
def test_report_on_empty_root(tmp_path: Path, make_plan: bool) -> None:
    if make_plan:
        (tmp_path / "plans").mkdir()
        (tmp_path / "plans" / "main.json").write_text(json.dumps({"items": []}))
    text = report.generate(tmp_path, extract=fake_extract)
    assert "## What this is" in text and "No repeat pairs yet." in text
    assert "GPUs measured: none yet" in text
