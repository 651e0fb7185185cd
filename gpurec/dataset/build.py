"""Merge raw JSON-lines shards into the shipped Parquet tables (raw files are kept).

Layout per GPU (``datasets/<tag>/``):
  raw/rows-*.jsonl, raw/provenance-*.json   as measured (never rewritten)
  operations.parquet                        one row per measured (operation, mode)
  networks.parquet                          one row per measured (model-input set, mode)
  in_network.parquet                        per (network row, position): kernel and host time of
                                            each operation inside the real step
  peaks.parquet                             per (model-input set, mode): the step's peak device memory
  repeats.parquet                           re-measurements (repeatability)
  idle.parquet                              idle power readings

Rows measured by the host-free method (``schema`` 2: ``gpu_time_ms``, ``gpu_power_w``,
``gpu_energy_mj``, ``host_ms``, ``captured``) take precedence over eager-only rows (schema 1)
of the same (operation, mode); the eager-only row's figures stay beside them as ``v1_*``
columns, and every raw line stays in ``raw/``.

An unreadable raw line fails the build (CorruptShardError names file and line) unless
``allow_corrupt`` is passed; either way nothing is left out without being counted in the
summary the build returns.
Every raw row is checked before anything is written (``validate_rows``): a row with no id, item
or GPU, an unknown item, mode or precision, a unit field (``*_ms``, ``*_mj``, ``*_w``, ...) that
is not a finite number, an ok row without a positive ``time_ms``, or a row of another GPU than
the directory's fails the build (InvalidRowsError names file and line) unless ``skip_invalid``
(then each is left out and counted).  A row's identity is (gpu, precision, id) (rows without a
``precision`` are "fp32"); the same row found twice (e.g. one shard copied under another name)
is kept once and counted, and a row replaced by a later or better measurement of the same
identity is counted too.  A GPU's tables are written as one set: every table to a temporary
file first, then all renamed, so a failure leaves the previous tables in place.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpurec.dataset.store import (
    BadLine,
    atomic_write_set,
    count_torn_fragments,
    orphaned_temp_files,
    raw_row_files,
    read_jsonl_lines,
)
from gpurec.ops.precision import DEFAULT_PRECISION, PRECISIONS, precision_or_default

ITEMS = ("op", "network", "peak", "idle")
MODES = ("inference", "training")
STATUSES = ("ok", "failed")
UNIT_SUFFIXES = ("_ms", "_mj", "_w", "_mhz", "_s", "_c")  # fields that must be finite numbers
IDENTITY = ("gpu", "_precision", "id")  # a row's identity in the tables (see row_identity)
TABLES = ("operations", "networks", "in_network", "repeats", "idle")
SKIP_HINT = ("Raw rows are kept as measured: fix or remove the file that holds it, or pass --skip-invalid-rows "
             "(skip_invalid=True) to leave such rows out and count them")


class InvalidRowsError(ValueError):
    """Raw rows that would put a wrong number (or another GPU's row) in a table."""

    def __init__(self, problems: list[RowProblem]):
        self.problems = problems
        more = f" (and {len(problems) - 1} more invalid row(s))" if len(problems) > 1 else ""
        super().__init__(f"{problems[0].describe()}{more}. {SKIP_HINT}")


class TableWriteError(ValueError):
    """A table could not be written; no table of the directory was changed."""


@dataclass(frozen=True)
class RowProblem:
    """Why one raw row cannot enter a table."""

    path: str
    line_no: int
    reason: str

    def describe(self) -> str:
        return f"{self.path} line {self.line_no}: {self.reason}"


@dataclass
class RawRow:
    path: str
    line_no: int
    row: dict[str, Any]


def row_precision(row: dict[str, Any]) -> str:
    """A row's precision; rows written before precision was recorded are "fp32"."""
    return precision_or_default(row.get("precision"))


def _canonical(names: dict[str, str], gpu: str) -> str:
    """A GPU name in the catalog's spelling (names the catalog lacks stay as they are)."""
    if gpu not in names:
        from gpurec.catalog import UnknownGPU, canonical_name

        try:
            names[gpu] = canonical_name(gpu)
        except UnknownGPU:
            names[gpu] = gpu
    return names[gpu]


def directory_gpu(gpu_dir: Path, rows: list[RawRow], names: dict[str, str] | None = None) -> tuple[str | None, str]:
    """(the GPU a directory holds, why): the catalog GPU its name resolves to (``h100``), else the
    GPU of its first row in file order."""
    from gpurec.catalog import UnknownGPU, canonical_name

    names = {} if names is None else names
    try:
        return canonical_name(gpu_dir.name), f"the directory name {gpu_dir.name!r}"
    except UnknownGPU:
        pass
    for r in rows:
        gpu = r.row.get("gpu")
        if isinstance(gpu, str) and gpu:
            return _canonical(names, gpu), f"its first row ({r.path} line {r.line_no})"
    return None, "no row names one"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def row_problem(row: dict[str, Any], gpu: str | None, gpu_why: str, names: dict[str, str]) -> str | None:
    """Why a raw row cannot enter a table, or None when it can."""
    rid, item = row.get("id"), row.get("item")
    if not isinstance(rid, str) or not rid:
        return "the row has no id"
    if item is None:
        return f"row {rid} has no item"
    if item not in ITEMS:
        return f"row {rid}: item {item!r} is not one of {', '.join(ITEMS)}"
    row_gpu = row.get("gpu")
    if not isinstance(row_gpu, str) or not row_gpu:
        return f"row {rid} names no GPU"
    if gpu is not None and _canonical(names, row_gpu) != gpu:
        return (f"row {rid} was measured on {row_gpu!r}, but this directory holds {gpu!r} rows (from {gpu_why}); "
                "a GPU's rows belong in its own directory")
    if "precision" in row and row["precision"] is not None and row["precision"] not in PRECISIONS:
        return f"row {rid}: precision {row['precision']!r} is not one of {', '.join(PRECISIONS)}"
    failed = row.get("status") == "failed"
    for k, v in row.items():
        if k.endswith(UNIT_SUFFIXES) and v is not None:
            if not _is_number(v):
                return f"row {rid}: {k} is {v!r}, not a number"
            if not math.isfinite(v) and not (failed and math.isnan(v)):  # a failed row's NaN: not measured
                return f"row {rid}: {k} is {v} (not a finite number)"
    if item == "idle":
        return None
    if row.get("mode") not in MODES:
        return f"row {rid}: mode {row.get('mode')!r} is not one of {', '.join(MODES)}"
    status = row.get("status", "ok")
    if status not in STATUSES:
        return f"row {rid}: status {status!r} is not one of {', '.join(STATUSES)}"
    if item == "peak":  # a peak-memory row measures memory, not time
        b = row.get("peak_memory_bytes")
        if status == "ok" and not (b is None or (_is_number(b) and b > 0)):
            return f"row {rid}: peak_memory_bytes is {b!r}; a measured (ok) peak needs a positive byte count"
        return None
    t = row.get("time_ms")
    if status == "ok" and not (_is_number(t) and t > 0):
        return f"row {rid}: time_ms is {t!r}; a measured (ok) row needs a positive time"
    return None


def _full_key(row: dict[str, Any], names: dict[str, str]) -> tuple[Any, ...]:
    """One measurement's identity: the same row copied into two files has the same key."""
    return (_canonical(names, str(row.get("gpu"))), row_precision(row), row.get("id"), row.get("run_id"),
            row.get("t_unix"), row.get("t_s"))


def validate_rows(gpu_dir: Path, rows: list[RawRow], skip_invalid: bool = False
                  ) -> tuple[list[RawRow], dict[str, Any]]:
    """(the rows that may enter the tables, what was left out and why).

    Raises InvalidRowsError on the first invalid row unless ``skip_invalid``; the same row found
    twice is kept once (counted as ``duplicate_rows_dropped``), and the same identity with other
    content is invalid."""
    names: dict[str, str] = {}
    gpu, why = directory_gpu(gpu_dir, rows, names)
    problems: list[RowProblem] = []
    kept: list[RawRow] = []
    seen: dict[tuple[Any, ...], RawRow] = {}
    duplicates: list[str] = []
    for r in rows:
        reason = row_problem(r.row, gpu, why, names)
        if reason is None:
            key = _full_key(r.row, names)
            first = seen.get(key)
            if first is None:
                seen[key] = r
                kept.append(r)
                continue
            if first.row == r.row:
                duplicates.append(f"{r.path} line {r.line_no}: the same row as {first.path} line {first.line_no}")
                continue
            reason = f"row {r.row['id']} has the identity of {first.path} line {first.line_no} with other content"
        problems.append(RowProblem(r.path, r.line_no, reason))
        if not skip_invalid:
            raise InvalidRowsError(problems)
    return kept, {"gpu": gpu, "invalid_rows_skipped": len(problems),
                  "invalid_rows": [p.describe() for p in problems],
                  "duplicate_rows_dropped": len(duplicates), "duplicate_rows": duplicates}


def _provenance(raw: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted(raw.glob("provenance-*.json")):
        d = json.loads(p.read_text())
        out[d.get("run_id", p.stem.replace("provenance-", ""))] = d
    return out


def _damage_summary(raw: Path, bad: list[BadLine]) -> dict[str, Any]:
    """What the build could not read: skipped corrupt lines, torn last lines of shards still being
    written, torn fragments that an earlier resume moved aside into ``*.torn`` files, and the
    temporary files of interrupted writes (never read: their rows are in the file they were to
    replace, or in the source a merge was copying from)."""
    torn_kept = count_torn_fragments(raw)
    orphans = orphaned_temp_files(raw)
    return {"corrupt_lines_skipped": sum(b.kind == "corrupt" for b in bad),
            "torn_last_lines": sum(b.kind == "torn_tail" for b in bad),
            "torn_fragments_kept_aside": sum(torn_kept.values()),
            "orphaned_temp_files": orphans,
            "bad_lines": [b.describe() for b in bad]
            + [f"{raw / name}: {n} torn fragment(s) kept aside" for name, n in torn_kept.items()]
            + [f"{raw / name}: temporary file of an interrupted write ({n} line(s)), not read; run the merge "
               "again to add rows it was copying, then delete it" for name, n in orphans.items()]}


def build_gpu_dataset(gpu_dir: Path | str, *, allow_corrupt: bool = False, skip_invalid: bool = False
                      ) -> dict[str, Any]:
    """(Re)build the Parquet tables of one GPU directory from its raw shards.

    Returns the row count of each table written, what could not be read (see
    ``_damage_summary``), what was left out (``validate_rows``) and ``rows_superseded`` (rows
    replaced by another measurement of the same identity).  Raises CorruptShardError at the first
    unreadable line that is not a torn last line, unless ``allow_corrupt``; InvalidRowsError at
    the first invalid row, unless ``skip_invalid``.
    """
    import pandas as pd

    gpu_dir = Path(gpu_dir)
    raw = gpu_dir / "raw"
    raw_rows: list[RawRow] = []
    bad: list[BadLine] = []
    for p in raw_row_files(raw):
        for line_no, _, r in read_jsonl_lines(p, allow_corrupt=allow_corrupt, bad_lines=bad):
            raw_rows.append(RawRow(p, line_no, r))
    damage = _damage_summary(raw, bad)
    kept, left_out = validate_rows(gpu_dir, raw_rows, skip_invalid)
    damage.update({k: v for k, v in left_out.items() if k.endswith(("_skipped", "_dropped"))})
    damage["bad_lines"] += left_out["invalid_rows"] + left_out["duplicate_rows"]
    rows = []
    for r in kept:
        r.row["source_file"] = Path(r.path).name
        rows.append(r.row)
    prov = _provenance(raw)
    df = pd.DataFrame(rows)
    if df.empty:
        return {**damage, "rows_superseded": 0}
    for col, key in (("driver", ("gpu", "driver_version")), ("torch", ("torch",)), ("host_cpu", ("host_cpu",)),
                     ("cuda_runtime", ("cuda_runtime",)), ("date", ("date",)),
                     ("cudnn_allow_tf32", ("cudnn_allow_tf32",)), ("cuda_matmul_allow_tf32", ("cuda_matmul_allow_tf32",))):
        def look(run_id: Any, key: tuple[str, ...] = key) -> Any:
            d: Any = prov.get(run_id, {})
            for k in key:
                d = d.get(k, {}) if isinstance(d, dict) else {}
            return d if d != {} else None

        df[col] = df["run_id"].map(look)
    if "model_sets" in df:  # absent when a shard holds only idle readings so far
        df["model_sets"] = df["model_sets"].map(lambda v: json.dumps(v) if isinstance(v, list) else v)
    if "precision" in df:
        df["precision"] = df["precision"].map(precision_or_default)
    df["_precision"] = df["precision"] if "precision" in df else DEFAULT_PRECISION
    is_repeat = df.get("repeat", pd.Series(False, index=df.index)).fillna(False).astype(bool)
    idle = df[df["item"] == "idle"]
    # A row measured twice (e.g. re-run after a failure) keeps its latest successful value.
    # (ok rows sort after failed ones, so a later failure never replaces a success)
    if "schema" not in df:
        df["schema"] = 1
    df["schema"] = df["schema"].fillna(1).astype(int)
    main = df[~is_repeat & (df["item"] != "idle")]
    v1 = _v1_columns(main, pd)
    superseded = 0
    if len(main):
        ok_last = main["status"].eq("ok") if "status" in main else pd.Series(True, index=main.index)
        before = len(main)
        main = (main.assign(_ok=ok_last).sort_values(["_ok", "schema", "t_unix"], kind="stable")
                .drop_duplicates(list(IDENTITY), keep="last").drop(columns="_ok"))
        superseded = before - len(main)
        if v1 is not None:
            main = main.merge(v1, on=list(IDENTITY), how="left")
    nets = main[main["item"] == "network"]
    in_network = _in_network_table(nets, pd)
    if "in_network" in nets:
        nets = nets.drop(columns="in_network")
    parts = {"operations": main[main["item"] == "op"], "networks": nets, "peaks": main[main["item"] == "peak"],
             "in_network": in_network,
             "repeats": df[is_repeat & (df["item"] != "idle")], "idle": idle}
    counts: dict[str, Any] = {}
    writes = {}
    for name, part in parts.items():
        part = part.drop(columns=[c for c in ("in_network", "_precision") if c in part])
        part = part.dropna(axis=1, how="all")
        writes[gpu_dir / f"{name}.parquet"] = _parquet_writer(name, part)
        counts[name] = int(len(part))
    try:
        atomic_write_set(writes)
    except TableWriteError:
        raise
    except Exception as exc:
        raise TableWriteError(f"{gpu_dir}: the tables could not be written ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}); no table was changed") from exc
    return {**counts, **damage, "rows_superseded": superseded}


def _parquet_writer(name: str, part: Any) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        try:
            part.to_parquet(tmp, index=False)
        except Exception as exc:
            raise TableWriteError(f"{name}.parquet could not be written ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}); no table was changed") from exc
    return write


V1_COLUMNS = ("time_ms", "energy_mj", "power_w", "dynamic_energy_mj", "time_iqr_ms")


def _v1_columns(main: Any, pd: Any) -> Any:
    """The latest successful eager-only (schema 1) figures of each id, as ``v1_*`` columns."""
    old = main[(main["schema"] == 1) & (main.get("status", "ok") == "ok")] if len(main) else main
    if not len(old) or not (main["schema"] >= 2).any():
        return None
    cols = [c for c in V1_COLUMNS if c in old]
    old = old.sort_values("t_unix", kind="stable").drop_duplicates(list(IDENTITY), keep="last")
    return old[[*IDENTITY, *cols]].rename(columns={c: f"v1_{c}" for c in cols})


IN_NETWORK_KEYS = ("gpu", "gpu_uuid", "precision", "set_key", "mode", "run_id", "id")


def _in_network_table(nets: Any, pd: Any) -> Any:
    """One row per (network row, position) from the network rows' column-wise ``in_network``."""
    if "in_network" not in nets:
        return pd.DataFrame()
    frames = []
    for _, r in nets.iterrows():
        cols = r["in_network"]
        if not isinstance(cols, dict) or not cols:
            continue
        f = pd.DataFrame(cols)
        for k in IN_NETWORK_KEYS:
            if k in r:
                f[k] = r[k]
        frames.append(f.rename(columns={"id": "network_id"}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def build_all(root: Path | str | None = None, *, allow_corrupt: bool = False, skip_invalid: bool = False
              ) -> dict[str, dict[str, Any]]:
    """Rebuild every ``<root>/<gpu>/`` that has a ``raw/`` directory; {gpu dir: build summary}.

    ``root`` defaults to the datasets the library loads ($GPUREC_DATASETS, else ``datasets/``
    of the checkout).  A root without any ``<gpu>/raw`` raises FileNotFoundError: building
    nothing must not look like success."""
    from gpurec.dataset.load import DATASET_DIR_ENV, default_root

    root = Path(root) if root is not None else default_root()
    dirs = sorted(p.parent for p in root.glob("*/raw") if p.is_dir())
    if not dirs:
        raise FileNotFoundError(f"no GPU directory with a raw/ folder under {root.resolve()}; pass the dataset root "
                                f"(--root) or set ${DATASET_DIR_ENV}")
    return {d.name: build_gpu_dataset(d, allow_corrupt=allow_corrupt, skip_invalid=skip_invalid) for d in dirs}
