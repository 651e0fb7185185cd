"""Append-only JSON-lines shards: every row is durable the moment it is written.

A row is one ``write()`` of a complete line followed by flush + fsync, so ``kill -9`` loses
at most the row in flight.  That torn last line is the only damage a crash can leave: on
resume the fragment is moved to ``<shard>.torn`` beside the shard (kept, and reported) and the
shard is cut back to its last complete row.  A reader skips a torn last line and reports it;
any other unreadable line raises CorruptShardError naming file and line, unless the caller
explicitly allows corrupt lines (then each one is reported).  Whole files (Parquet, JSON
reports) are written to a temporary name and renamed, which is atomic on POSIX.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
TORN_SUFFIX = ".torn"  # <shard>.torn: fragments of torn last lines, moved aside on resume


class TornLineRepaired(UserWarning):
    """A shard's torn last line was moved aside to ``<shard>.torn`` before appending to it."""


class CorruptShardError(ValueError):
    """A raw shard holds an unreadable line that a crash cannot explain (not a torn last line)."""

    def __init__(self, bad: BadLine):
        self.bad = bad
        super().__init__(
            f"{bad.path} line {bad.line_no}: {bad.reason} ({bad.text!r}). Raw rows are kept as measured, so find "
            "what damaged the file and restore it from its source, or pass --skip-corrupt-lines "
            "(allow_corrupt=True) to leave such lines out and report how many")


@dataclass(frozen=True)
class BadLine:
    """One line of a shard that is not a row: ``kind`` is 'torn_tail' (a crash's unfinished last
    line) or 'corrupt' (anything else)."""

    path: str
    line_no: int
    kind: str
    reason: str
    text: str  # the start of the line, for the report

    def describe(self) -> str:
        return f"{self.path}:{self.line_no}: {self.kind}: {self.reason}"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_safe(value: Any) -> Any:
    """Strict-JSON form of reports and manifests: NaN/inf and pandas' NA -> None, numpy arrays and
    scalars -> Python, tuples -> lists, paths -> str, dict keys -> str (so a written file is valid
    JSON that any reader accepts)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays and scalars
        return json_safe(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if type(value).__name__ in ("NAType", "NaTType"):
        return None
    return value


class JsonlShard:
    """One worker's output file."""

    def __init__(self, path: Path | str, on_repair: Callable[[BadLine], None] | None = None):
        """``on_repair`` hears about a torn last line moved aside before the first append (also
        kept in ``self.repaired``); without it, the repair is reported as a TornLineRepaired warning."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = None
        self.on_repair = on_repair
        self.repaired: BadLine | None = None

    def append(self, row: dict[str, Any]) -> None:
        line = json.dumps({k: _clean(v) for k, v in row.items()}, separators=(",", ":"), default=str) + "\n"
        if self._fh is None:
            self.repaired = repair_torn_tail(self.path)
            if self.repaired is not None:
                if self.on_repair is not None:
                    self.on_repair(self.repaired)
                else:
                    warnings.warn(f"repaired {self.repaired.describe()}", TornLineRepaired, stacklevel=2)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for speed
        self._fh.write(line)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> JsonlShard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _excerpt(raw: bytes) -> str:
    return raw[:120].decode("utf-8", errors="replace").rstrip("\r\n")


def _parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """(row, '') or (None, why the line is not a row)."""
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not a row object"
    return row, ""


def read_jsonl(path: Path | str, *, allow_corrupt: bool = False,
               bad_lines: list[BadLine] | None = None) -> Iterator[dict[str, Any]]:
    """Rows of a shard.

    An unreadable last line without a newline is a crash's torn row: it is skipped and reported
    in ``bad_lines``.  Any other unreadable line raises CorruptShardError (file and line), or with
    ``allow_corrupt`` is skipped and reported in ``bad_lines``.  Blank lines are not rows.
    """
    for _, _, row in read_jsonl_lines(path, allow_corrupt=allow_corrupt, bad_lines=bad_lines):
        yield row


def read_jsonl_lines(path: Path | str, *, allow_corrupt: bool = False, bad_lines: list[BadLine] | None = None
                     ) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """(line number, the line as written with its newline, row) for each row; as ``read_jsonl``."""
    p = Path(path)
    if not p.exists():
        return
    with (gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")) as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            row, reason = _parse_line(raw)
            if row is not None:
                yield line_no, raw, row
                continue
            torn = not raw.endswith(b"\n")  # only the last line can lack its newline
            bad = BadLine(str(p), line_no, "torn_tail" if torn else "corrupt",
                          "unfinished last line (a crash while writing)" if torn else reason, _excerpt(raw))
            if not torn and not allow_corrupt:
                raise CorruptShardError(bad)
            if bad_lines is not None:
                bad_lines.append(bad)


def _last_newline_end(fh: Any, size: int, chunk: int = 1 << 16) -> int:
    """Offset just after the last newline of an open binary file (0 when it has none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - chunk)
        fh.seek(start)
        block = fh.read(pos - start)
        i = block.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def repair_torn_tail(path: Path | str) -> BadLine | None:
    """Make a shard end on a complete line before appending to it.

    A last line without a newline that still parses as a row is complete (only the newline was
    lost) and gets its newline.  Otherwise it is a torn row: the fragment is appended to
    ``<shard>.torn`` (fsynced first, so it is never lost), the shard is cut back to its last
    complete line, and the fragment is returned as a BadLine for the caller to report.
    """
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        return None
    with open(p, "rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        cut = _last_newline_end(fh, size)
        if cut == size:
            return None
        fh.seek(cut)
        tail = fh.read()
        if not tail.strip():  # trailing whitespace only: nothing to keep aside
            fh.write(b"\n")
            fh.flush()
            os.fsync(fh.fileno())
            return None
        row, _ = _parse_line(tail)
        if row is not None:
            fh.write(b"\n")
            fh.flush()
            os.fsync(fh.fileno())
            return None
        line_no, pos = 1, 0
        fh.seek(0)
        while pos < cut:
            block = fh.read(min(1 << 16, cut - pos))
            line_no += block.count(b"\n")
            pos += len(block)
        side = p.with_name(p.name + TORN_SUFFIX)
        with open(side, "ab") as out:
            out.write(tail + b"\n")
            out.flush()
            os.fsync(out.fileno())
        fh.truncate(cut)
        fh.flush()
        os.fsync(fh.fileno())
    return BadLine(str(p), line_no, "torn_tail", f"unfinished last line moved to {side.name}", _excerpt(tail))


def count_torn_fragments(raw_dir: Path | str) -> dict[str, int]:
    """{side file name: fragments kept} for the ``*.torn`` files of a raw directory."""
    out = {}
    for side in sorted(Path(raw_dir).glob(f"*{TORN_SUFFIX}")):
        with open(side, "rb") as fh:
            out[side.name] = sum(1 for line in fh if line.strip())
    return out


ORPHAN_PATTERN = ".rows-*.tmp*"  # atomic_write_file's temporary name for a rows-*.jsonl target


def orphaned_temp_files(raw_dir: Path | str) -> dict[str, int]:
    """{name: lines} of the temporary files that interrupted atomic writes of shards left behind.

    Such a file is never a shard: its rows are either in the file it was to replace or still in
    the source being copied, so readers skip it; callers report it so it is never lost silently."""
    out = {}
    for tmp in sorted(Path(raw_dir).glob(ORPHAN_PATTERN)):
        with open(tmp, "rb") as fh:
            out[tmp.name] = sum(1 for line in fh if line.strip())
    return out


def is_shard_name(name: str) -> bool:
    """A rows shard (``rows-*.jsonl``, a closed ``rows-*.jsonl.gz``, or a ``seed-rows-*`` copy of
    either), never a hidden temporary file.  (Before the gzip shards counted, a collection seeded
    with ``datasets/<gpu>/raw`` re-measured every row already there.)"""
    return not name.startswith(".") and name.endswith((".jsonl", ".jsonl.gz")) and "rows-" in name


def read_many(paths: Iterable[Path | str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for p in paths:
        rows.extend(read_jsonl(p))
    return rows


def atomic_write_text(path: Path | str, text: str) -> None:
    atomic_write_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _new_file_mode(path: Path) -> int:
    """The permission bits a replaced file keeps (its own), or those a new file gets under the
    process umask: a temporary file is created 0600, and renaming it must not narrow them."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mask = os.umask(0)  # the only portable way to read the umask is to set it
        os.umask(mask)
        return 0o666 & ~mask


def _temp_beside(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=f".tmp{p.suffix}")
    os.close(fd)
    return Path(tmp)


def _finish_temp(tmp: Path, dest: Path) -> None:
    """fsync a written temporary file and give it the mode ``dest`` keeps (or the umask's)."""
    os.chmod(tmp, _new_file_mode(dest))
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())


def atomic_write_file(path: Path | str, write: Callable[[Path], None]) -> None:
    """Call ``write(temp_path)`` on a temporary file beside ``path`` (same suffix, so writers that
    pick a format by extension still work), then rename it over ``path``.  The file keeps the mode
    of the one it replaces (a new one gets the umask's), never the temporary file's 0600."""
    atomic_write_set({Path(path): write})


def atomic_write_set(writes: dict[Path, Callable[[Path], None]]) -> None:
    """Write several files as one set: every file to a temporary name first, then all renamed.

    If any write fails, every temporary file is removed and no target is touched, so readers
    never see one new file beside another's old version because a later write failed."""
    temps: dict[Path, Path] = {}
    try:
        for dest, write in writes.items():
            temps[dest] = _temp_beside(dest)
            write(temps[dest])
            _finish_temp(temps[dest], dest)
        for dest, tmp in temps.items():
            os.replace(tmp, dest)
    except BaseException:
        for tmp in temps.values():
            if tmp.exists():
                tmp.unlink()
        raise


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    atomic_write_file(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_json(path: Path | str, obj: Any, compact: bool = False) -> None:
    """``compact``: no indentation (plans: indented, three of them took the working tree past the
    64 MiB a device call carries)."""
    text = json.dumps(obj, separators=(",", ":"), sort_keys=True, default=str) if compact else \
        json.dumps(obj, indent=2, sort_keys=True, default=str)
    atomic_write_text(path, text + "\n")


def read_spec(cls: type[T], path: Path | str, what: str) -> T:
    """A dataclass from a JSON spec file (how a parent process hands work to a child); a
    ValueError names unknown fields and missing or mistyped ones."""
    data = json.loads(Path(path).read_text())
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown {what} field(s) {unknown}; known: {sorted(known)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def atomic_write_parquet(path: Path | str, df: Any) -> None:
    atomic_write_file(path, lambda tmp: df.to_parquet(tmp, index=False))


RAW_ROW_PATTERNS = ("rows-*.jsonl", "rows-*.jsonl.gz")


def raw_row_files(directory: Path | str, prefix: str = "") -> list[Path]:
    """A directory's row shards, plain and gzip-compressed (closed shards under ``datasets/``
    are stored compressed: the bytes of every line are kept, only the file is smaller)."""
    d = Path(directory)
    return sorted(p for pat in RAW_ROW_PATTERNS for p in d.glob(prefix + pat))
