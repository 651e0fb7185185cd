"""The GPU catalogue: vendor datasheet figures for every GPU gpurec knows about.

Stdlib only, so that naming and describing a GPU never needs torch, NVML or a GPU.
The figures live in ``gpurec/data/gpus.json``; its top-level ``notes`` says what they mean
(tensor-core rates are dense, i.e. without 2:4 sparsity).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

__all__ = [
    "GPUSpec",
    "HARDWARE_FEATURES",
    "UnknownGPU",
    "canonical_name",
    "gpu_names",
    "idle_share_of_limit",
    "load_catalog",
    "parse_catalog",
    "resolve_gpu",
    "short_name",
]

SCHEMA_VERSION = 1

# Order is the column order ML code gets; keep it stable, models are trained against it.
HARDWARE_FEATURES: tuple[str, ...] = (
    "sm_count",
    "max_sm_clock_mhz",
    "fp32_tflops",
    "tf32_tflops",
    "fp16_tflops",
    "bf16_tflops",
    "memory_bandwidth_gbs",
    "l2_cache_mb",
    "memory_gb",
    "tdp_w",
    "ridge_fp32_flop_per_byte",
    "ridge_tf32_flop_per_byte",
)

# Words that appear in NVML names but never identify the model itself.
_VENDOR_PREFIXES = ("nvidia", "tesla", "geforce")
_NEUTRAL_TOKENS = frozenset(
    {"nvidia", "tesla", "geforce", "rtx", "pcie", "sxm", "sxm2", "sxm4", "sxm5",
     "hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x"}
)
_MEMORY_TOKEN = re.compile(r"^(\d+)gb$")


class UnknownGPU(ValueError):
    """A GPU name that is not in the catalogue; the message lists valid names and near misses."""


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet figures (units in the field names; see gpus.json ``notes``)."""

    nvml_name: str
    aliases: tuple[str, ...]
    architecture: str
    compute_capability: str
    sm_count: int
    max_sm_clock_mhz: int
    base_sm_clock_mhz: int | None
    fp32_tflops: float
    tf32_tflops: float
    fp16_tflops: float
    bf16_tflops: float
    memory_gb: float
    memory_type: str
    memory_bandwidth_gbs: float
    l2_cache_mb: float
    l1_shared_kb_per_sm: float
    tdp_w: float
    form_factor: str
    release_year: int
    sources: tuple[str, ...]
    notes: str = ""
    power_limit_w: float | None = None  # default enforced board power limit (None: tdp_w)
    idle_power_w: float | None = None  # measured idle board power (None: not measured, estimated)
    power_source: str = ""

    def features(self) -> dict[str, float]:
        """Numeric hardware features, keyed as in HARDWARE_FEATURES, for models that generalise across GPUs.

        The ridge points (peak FLOP/s over DRAM byte/s) say where an operation turns from memory- to
        compute-bound, which raw TFLOPS and bandwidth only give a model indirectly.
        """
        bytes_per_s = self.memory_bandwidth_gbs * 1e9
        out = {
            "sm_count": float(self.sm_count),
            "max_sm_clock_mhz": float(self.max_sm_clock_mhz),
            "fp32_tflops": float(self.fp32_tflops),
            "tf32_tflops": float(self.tf32_tflops),
            "fp16_tflops": float(self.fp16_tflops),
            "bf16_tflops": float(self.bf16_tflops),
            "memory_bandwidth_gbs": float(self.memory_bandwidth_gbs),
            "l2_cache_mb": float(self.l2_cache_mb),
            "memory_gb": float(self.memory_gb),
            "tdp_w": float(self.tdp_w),
            "ridge_fp32_flop_per_byte": self.fp32_tflops * 1e12 / bytes_per_s,
            "ridge_tf32_flop_per_byte": self.tf32_tflops * 1e12 / bytes_per_s,
        }
        return {key: out[key] for key in HARDWARE_FEATURES}

    def power_bounds_w(self) -> tuple[float, float]:
        """(idle, limit): the range an average board power must lie in.

        The firmware holds the average power at or below the enforced limit (it lowers clocks),
        and a board with a live context never draws less than its idle power.  Where the idle
        power was not measured it is estimated as the limit times the median idle/limit share of
        the catalogued GPUs that were measured (:func:`idle_share_of_limit`)."""
        limit = float(self.power_limit_w if self.power_limit_w is not None else self.tdp_w)
        idle = self.idle_power_w if self.idle_power_w is not None else idle_share_of_limit() * limit
        return float(min(idle, limit)), limit

    @property
    def short_name(self) -> str:
        """Compact label for tables and file names (the first alias)."""
        return self.aliases[0] if self.aliases else self.nvml_name


def _normalise(name: str) -> str:
    """Case-, space-, hyphen- and underscore-insensitive key, so 'a100 sxm4_80gb' finds 'A100-SXM4-80GB'."""
    return re.sub(r"[^0-9a-z]+", "", name.lower())


def _strip_vendor(key: str) -> str:
    """'nvidiageforcertx4090' -> 'rtx4090', so users may leave out the vendor words NVML puts first."""
    changed = True
    while changed:
        changed = False
        for prefix in _VENDOR_PREFIXES:
            if key.startswith(prefix) and len(key) > len(prefix):
                key, changed = key[len(prefix):], True
    return key


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^0-9a-z]+", name.lower()) if t]


def _keys(spec: GPUSpec) -> set[str]:
    nvml = _normalise(spec.nvml_name)
    return {nvml, _strip_vendor(nvml)} | {_normalise(a) for a in spec.aliases}


def parse_catalog(data: Mapping[str, Any]) -> list[GPUSpec]:
    """Validate and build specs from the JSON document; raises ValueError on a malformed or ambiguous file."""
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"GPU catalogue schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    known = {f.name for f in fields(GPUSpec)}
    specs: list[GPUSpec] = []
    owner: dict[str, str] = {}
    for i, raw in enumerate(data.get("gpus", [])):
        extra = set(raw) - known
        if extra:
            raise ValueError(f"GPU catalogue entry {i} has unknown fields {sorted(extra)}")
        values = dict(raw)
        values["aliases"] = tuple(values.get("aliases", ()))
        values["sources"] = tuple(values.get("sources", ()))
        try:
            spec = GPUSpec(**values)
        except TypeError as exc:
            raise ValueError(f"GPU catalogue entry {i} ({raw.get('nvml_name')!r}): {exc}") from exc
        for key in _keys(spec):
            if key in owner and owner[key] != spec.nvml_name:
                raise ValueError(f"GPU name {key!r} is claimed by both {owner[key]!r} and {spec.nvml_name!r}")
            owner[key] = spec.nvml_name
        specs.append(spec)
    if not specs:
        raise ValueError("GPU catalogue lists no GPUs")
    return specs


@functools.lru_cache(maxsize=1)
def load_catalog() -> list[GPUSpec]:
    """All catalogued GPUs, in file order. The list is shared between callers: copy it before changing it."""
    text = resources.files("gpurec").joinpath("data/gpus.json").read_text(encoding="utf-8")
    return parse_catalog(json.loads(text))


# Idle/limit share used before any GPU of the catalogue has a measured idle power.
DEFAULT_IDLE_SHARE_OF_LIMIT = 0.1


@functools.lru_cache(maxsize=1)
def idle_share_of_limit() -> float:
    """Median measured idle power / power limit over the catalogued GPUs with a measured idle power
    (the estimate of an unmeasured GPU's idle power, as a share of its limit)."""
    shares = sorted(s.idle_power_w / float(s.power_limit_w if s.power_limit_w is not None else s.tdp_w)
                    for s in load_catalog() if s.idle_power_w is not None)
    if not shares:
        return DEFAULT_IDLE_SHARE_OF_LIMIT
    mid = len(shares) // 2
    return shares[mid] if len(shares) % 2 else 0.5 * (shares[mid - 1] + shares[mid])


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, GPUSpec]:
    return {key: spec for spec in load_catalog() for key in _keys(spec)}


def _fuzzy(name: str, specs: Iterable[GPUSpec]) -> GPUSpec | None:
    """Match an NVML name that is not catalogued verbatim, only when exactly one GPU fits.

    A candidate's model words (its NVML name minus neutral words, e.g. 'h100') must all appear, every
    other word must be neutral (vendor, form factor, memory), and any stated memory size, memory type or
    form factor must agree. So 'NVIDIA H100 80GB HBM3' still finds the H100 SXM5, while 'NVIDIA H100 NVL',
    MIG slices ('... MIG 1g.10gb') and 'Tesla V100-PCIE-32GB' are refused rather than guessed.
    """
    words = set(_tokens(name))
    mem_sizes = {int(m.group(1)) for w in words if (m := _MEMORY_TOKEN.match(w))}
    mem_types = words & {"hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x"}
    sxm = {w for w in words if w.startswith("sxm")}
    pcie = "pcie" in words
    candidates: list[GPUSpec] = []
    for spec in specs:
        model = {t for t in _tokens(spec.nvml_name) if t not in _NEUTRAL_TOKENS and not _MEMORY_TOKEN.match(t)}
        if not model or not model <= words:
            continue
        if any(w not in model and w not in _NEUTRAL_TOKENS and not _MEMORY_TOKEN.match(w) for w in words):
            continue
        form = spec.form_factor.lower()
        if mem_sizes and mem_sizes != {round(spec.memory_gb)}:
            continue
        if mem_types and mem_types != {spec.memory_type.lower()}:
            continue
        if pcie and form != "pcie":
            continue
        if sxm and not (form.startswith("sxm") and all(s == "sxm" or s == form for s in sxm)):
            continue
        candidates.append(spec)
    if len(candidates) > 1 and not pcie:
        # NVML names of PCIe variants of SXM parts always say "PCIe"; without it, the SXM part is meant.
        candidates = [c for c in candidates if c.form_factor.lower() != "pcie"]
    return candidates[0] if len(candidates) == 1 else None


def resolve_gpu(name: str | GPUSpec) -> GPUSpec:
    """The catalogued GPU for an NVML name or alias, ignoring case, spaces, hyphens and underscores.

    Raises UnknownGPU (a ValueError) naming the valid choices and the closest matches.
    """
    if isinstance(name, GPUSpec):
        return name
    index = _index()
    key = _normalise(str(name))
    spec = index.get(key) or index.get(_strip_vendor(key))
    if spec is None:
        spec = _fuzzy(str(name), load_catalog())
    if spec is None:
        raise UnknownGPU(_unknown_message(str(name)))
    return spec


def _unknown_message(name: str) -> str:
    labels: dict[str, str] = {}
    for spec in load_catalog():
        for label in (spec.nvml_name, *spec.aliases):
            labels.setdefault(_normalise(label), label)
    near = difflib.get_close_matches(_strip_vendor(_normalise(name)), list(labels), n=3, cutoff=0.6)
    choices = ", ".join(f"{short_name(s)} ({s.nvml_name})" for s in load_catalog())
    hint = f" Did you mean: {', '.join(labels[n] for n in near)}?" if near else ""
    return f"Unknown GPU {name!r}.{hint} Valid choices: {choices}."


def canonical_name(name: str | GPUSpec) -> str:
    """The NVML name of a GPU given any accepted spelling; use it as the join key in data sets."""
    return resolve_gpu(name).nvml_name


def gpu_names() -> list[str]:
    """NVML names of every catalogued GPU, in file order."""
    return [spec.nvml_name for spec in load_catalog()]


def short_name(spec: GPUSpec | str) -> str:
    """Compact label (first alias) for a spec or any accepted spelling of a GPU name."""
    return resolve_gpu(spec).short_name
