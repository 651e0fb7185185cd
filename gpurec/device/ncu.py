"""The one Nsight Compute (ncu) adapter: find it, ask it, run it, read its CSV.

Calibration, per-operation counters (gpurec.collect.counters) and profiling all use it.

- Every ncu command line comes from :func:`ncu_command`, which always passes
  ``--clock-control none`` and refuses an override: ncu otherwise locks the GPU to base
  clocks, which we must not do on a lent GPU and which would not match normal runs.
- Reports are exported to ``.ncu-rep`` first and then printed with ``--csv --page raw
  --print-units base``, so the application's own stdout never mixes with the CSV.
- :func:`parse_ncu_csv` turns that raw page (one row per kernel, a units row under the
  header, numbers with thousands separators) into a DataFrame with numeric metric columns.
- :func:`available_metrics` caches which metrics this GPU has in a per-user cache
  directory (never the shared temp directory); a failed query is remembered only briefly.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurec.device.errors import NcuError, NcuNotFound

if TYPE_CHECKING:  # pandas is imported lazily
    import pandas as pd

__all__ = [
    "NcuError", "NcuNotFound", "find_ncu", "ncu_version", "ncu_command", "run_ncu", "export_raw_csv",
    "run_process_group", "parse_query_metrics", "query_metrics", "available_metrics", "split_available",
    "metric_base", "parse_ncu_csv", "metric_columns", "read_text", "unit_scale", "cache_dir",
]

NCU_FIX = (
    "Nsight Compute's CLI (ncu) was not found on PATH, in $NCU, $CUDA_HOME/bin, /usr/local/cuda/bin "
    "or /opt/nvidia/nsight-compute/*/. Install Nsight Compute (it ships with the CUDA toolkit, "
    "https://developer.nvidia.com/nsight-compute) and put it on PATH, or set NCU=/path/to/ncu. "
    "Without ncu, profile with ncu=False (CLI: gpurec profile --no-ncu), which still reports time, "
    "GPU utilization and framework overhead, and calibrate with --no-ncu."
)
DEFAULT_NCU_GLOBS: tuple[str, ...] = (
    "/usr/local/cuda/bin/ncu",
    "/usr/local/cuda-*/bin/ncu",
    "/usr/local/cuda/nsight-compute-*/ncu",
    "/opt/nvidia/nsight-compute/*/ncu",
    "/opt/nvidia/nsight-compute*/ncu",
    "/usr/local/NVIDIA-Nsight-Compute*/ncu",
)
IDENTITY_COLUMNS = (
    "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
    "Block Size", "Grid Size", "Device", "CC",
)
# How long a failed metric query is remembered (so a batch of runs does not repeat a slow
# failure), after which ncu is asked again.
QUERY_FAILURE_TTL_S = 600.0


def find_ncu() -> Path:
    """Locate ncu ($NCU, $GPUREC_NCU, PATH, $CUDA_HOME, usual install folders) or raise NcuNotFound."""
    for var in ("NCU", "GPUREC_NCU"):
        env = os.environ.get(var)
        if env and Path(env).is_file() and os.access(env, os.X_OK):
            return Path(env)
    found = shutil.which("ncu")
    if found:
        return Path(found)
    cands = [str(Path(os.environ[v]) / "bin" / "ncu") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    for pattern in cands + list(DEFAULT_NCU_GLOBS):
        for c in sorted(glob.glob(pattern), reverse=True):
            if os.access(c, os.X_OK):
                return Path(c)
    raise NcuNotFound(NCU_FIX)


def ncu_version(ncu: Path | str | None = None) -> str:
    ncu = ncu or find_ncu()
    out = subprocess.run([str(ncu), "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"Version\s+([\w.\-() ]+)", out)
    return m.group(1).strip() if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


# -- which metrics exist --------------------------------------------------------------------------

_ROLLUPS = {"sum", "avg", "min", "max"}


def metric_base(name: str) -> str:
    """``'dram__sectors_read.sum'`` -> ``'dram__sectors_read'`` (what --query-metrics lists)."""
    head, _, tail = name.rpartition(".")
    if head and tail in _ROLLUPS:
        return head
    return name.split(".", 1)[0]


def parse_query_metrics(text: str) -> set[str]:
    """Base metric names from ``ncu --query-metrics`` output (the first token of each row)."""
    return set(re.findall(r"^\s*([a-z0-9]+__[A-Za-z0-9_]+)(?:\s|$)", text, flags=re.M))


def query_metrics(ncu: Path | str | None = None, timeout_s: float = 120.0) -> set[str]:
    """Base metric names available on the visible GPU (needs a GPU and counter permission)."""
    ncu = ncu or find_ncu()
    try:
        proc = subprocess.run([str(ncu), "--query-metrics"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise NcuError(f"ncu --query-metrics timed out after {timeout_s:.0f} s") from exc
    except OSError as exc:
        raise NcuError(f"could not run {ncu} --query-metrics: {exc}") from exc
    names = parse_query_metrics(proc.stdout)
    if proc.returncode != 0 or not names:
        raise NcuError(f"ncu --query-metrics failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
    return names


def cache_dir() -> Path:
    """This user's gpurec cache: ``$GPUREC_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpurec``, else ``~/.cache/gpurec``."""
    if os.environ.get("GPUREC_CACHE_DIR"):
        return Path(os.environ["GPUREC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpurec"


def _gpu_names() -> list[str]:
    try:
        from gpurec.device.nvml import list_gpus

        return [g.name for g in list_gpus()]
    except Exception:  # noqa: BLE001 - no NVML: the visible-device list alone keys the cache
        return ["unknown"]


def _metrics_cache_file(ncu: Path | str, directory: Path) -> Path:
    """One file per ncu binary (path, size, mtime), visible GPUs and their names."""
    p = Path(ncu)
    try:
        st = p.stat()
        ident = [str(p.resolve()), st.st_size, int(st.st_mtime)]
    except OSError:
        ident = [str(p), 0, 0]
    key = json.dumps([ident, os.environ.get("CUDA_VISIBLE_DEVICES", "all"), _gpu_names()])
    return directory / f"ncu_metrics_{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"


def available_metrics(ncu: Path | str, timeout_s: float = 60.0, directory: Path | None = None,
                      failure_ttl_s: float = QUERY_FAILURE_TTL_S) -> set[str] | None:
    """Base metric names this GPU supports, or None if ncu could not tell.

    Cached under ``directory`` (default :func:`cache_dir`), because each query costs seconds.
    A success is kept; a failure only for ``failure_ttl_s``, then ncu is asked again.
    """
    directory = Path(directory) if directory is not None else cache_dir()
    path = _metrics_cache_file(ncu, directory)
    try:
        saved = json.loads(path.read_text())
        if saved.get("metrics"):
            return set(saved["metrics"])
        if time.time() - float(saved.get("failed_at", 0)) < failure_ttl_s:
            return None
    except (OSError, ValueError, TypeError, AttributeError):
        pass  # no cache yet, or a damaged one: ask ncu
    try:
        names: set[str] | None = query_metrics(ncu, timeout_s)
        record: dict[str, Any] = {"ncu": str(ncu), "metrics": sorted(names or ())}
    except NcuError as exc:
        names = None
        record = {"ncu": str(ncu), "failed_at": time.time(), "error": str(exc)[-500:]}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only costs a repeated query
    return names


def split_available(metrics: Sequence[str], available: set[str] | None) -> tuple[list[str], list[str]]:
    """(metrics whose base name is available, the others); everything is kept if unknown."""
    if not available:
        return list(metrics), []
    keep = [m for m in metrics if metric_base(m) in available]
    return keep, [m for m in metrics if metric_base(m) not in available]


# -- running --------------------------------------------------------------------------------------

def ncu_command(ncu: Path | str, target_cmd: Sequence[str], report_base: Path | str,
                metrics: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
    """The ncu command line: clocks never locked, every process followed, a report exported.

    ``--clock-control none`` is always passed; ``extra`` may not name ``--clock-control``.
    """
    _check_extra(extra)
    args = [str(ncu), "--clock-control", "none", "--target-processes", "all", *map(str, extra)]
    if metrics:
        args += ["--metrics", ",".join(metrics)]
    return [*args, "--force-overwrite", "--export", str(report_base), *map(str, target_cmd)]


def _check_extra(extra: Sequence[str]) -> None:
    if any(str(a).startswith("--clock-control") for a in extra):
        raise ValueError("ncu always runs with --clock-control none (clocks are never locked); "
                         "do not pass --clock-control")


def export_raw_csv(ncu: Path | str, report: Path, out_csv: Path, timeout_s: float = 300.0) -> Path:
    """``ncu --import REPORT --page raw --csv`` into ``out_csv`` (base units, demangled names if possible)."""
    base = [str(ncu), "--import", str(report), "--csv", "--page", "raw"]
    attempts = [base + ["--print-units", "base", "--print-kernel-base", "demangled"],
                base + ["--print-units", "base"], base]
    last_err = ""
    for cmd in attempts:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise NcuError(f"ncu --import timed out after {timeout_s:.0f} s") from exc
        if proc.returncode == 0 and '"ID"' in proc.stdout:
            out_csv.parent.mkdir(parents=True, exist_ok=True)
            out_csv.write_text(proc.stdout)
            return out_csv
        last_err = (proc.stderr or proc.stdout)[-2000:]
    raise NcuError(f"could not export {report} to CSV: {last_err}")


def run_ncu(
    cmd: Sequence[str],
    metrics: Sequence[str],
    out_csv: Path,
    nvtx_include: Sequence[str] | None = None,
    extra: Sequence[str] = (),
    kernel_regex: str | None = None,
    timeout_s: float = 600.0,
    ncu: Path | str | None = None,
    env: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Profile ``cmd`` under ncu and return the parsed raw page (also written to ``out_csv``).

    ``nvtx_include`` entries become ``--nvtx --nvtx-include X``; ``kernel_regex`` becomes
    ``-k regex:X``.  Raises :class:`NcuError` with ncu's output on failure.
    """
    flags: list[str] = []
    if nvtx_include:
        flags += ["--nvtx"]
        for item in nvtx_include:
            flags += ["--nvtx-include", item]
    if kernel_regex:
        flags += ["-k", f"regex:{kernel_regex}"]
    flags += list(extra)
    _check_extra(flags)
    ncu = ncu or find_ncu()
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpurec-ncu-") as tmp:
        report = Path(tmp) / "report"
        args = ncu_command(ncu, cmd, report, metrics, flags)
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired as exc:
            raise NcuError(f"ncu timed out after {timeout_s:.0f} s: {' '.join(args)}") from exc
        rep = report.with_suffix(".ncu-rep")
        if proc.returncode != 0 or not rep.exists():
            raise NcuError(
                f"ncu failed ({proc.returncode}): {' '.join(args)}\n{(proc.stdout + proc.stderr)[-4000:]}"
            )
        try:
            exp = subprocess.run(
                [str(ncu), "--import", str(rep), "--csv", "--page", "raw", "--print-units", "base"],
                capture_output=True, text=True, timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise NcuError(f"ncu --import timed out after {timeout_s:.0f} s") from exc
        if exp.returncode != 0:
            raise NcuError(f"ncu --import failed ({exp.returncode}): {exp.stderr[-2000:]}")
        out_csv.write_text(exp.stdout)
    df = parse_ncu_csv(out_csv)
    if df.empty:
        raise NcuError(f"ncu profiled no kernel: {' '.join(args)}\n{(proc.stdout + proc.stderr)[-2000:]}")
    return df


def run_process_group(
    cmd: Sequence[str],
    log_path: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> int:
    """Run cmd in its own process group with output to log_path; kill the whole group on
    timeout or interruption, so no profiled grandchild keeps holding the GPU. Returns rc;
    raises subprocess.TimeoutExpired after the kill."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(str(c) for c in cmd) + "\n")
        log.flush()
        proc = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except BaseException:
            _kill_group(proc)
            raise


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


# -- parsing ---------------------------------------------------------------------------------

# Units --print-units base should not produce, converted anyway: (base unit, factor).
# ncu 2025 writes times as "ns" (older versions "nsecond"); both are kept as reported.
_UNIT_SCALE = {
    "nsecond": ("nsecond", 1.0), "usecond": ("nsecond", 1e3), "msecond": ("nsecond", 1e6),
    "second": ("nsecond", 1e9), "ns": ("ns", 1.0), "us": ("ns", 1e3), "ms": ("ns", 1e6), "s": ("ns", 1e9),
    "byte": ("byte", 1.0), "Kbyte": ("byte", 1e3), "Mbyte": ("byte", 1e6),
    "Gbyte": ("byte", 1e9), "Tbyte": ("byte", 1e12), "KB": ("byte", 1e3), "MB": ("byte", 1e6),
    "GB": ("byte", 1e9), "hz": ("hz", 1.0), "Khz": ("hz", 1e3), "Mhz": ("hz", 1e6), "Ghz": ("hz", 1e9),
    "cycle/nsecond": ("cycle/nsecond", 1.0), "cycle/usecond": ("cycle/nsecond", 1e-3),
}
_PREFIXED_COUNT = re.compile(r"([KMG])((?:cycle|inst|warp|thread|block|register|sector|request)s?(?:/.*)?)")


def unit_scale(unit: str) -> tuple[str, float]:
    """(base unit, factor to it): times to ns, K/M/G bytes and hertz, K/M/G-prefixed counts (Kcycle)."""
    u = unit.strip()
    if u in _UNIT_SCALE:
        return _UNIT_SCALE[u]
    m = _PREFIXED_COUNT.fullmatch(u)
    if m:
        return m.group(2), {"K": 1e3, "M": 1e6, "G": 1e9}[m.group(1)]
    return u, 1.0


def read_text(path_or_text: str | Path) -> str:
    """The CSV text of a path (plain, gzip or UTF-16) or the text itself."""
    if isinstance(path_or_text, Path) or ("\n" not in str(path_or_text) and Path(str(path_or_text)).is_file()):
        raw = Path(path_or_text).read_bytes()
        if raw.startswith(b"\x1f\x8b"):  # gzip (e.g. ncu_raw_chunk0.csv.gz)
            import gzip

            raw = gzip.decompress(raw)
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            return raw.decode("utf-16")
        return raw.decode("utf-8-sig", errors="replace")
    return str(path_or_text)


def _to_number(value: str) -> float | None:
    v = value.strip()
    if v in ("", "n/a", "N/A", "nan", "-"):
        return None
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def _dims(text: str) -> tuple[int, int, int] | None:
    nums = re.findall(r"\d+", text or "")
    if not nums:
        return None
    vals = [int(x) for x in nums[:3]] + [1] * (3 - min(len(nums), 3))
    return vals[0], vals[1], vals[2]


def _nvtx_stack(cell: str) -> list[str]:
    """Range names from an NVTX cell like ``1  "<default domain>:fwd:none:..."  "...:conv:none:..."``.

    Each quoted entry is Domain:Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg; names may
    contain ':' (``aten::conv2d``), so the domain and the six trailing fields are cut off.
    """
    entries = re.findall(r'"([^"]*)"', cell or "") or ([cell] if cell and ":" in cell else [])
    names = []
    for e in entries:
        body = e.split(":", 1)[1] if ":" in e else e
        parts = body.rsplit(":", 6)
        names.append(parts[0] if len(parts) == 7 else body)
    return names


def _long_to_wide(header: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]], dict[str, str]]:
    """The --page details layout (one row per metric) -> the raw layout (one row per kernel)."""
    hi = {h: i for i, h in enumerate(header)}
    ident = [h for h in header if h not in ("Section Name", "Metric Name", "Metric Unit", "Metric Value")
             and not h.startswith(("Rule ", "Estimated Speedup"))]
    kernels: dict[str, dict[str, str]] = {}
    units: dict[str, str] = {}
    metric_order: list[str] = []
    for r in rows:
        k = kernels.setdefault(r[hi["ID"]], {h: r[hi[h]] for h in ident})
        name = r[hi["Metric Name"]]
        if not name:
            continue
        if name not in metric_order:
            metric_order.append(name)
        k[name] = r[hi["Metric Value"]]
        units[name] = r[hi["Metric Unit"]] if "Metric Unit" in hi else ""
    new_header = ident + metric_order
    return new_header, [[k.get(h, "") for h in new_header] for k in kernels.values()], units


def parse_ncu_csv(path_or_text: str | Path) -> pd.DataFrame:
    """ncu ``--csv --page raw`` output -> one row per profiled kernel, in report order.

    Metric columns (names containing ``__``) become floats (thousands separators removed,
    ``n/a`` -> NaN, scaled to base units when a scaled unit slipped through); a metric whose
    values are all text (a device attribute name) stays text.  Added columns: ``id``,
    ``kernel_name``, ``block_x/y/z``, ``grid_x/y/z``, ``threads_per_block``, ``grid_blocks``
    and, when NVTX was collected, ``nvtx_range`` (innermost push/pop range) and
    ``nvtx_stack`` (outer/inner joined by ' / ').  Units are in ``df.attrs['units']``.
    ``==PROF==`` lines and application output are ignored; the long ``--page details``
    layout is accepted too.  Text without an ncu header gives an empty frame.
    """
    import pandas as pd

    text = read_text(path_or_text)
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"') or ln.startswith("ID,")), None)
    if start is None:
        start = next((i for i, ln in enumerate(lines) if ln.startswith('"')), None)
    if start is None:
        return pd.DataFrame()
    body = [lines[start]] + [ln for ln in lines[start + 1:] if ln.startswith('"') or re.match(r"^\d", ln)]
    records = list(csv.reader(io.StringIO("\n".join(body))))
    header, rows = records[0], [r for r in records[1:] if len(r) == len(records[0])]
    units: dict[str, str] = {}
    if "Metric Name" in header and "Metric Value" in header:
        header, rows, units = _long_to_wide(header, rows)
    elif rows and "ID" in header and not rows[0][header.index("ID")].strip().isdigit():
        units = {h: u for h, u in zip(header, rows[0], strict=True) if u}
        rows = rows[1:]
    # Columns are built in a dict and joined once: inserting hundreds of metric columns one by
    # one (a real raw page has ~300) fragments the frame and floods the log with warnings.
    cols: dict[str, Any] = {h: [r[j] for r in rows] for j, h in enumerate(header)}
    n = len(rows)
    out_units: dict[str, str] = {}
    numeric: set[str] = set()
    for col in header:
        if "__" not in col:
            continue
        raw_vals = cols[col]
        vals = [_to_number(v) for v in raw_vals]
        if any(v.strip() not in ("", "n/a", "N/A") for v in raw_vals) and all(v is None for v in vals):
            continue  # a string-valued metric (e.g. a device attribute name): keep as text
        unit = units.get(col, "")
        base_unit, scale = unit_scale(unit) if unit else ("", 1.0)
        cols[col] = [v * scale if v is not None else float("nan") for v in vals]
        numeric.add(col)
        if base_unit:
            out_units[col] = base_unit
    index = pd.RangeIndex(n)
    frame: dict[str, Any] = {
        col: pd.Series(cols[col], index=index, dtype="float64" if col in numeric else object, name=col)
        for col in header
    }
    extra: dict[str, Any] = {}
    if "ID" in frame:
        extra["id"] = pd.to_numeric(frame["ID"], errors="coerce").astype("Int64")
    name_col = next((c for c in ("Kernel Name", "Function Name", "Name") if c in frame), None)
    if name_col:
        extra["kernel_name"] = frame[name_col].astype(str)
    for src, prefix in (("Block Size", "block"), ("Grid Size", "grid")):
        if src in frame:
            dims = [_dims(v) if isinstance(v, str) else None for v in cols[src]]
            for j, axis in enumerate("xyz"):
                extra[f"{prefix}_{axis}"] = pd.array([d[j] if d else None for d in dims], dtype="Int64")
    if "block_x" in extra:
        extra["threads_per_block"] = extra["block_x"] * extra["block_y"] * extra["block_z"]
    if "grid_x" in extra:
        extra["grid_blocks"] = extra["grid_x"] * extra["grid_y"] * extra["grid_z"]
    nvtx_cols = [c for c in header if "push/pop_range" in c.lower() or c.lower().startswith("nvtx")]
    nvtx_cols += [c for c in header if "start/stop_range" in c.lower() and c not in nvtx_cols]
    if nvtx_cols:
        stacks = [_nvtx_stack(v if isinstance(v, str) else "") for v in cols[nvtx_cols[0]]]
        extra["nvtx_range"] = pd.Series([s[-1] if s else None for s in stacks], dtype=object)
        extra["nvtx_stack"] = pd.Series([" / ".join(s) if s else None for s in stacks], dtype=object)
    for k, v in extra.items():
        frame.setdefault(k, pd.Series(v, index=index, name=k))
    df = pd.concat(list(frame.values()), axis=1) if frame else pd.DataFrame(index=index)
    df.attrs["units"] = out_units
    df.attrs["nvtx_columns"] = nvtx_cols
    return df


def metric_columns(df: pd.DataFrame) -> list[str]:
    """The numeric ncu metric columns of a parsed frame."""
    return [c for c in df.columns if "__" in c and str(df[c].dtype).startswith("float")]


def describe(df: pd.DataFrame) -> dict[str, Any]:
    """Small summary for logs and JSON: kernels and metrics seen."""
    return {"kernels": int(len(df)), "metrics": metric_columns(df)}
