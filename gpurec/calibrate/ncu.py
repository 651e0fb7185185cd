"""Generic Nsight Compute (ncu) helpers, usable outside calibration too.

- :func:`run_ncu` always passes ``--clock-control none``: ncu otherwise locks the GPU to base
  clocks, which we must not do on a lent GPU and which would not match normal runs.
- Reports are exported to ``.ncu-rep`` first and then printed with ``--csv --page raw
  --print-units base``, so the application's own stdout never mixes with the CSV.
- :func:`parse_ncu_csv` turns that raw page (one row per kernel, a units row under the
  header, numbers with thousands separators) into a DataFrame with numeric metric columns.
"""

from __future__ import annotations

import csv
import glob
import io
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurec.calibrate.errors import NcuError, NcuNotFound

if TYPE_CHECKING:  # pandas is imported lazily
    import pandas as pd

NCU_FIX = (
    "ncu (Nsight Compute CLI) was not found on PATH, in $NCU, $CUDA_HOME/bin, /usr/local/cuda/bin "
    "or /opt/nvidia/nsight-compute/*/. Install Nsight Compute (it ships with the CUDA toolkit) and "
    "put it on PATH, or set NCU=/path/to/ncu."
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
# Non-base units that --print-units base should not produce, converted anyway (to the first unit).
# ncu 2025 writes times as "ns" (older versions "nsecond"); both are kept as reported.
_UNIT_SCALE = {
    "nsecond": ("nsecond", 1.0), "usecond": ("nsecond", 1e3), "msecond": ("nsecond", 1e6),
    "second": ("nsecond", 1e9), "ns": ("ns", 1.0), "us": ("ns", 1e3), "ms": ("ns", 1e6), "s": ("ns", 1e9), "byte": ("byte", 1.0), "Kbyte": ("byte", 1e3), "Mbyte": ("byte", 1e6),
    "Gbyte": ("byte", 1e9), "Tbyte": ("byte", 1e12), "KB": ("byte", 1e3), "MB": ("byte", 1e6),
    "GB": ("byte", 1e9), "hz": ("hz", 1.0), "Khz": ("hz", 1e3), "Mhz": ("hz", 1e6), "Ghz": ("hz", 1e9),
    "cycle/nsecond": ("cycle/nsecond", 1.0), "cycle/usecond": ("cycle/nsecond", 1e-3),
}


def find_ncu() -> Path:
    """Locate ncu or raise :class:`NcuNotFound` with the fix."""
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


def ncu_version(ncu: Path | None = None) -> str:
    ncu = ncu or find_ncu()
    out = subprocess.run([str(ncu), "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"Version\s+([\w.\-() ]+)", out)
    return m.group(1).strip() if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


def metric_base(name: str) -> str:
    """``'dram__sectors_read.sum'`` -> ``'dram__sectors_read'`` (what --query-metrics lists)."""
    return name.split(".", 1)[0]


def query_metrics(ncu: Path | None = None, timeout_s: float = 120.0) -> set[str]:
    """Base metric names available on the visible GPU (needs a GPU and counter permission)."""
    ncu = ncu or find_ncu()
    proc = subprocess.run([str(ncu), "--query-metrics"], capture_output=True, text=True, timeout=timeout_s)
    names = set(re.findall(r"^\s*([a-z0-9]+__[A-Za-z0-9_]+)\b", proc.stdout, flags=re.M))
    if proc.returncode != 0 or not names:
        raise NcuError(f"ncu --query-metrics failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
    return names


def split_available(metrics: Sequence[str], available: set[str] | None) -> tuple[list[str], list[str]]:
    """(metrics whose base name is available, the others); everything is kept if unknown."""
    if not available:
        return list(metrics), []
    keep = [m for m in metrics if metric_base(m) in available]
    return keep, [m for m in metrics if metric_base(m) not in available]


def run_ncu(
    cmd: Sequence[str],
    metrics: Sequence[str],
    out_csv: Path,
    nvtx_include: Sequence[str] | None = None,
    extra: Sequence[str] = (),
    kernel_regex: str | None = None,
    timeout_s: float = 600.0,
    ncu: Path | None = None,
    env: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Profile ``cmd`` under ncu and return the parsed raw page (also written to ``out_csv``).

    Clocks are never locked (``--clock-control none`` is always passed and cannot be overridden
    through ``extra``).  ``nvtx_include`` entries become ``--nvtx --nvtx-include X``;
    ``kernel_regex`` becomes ``-k regex:X``.  Raises :class:`NcuError` with ncu's output on failure.
    """
    if any(a.startswith("--clock-control") for a in extra):
        raise ValueError("run_ncu always uses --clock-control none; do not pass it in extra.")
    ncu = ncu or find_ncu()
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpurec-ncu-") as tmp:
        report = Path(tmp) / "report"
        args = [str(ncu), "--clock-control", "none", "--target-processes", "all", "-f", "-o", str(report)]
        if metrics:
            args += ["--metrics", ",".join(metrics)]
        if nvtx_include:
            args += ["--nvtx"]
            for item in nvtx_include:
                args += ["--nvtx-include", item]
        if kernel_regex:
            args += ["-k", f"regex:{kernel_regex}"]
        args += [*extra, *cmd]
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


# -- parsing ---------------------------------------------------------------------------------

def _read_text(path_or_text: str | Path) -> str:
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
    if v in ("", "n/a", "N/A", "nan"):
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
    """ncu ``--csv --page raw`` output -> one row per profiled kernel.

    Metric columns (names containing ``__``) become floats (thousands separators removed,
    ``n/a`` -> NaN, scaled to base units when a scaled unit slipped through).  Added columns:
    ``id``, ``kernel_name``, ``block_x/y/z``, ``grid_x/y/z``, ``threads_per_block``,
    ``grid_blocks`` and, when NVTX was collected, ``nvtx_range`` (innermost push/pop range)
    and ``nvtx_stack`` (outer/inner joined by ' / ').  Units are in ``df.attrs['units']``.
    ``==PROF==`` lines and application output are ignored; the long ``--page details``
    layout is accepted too.
    """
    import pandas as pd

    text = _read_text(path_or_text)
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
    elif rows and "ID" in header and rows[0][header.index("ID")] == "":
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
        base_unit, scale = _UNIT_SCALE.get(unit, (unit, 1.0))
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
    if "Kernel Name" in frame:
        extra["kernel_name"] = frame["Kernel Name"].astype(str)
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
