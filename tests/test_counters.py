"""Per-operation ncu counters: marker segmentation on a real ncu export and feature derivation.

Fixtures (tests/fixtures/counters/): ``ncu_segment.csv`` = the first 16 lines of the real raw
export ``datasets/h200/counters/ncu_raw_chunk0.csv.gz`` (H200, ncu 2025.3.1): header, units row
and 14 kernels = 3 marker segments (spin_kernel + the operation's kernels);
``chunk_order.jsonl`` = the matching 3 rows of chunk_order_0.jsonl; ``expected_counters.jsonl``
= what the device run wrote to counters.jsonl for those 3 operations.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pandas as pd
import pytest

from gpurec.calibrate.features import FEATURE_COLUMNS, METRICS, NON_ADDITIVE, op_feature_table
from gpurec.collect.counters import MARKER, segment
from gpurec.device import ncu

FIX = Path(__file__).parent / "fixtures" / "counters"
CSV = FIX / "ncu_segment.csv"
H200_EPS = {"shared": 90.28865990874242, "l1": 181.3356179670167, "l2": 926.5032496056435, "dram": 2934.3995463376386}
CAL = {"gpu": "NVIDIA H200", "levels": {k: {"pj_per_sector": v} for k, v in H200_EPS.items()}}


def _jsonl(path: Path) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def raw() -> pd.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no pandas fragmentation warnings on a 349-column export
        return ncu.parse_ncu_csv(CSV)


def test_real_export_parses(raw: pd.DataFrame) -> None:
    assert len(raw) == 14 and list(raw["id"]) == list(range(14))
    assert raw["kernel_name"].str.contains(MARKER, regex=False).sum() == 3
    assert raw.loc[0, "kernel_name"] == "cuda::<unnamed>::spin_kernel(long)"
    for m in METRICS:
        assert m in raw.columns and raw[m].dtype == "float64", m
    assert raw.attrs["units"]["gpu__time_duration.sum"] == "ns"
    assert raw.attrs["units"]["dram__sectors_read.sum"] == "sector"
    assert (raw["smsp__cycles_elapsed.sum"] == 4 * raw["sm__cycles_elapsed.sum"]).all()
    assert list(raw["threads_per_block"][:3]) == [1, 64, 128]  # marker, cuDNN conv, elementwise


def test_segment_sums_each_operation_between_markers(raw: pd.DataFrame) -> None:
    order = _jsonl(FIX / "chunk_order.jsonl")
    expected = {r["id"]: r for r in _jsonl(FIX / "expected_counters.jsonl")}
    rows = segment(raw, order)
    assert [r["id"] for r in rows] == [r["id"] for r in order]
    assert [r["kernels"] for r in rows] == [2, 7, 2]
    for r in rows:
        assert MARKER not in r["kernel_names"]
        exp = expected[r["id"]]
        for k, v in r.items():
            if isinstance(v, float) and k != "ncu_wall_s":
                assert v == pytest.approx(exp[k]), (r["id"], k)
    # the sums are the kernels' own values: segment 2 = rows 4..10 of the export
    seg2 = raw.iloc[4:11]
    assert rows[1]["dram__sectors_read.sum"] == pytest.approx(seg2["dram__sectors_read.sum"].sum())
    assert rows[1]["gpu__time_duration.sum"] == pytest.approx(seg2["gpu__time_duration.sum"].sum())
    assert not any(k.endswith((".pct", ".avg", ".max", ".min")) for k in rows[0])


def test_segment_skips_failed_ops_and_keeps_kernelless_ones(raw: pd.DataFrame) -> None:
    order = _jsonl(FIX / "chunk_order.jsonl")
    failed = {"seq": 1, "id": "op:failed:inference", "status": "failed", "error": "RuntimeError: x"}
    view = {"seq": 4, "id": "op:view:inference", "status": "ok", "wall_s": 0.1}
    rows = segment(raw, [order[0], failed, *order[1:], view])
    ids = [r["id"] for r in rows]
    assert "op:failed:inference" not in ids
    assert ids[:3] == [r["id"] for r in order]  # failed rows launch no marker: no shift
    assert rows[-1] == {"id": "op:view:inference", "kernels": 0, "ncu_wall_s": 0.1}


def test_op_feature_table_from_segments(raw: pd.DataFrame) -> None:
    expected = _jsonl(FIX / "expected_counters.jsonl")
    counters = pd.DataFrame(expected)
    ops = pd.DataFrame({"op_signature": [r["op_signature"] for r in expected], "mode": [r["mode"] for r in expected],
                        "op_kind": "Conv2d", "time_ms": [0.02, 0.07, 0.01], "dynamic_energy_mj": [5.0, 20.0, 1.0],
                        "energy_mj": [10.0, 40.0, 2.0], "instances": 4.0})
    t = op_feature_table(counters, CAL, ops)
    assert len(t) == 3 and set(FEATURE_COLUMNS) <= set(t.columns)
    assert not set(NON_ADDITIVE) & set(t.columns)  # per-kernel occupancy limits: not summable
    r = t.iloc[1]
    dram = r["dram__sectors_read.sum"] + r["dram__sectors_write.sum"]
    assert r["mem_energy_dram_mj"] == pytest.approx(dram * H200_EPS["dram"] * 1e-9)
    assert r["mem_energy_l2_mj"] == pytest.approx(r["lts__t_sectors_lookup_hit.sum"] * H200_EPS["l2"] * 1e-9)
    assert r["mem_energy_l1_mj"] == pytest.approx(
        r["l1tex__t_sectors_pipe_lsu_mem_global_op_ld_lookup_hit.sum"] * H200_EPS["l1"] * 1e-9)
    assert r["mem_energy_shared_mj"] == pytest.approx(
        r["l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"] * 4 * H200_EPS["shared"] * 1e-9)
    levels = ["mem_energy_dram_mj", "mem_energy_l2_mj", "mem_energy_l1_mj", "mem_energy_shared_mj"]
    assert r["mem_energy_total_mj"] == pytest.approx(r[levels].sum())
    assert r["mem_share_of_dynamic"] == pytest.approx(r["mem_energy_total_mj"] / 20.0)
    assert sum(r[f"mem_share_{lv}"] for lv in ("dram", "l2", "l1", "shared")) == pytest.approx(1.0)
    assert r["ncu_time_ms"] == pytest.approx(r["gpu__time_duration.sum"] / 1e6)
    assert r["ncu_time_ratio"] == pytest.approx(r["ncu_time_ms"] / 0.07)
    assert r["smsp_issue_util"] == pytest.approx(r["smsp__issue_active.sum"] / r["smsp__cycles_elapsed.sum"])
    # tensor-pipe cycles are SMSP sums: over SMSP elapsed cycles they stay within [0, 1]
    for u in ("smsp_active_util", "smsp_issue_util", "tc_active_util", "tc_issue_util"):
        assert t[u].between(0.0, 1.0).all(), u
    assert r["tc_active_util"] == pytest.approx(
        r["sm__pipe_tensor_cycles_active.sum"] / r["smsp__cycles_elapsed.sum"])
    # without measurements: features only
    bare = op_feature_table(counters, CAL)
    assert "mem_share_of_dynamic" not in bare and bare["mem_energy_total_mj"].notna().all()


def test_tc_active_util_uses_smsp_cycles() -> None:
    """Counter values of a real TF32 cuDNN conv kernel (ncu_raw_chunk0.csv.gz, H200): the
    SM-prefixed tensor counter is 3.05x sm__cycles_elapsed (a sum over the 4 SMSPs), so the
    utilization divides by SMSP elapsed cycles (0.76), as Table 4.1 of the seed defines it."""
    from gpurec.calibrate.features import memory_energy_features

    c = pd.DataFrame({"sm__pipe_tensor_cycles_active.sum": [562_214_400.0],
                      "smsp__pipe_tensor_op_hmma_cycles_active.sum": [562_214_400.0],
                      "sm__cycles_elapsed.sum": [184_074_744.0], "smsp__cycles_elapsed.sum": [736_298_976.0],
                      "smsp__inst_executed_pipe_tensor_op_hmma.sum": [93_702_400.0]})
    f = memory_energy_features(c, CAL).iloc[0]
    assert f["tc_active_util"] == pytest.approx(562_214_400 / 736_298_976)
    assert f["tc_issue_util"] == pytest.approx(93_702_400 / 736_298_976)
    assert math.isnan(f["mem_energy_total_mj"])  # no memory counters: NaN, not 0


def test_rows_that_name_their_set_and_precision_join_without_duplicate_columns() -> None:
    """Counters rows written since session 22 carry ``set_key`` and ``precision``; the operations
    table has a ``set_key`` too: the join keeps one of each (the counters'), never ``set_key_x``."""
    expected = _jsonl(FIX / "expected_counters.jsonl")
    counters = pd.DataFrame(expected).assign(set_key="resnet18:b8:r224", precision="fp32")
    ops = pd.DataFrame({"op_signature": [r["op_signature"] for r in expected], "mode": [r["mode"] for r in expected],
                        "op_kind": "Conv2d", "set_key": "alexnet:b1:r224", "time_ms": 0.02,
                        "dynamic_energy_mj": 5.0, "energy_mj": 10.0, "instances": 4.0})
    t = op_feature_table(counters, CAL, ops)
    assert "set_key_x" not in t.columns and "set_key_y" not in t.columns
    assert (t["set_key"] == "resnet18:b8:r224").all() and (t["precision"] == "fp32").all()
    assert t["mem_share_of_dynamic"].notna().all()


def test_pending_keeps_the_kinds_asked_for_in_plan_order(tmp_path: Path) -> None:
    from gpurec.collect.counters import pending

    items = [{"item": "op", "key": f"{i:016x}", "kind": kind, "mode": "inference", "set_key": "resnet18:b1:r224"}
             for i, kind in enumerate(["Conv2d", "Linear", "add", "Linear", "LSTM"])]
    items.append({"item": "network", "key": "resnet18:b1:r224", "kind": "network", "mode": "inference",
                  "set_key": "resnet18:b1:r224"})
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"items": items}))
    every = pending(plan, set())
    assert [w.kind for w in every] == ["Conv2d", "Linear", "add", "Linear", "LSTM"]  # operations only
    done = {every[1].id}
    assert [w.key for w in pending(plan, done, kinds={"Linear", "LSTM"})] == [f"{3:016x}", f"{4:016x}"]


def test_drive_pairs_counters_with_this_runs_operations_despite_earlier_chunk_files(
        tmp_path: Path, raw: pd.DataFrame, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed run in a directory that keeps an earlier lease's ``chunk_order_0.jsonl``:
    ncu is faked (it returns the real 3-segment export and writes the child's order file),
    the rest of ``drive`` is the real code path."""
    from gpurec.collect import counters as counters_mod
    from gpurec.dataset.store import JsonlShard

    items = [{"item": "op", "key": f"{i:016x}", "kind": "Conv2d", "mode": "inference", "set_key": "resnet18:b1:r224"}
             for i in range(3)]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"items": items}))
    out = tmp_path / "counters"
    out.mkdir()
    stale = [{"seq": s, "id": f"op:earlier{s}:inference", "status": "ok", "wall_s": 0.1} for s in range(3)]
    (out / "chunk_order_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stale))

    def fake_run_ncu(cmd, metrics, csv_path, extra=(), timeout_s=0.0, env=None):  # noqa: ANN001, ANN202
        spec = json.loads(Path(cmd[-1]).read_text())
        ids = json.loads(Path(spec["ids"]).read_text())
        with JsonlShard(Path(spec["order"])) as order:  # what the child appends
            for seq, item_id in enumerate(ids):
                order.append({"seq": seq, "id": item_id, "status": "ok", "wall_s": 0.2})
        return raw

    monkeypatch.setattr(ncu, "run_ncu", fake_run_ncu)
    monkeypatch.setattr(ncu, "query_metrics", lambda: list(METRICS))
    summary = counters_mod.drive(plan, out, budget_s=600.0, chunk=3, log=lambda *_: None)
    assert summary["profiled"] == 3 and summary["failed"] == 0
    rows = _jsonl(out / "counters.jsonl")
    want = [w.id for w in counters_mod.pending(plan, set())]
    assert [r["id"] for r in rows] == want
    assert [r["kernels"] for r in rows] == [2, 7, 2]  # the export's segments, in order
    assert (out / "chunk_order_0.jsonl").read_text().count("earlier") == 3  # provenance kept
    assert (out / "chunk_order_1.jsonl").exists()
