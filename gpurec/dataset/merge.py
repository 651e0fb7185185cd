"""Combine shards from several processes or hosts into one GPU dataset directory.

Shards are merged row by row, not file by file: a shard that grew since the last merge (the
runner appends to the same file across calls) and a partial copy already in the target both
end up with every row.  A row is identified by (gpu, precision, id, run_id, t_unix); the same
identity with other content is a conflict, reported and never overwritten, and a row the target
already holds in another file (a shard copied under another name) is not added again.  Every
source row must be of the target's GPU (ForeignGPUError, raised before anything is written).
Files are only ever replaced by rename, so an interrupted merge leaves each target file either
as it was or complete.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpurec.dataset.build import RawRow, build_gpu_dataset, directory_gpu, row_precision
from gpurec.dataset.store import (
    BadLine,
    atomic_write_bytes,
    raw_row_files,
    read_jsonl_lines,
    repair_torn_tail,
)

RowKey = tuple[Any, ...]


class ForeignGPUError(ValueError):
    """A source row was measured on another GPU than the one the target directory holds."""


def row_key(row: dict[str, Any]) -> RowKey:
    """A row's identity: the same work item can be measured again in another run or later in
    the same run (repeats), so the item id alone is not unique; ids of two GPUs or precisions
    can be the same."""
    return (row.get("gpu"), row_precision(row), row.get("id"), row.get("run_id"), row.get("t_unix"))


def _target_rows(raw: Path) -> list[RawRow]:
    return [RawRow(str(p), n, r) for p in sorted(raw.glob("rows-*.jsonl"))
            for n, _, r in read_jsonl_lines(p, allow_corrupt=True)]


def _check_gpu(out: Path, files: list[Path]) -> None:
    """Raise ForeignGPUError at the first source row of another GPU than ``out`` holds (the GPU its
    name resolves to, else its rows', else the first source row's)."""
    from gpurec.dataset.build import _canonical

    names: dict[str, str] = {}
    sources = [RawRow(str(f), n, r) for f in files if not f.name.startswith("provenance-")
               for n, _, r in read_jsonl_lines(f, allow_corrupt=True)]
    gpu, why = directory_gpu(out, _target_rows(out / "raw") or sources, names)
    if gpu is None:
        return
    for r in sources:
        have = r.row.get("gpu")
        if isinstance(have, str) and _canonical(names, have) != gpu:
            raise ForeignGPUError(f"{r.path} line {r.line_no}: row {r.row.get('id')} was measured on {have!r}, but "
                                  f"{out} holds {gpu!r} rows (from {why}); merge each GPU's shards into its own "
                                  "directory (e.g. datasets/<gpu>)")


def _lines(path: Path, bad: list[BadLine], allow_corrupt: bool) -> list[tuple[int, bytes, dict[str, Any]]]:
    return list(read_jsonl_lines(path, allow_corrupt=allow_corrupt, bad_lines=bad))


def _source_files(shards: Iterable[Path | str]) -> list[Path]:
    files: list[Path] = []
    for s in map(Path, shards):
        if s.is_dir():
            files += raw_row_files(s) + sorted(s.glob("provenance-*.json"))
        elif s.exists():
            files.append(s)
        else:
            raise FileNotFoundError(f"shard {s} does not exist")
    return files


def _merge_rows(src: Path, dest: Path, result: dict[str, Any], bad: list[BadLine], allow_corrupt: bool) -> None:
    src_lines = _lines(src, bad, allow_corrupt)
    elsewhere = {row_key(r.row): r.row for r in _target_rows(dest.parent) if Path(r.path).name != dest.name}
    fresh = []
    for n, raw, row in src_lines:
        key = row_key(row)
        if key not in elsewhere:
            fresh.append((n, raw, row))
        elif elsewhere[key] == row:
            result["already_present_rows"] += 1
        else:
            result["conflicts"].append({"file": dest.name, "source": str(src), "source_line": n,
                                        "id": key[2], "run_id": key[3], "t_unix": key[4]})
    src_lines = fresh
    if not dest.exists():
        if src_lines:
            atomic_write_bytes(dest, b"".join(raw for _, raw, _ in src_lines))
            result["copied"][dest.name] = len(src_lines)
        else:
            result["unchanged"].append(dest.name)
        return
    repaired = repair_torn_tail(dest)  # a target left torn by a crash: fragment kept in <name>.torn
    if repaired is not None:
        bad.append(repaired)
    have = {row_key(r): r for _, _, r in _lines(dest, bad, allow_corrupt)}
    new: list[bytes] = []
    for n, raw, row in src_lines:
        key = row_key(row)
        if key not in have:
            new.append(raw)
            have[key] = row
        elif have[key] != row:
            result["conflicts"].append({"file": dest.name, "source": str(src), "source_line": n,
                                        "id": key[2], "run_id": key[3], "t_unix": key[4]})
    if new:
        atomic_write_bytes(dest, dest.read_bytes() + b"".join(new))
        result["added_rows"][dest.name] = result["added_rows"].get(dest.name, 0) + len(new)
    else:
        result["unchanged"].append(dest.name)


def _merge_provenance(src: Path, dest: Path, result: dict[str, Any]) -> None:
    data = src.read_bytes()
    if not dest.exists():
        atomic_write_bytes(dest, data)
        result["copied"][dest.name] = 1
    elif dest.read_bytes() == data or _same_json(dest.read_bytes(), data):
        result["unchanged"].append(dest.name)
    else:
        result["conflicts"].append({"file": dest.name, "source": str(src), "source_line": None,
                                    "id": None, "run_id": None, "t_unix": None})


def _same_json(a: bytes, b: bytes) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


def merge_shards(shards: Iterable[Path | str], out: Path | str, *, allow_corrupt: bool = False,
                 skip_invalid: bool = False) -> dict[str, Any]:
    """Merge ``rows-*.jsonl`` / ``provenance-*.json`` from ``shards`` (files or directories) into
    ``out/raw`` row by row, then rebuild ``out``'s tables.

    Returns ``copied`` {new file: rows}, ``added_rows`` {existing file: rows appended},
    ``unchanged`` [files with nothing new], ``already_present_rows`` (source rows the target
    already holds in another file, not added again), ``conflicts`` [rows or provenance files whose
    content differs from what ``out`` already holds under the same identity; ``out`` keeps
    its version], ``bad_lines`` [torn or skipped lines] and ``tables`` (the build summary).
    Raises CorruptShardError on an unreadable line unless ``allow_corrupt``, and ForeignGPUError
    (before writing anything) when a source row is of another GPU than the target's.
    """
    out = Path(out)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    files = _source_files(shards)
    _check_gpu(out, files)
    result: dict[str, Any] = {"copied": {}, "added_rows": {}, "unchanged": [], "already_present_rows": 0,
                              "conflicts": []}
    bad: list[BadLine] = []
    for f in files:
        # A compressed source merges into a plain shard: merged shards are appended to.
        dest = raw / (f.name[:-3] if f.name.endswith(".jsonl.gz") else f.name)
        if f.resolve() == dest.resolve():
            result["unchanged"].append(dest.name)
        elif f.name.startswith("provenance-"):
            _merge_provenance(f, dest, result)
        else:
            _merge_rows(f, dest, result, bad, allow_corrupt)
    result["bad_lines"] = [b.describe() for b in bad]
    result["tables"] = build_gpu_dataset(out, allow_corrupt=allow_corrupt, skip_invalid=skip_invalid)
    return result
