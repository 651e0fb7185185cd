"""Offline parsers of Nsight Compute (ncu) output: the raw CSV page and ``--query-metrics``.

CPU core: reports and feature tables read committed ncu output with these on a laptop, without
ncu or a GPU.  Running ncu lives in ``gpurec.device.ncu`` (the one adapter), which uses them.
:func:`parse_ncu_csv` turns the raw page (one row per kernel, a units row under the header,
numbers with thousands separators) into a DataFrame with numeric metric columns.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported lazily
    import pandas as pd

IDENTITY_COLUMNS = (
    "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
    "Block Size", "Grid Size", "Device", "CC",
)

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
