"""Public measurements of other GPUs: NeuSight's per-operation and whole-model latencies.

NeuSight (Lee, Phanishayee, Mahajan, ASPLOS 2025; github.com/sitar-lab/NeuSight, MIT licence)
published per-operation latencies of linear, bmm, conv, elementwise, layer norm and softmax on
Tesla P4, P100, T4, V100 and two A100s, and whole transformer models with one-layer traces.
:func:`ingest_neusight` turns a copy of that artifact (the layout of
``/work/shared/external/neusight``, see its README) into three small Parquet tables under
``datasets/external/neusight/``, with the licence and source commit copied beside them:

* ``operations.parquet``: one row per measured operation, mapped to gpurec's operation features
  (gpurec kind, ``flops``, ``flops_elementwise``, ``bytes_read``/``bytes_written``,
  ``output_elements``, ``params``) and to the catalogue's NVML name;
* ``models.parquet``: the whole-model JSONs (``e2e``/``fw``/``bwall`` latencies, full depth);
* ``nodes.parquet``: the one-layer per-node traces (torch.fx nodes, forward/backward latency).

**Host floor (excluded, not modelled).**  Every NeuSight number is a CUDA event pair around one
Python call, so the host's dispatch is inside it: the smallest rows of an operation read
24-52 µs on every GPU, whatever the GPU.  Per (GPU, operation) the floor is the smallest
latency of that operation (``host_floor_ms``; the smallest row's own kernel is a few µs, so the
floor slightly overstates the host).  Rows below ``HOST_DOMINATED_FACTOR`` times the floor are
flagged ``host_dominated`` and carry no GPU time; the others get
``gpu_time_ms = latency_ms - host_floor_ms`` (the GPU idles while the host dispatches, then the
kernel runs; the host's work after the launch overlaps the kernel).  Raw ``latency_ms`` is kept.

Rows are FP32 with TF32 off (``precision = "fp32"``, ``tf32 = False``): conv rows on Ampere are
FFMA kernels, not what a default PyTorch run does there.  They are never mixed with this
project's rows: ``gpurec.load_dataset(source="neusight")`` reads them, the default reads ours.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

NEUSIGHT_DIR = Path("external") / "neusight"  # under the datasets root
NEUSIGHT_TABLES = ("operations", "models", "nodes")
HOST_DOMINATED_FACTOR = 3.0
SOURCE_REPO = "https://github.com/sitar-lab/NeuSight"
LICENCE = "MIT"
_BYTES_FP32 = 4

# NeuSight operation name -> (gpurec kind, elementwise FLOPs per output element, tensor inputs).
# The kinds are those gpurec.ops extracts (module class or function name), so kind_group() and
# the cross-GPU model treat both sources alike; ``*u`` rows take a Python scalar as second input.
_ELEMENTWISE: dict[str, tuple[str, float, int]] = {
    "add": ("add", 1.0, 2), "addu": ("add", 1.0, 1), "mul": ("mul", 1.0, 2), "mulu": ("mul", 1.0, 1),
    "div": ("div", 1.0, 2), "divu": ("div", 1.0, 1), "pow": ("pow", 1.0, 2), "powu": ("pow", 1.0, 1),
    "relu": ("ReLU", 1.0, 1), "gelu": ("GELU", 8.0, 1), "tanh": ("tanh", 1.0, 1),
    "ln": ("LayerNorm", 8.0, 1), "softmax": ("softmax", 5.0, 1),
}


class ExternalDataError(ValueError):
    """The public artifact is missing, laid out differently, or names a GPU the catalogue lacks."""


@dataclass
class IngestSummary:
    """What one ingest wrote: rows per table and GPU, and the files."""

    out_dir: Path
    rows: dict[str, int]
    rows_by_gpu: dict[str, int]
    host_dominated_rows: int
    files: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)


def _device_gpu(device: str) -> str:
    """Catalogue NVML name of a NeuSight device string ('Tesla P4', 'NVIDIA_A100_80GB_PCIe', ...)."""
    from gpurec.catalog import UnknownGPU, canonical_name

    try:
        return canonical_name(device.replace("_", " ").strip())
    except UnknownGPU:
        pass
    raise ExternalDataError(f"NeuSight device {device!r} is not in the GPU catalogue (gpurec/data/gpus.json); "
                            "add it with its datasheet figures before ingesting its rows")


def _source_commit(src: Path) -> str:
    text = (src / "SOURCE").read_text(encoding="utf-8") if (src / "SOURCE").exists() else ""
    m = re.search(r"\b([0-9a-f]{40})\b", text)
    if not m:
        raise ExternalDataError(f"{src / 'SOURCE'} does not name the source commit (40 hex digits)")
    return m.group(1)


def _features(op: str, d: Any) -> dict[str, np.ndarray]:
    """gpurec operation features of NeuSight rows of one operation (FP32 bytes, FLOPs as 2 x MACs)."""
    f = {k: np.zeros(len(d)) for k in ("flops", "flops_elementwise", "bytes_read", "bytes_written",
                                       "output_elements", "input_elements", "params")}
    if op in ("linear", "bmm"):
        b = d["B"].to_numpy(float)
        m, n, k = d["M"].to_numpy(float), d["N"].to_numpy(float), d["K"].to_numpy(float)
        f["flops"] = 2.0 * b * m * n * k
        f["input_elements"] = b * m * n if op == "linear" else b * (m * n + n * k)
        f["params"] = n * k if op == "linear" else np.zeros(len(d))
        f["bytes_read"] = _BYTES_FP32 * (b * m * n + (n * k if op == "linear" else b * n * k))
        f["output_elements"] = b * m * k
    elif op == "conv":
        b, cin, cout = d["B"].to_numpy(float), d["Input_Channel"].to_numpy(float), d["Output_Channel"].to_numpy(float)
        k, h = d["Kernel_Szie"].to_numpy(float), d["Input_Size"].to_numpy(float)
        s, p = d["Stride"].to_numpy(float), d["Padding"].to_numpy(float)
        ho = np.floor((h + 2 * p - k) / np.maximum(s, 1)) + 1
        f["flops"] = 2.0 * b * cout * ho * ho * cin * k * k
        f["input_elements"] = b * cin * h * h
        f["params"] = cout * cin * k * k
        f["bytes_read"] = _BYTES_FP32 * (f["input_elements"] + f["params"])
        f["output_elements"] = b * cout * ho * ho
    elif op in _ELEMENTWISE:
        _, per_el, n_in = _ELEMENTWISE[op]
        bh = d["B"].to_numpy(float) * d["H"].to_numpy(float)
        f["flops_elementwise"] = per_el * bh
        f["input_elements"] = n_in * bh
        f["params"] = 2.0 * d["H"].to_numpy(float) if op == "ln" else np.zeros(len(d))
        f["bytes_read"] = _BYTES_FP32 * (f["input_elements"] + f["params"])
        f["output_elements"] = bh
    else:
        raise ExternalDataError(f"NeuSight operation {op!r} has no mapping to gpurec operation features")
    f["bytes_written"] = _BYTES_FP32 * f["output_elements"]
    return f


def _kind(op: str) -> str:
    return {"linear": "Linear", "bmm": "bmm", "conv": "Conv2d"}.get(op) or _ELEMENTWISE[op][0]


def _operation_frame(path: Path, split: str, commit: str, src: Path) -> Any:
    import pandas as pd

    d = pd.read_csv(path)
    # A row's identity is (source_file, source_row): its data line in the published CSV.
    d = d.rename(columns={"OPName": "neusight_op"}).assign(source_row=np.arange(len(d), dtype=np.int32))
    out = []
    for op, part in d.groupby("neusight_op", sort=True):
        part = part.reset_index(drop=True)
        feats = _features(str(op), part)
        frame = pd.DataFrame({
            "source": "neusight", "source_repo": SOURCE_REPO, "source_commit": commit, "licence": LICENCE,
            "source_file": str(path.relative_to(src)), "source_row": part["source_row"], "split": split,
            "neusight_device": part["Device"].astype(str),
            "neusight_op": str(op), "op_kind": _kind(str(op)), "precision": "fp32", "tf32": False, "mode": "inference",
            "latency_ms": part["Latency"].astype(float),
            **{k: v for k, v in feats.items()},
            **{c.lower(): pd.to_numeric(part[c], errors="coerce") for c in
               ("B", "M", "N", "K", "H", "Input_Channel", "Output_Channel", "Input_Size", "Stride", "Padding")
               if c in part},
            **({"kernel_size": pd.to_numeric(part["Kernel_Szie"], errors="coerce")} if "Kernel_Szie" in part else {}),
            "kernel_name": part.get("Kernel Name", pd.Series([""] * len(part))).astype(str),
            "grid_blocks": (pd.to_numeric(part["Grid x"], errors="coerce") * pd.to_numeric(part["Grid y"], errors="coerce")
                            * pd.to_numeric(part["Grid z"], errors="coerce")),
            "block_threads": (pd.to_numeric(part["Block x"], errors="coerce")
                              * pd.to_numeric(part["Block y"], errors="coerce")
                              * pd.to_numeric(part["Block z"], errors="coerce")),
            "blocks_per_sm": pd.to_numeric(part["Blocks per SM"], errors="coerce"),
            "torch": part["Torch Version"].astype(str), "cudnn": part["CUDNN Version"].astype(str),
            "cuda_runtime": part["CUDA Version"].astype(str),
        })
        out.append(frame)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _with_host_floor(ops: Any) -> Any:
    """Add ``host_floor_ms``, ``host_dominated`` and ``gpu_time_ms`` (see the module docstring).

    The floor comes from the ``train`` split, whose shapes reach down to a few hundred elements;
    a (GPU, operation) with only large ``test`` shapes (the A100 80GB's elementwise rows) takes
    the median floor of that operation on the other GPUs (the floor is the host's work)."""
    train = ops[ops["split"] == "train"]
    floor_of = train.groupby(["gpu", "neusight_op"])["latency_ms"].min()
    by_op = floor_of.groupby(level="neusight_op").median()
    keys = zip(ops["gpu"], ops["neusight_op"], strict=True)
    floor = np.array([floor_of.get(k, by_op.get(k[1], np.nan)) for k in keys], dtype=np.float64)
    dominated = ~(ops["latency_ms"].to_numpy() >= HOST_DOMINATED_FACTOR * floor)
    return ops.assign(host_floor_ms=floor, host_dominated=dominated,
                      gpu_time_ms=np.where(dominated, np.nan, ops["latency_ms"] - floor))


def _model_rows(src: Path, commit: str) -> tuple[Any, Any]:
    """Whole-model JSONs and one-layer node traces under ``src/models``."""
    import pandas as pd

    models, nodes = [], []
    pat = re.compile(r"^(?P<model>[a-z0-9_]+)-(?P<mode>inf|train)-(?P<seq>\d+)-(?P<batch>\d+)(?:-(?P<tag>[a-z0-9_]+))?$")
    for dev_dir in sorted(p for p in (src / "models").iterdir() if p.is_dir()):
        gpu = _device_gpu(dev_dir.name)
        for path in sorted(dev_dir.iterdir()):
            stem = path.name.removesuffix(".csv.gz").removesuffix(".json")
            m = pat.match(stem)
            if not m:
                raise ExternalDataError(f"unexpected NeuSight model file name {path.name!r}")
            key = {"gpu": gpu, "neusight_device": dev_dir.name, "model": m["model"],
                   "mode": "inference" if m["mode"] == "inf" else "training", "seq_len": int(m["seq"]),
                   "batch": int(m["batch"]), "variant": m["tag"] or "", "source_file": str(path.relative_to(src))}
            if path.name.endswith(".json"):
                d = json.loads(path.read_text(encoding="utf-8"))

                def num(k: str, d: dict[str, Any] = d) -> float:  # null in a few files: kept as NaN
                    v = d.get(k)
                    return float(v) if v is not None else np.nan

                models.append({**key, "num_layer": num("num_layer"), "e2e_latency_ms": num("e2e_latency"),
                               "fw_latency_ms": num("fw_latency"), "bwall_latency_ms": num("bwall_latency")})
            else:
                with gzip.open(path, "rt", encoding="utf-8") as fh:
                    d = pd.read_csv(fh)
                keep = d[["Name", "op", "target", "input_shapes", "output_shape", "fw_latency", "bw_latency",
                          "acc_latency"]].rename(columns={"Name": "node", "fw_latency": "fw_latency_ms",
                                                          "bw_latency": "bw_latency_ms",
                                                          "acc_latency": "acc_latency_ms"})
                keep = keep.assign(**key, position=np.arange(len(keep)), target=keep["target"].astype(str),
                                   input_shapes=keep["input_shapes"].astype(str),
                                   output_shape=keep["output_shape"].astype(str))
                nodes.append(keep)
    prov = {"source": "neusight", "source_repo": SOURCE_REPO, "source_commit": commit, "licence": LICENCE,
            "precision": "fp32", "tf32": False}
    mdf = pd.DataFrame(models).assign(**prov)
    ndf = pd.concat(nodes, ignore_index=True).assign(**prov) if nodes else pd.DataFrame()
    if len(mdf):
        traced = {(r.gpu, r.model, r.mode, r.seq_len, r.batch) for r in ndf.itertuples()} if len(ndf) else set()
        mdf["has_trace"] = [(r.gpu, r.model, r.mode, r.seq_len, r.batch) in traced and r.variant == ""
                            for r in mdf.itertuples()]
    return mdf, ndf


def ingest_neusight(src: Path | str, root: Path | str | None = None) -> IngestSummary:
    """Build ``<root>/external/neusight/`` from a copy of NeuSight's artifact at ``src``.

    ``root`` is the datasets root (default: gpurec's).  Raises ExternalDataError when ``src`` lacks
    the licence, the source commit or the expected folders, or names a GPU the catalogue lacks.
    """
    import pandas as pd

    from gpurec.dataset.load import default_root
    from gpurec.dataset.store import atomic_write_file, atomic_write_text

    src = Path(src)
    if not (src / "LICENSE").exists():
        raise ExternalDataError(f"{src} has no LICENSE: the MIT licence must travel with the data")
    if not (src / "ops_train").is_dir():
        raise ExternalDataError(f"{src} has no ops_train/ folder: point --src at the NeuSight copy "
                                "(e.g. /work/shared/external/neusight)")
    commit = _source_commit(src)
    frames = []
    for op_dir in sorted(p for p in (src / "ops_train").iterdir() if p.is_dir()):
        for path in sorted(op_dir.glob("*.csv.gz")):
            frames.append(_operation_frame(path, "train", commit, src))
    for path in sorted((src / "ops_test").glob("*.csv.gz")) if (src / "ops_test").is_dir() else []:
        frames.append(_operation_frame(path, "test", commit, src))
    ops = pd.concat([f for f in frames if len(f)], ignore_index=True)
    gpu_of = {d: _device_gpu(d) for d in ops["neusight_device"].unique()}
    ops.insert(0, "gpu", ops["neusight_device"].map(gpu_of))
    ops = _with_host_floor(ops)
    models, nodes = _model_rows(src, commit) if (src / "models").is_dir() else (pd.DataFrame(), pd.DataFrame())
    out = Path(root) if root is not None else default_root()
    out = out / NEUSIGHT_DIR
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for name, df in (("operations", ops), ("models", models), ("nodes", nodes)):
        atomic_write_file(out / f"{name}.parquet",
                          lambda tmp, df=df: df.to_parquet(tmp, index=False, compression="zstd"))
        files.append(f"{name}.parquet")
    atomic_write_text(out / "README.md", _readme(commit, ops, models, nodes))
    files.append("README.md")
    for name in ("LICENSE", "SOURCE"):
        if (src / name).exists():
            shutil.copyfile(src / name, out / f"{name}.tmp")
            (out / f"{name}.tmp").replace(out / name)
            files.append(name)
    return IngestSummary(out_dir=out, rows={"operations": len(ops), "models": len(models), "nodes": len(nodes)},
                         rows_by_gpu={str(k): int(v) for k, v in ops["gpu"].value_counts().sort_index().items()},
                         host_dominated_rows=int(ops["host_dominated"].sum()), files=files)


def _readme(commit: str, ops: Any, models: Any, nodes: Any) -> str:
    """Provenance note written beside the derived tables."""
    gpus = ", ".join(f"{g} ({n} rows)" for g, n in ops["gpu"].value_counts().sort_index().items())
    return (
        "# NeuSight's public GPU measurements (derived tables)\n\n"
        f"Derived by `gpurec dataset external neusight --src PATH` (gpurec/dataset/external.py) from "
        f"{SOURCE_REPO} at commit `{commit}` (ASPLOS 2025, Lee, Phanishayee, Mahajan), under the {LICENCE} "
        "licence in `LICENSE`. **Not measured by this project**; read with "
        "`gpurec.load_dataset(source=\"neusight\", table=...)`, never mixed into this project's rows.\n\n"
        f"* `operations.parquet`: {len(ops)} per-operation rows, FP32 with TF32 off, mapped to gpurec kinds and "
        f"features (FLOPs as 2 x MACs, FP32 bytes) and catalogue GPUs: {gpus}.\n"
        f"* `models.parquet`: {len(models)} whole-model latencies (`e2e`/`fw`/`bwall`, ms, full depth).\n"
        f"* `nodes.parquet`: {len(nodes)} nodes of the one-layer traces (torch.fx; `fw`/`bw`/`acc` ms).\n\n"
        "Every latency is a CUDA event pair around one Python call, so the host's dispatch is inside it. "
        "The host floor is excluded, not modelled: per (GPU, operation) the smallest latency of the train split "
        f"is `host_floor_ms`; rows under {HOST_DOMINATED_FACTOR:g}x it are `host_dominated` with no GPU time, "
        "the others carry `gpu_time_ms = latency_ms - host_floor_ms`. `latency_ms` is the published number.\n")


def load_neusight(root: Path | str | None = None, table: str = "operations") -> Any:
    """A NeuSight table (``operations``, ``models`` or ``nodes``) from ``<root>/external/neusight``."""
    import pandas as pd

    from gpurec.dataset.load import default_root

    if table not in NEUSIGHT_TABLES:
        raise ValueError(f"table must be one of {', '.join(NEUSIGHT_TABLES)} for source='neusight', not {table!r}")
    path = (Path(root) if root is not None else default_root()) / NEUSIGHT_DIR / f"{table}.parquet"
    if not path.exists():
        raise FileNotFoundError(f"no NeuSight {table} table at {path}; build it with "
                                "`gpurec dataset external neusight --src PATH`")
    return pd.read_parquet(path)
