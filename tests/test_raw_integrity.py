"""Raw shards are never dropped or kept partial silently: corrupt lines, torn tails and merges."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import cli
from gpurec.dataset.build import build_gpu_dataset
from gpurec.dataset.merge import merge_shards
from gpurec.dataset.store import CorruptShardError, JsonlShard, TornLineRepaired, read_jsonl, repair_torn_tail

ROOT = Path(__file__).resolve().parents[1]
RUN = "20260101T000000-0of1-abcdef"
GPU = "NVIDIA H100 80GB HBM3"
# Shipped shards are stored compressed; the test damages a plain copy of one.
SHIPPED_SHARD_GZ = ROOT / "datasets" / "h100" / "raw" / "rows-20261126-smoke-1of40.jsonl.gz"
SHIPPED_SHARD = Path(SHIPPED_SHARD_GZ.name[: -len(".gz")])


def _row(i: int, **kw: object) -> dict:
    row = {"id": f"op:{i:016x}:inference", "item": "op", "run_id": RUN, "gpu": GPU, "t_unix": 1000.0 + i,
           "status": "ok", "mode": "inference", "op_signature": f"{i:016x}", "op_kind": "Conv2d",
           "set_key": "resnet18:b8:r224", "model_sets": ["resnet18:b8:r224"], "time_ms": 1.0 + i, "power_w": 200.0,
           "energy_mj": 200.0 * (1.0 + i)}
    row.update(kw)
    return row


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with JsonlShard(path) as sh:
        for r in rows:
            sh.append(r)
    return path


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _damage(path: Path, line_no: int, text: bytes) -> None:
    """Replace line ``line_no`` (1-based) of a file with ``text``."""
    lines = path.read_bytes().split(b"\n")
    lines[line_no - 1] = text
    path.write_bytes(b"\n".join(lines))


@pytest.fixture
def gpu_dir(tmp_path: Path) -> Path:
    d = tmp_path / "datasets" / "h100"
    _write(d / "raw" / "rows-0of1.jsonl", [_row(i) for i in range(6)])
    return d


# -- reading: corrupt lines fail, torn tails are reported --------------------------------------

@pytest.mark.parametrize("damage, reason", [
    (b'{"id": "op:broken", "time_ms": 1.', "not valid JSON"),
    (b"\xff\xfe garbage", "not UTF-8"),
    (b"[1, 2, 3]", "a JSON list, not a row object"),
])
def test_a_corrupt_line_fails_the_build_naming_file_and_line(gpu_dir: Path, damage: bytes, reason: str) -> None:
    shard = gpu_dir / "raw" / "rows-0of1.jsonl"
    _damage(shard, 3, damage)
    with pytest.raises(CorruptShardError, match=rf"rows-0of1\.jsonl line 3: {reason}") as exc:
        build_gpu_dataset(gpu_dir)
    assert "--skip-corrupt-lines" in str(exc.value)
    assert not (gpu_dir / "operations.parquet").exists()
    summary = build_gpu_dataset(gpu_dir, allow_corrupt=True)
    assert summary["operations"] == 5 and summary["corrupt_lines_skipped"] == 1
    assert len(summary["bad_lines"]) == 1 and summary["bad_lines"][0].startswith(f"{shard}:3: corrupt: {reason}")


def test_torn_last_line_is_skipped_and_reported_not_fatal(gpu_dir: Path) -> None:
    shard = gpu_dir / "raw" / "rows-0of1.jsonl"
    with open(shard, "ab") as fh:
        fh.write(b'{"id": "op:half')
    bad: list = []
    assert len(list(read_jsonl(shard, bad_lines=bad))) == 6
    assert [(b.line_no, b.kind) for b in bad] == [(7, "torn_tail")]
    summary = build_gpu_dataset(gpu_dir)
    assert summary["operations"] == 6 and summary["torn_last_lines"] == 1 and summary["corrupt_lines_skipped"] == 0
    # the same bytes with a newline after them are no longer a crash's signature: corrupt
    with open(shard, "ab") as fh:
        fh.write(b"\n")
    with pytest.raises(CorruptShardError, match="line 7"):
        build_gpu_dataset(gpu_dir)


def test_resume_moves_a_torn_fragment_aside_and_reports_it(gpu_dir: Path) -> None:
    shard = gpu_dir / "raw" / "rows-0of1.jsonl"
    with open(shard, "ab") as fh:
        fh.write(b'{"id": "op:half", "time_')
    heard = []
    with JsonlShard(shard, on_repair=heard.append) as sh:
        sh.append(_row(6))
    assert sh.repaired is not None and heard == [sh.repaired]
    assert sh.repaired.line_no == 7 and sh.repaired.kind == "torn_tail" and "rows-0of1.jsonl.torn" in sh.repaired.reason
    assert (gpu_dir / "raw" / "rows-0of1.jsonl.torn").read_bytes() == b'{"id": "op:half", "time_\n'
    assert [json.loads(line)["id"] for line in _lines(shard)] == [_row(i)["id"] for i in range(7)]
    summary = build_gpu_dataset(gpu_dir)  # the shard is clean again; the fragment is still counted
    assert summary["operations"] == 7 and summary["torn_last_lines"] == 0
    assert summary["torn_fragments_kept_aside"] == 1 and "1 torn fragment(s) kept aside" in summary["bad_lines"][0]


def test_resume_without_a_listener_warns(gpu_dir: Path) -> None:
    shard = gpu_dir / "raw" / "rows-0of1.jsonl"
    with open(shard, "ab") as fh:
        fh.write(b'{"id": "op:half"')
    with pytest.warns(TornLineRepaired, match=r"rows-0of1\.jsonl:7: torn_tail"), JsonlShard(shard) as sh:
        sh.append(_row(6))
    assert len(list(read_jsonl(shard))) == 7


def test_repair_keeps_a_complete_row_that_lost_only_its_newline(tmp_path: Path) -> None:
    p = _write(tmp_path / "rows-0.jsonl", [_row(0)])
    p.write_bytes(p.read_bytes() + json.dumps(_row(1)).encode())
    assert repair_torn_tail(p) is None
    assert p.read_bytes().endswith(b"}\n") and len(list(read_jsonl(p))) == 2
    assert not (tmp_path / "rows-0.jsonl.torn").exists()
    assert repair_torn_tail(p) is None and repair_torn_tail(tmp_path / "missing.jsonl") is None


def test_cli_build_on_a_damaged_copy_of_shipped_data(tmp_path: Path) -> None:
    """The issue's case: a damaged line in a copy of real raw data fails the build or is counted."""
    raw = tmp_path / "h100" / "raw"
    raw.mkdir(parents=True)
    (raw / SHIPPED_SHARD.name).write_bytes(gzip.decompress(SHIPPED_SHARD_GZ.read_bytes()))
    n_rows = len(_lines(raw / SHIPPED_SHARD.name))
    res = CliRunner().invoke(cli.app, ["dataset", "build", "--root", str(tmp_path)])
    assert res.exit_code == 0, res.output
    clean = json.loads(res.stdout)["h100"]
    assert clean["corrupt_lines_skipped"] == 0 and clean["bad_lines"] == []
    assert sum(clean[t] for t in ("operations", "networks", "repeats", "idle")) == n_rows
    shard = raw / SHIPPED_SHARD.name
    _damage(shard, 40, _lines(shard)[39][:-25].encode())
    res = CliRunner().invoke(cli.app, ["dataset", "build", "--root", str(tmp_path)])
    assert res.exit_code != 0
    assert f"{SHIPPED_SHARD.name} line 40: not valid JSON" in res.stderr
    res = CliRunner().invoke(cli.app, ["dataset", "build", "--root", str(tmp_path), "--skip-corrupt-lines"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)["h100"]
    assert out["corrupt_lines_skipped"] == 1
    assert sum(out[t] for t in ("operations", "networks", "repeats", "idle")) == n_rows - 1
    assert f"{SHIPPED_SHARD.name}:40: corrupt" in res.stderr


# -- merging -----------------------------------------------------------------------------------

def test_merge_completes_a_partial_copy_in_the_target(tmp_path: Path) -> None:
    src = _write(tmp_path / "run" / "rows-0of1.jsonl", [_row(i) for i in range(20)])
    out = tmp_path / "datasets" / "h100"
    (out / "raw").mkdir(parents=True)
    dest = out / "raw" / src.name
    dest.write_text("\n".join(_lines(src)[:7]) + "\n")  # an earlier copy that stopped part way
    result = merge_shards([src.parent], out)
    assert result["added_rows"] == {src.name: 13} and result["conflicts"] == [] and result["copied"] == {}
    assert dest.read_bytes() == src.read_bytes()
    assert result["tables"]["operations"] == 20


def test_merge_picks_up_rows_of_a_shard_that_grew(tmp_path: Path) -> None:
    src = _write(tmp_path / "run" / "rows-0of1.jsonl", [_row(i) for i in range(5)])
    out = tmp_path / "datasets" / "h100"
    first = merge_shards([src], out)
    assert first["copied"] == {src.name: 5} and first["tables"]["operations"] == 5
    _write(src, [_row(i) for i in range(5, 9)])  # the runner appended in a later call
    second = merge_shards([src], out)
    assert second["added_rows"] == {src.name: 4} and second["tables"]["operations"] == 9
    assert (out / "raw" / src.name).read_bytes() == src.read_bytes()
    before = (out / "raw" / src.name).stat().st_mtime_ns
    third = merge_shards([src], out)
    assert third["unchanged"] == [src.name] and third["added_rows"] == {}
    assert (out / "raw" / src.name).stat().st_mtime_ns == before


def test_merge_reports_conflicts_and_keeps_the_target(tmp_path: Path) -> None:
    src = _write(tmp_path / "run" / "rows-0of1.jsonl", [_row(i) for i in range(4)])
    prov = tmp_path / "run" / f"provenance-{RUN}.json"
    prov.write_text(json.dumps({"run_id": RUN, "torch": "2.11"}))
    out = tmp_path / "datasets" / "h100"
    merge_shards([src.parent], out)
    dest = out / "raw" / src.name
    edited = [json.loads(line) for line in _lines(dest)]
    edited[2]["time_ms"] = 99.0  # same identity, other content
    dest.write_text("".join(json.dumps(r) + "\n" for r in edited))
    (out / "raw" / prov.name).write_text(json.dumps({"run_id": RUN, "torch": "2.99"}))
    _write(src, [_row(4)])
    result = merge_shards([src.parent], out)
    assert result["added_rows"] == {src.name: 1}
    assert [(c["file"], c["source_line"], c["id"]) for c in result["conflicts"]] == [
        (src.name, 3, _row(2)["id"]), (prov.name, None, None)]
    ops = pd.read_parquet(out / "operations.parquet").set_index("id")
    assert ops.loc[_row(2)["id"], "time_ms"] == 99.0 and len(ops) == 5
    res = CliRunner().invoke(cli.app, ["dataset", "merge", str(src.parent), "--out", str(out)])
    assert res.exit_code == 1 and "2 row(s) or file(s) differ" in res.stderr
    assert len(json.loads(res.stdout)["conflicts"]) == 2


def test_merge_is_atomic_when_a_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _write(tmp_path / "run" / "rows-0of1.jsonl", [_row(i) for i in range(3)])
    out = tmp_path / "datasets" / "h100"
    merge_shards([src], out)
    dest = out / "raw" / src.name
    before = dest.read_bytes()
    _write(src, [_row(3), _row(4)])

    def broken_replace(a: object, b: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        merge_shards([src], out)
    monkeypatch.undo()
    assert dest.read_bytes() == before
    assert [p.name for p in (out / "raw").iterdir()] == [src.name]  # no temporary file left behind
    assert merge_shards([src], out)["added_rows"] == {src.name: 2}


def test_merge_skips_a_torn_source_tail_and_repairs_a_torn_target(tmp_path: Path) -> None:
    src = _write(tmp_path / "run" / "rows-0of1.jsonl", [_row(i) for i in range(3)])
    with open(src, "ab") as fh:
        fh.write(b'{"id": "op:in_flight')  # copied while the runner was writing
    out = tmp_path / "datasets" / "h100"
    result = merge_shards([src], out)
    dest = out / "raw" / src.name
    assert result["copied"] == {src.name: 3} and len(_lines(dest)) == 3
    assert result["bad_lines"] == [f"{src}:4: torn_tail: unfinished last line (a crash while writing)"]
    with open(dest, "ab") as fh:
        fh.write(b'{"id": "op:torn_in_target')
    src.write_bytes(b"".join(line.encode() + b"\n" for line in _lines(src)[:3]))
    _write(src, [_row(3)])
    result = merge_shards([src], out)
    assert result["added_rows"] == {src.name: 1} and len(_lines(dest)) == 4
    assert (out / "raw" / f"{src.name}.torn").read_text() == '{"id": "op:torn_in_target\n'
    assert result["tables"]["torn_fragments_kept_aside"] == 1


def test_merge_refuses_a_corrupt_source_unless_allowed(tmp_path: Path) -> None:
    src = _write(tmp_path / "run" / "rows-0of1.jsonl", [_row(i) for i in range(3)])
    _damage(src, 2, b"{oops}")
    out = tmp_path / "datasets" / "h100"
    with pytest.raises(CorruptShardError, match="line 2"):
        merge_shards([src], out)
    assert not (out / "raw" / src.name).exists()
    result = merge_shards([src], out, allow_corrupt=True)
    assert result["copied"] == {src.name: 2} and result["tables"]["operations"] == 2
    assert "corrupt" in result["bad_lines"][0]
