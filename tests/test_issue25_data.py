"""Nothing lost, nothing bad let in: GPU-safe row identity, validated raw rows, tables written as a
set, file modes kept, and the orphaned temporary files of a killed write counted, never used."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import cli
from gpurec.collect.runner import done_ids
from gpurec.dataset.build import build_gpu_dataset
from gpurec.dataset.merge import merge_shards
from gpurec.dataset.store import JsonlShard, atomic_write_json, atomic_write_parquet, atomic_write_text

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"
RUN = "20260101T000000-0of1-abcdef"


def _row(i: int, gpu: str = H100, run: str = RUN, **kw: object) -> dict:
    row = {"id": f"op:{i:016x}:inference", "item": "op", "run_id": run, "gpu": gpu, "t_unix": 1000.0 + i,
           "status": "ok", "mode": "inference", "op_signature": f"{i:016x}", "op_kind": "Conv2d",
           "set_key": "resnet18:b8:r224", "model_sets": ["resnet18:b8:r224"], "time_ms": 1.0 + i,
           "power_w": 200.0, "energy_mj": 200.0 * (1.0 + i)}
    row.update(kw)
    return row


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with JsonlShard(path) as sh:
        for r in rows:
            sh.append(r)
    return path


def _write_raw_lines(path: Path, lines: list[str]) -> Path:
    """Lines as a hand-edited or foreign file could hold them (NaN, Infinity, strings)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


# -- file modes --------------------------------------------------------------------------------

@pytest.mark.parametrize("write", [
    lambda p: atomic_write_text(p, "x"),
    lambda p: atomic_write_json(p, {"a": 1}),
    lambda p: atomic_write_parquet(p, pd.DataFrame({"a": [1]})),
])
def test_atomic_writes_respect_the_umask_and_keep_an_existing_mode(tmp_path: Path, write) -> None:  # noqa: ANN001
    old = os.umask(0o022)
    try:
        target = tmp_path / "f.out"
        write(target)
        assert stat.S_IMODE(target.stat().st_mode) == 0o644  # not mkstemp's 0600
        os.chmod(target, 0o640)
        write(target)
        assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the replaced file's mode is kept
    finally:
        os.umask(old)


# -- row identity: (gpu, precision, id) ---------------------------------------------------------

def test_merging_a_second_gpu_into_a_directory_is_refused_and_keeps_the_first(tmp_path: Path) -> None:
    h200 = _write(tmp_path / "src200" / "rows-0of1.jsonl", [_row(i, gpu=H200, run="r200") for i in range(3)])
    h100 = _write(tmp_path / "src100" / "rows-0of1.jsonl", [_row(i, gpu=H100, run="r100") for i in range(4)])
    out = tmp_path / "X"
    assert merge_shards([h200.parent], out)["tables"]["operations"] == 3
    before = {p.name: p.read_bytes() for p in (out / "raw").iterdir()}
    with pytest.raises(ValueError, match=r"rows-0of1\.jsonl line 1: .*NVIDIA H100 80GB HBM3.*NVIDIA H200"):
        merge_shards([h100.parent], out)
    assert {p.name: p.read_bytes() for p in (out / "raw").iterdir()} == before  # nothing written
    assert set(pd.read_parquet(out / "operations.parquet")["gpu"]) == {H200}
    res = CliRunner().invoke(cli.app, ["dataset", "merge", str(h100.parent), "--out", str(out)])
    assert res.exit_code == 2 and "NVIDIA H200" in res.output


def test_a_shard_of_another_gpu_in_a_gpus_directory_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "h100"
    _write(d / "raw" / "rows-a.jsonl", [_row(i) for i in range(3)])
    _write(d / "raw" / "rows-b.jsonl", [_row(i, gpu=H200, run="r200") for i in range(2)])
    with pytest.raises(ValueError, match=r"rows-b\.jsonl line 1: .*'NVIDIA H200'.*'NVIDIA H100 80GB HBM3'"):
        build_gpu_dataset(d)
    assert not (d / "operations.parquet").exists()
    summary = build_gpu_dataset(d, skip_invalid=True)
    assert summary["operations"] == 3 and summary["invalid_rows_skipped"] == 2
    # a directory whose name is no catalog GPU holds the GPU of its first row
    other = tmp_path / "mixed"
    _write(other / "raw" / "rows-a.jsonl", [_row(0, gpu=H200, run="r200")])
    _write(other / "raw" / "rows-b.jsonl", [_row(1)])
    with pytest.raises(ValueError, match=r"rows-b\.jsonl line 1"):
        build_gpu_dataset(other)


def test_row_identity_includes_the_precision(tmp_path: Path) -> None:
    d = tmp_path / "h100"
    _write(d / "raw" / "rows-0.jsonl", [
        _row(1),                                   # written before precision was a column: fp32
        _row(1, precision="bf16", time_ms=0.5),    # the same id at another precision: another row
        _row(2, precision="fp32"),
        _row(2, t_unix=5000.0, time_ms=9.0),       # no precision == fp32: replaces the row above
    ])
    summary = build_gpu_dataset(d)
    ops = pd.read_parquet(d / "operations.parquet")
    assert summary["operations"] == 3 and summary["rows_superseded"] == 1
    got = sorted(zip(ops["id"], ops["precision"], ops["time_ms"], strict=True))
    assert got == [(_row(1)["id"], "bf16", 0.5), (_row(1)["id"], "fp32", 2.0), (_row(2)["id"], "fp32", 9.0)]


def test_the_same_rows_under_another_file_name_count_once(tmp_path: Path) -> None:
    d = tmp_path / "h100"
    rows = [{"id": f"idle:{RUN}:0", "item": "idle", "run_id": RUN, "repeat": True, "gpu": H100,
             "idle_power_w": 80.0, "t_s": 5.0},
            _row(1), _row(2), _row(1, id=_row(1)["id"] + ":rep", repeat=True, t_unix=3000.0)]
    shard = _write(d / "raw" / "rows-0of1.jsonl", rows)
    once = build_gpu_dataset(d)
    (d / "raw" / "rows-copy-0of1.jsonl").write_bytes(shard.read_bytes())
    twice = build_gpu_dataset(d)
    for table in ("operations", "repeats", "idle"):
        assert twice[table] == once[table], table
    assert twice["duplicate_rows_dropped"] == len(rows) and once["duplicate_rows_dropped"] == 0
    assert twice["rows_superseded"] == 0
    # merging the copy under another name adds nothing either
    out = tmp_path / "merged" / "h100"
    merge_shards([shard], out)
    res = merge_shards([d / "raw" / "rows-copy-0of1.jsonl"], out)
    assert res["tables"]["repeats"] == 1 and res["tables"]["idle"] == 1
    assert res["already_present_rows"] == len(rows)


# -- raw-row validation ------------------------------------------------------------------------

GOOD = json.dumps(_row(7))


def _bad(**kw: object) -> str:
    row = _row(2, **kw)
    for k, v in list(row.items()):
        if v is _DROP:
            del row[k]
    return json.dumps(row)


_DROP = object()


@pytest.mark.parametrize("line, reason", [
    (_bad(id=_DROP), "has no id"),
    (_bad(item=_DROP), "has no item"),
    (_bad(time_ms=math.nan), "time_ms is nan"),
    (_bad(time_ms=-1.0), "time_ms is -1.0"),
    (_bad(time_ms=0.0), "time_ms is 0.0"),
    (_bad(time_ms=None), "time_ms is None"),
    (_bad(energy_mj=math.inf), "energy_mj is inf"),
    (_bad(mode="trainnig"), "mode 'trainnig'"),
    (_bad(gpu=H200), "measured on 'NVIDIA H200'"),
    (_bad(gpu=_DROP), "names no GPU"),
    (_bad(item="network", id="network:resnet18:b8:r224:inference", time_ms="12.5"), "time_ms is '12.5', not a number"),
    (_bad(precision="bf61"), "precision 'bf61'"),
])
def test_an_invalid_raw_row_is_refused_with_file_and_line_or_counted(tmp_path: Path, line: str, reason: str) -> None:
    d = tmp_path / "h100"
    shard = _write_raw_lines(d / "raw" / "rows-0.jsonl", [json.dumps(_row(0)), json.dumps(_row(1)), line, GOOD])
    with pytest.raises(ValueError, match=rf"rows-0\.jsonl line 3: .*{reason}") as exc:
        build_gpu_dataset(d)
    assert "--skip-invalid-rows" in str(exc.value)
    assert not (d / "operations.parquet").exists()
    summary = build_gpu_dataset(d, skip_invalid=True)
    assert summary["invalid_rows_skipped"] == 1 and summary["operations"] + summary["networks"] == 3
    assert any(b.startswith(f"{shard} line 3: ") and reason in b for b in summary["bad_lines"])
    res = CliRunner().invoke(cli.app, ["dataset", "build", "--root", str(tmp_path)])
    assert res.exit_code == 2 and "rows-0.jsonl line 3" in res.output
    res = CliRunner().invoke(cli.app, ["dataset", "build", "--root", str(tmp_path), "--skip-invalid-rows"])
    assert res.exit_code == 0 and '"invalid_rows_skipped": 1' in res.output


def test_a_failed_row_needs_no_time(tmp_path: Path) -> None:
    d = tmp_path / "h100"
    _write_raw_lines(d / "raw" / "rows-0.jsonl", [
        json.dumps(_row(0, status="failed", time_ms=None, error="OOM")),
        json.dumps(_row(1, status="failed", time_ms=math.nan, energy_mj=math.nan, error="OOM"))])
    assert build_gpu_dataset(d)["operations"] == 2
    _write_raw_lines(d / "raw" / "rows-1.jsonl", [json.dumps(_row(2, status="failed", energy_mj=math.inf))])
    with pytest.raises(ValueError, match=r"rows-1\.jsonl line 1: .*energy_mj is inf"):
        build_gpu_dataset(d)


# -- tables written as one set -----------------------------------------------------------------

def test_a_failed_table_write_leaves_every_table_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "h100"
    _write(d / "raw" / "rows-0.jsonl", [_row(i) for i in range(3)])
    build_gpu_dataset(d)
    before = {p.name: p.read_bytes() for p in d.glob("*.parquet")}
    _write(d / "raw" / "rows-1.jsonl", [_row(i, run="r2") for i in range(10, 14)])
    real = pd.DataFrame.to_parquet
    calls = []

    def failing(self, path, *a, **kw):  # noqa: ANN001, ANN002, ANN003
        calls.append(path)
        if len(calls) == 3:
            raise OSError("No space left on device")
        return real(self, path, *a, **kw)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", failing)
    with pytest.raises((OSError, ValueError), match="No space left"):
        build_gpu_dataset(d)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in d.glob("*.parquet")} == before
    assert not [p.name for p in d.iterdir() if p.name.startswith(".")]
    assert build_gpu_dataset(d)["operations"] == 7


# -- dataset build finds the datasets the library loads -----------------------------------------

def test_dataset_build_respects_gpurec_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "data"
    _write(root / "h100" / "raw" / "rows-0.jsonl", [_row(i) for i in range(2)])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("GPUREC_DATASETS", str(root))
    res = CliRunner().invoke(cli.app, ["dataset", "build"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["h100"]["operations"] == 2
    assert (root / "h100" / "operations.parquet").exists()
    monkeypatch.setenv("GPUREC_DATASETS", str(elsewhere))  # no GPU directory there: not a silent {}
    res = CliRunner().invoke(cli.app, ["dataset", "build"])
    assert res.exit_code != 0 and "no GPU directory" in res.output


# -- temporary files of a killed write ----------------------------------------------------------

def test_an_orphaned_temporary_shard_is_never_done_and_never_silent(tmp_path: Path) -> None:
    raw = tmp_path / "h100" / "raw"
    _write(raw / "rows-0of1.jsonl", [_row(0)])
    orphan = _write(raw / ".rows-0of1.jsonl.k2j3.tmp.jsonl", [_row(0), _row(1), _row(2)])
    assert done_ids(raw) == {_row(0)["id"]}  # rows of an unfinished write were never committed
    summary = build_gpu_dataset(raw.parent)
    assert summary["operations"] == 1
    assert summary["orphaned_temp_files"] == {orphan.name: 3}
    assert any(orphan.name in b for b in summary["bad_lines"])


# -- collect: one run per output, no silent default plan -----------------------------------------

def _collect_opts(out: Path, **kw: object):  # noqa: ANN202
    from gpurec.collect.api import CollectOptions

    return CollectOptions(out=str(out), models=["resnet18"], batch_sizes=[2], resolutions=[32], modes=["inference"],
                          device="cpu", **kw)


def test_a_second_collect_on_the_same_output_is_refused_with_one_line(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    monkeypatch.setattr(cli, "_require_gpu", lambda *a, **k: None)  # the lock is what is under test, not the GPU check

    from gpurec.collect.api import collect

    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".collect.lock", "a") as held:  # what a running collect holds
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RuntimeError, match=r"in use by another gpurec collect"):
            collect(_collect_opts(out))
        res = CliRunner().invoke(cli.app, ["collect", "--out", str(out), "--models", "resnet18", "--batch-sizes", "2",
                                           "--resolutions", "32", "--modes", "inference"])
        assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1, res.output
        assert "in use by another gpurec collect" in res.output
    assert not list(out.glob("rows-*.jsonl")) and not list(out.glob("provenance-*.json"))


def test_the_output_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    from gpurec.collect.runner import CollectionInProgress, output_lock

    with output_lock(tmp_path):
        with pytest.raises(CollectionInProgress):
            with output_lock(tmp_path):
                pass
        with output_lock(tmp_path, ".lock-rows-0of2"):  # a worker's shard lock is another file
            pass
    with output_lock(tmp_path):  # released on exit
        pass


@pytest.mark.parametrize("extra", [{}, {"plan_only": True}, {"devices": [0]}])
def test_a_missing_plan_file_is_refused(tmp_path: Path, extra: dict) -> None:
    from gpurec.collect.api import collect

    typo = tmp_path / "typo.json"
    with pytest.raises(FileNotFoundError, match=r"--plan .*typo\.json does not exist"):
        collect(_collect_opts(tmp_path / "out", plan=str(typo), **extra))
    assert not typo.exists()
    res = CliRunner().invoke(cli.app, ["collect", "--out", str(tmp_path / "out"), "--plan", str(typo), "--plan-only"])
    assert res.exit_code != 0 and "does not exist" in res.output
