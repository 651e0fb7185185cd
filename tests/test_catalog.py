"""The GPU catalogue: complete, self-consistent, and forgiving about how users spell GPU names."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from gpurec.catalog import (
    HARDWARE_FEATURES,
    GPUSpec,
    UnknownGPU,
    canonical_name,
    gpu_names,
    load_catalog,
    parse_catalog,
    resolve_gpu,
    short_name,
)

REQUIRED = [
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H100 PCIe",
    "NVIDIA H200",
    "NVIDIA A100-SXM4-40GB",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100-PCIE-40GB",
    "NVIDIA A100 80GB PCIe",
    "Tesla V100-SXM2-16GB",
    "Tesla V100-SXM2-32GB",
    "NVIDIA L4",
    "NVIDIA L40S",
    "NVIDIA A10",
    "Tesla T4",
    # the GPUs of NeuSight's public per-operation data (datasets/external/neusight)
    "Tesla P4",
    "Tesla P100-PCIE-16GB",
    "Tesla V100-PCIE-32GB",
]

POSITIVE_FIELDS = [
    "sm_count", "max_sm_clock_mhz", "fp32_tflops", "tf32_tflops", "fp16_tflops", "bf16_tflops",
    "memory_gb", "memory_bandwidth_gbs", "l2_cache_mb", "l1_shared_kb_per_sm", "tdp_w", "release_year",
]


def _raw() -> dict:
    return json.loads(resources.files("gpurec").joinpath("data/gpus.json").read_text(encoding="utf-8"))


def _norm(s: str) -> str:
    return "".join(ch for ch in s.lower() if ch.isalnum())


def test_required_gpus_present() -> None:
    missing = set(REQUIRED) - set(gpu_names())
    assert not missing, f"missing from gpus.json: {sorted(missing)}"


def test_top_level_document() -> None:
    raw = _raw()
    assert raw["schema_version"] == 1
    assert "dense" in raw["notes"].lower() and "sparsity" in raw["notes"].lower()
    assert len(raw["gpus"]) == len(load_catalog())


@pytest.mark.parametrize("spec", load_catalog(), ids=lambda s: s.nvml_name)
def test_fields_positive_and_plausible(spec: GPUSpec) -> None:
    for name in POSITIVE_FIELDS:
        value = getattr(spec, name)
        assert isinstance(value, (int, float)) and not isinstance(value, bool), name
        assert value > 0, f"{spec.nvml_name}.{name} = {value}"
    assert spec.base_sm_clock_mhz is None or 0 < spec.base_sm_clock_mhz <= spec.max_sm_clock_mhz
    assert spec.architecture and spec.memory_type and spec.form_factor
    major, minor = spec.compute_capability.split(".")
    assert major.isdigit() and minor.isdigit()
    # Tensor-core rates never fall below the CUDA-core FP32 rate, and FP32 is bounded by SMs x clock.
    assert spec.fp16_tflops >= spec.fp32_tflops and spec.tf32_tflops >= spec.fp32_tflops
    fp32_bound = spec.sm_count * 128 * 2 * spec.max_sm_clock_mhz * 1e6 / 1e12
    assert spec.fp32_tflops <= fp32_bound * 1.02, f"{spec.nvml_name} fp32 above SMs x 128 lanes x clock"


@pytest.mark.parametrize("spec", load_catalog(), ids=lambda s: s.nvml_name)
def test_every_entry_has_sources(spec: GPUSpec) -> None:
    assert isinstance(spec.sources, tuple) and len(spec.sources) >= 1
    assert all(src.startswith("https://") for src in spec.sources)


def test_aliases_unique_across_file() -> None:
    seen: dict[str, str] = {}
    for spec in load_catalog():
        assert spec.aliases, f"{spec.nvml_name} has no alias (needed for short_name)"
        for alias in spec.aliases:
            key = _norm(alias)
            assert seen.get(key, spec.nvml_name) == spec.nvml_name, f"alias {alias!r} used twice"
            seen[key] = spec.nvml_name
    nvml_keys = {_norm(s.nvml_name): s.nvml_name for s in load_catalog()}
    for key, owner in seen.items():
        assert nvml_keys.get(key, owner) == owner, f"alias {key!r} collides with another GPU's NVML name"


def test_nvml_names_unique() -> None:
    names = gpu_names()
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", REQUIRED)
def test_resolve_by_nvml_name(name: str) -> None:
    assert resolve_gpu(name).nvml_name == name
    assert canonical_name(name) == name


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("H100", "NVIDIA H100 80GB HBM3"),
        ("h100", "NVIDIA H100 80GB HBM3"),
        ("h100_sxm", "NVIDIA H100 80GB HBM3"),
        ("H100 PCIe", "NVIDIA H100 PCIe"),
        ("A100", "NVIDIA A100-SXM4-80GB"),
        ("a100 40gb", "NVIDIA A100-SXM4-40GB"),
        ("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"),
        ("V100", "Tesla V100-SXM2-32GB"),
        ("v100_16gb", "Tesla V100-SXM2-16GB"),
        ("t4", "Tesla T4"),
        ("  nvidia l40s ", "NVIDIA L40S"),
        ("NVIDIA_H200", "NVIDIA H200"),
        ("nvidia-a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB"),
        ("rtx 4090", "NVIDIA GeForce RTX 4090"),
    ],
)
def test_resolve_alias_and_odd_spelling(query: str, expected: str) -> None:
    assert canonical_name(query) == expected


def test_resolve_nvml_variant_conservatively() -> None:
    # A differently formatted NVML name is matched only when exactly one GPU fits.
    assert canonical_name("NVIDIA H100 SXM5 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert canonical_name("NVIDIA A100 SXM4 40GB") == "NVIDIA A100-SXM4-40GB"
    for unknown in ("NVIDIA H100 NVL", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "Tesla V100-PCIE-16GB",
                    "NVIDIA A10G", "NVIDIA RTX A6000"):
        with pytest.raises(UnknownGPU):
            resolve_gpu(unknown)


def test_unknown_name_lists_choices_and_suggests() -> None:
    with pytest.raises(UnknownGPU) as info:
        resolve_gpu("H1000")
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "Valid choices" in message
    for name in REQUIRED:
        assert name in message
    assert "Did you mean" in message and "H100" in message


def test_resolve_accepts_spec() -> None:
    spec = load_catalog()[0]
    assert resolve_gpu(spec) is spec


def test_short_name_is_first_alias() -> None:
    for spec in load_catalog():
        assert short_name(spec) == spec.aliases[0] == spec.short_name
    assert short_name("NVIDIA A100-SXM4-80GB") == resolve_gpu("A100").aliases[0]


@pytest.mark.parametrize("spec", load_catalog(), ids=lambda s: s.nvml_name)
def test_features(spec: GPUSpec) -> None:
    feats = spec.features()
    assert tuple(feats) == HARDWARE_FEATURES
    assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in feats.values())
    expected = spec.fp32_tflops * 1e12 / (spec.memory_bandwidth_gbs * 1e9)
    assert feats["ridge_fp32_flop_per_byte"] == pytest.approx(expected)
    assert feats["ridge_tf32_flop_per_byte"] >= feats["ridge_fp32_flop_per_byte"]


def test_h100_figures_are_dense() -> None:
    h100 = resolve_gpu("H100")
    assert h100.fp16_tflops == pytest.approx(989.4, rel=0.01)  # 1979 TFLOPS is the sparse figure
    assert h100.tf32_tflops == pytest.approx(494.7, rel=0.01)
    assert h100.memory_bandwidth_gbs == 3350


def test_load_catalog_is_cached() -> None:
    assert load_catalog() is load_catalog()


def test_parse_catalog_rejects_bad_documents() -> None:
    raw = _raw()
    dup = json.loads(json.dumps(raw))
    dup["gpus"][1]["aliases"].append("h-100")  # normalises to H100's alias
    with pytest.raises(ValueError, match="claimed by both"):
        parse_catalog(dup)
    typo = json.loads(json.dumps(raw))
    typo["gpus"][0]["fp32_tflop"] = 1.0
    with pytest.raises(ValueError, match="unknown fields"):
        parse_catalog(typo)
    with pytest.raises(ValueError, match="schema_version"):
        parse_catalog({**raw, "schema_version": 99})


def test_import_needs_neither_torch_nor_nvml() -> None:
    code = (
        "import sys\n"
        "for m in ('torch', 'pynvml', 'numpy', 'pandas'): sys.modules[m] = None\n"
        "from gpurec.catalog import resolve_gpu\n"
        "print(resolve_gpu('h100').nvml_name)\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, env=env)
    assert out.stdout.strip() == "NVIDIA H100 80GB HBM3"
