"""gpurec.collect on the CPU: planning, sharding, resumable runs, failures and the energy window.

Runs use ``run_worker(device="cpu")`` against tests/fakes.py's FakeNVML, whose energy
counter advances in steps of board power x update period, like the real one.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeBoard, FakeNVML

from gpurec.collect import (
    CollectConfig,
    ModelInputSet,
    WindowConfig,
    WorkItem,
    build_plan,
    measure_idle,
    measure_step,
    model_input_sets,
    parse_shard,
    run_worker,
    shard_items,
)
from gpurec.collect.runner import OperationSource, TooManyFailures, auto_instances, done_ids
from gpurec.dataset.store import (
    JsonlShard,
    TornLineRepaired,
    atomic_write_json,
    atomic_write_parquet,
    atomic_write_text,
    read_jsonl,
)
from gpurec.device import nvml, open_gpu
from gpurec.device.sampler import Sampler

SET = ModelInputSet("resnet18", 2, 32)  # tiny input: CPU steps take well under a millisecond
FAST = WindowConfig(min_window_s=0.05, tick_timeout_s=10.0, gpu_blocks=3, gpu_min_block_ms=1.0)


# -- planning ----------------------------------------------------------------------------------

def _fake_extract(arch: str, shape: tuple[int, ...], mode: str) -> list[SimpleNamespace]:
    """Three kinds per set, plus one operation every architecture shares at a batch size."""
    b = shape[0]
    ops = [SimpleNamespace(signature=f"{arch}-{b}-{kind}-{i}", kind=kind)
           for i in range(4) for kind in ("Conv2d", "ReLU", "add")]
    ops.insert(1, SimpleNamespace(signature=f"shared-{b}", kind="Linear"))
    ops.append(SimpleNamespace(signature=f"{arch}-{b}-Conv2d-0", kind="Conv2d"))  # repeated in the network
    return ops


def test_model_input_set_keys_round_trip() -> None:
    s = ModelInputSet("vit_b_16", 32, 224)
    assert s.key == "vit_b_16:b32:r224" and ModelInputSet.parse(s.key) == s
    assert s.input_shape == (32, 3, 224, 224)
    sets = model_input_sets(["a", "b"], [1, 8], [224, 256])
    assert len(sets) == 8 and len({x.key for x in sets}) == 8


def test_plan_deduplicates_and_records_owners() -> None:
    sets = model_input_sets(["archA", "archB"], [1, 8])
    items = build_plan(sets, extract=_fake_extract)
    ids = [w.id for w in items]
    assert len(ids) == len(set(ids))
    nets = [w for w in items if w.item == "network"]
    assert len(nets) == len(sets) * 2 and items[:len(nets)] == nets  # networks first
    ops = [w for w in items if w.item == "op"]
    # 12 own + 1 shared per (arch, batch), the shared one once per batch; both modes
    assert len(ops) == 2 * (4 * 12 + 2)
    shared = [w for w in ops if w.key == "shared-1"]
    assert {w.mode for w in shared} == {"inference", "training"}
    for w in shared:
        assert w.set_key == "archA:b1:r224"
        assert w.model_sets == ["archA:b1:r224", "archB:b1:r224"]
    own = next(w for w in ops if w.key == "archB-8-ReLU-2")
    assert own.model_sets == ["archB:b8:r224"] and own.kind == "ReLU"


def test_plan_prefix_is_balanced_across_archs_batches_modes_and_kinds() -> None:
    sets = model_input_sets(["archA", "archB", "archC"], [1, 8])
    items = [w for w in build_plan(sets, extract=_fake_extract) if w.item == "op"]
    groups = {(s.key, m) for s in sets for m in ("inference", "training")}
    prefix = items[:len(groups)]
    assert {(w.set_key, w.mode) for w in prefix} == groups  # every group once
    # any prefix stays balanced: group counts differ by at most one
    for n in (len(groups) * 2, len(groups) * 3 + 5):
        counts = Counter((w.set_key, w.mode) for w in items[:n])
        assert max(counts.values()) - min(counts.values()) <= 1
        modes = Counter(w.mode for w in items[:n])
        assert abs(modes["inference"] - modes["training"]) <= 1
    # within a group, kinds alternate
    first_a = [w.kind for w in items if w.set_key == "archA:b1:r224" and w.mode == "inference"][:4]
    assert len(set(first_a)) == 4


def test_plan_with_real_extraction_shares_operations_between_resnets() -> None:
    sets = [ModelInputSet("resnet18", 2, 32), ModelInputSet("resnet34", 2, 32)]
    items = build_plan(sets, modes=("inference",), networks=False)
    assert all(w.item == "op" and w.mode == "inference" for w in items)
    assert len({w.key for w in items}) == len(items)
    both = [w for w in items if len(w.model_sets) == 2]
    assert both, "resnet18 and resnet34 share their stem and basic blocks"
    assert {w.kind for w in both} >= {"Conv2d", "BatchNorm2d", "ReLU"}
    only34 = [w for w in items if w.model_sets == ["resnet34:b2:r32"]]
    assert all(w.set_key == "resnet34:b2:r32" for w in only34)


def test_plan_networks_only() -> None:
    items = build_plan([SET], networks=True, operations=False)
    assert [w.id for w in items] == [f"network:{SET.key}:inference", f"network:{SET.key}:training"]


# -- sharding ----------------------------------------------------------------------------------

def test_sharding_is_deterministic_disjoint_and_complete() -> None:
    items = build_plan(model_input_sets(["archA", "archB", "archC"], [1, 8]), extract=_fake_extract)
    for n in (1, 3, 4):
        shards = [shard_items(items, i, n) for i in range(n)]
        assert shards == [shard_items(items, i, n) for i in range(n)]  # deterministic
        ids = [w.id for s in shards for w in s]
        assert len(ids) == len(set(ids)) == len(items)  # disjoint, union = all
        order = {w.id: k for k, w in enumerate(items)}
        for s in shards:
            assert [order[w.id] for w in s] == sorted(order[w.id] for w in s)  # plan order kept
            if n > 1:
                assert {w.mode for w in s} == {"inference", "training"}  # not one mode per shard


def test_sharding_does_not_depend_on_the_rest_of_the_plan() -> None:
    items = build_plan(model_input_sets(["archA", "archB"], [1, 8]), extract=_fake_extract)
    sub = items[::3]
    for i in range(4):
        assert {w.id for w in shard_items(sub, i, 4)} == {w.id for w in shard_items(items, i, 4)} & {w.id for w in sub}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for k in ("RANK", "WORLD_SIZE", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_parse_shard_text_and_default(clean_env: pytest.MonkeyPatch) -> None:
    assert parse_shard(None) == (0, 1)
    assert parse_shard("") == (0, 1)
    assert parse_shard("1/4") == (1, 4)
    assert parse_shard("0/1") == (0, 1)
    for bad in ("4/4", "-1/4", "1/0", "x", "1/2/3", "1"):
        with pytest.raises(ValueError, match="0 <= i < n"):
            parse_shard(bad)


def test_parse_shard_from_torchrun(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RANK", "3")
    clean_env.setenv("WORLD_SIZE", "8")
    assert parse_shard(None) == (3, 8)
    assert parse_shard("1/2") == (1, 2)  # an explicit --shard wins
    clean_env.setenv("RANK", "8")
    with pytest.raises(ValueError):
        parse_shard(None)


def test_parse_shard_from_slurm_array(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("SLURM_ARRAY_TASK_ID", "2")
    clean_env.setenv("SLURM_ARRAY_TASK_COUNT", "5")
    assert parse_shard(None) == (2, 5)
    clean_env.setenv("SLURM_ARRAY_TASK_MIN", "1")  # --array=1-5
    clean_env.setenv("SLURM_ARRAY_TASK_ID", "5")
    assert parse_shard(None) == (4, 5)
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "2")
    assert parse_shard(None) == (0, 2)  # torchrun variables take precedence


# -- store: atomic and torn writes -------------------------------------------------------------

def test_torn_last_line_is_skipped_and_next_append_starts_fresh(tmp_path: Path) -> None:
    p = tmp_path / "rows-0.jsonl"
    with JsonlShard(p) as sh:
        sh.append({"id": "a", "x": 1.0})
        sh.append({"id": "b", "x": float("nan")})  # non-finite floats become null
    with open(p, "a", encoding="utf-8") as fh:
        fh.write('{"id": "torn", "x": 1')  # killed mid-write
    assert [r["id"] for r in read_jsonl(p)] == ["a", "b"]
    assert list(read_jsonl(p))[1]["x"] is None
    with JsonlShard(p) as sh, pytest.warns(TornLineRepaired, match="rows-0.jsonl.torn"):
        sh.append({"id": "c"})
        sh.append({"id": "d"})
    lines = p.read_text().split("\n")  # the fragment is kept aside, not left mid-file
    assert json.loads(lines[2]) == {"id": "c"}
    assert (tmp_path / "rows-0.jsonl.torn").read_text() == '{"id": "torn", "x": 1\n'
    assert [r["id"] for r in read_jsonl(p)] == ["a", "b", "c", "d"]
    assert done_ids(tmp_path) == {"a", "b", "c", "d"}
    assert list(read_jsonl(tmp_path / "missing.jsonl")) == []


def test_atomic_write_json_leaves_no_temp_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out" / "report.json"
    atomic_write_json(target, {"v": 1})
    assert json.loads(target.read_text()) == {"v": 1}

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_json(target, {"v": 2})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"v": 1}  # old content intact
    assert sorted(x.name for x in target.parent.iterdir()) == ["report.json"]

    class Interrupting:
        def __str__(self) -> str:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "x" * 10 + str(Interrupting()))
    assert sorted(x.name for x in target.parent.iterdir()) == ["report.json"]


def test_atomic_write_parquet_leaves_no_temp_file_on_failure(tmp_path: Path) -> None:
    class Broken:
        def to_parquet(self, path: str, index: bool = False) -> None:
            Path(path).write_bytes(b"PAR1 partial")
            raise RuntimeError("arrow failed")

    with pytest.raises(RuntimeError, match="arrow failed"):
        atomic_write_parquet(tmp_path / "t.parquet", Broken())
    assert list(tmp_path.iterdir()) == []


# -- window measurement with the fake board ----------------------------------------------------

@pytest.fixture
def board() -> FakeBoard:
    b = FakeBoard(power_w=250.0, update_period_s=0.02)
    nvml.set_backend(FakeNVML([b]))
    yield b
    nvml.set_backend(None)


def test_idle_power_from_the_counter(board: FakeBoard) -> None:
    with Sampler(open_gpu(0)) as s:
        idle = measure_idle(s, duration_s=0.5)
    assert idle["idle_power_w"] == pytest.approx(250.0, rel=0.03)
    assert idle["idle_window_s"] >= 0.5


def test_counter_that_never_ticks_times_out(board: FakeBoard) -> None:
    board.update_period_s = 1e9
    with Sampler(open_gpu(0)) as s, pytest.raises(TimeoutError, match="did not update"):
        measure_step(lambda: sum(range(200)), s, WindowConfig(min_window_s=0.05, tick_timeout_s=0.2),
                     None, inference=True)


# -- run_worker on the CPU ---------------------------------------------------------------------

def _cfg(**kw: object) -> CollectConfig:
    base: dict[str, object] = {"window": FAST, "repeat_every": 0, "max_consecutive_failures": 5}
    base.update(kw)
    return CollectConfig(**base)  # type: ignore[arg-type]


def _pick(items: list[WorkItem], n_ops: int = 2) -> list[WorkItem]:
    nets = [w for w in items if w.item == "network" and w.mode == "inference"]
    ops = [w for w in items if w.item == "op" and w.kind in ("Conv2d", "ReLU", "add")]
    return nets + ops[:n_ops * 2]


@pytest.fixture(scope="module")
def plan() -> list[WorkItem]:
    return build_plan([SET])


def _rows(out: Path) -> list[dict]:
    return [r for p in sorted(out.glob("rows-*.jsonl")) for r in read_jsonl(p)]


def test_run_worker_measures_then_resumes_without_remeasuring(tmp_path: Path, fast_worker: FakeNVML,
                                                              plan: list[WorkItem]) -> None:
    items = _pick(plan)
    assert {w.mode for w in items if w.item == "op"} == {"inference", "training"}
    logs: list[str] = []
    s1 = run_worker(items, tmp_path, _cfg(), shard_name="0of1", device="cpu", log=logs.append)
    assert s1["ok"] == len(items) and s1["failed"] == 0 and s1["gpu"] == "NVIDIA H100 80GB HBM3"
    rows = _rows(tmp_path)
    measured = [r for r in rows if r["item"] != "idle"]
    assert sorted(r["id"] for r in measured) == sorted(w.id for w in items)
    order = [r["set_key"] + r["mode"] for r in measured]  # one (set, mode) at a time: one extraction each
    assert all(order.index(k) == i or order[i - 1] == k for i, k in enumerate(order))
    for r in measured:
        assert r["status"] == "ok" and r["gpu"] == "NVIDIA H100 80GB HBM3" and r["gpu_uuid"] == "GPU-fake-0000"
        assert r["schema"] == 2 and r["captured"] is False and r["capture_error"]  # no CUDA graphs on the CPU
        assert r["time_ms"] > 0 and r["gpu_time_ms"] > 0 and r["host_ms"] > 0
        assert r["gpu_power_w"] == pytest.approx(100.0, rel=0.5)  # short windows: a sanity check
        assert r["run_id"] == s1["run_id"] and r["instances"] >= 1
    by_id = {r["id"]: r for r in measured}
    train_op = next(w for w in items if w.item == "op" and w.mode == "training")
    assert by_id[train_op.id]["backward"] is True and by_id[train_op.id]["op_signature"] == train_op.key
    prov = json.loads((tmp_path / f"provenance-{s1['run_id']}.json").read_text())
    assert prov["gpu"]["name"] == "NVIDIA H100 80GB HBM3" and prov["clocks"].startswith("default")
    assert prov["settings"]["window"]["min_window_s"] == FAST.min_window_s

    s2 = run_worker(items, tmp_path, _cfg(), shard_name="0of1", device="cpu", log=logs.append)
    assert s2["ok"] == 0 and s2["failed"] == 0
    assert f"0 to measure, {len(items)} done" in logs[-3] or any(f"0 to measure, {len(items)} done" in x for x in logs)
    rows2 = _rows(tmp_path)
    assert [r for r in rows2 if r["item"] != "idle"] == measured  # nothing re-measured
    assert len([r for r in rows2 if r["item"] == "idle"]) == 2  # one idle reading per run


def test_idle_rows(tmp_path: Path, fast_worker: FakeNVML, plan: list[WorkItem]) -> None:
    items = _pick(plan, n_ops=1)[:2]
    run_worker(items, tmp_path, _cfg(idle_every_s=0.0), device="cpu", log=lambda m: None)
    rows = _rows(tmp_path)
    assert rows[0]["item"] == "idle" and rows[0]["repeat"] is True
    assert rows[0]["idle_power_w"] == pytest.approx(100.0, rel=0.3)
    assert rows[0]["tick_period_s"] == pytest.approx(0.02, rel=0.5)
    # with idle_every_s=0 the idle power is re-read before every row
    assert [r["item"] for r in rows] == ["idle", "idle", "network", "idle", "op"]
    assert all(r["idle_power_w"] == pytest.approx(100.0, rel=0.3) for r in rows if r["item"] == "idle")
    assert done_ids(tmp_path) == {w.id for w in items}  # idle rows are never "done" items


def test_repeat_rows_do_not_count_as_done(tmp_path: Path, fast_worker: FakeNVML, plan: list[WorkItem]) -> None:
    items = _pick(plan, n_ops=1)
    run_worker(items, tmp_path, _cfg(repeat_every=2), device="cpu", log=lambda m: None)
    reps = [r for r in _rows(tmp_path) if r["item"] != "idle" and r.get("repeat")]
    assert reps and all(r["id"].endswith(":rep") and r["status"] == "ok" for r in reps)
    assert done_ids(tmp_path) == {w.id for w in items}


def test_failed_rows_are_recorded_and_the_run_continues(tmp_path: Path, fast_worker: FakeNVML,
                                                        plan: list[WorkItem], monkeypatch: pytest.MonkeyPatch) -> None:
    good = _pick(plan, n_ops=1)
    ghost = WorkItem("op", "0123456789abcdef", "inference", "Conv2d", SET.key, [SET.key])
    relu = next(w for w in plan if w.item == "op" and w.kind == "ReLU" and w.mode == "inference")

    real_get = OperationSource.get

    class Exploding:
        instances, backward = 1, False

        def step(self) -> None:
            raise RuntimeError("kernel exploded")

    def get(self: OperationSource, set_key: str, mode: str, signature: str):
        op = real_get(self, set_key, mode, signature)
        if signature == relu.key:
            return SimpleNamespace(params=0, dtype="float32", materialize=lambda **kw: Exploding())
        return op

    monkeypatch.setattr(OperationSource, "get", get)
    items = [ghost, good[0], relu, *good[1:]]
    logs: list[str] = []
    summary = run_worker(items, tmp_path, _cfg(), device="cpu", log=logs.append)
    assert summary["failed"] == 2 and summary["ok"] == len(good)
    rows = {r["id"]: r for r in _rows(tmp_path) if r["item"] != "idle"}
    assert rows[ghost.id]["status"] == "failed"
    assert rows[ghost.id]["error"].startswith("LookupError: signature 0123456789abcdef not found in resnet18:b2:r32")
    assert rows[ghost.id]["op_signature"] == ghost.key and rows[ghost.id]["op_kind"] == "Conv2d"
    assert rows[relu.id]["status"] == "failed" and rows[relu.id]["error"] == "RuntimeError: kernel exploded"
    assert all(rows[w.id]["status"] == "ok" for w in good)
    assert any("failed" in m and ghost.id in m for m in logs)
    # failed rows count as done: a resumed run does not retry them
    again = run_worker(items, tmp_path, _cfg(), device="cpu", log=lambda m: None)
    assert again["ok"] == again["failed"] == 0


def test_too_many_consecutive_failures(tmp_path: Path, fast_worker: FakeNVML, plan: list[WorkItem]) -> None:
    ghosts = [WorkItem("op", f"{i:016x}", "inference", "Conv2d", SET.key) for i in range(5)]
    good = _pick(plan, n_ops=1)[1]
    # a success in between resets the count
    run_worker([ghosts[0], ghosts[1], good, ghosts[2], ghosts[3]], tmp_path / "a",
               _cfg(max_consecutive_failures=3), device="cpu", log=lambda m: None)
    with pytest.raises(TooManyFailures, match="3 consecutive failures; last: LookupError"):
        run_worker(ghosts, tmp_path / "b", _cfg(max_consecutive_failures=3), device="cpu", log=lambda m: None)
    rows = [r for r in _rows(tmp_path / "b") if r["item"] != "idle"]
    assert [r["id"] for r in rows] == [w.id for w in ghosts[:3]]
    assert all(r["status"] == "failed" for r in rows)


def test_time_budget_stops_early(tmp_path: Path, fast_worker: FakeNVML, plan: list[WorkItem]) -> None:
    logs: list[str] = []
    summary = run_worker(_pick(plan), tmp_path, _cfg(time_budget_s=0.0), device="cpu", log=logs.append)
    assert summary["ok"] == 0 and any("time budget reached after 0 rows" in m for m in logs)


def test_operation_source_finds_planned_signatures() -> None:
    src = OperationSource()
    ops = build_plan([SET], modes=("training",), networks=False)
    op = src.get(SET.key, "training", ops[0].key)
    assert op.signature == ops[0].key and op.mode == "training" and op.source is not None
    with pytest.raises(LookupError, match="extraction differs"):
        src.get(SET.key, "training", "f" * 16)


def test_auto_instances() -> None:
    cfg = CollectConfig(max_instances=4, l2_bytes=50 * 2**20, instance_budget_bytes=2 * 2**30)
    assert auto_instances(0, cfg) == 1
    assert auto_instances(1024, cfg) == 4  # tiny weights: capped by max_instances
    assert auto_instances(20 * 2**20, cfg) == 3  # ceil(50 / 20)
    assert auto_instances(100 * 2**20, cfg) == 1  # one copy already exceeds L2
    assert auto_instances(1536 * 2**20, CollectConfig(l2_bytes=4 * 2**30)) == 1  # memory budget


# -- counters: splitting ncu's kernel list at markers ------------------------------------------

def test_counter_segments_split_at_markers() -> None:
    pd = pytest.importorskip("pandas")
    from gpurec.collect.counters import segment

    df = pd.DataFrame({
        "kernel_name": ["spin_kernel", "gemm_a", "relu_b", "spin_kernel", "spin_kernel", "add_c"],
        "dram__bytes_read.sum": [1.0, 10.0, 20.0, 1.0, 1.0, 5.0],
        "dram__throughput.avg.pct_of_peak_sustained_elapsed": [1.0, 50.0, 60.0, 1.0, 1.0, 70.0],
        "sm__maximum_warps_per_active_cycle_pct": [68.75] * 6,  # a device attribute, not a counter
        "lts__t_sector_hit_rate.pct": [50.0] * 6,
    })
    order = [{"id": "op1", "status": "ok", "wall_s": 0.1}, {"id": "op2", "status": "ok"},
             {"id": "bad", "status": "failed"}, {"id": "op3", "status": "ok"}]
    rows = {r["id"]: r for r in segment(df, order)}
    assert rows["op1"]["kernels"] == 2 and rows["op1"]["dram__bytes_read.sum"] == 30.0
    for rate in ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__maximum_warps_per_active_cycle_pct",
                 "lts__t_sector_hit_rate.pct"):
        assert rate not in rows["op1"]  # rates and attributes are not summed over kernels
    assert rows["op1"]["kernel_names"] == "gemm_a;relu_b"
    assert rows["op2"]["kernels"] == 0  # a view: no kernel, still a row
    assert rows["op3"]["dram__bytes_read.sum"] == 5.0
    assert "bad" not in rows


def test_done_ids_skips_failed_rows_only_when_retrying(tmp_path: Path) -> None:
    with JsonlShard(tmp_path / "rows-0of1.jsonl") as shard:
        shard.append({"id": "op:a:inference", "status": "ok"})
        shard.append({"id": "op:b:inference", "status": "failed", "error": "CUDA out of memory"})
        shard.append({"id": "op:a:inference:rep", "status": "ok", "repeat": True})
    assert done_ids(tmp_path) == {"op:a:inference", "op:b:inference"}
    assert done_ids(tmp_path, retry_failed=True) == {"op:a:inference"}


def test_done_ids_count_gzip_seeds_and_skip_temporary_files(tmp_path: Path) -> None:
    """A collection seeded with datasets/<gpu>/raw (closed shards are gzip) must not measure them again."""
    import gzip

    with gzip.open(tmp_path / "seed-rows-r2c-0of2.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "op:a:inference", "status": "ok", "schema": 2}) + "\n")
    with JsonlShard(tmp_path / "rows-0of1.jsonl") as shard:
        shard.append({"id": "op:b:inference", "status": "ok", "schema": 2})
    (tmp_path / ".rows-0of1.jsonl.tmp123").write_text(json.dumps({"id": "op:c:inference"}) + "\n")
    assert done_ids(tmp_path, min_schema=2) == {"op:a:inference", "op:b:inference"}


def test_peak_items_are_measured_resumed_and_built_into_their_own_table(tmp_path: Path, fast_worker: FakeNVML) -> None:
    from gpurec.collect.plan import peak_items
    from gpurec.dataset.build import build_gpu_dataset
    from gpurec.device.graphs import CpuBackend

    class Peaks(CpuBackend):
        def peak_memory_bytes(self, fn):  # noqa: ANN001, ANN201
            fn()
            return 12345

    items = peak_items([SET])
    assert [w.id for w in items] == [f"peak:{SET.key}:inference", f"peak:{SET.key}:training"]
    raw = tmp_path / "h100" / "raw"
    raw.mkdir(parents=True)
    summary = run_worker(items, raw, _cfg(), device="cpu", log=lambda m: None, backend=Peaks())
    assert summary["ok"] == 2 and summary["failed"] == 0
    rows = [r for r in _rows(raw) if r["item"] == "peak"]
    assert {r["mode"] for r in rows} == {"inference", "training"}
    assert all(r["status"] == "ok" and r["peak_memory_bytes"] == 12345 for r in rows)
    assert done_ids(raw) == {w.id for w in items}
    counts = build_gpu_dataset(tmp_path / "h100")
    assert counts["peaks"] == 2 and counts["networks"] == 0 and counts["operations"] == 0


def test_network_rows_start_after_earlier_rows_garbage_is_freed(tmp_path: Path, fast_worker: FakeNVML,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit left in a reference cycle by an earlier row must not be allocated when the next
    network row starts: its peak would include it (sequence peaks carried gigabytes of that)."""
    import gc
    import weakref

    from gpurec.collect import runner
    from gpurec.collect.plan import peak_items
    from gpurec.device.graphs import CpuBackend

    live: weakref.WeakSet = weakref.WeakSet()
    built = runner.NetworkUnit.__init__

    def init_in_a_cycle(self, *a, **kw) -> None:  # noqa: ANN001, ANN002, ANN003
        built(self, *a, **kw)
        self.cycle = self  # freed only by the cyclic collector
        live.add(self)

    class Counting(CpuBackend):
        def allocated_bytes(self) -> int:
            return 1000 * len(live)

    monkeypatch.setattr(runner.NetworkUnit, "__init__", init_in_a_cycle)
    items = peak_items([SET])
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection: only the worker's own collection can free the cycle
    try:
        run_worker(items, tmp_path, _cfg(), device="cpu", log=lambda m: None, backend=Counting())
    finally:
        if was_enabled:
            gc.enable()
    rows = [r for r in _rows(tmp_path) if r["item"] == "peak"]
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)
    assert [r["memory_allocated_before_bytes"] for r in rows] == [0, 0]
    assert CpuBackend().allocated_bytes() is None  # the CPU has no device allocator


def test_network_peak_plan_has_one_peak_per_network_held_out_first(tmp_path: Path) -> None:
    import json

    from gpurec.tools.plan import network_peak_items

    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"items": [
        {"item": "network", "key": "resnet18:b8:r224", "mode": "training", "kind": "network",
         "set_key": "resnet18:b8:r224", "model_sets": []},
        {"item": "op", "key": "sig", "mode": "training", "kind": "Conv2d", "set_key": "resnet18:b8:r224"},
        {"item": "network", "key": "swin_s:b8:r224", "mode": "inference", "kind": "network",
         "set_key": "swin_s:b8:r224", "model_sets": [], "precision": "bf16-mixed"},
        {"item": "network", "key": "resnet18:b8:r224", "mode": "training", "kind": "network",
         "set_key": "resnet18:b8:r224", "model_sets": []}]}))
    items = network_peak_items([plan])
    assert [w.id for w in items] == ["peak:swin_s:b8:r224:inference:bf16-mixed", "peak:resnet18:b8:r224:training"]
    with pytest.raises(FileNotFoundError, match="no such plan"):
        network_peak_items([tmp_path / "missing.json"])
