"""Calibration plots (matplotlib, Agg): what a reader checks before trusting the numbers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gpurec.calibrate.fit import LEVELS


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def energy_vs_accesses(rows: list[dict[str, Any]], fits: list[dict[str, Any]], levels: dict[str, Any],
                       path: Path) -> Path:
    """Measurement energy per launch vs sectors per launch, for the lower-bound config of each level."""
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(10, 8))
    for ax, level in zip(axes.flat, LEVELS, strict=True):
        lb = levels.get(level) or {}
        cands = [f for f in fits if f["level"] == level and not f["div"]
                 and f["threads"] == lb.get("threads_per_block")]
        fit = min(cands, key=lambda f: f["pj_per_sector"], default=None)
        ax.set_title(level)
        if fit is None:
            ax.text(0.5, 0.5, "no fit", ha="center", transform=ax.transAxes)
            continue
        pts = [r for r in rows if r["config_id"] == fit["config_id"] and not r["warmup_only"]]
        xs = [r["sectors_per_launch"] for r in pts]
        ax.scatter(xs, [r["meas_energy_mj"] for r in pts], s=12)
        if xs and math.isfinite(fit["pj_per_sector"]):
            x0, x1 = 0.0, max(xs)
            ax.plot([x0, x1], [fit["offset_mj"] + fit["pj_per_sector"] * 1e-9 * x for x in (x0, x1)], "r-",
                    label=f"{fit['pj_per_sector']:.0f} pJ/sector, r2={fit['r2']:.3f}")
            ax.legend(fontsize=8)
        ax.set_xlabel(f"sectors per launch (T={fit['threads']}, blocks={fit['blocks']})")
        ax.set_ylabel("measurement energy per launch [mJ]")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def eps_vs_threads(fits: list[dict[str, Any]], path: Path) -> Path:
    """pJ per sector vs threads per block, one line per level (LOAD fits, each blocks value)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5))
    for level in LEVELS:
        for blocks in sorted({f["blocks"] for f in fits if f["level"] == level}):
            pts = sorted((f["threads"], f["pj_per_sector"]) for f in fits
                         if f["level"] == level and f["blocks"] == blocks and not f["div"]
                         and math.isfinite(f["pj_per_sector"]) and f["pj_per_sector"] > 0)
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", label=f"{level} ({blocks} blocks)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("threads per block")
    ax.set_ylabel("energy per access [pJ / 32-B sector]")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def miss_rate(sweep: list[dict[str, Any]], path: Path) -> Path:
    """Measurement-loop miss rate vs footprint, L1 and L2 (seed Fig. 5.4)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for level in ("l1", "l2"):
        pts = sorted((r["footprint_bytes"] if level == "l2" else r["array_bytes"], r["miss_rate"])
                     for r in sweep if r["level"] == level)
        if pts:
            ax.plot([p[0] / 1024 for p in pts], [p[1] for p in pts], "o-",
                    label=f"{level} ({'total' if level == 'l2' else 'per block'})")
    ax.set_xscale("log")
    ax.set_xlabel("array size [KiB]")
    ax.set_ylabel("miss rate (measurement loop)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def eps_comparison(per_gpu: dict[str, dict[str, float]], path: Path,
                   reference: dict[str, float] | None = None, reference_label: str = "A100 (seed, base clock)") -> Path:
    """Grouped bars of pJ per sector per level: the reference (seed A100) and each calibrated GPU."""
    plt = _plt()
    series = ([(reference_label, reference)] if reference else []) + list(per_gpu.items())
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    width = 0.8 / max(1, len(series))
    for i, (label, vals) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(LEVELS))]
        ys = [vals.get(lv) if vals.get(lv) is not None else float("nan") for lv in LEVELS]
        bars = ax.bar(xs, ys, width, label=label)
        for b, y in zip(bars, ys, strict=True):
            if math.isfinite(y):
                ax.annotate(f"{y:.0f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(LEVELS)), list(LEVELS))
    ax.set_yscale("log")
    ax.set_ylabel("energy per access [pJ / 32-B sector]")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(result: dict[str, Any], fits: list[dict[str, Any]], sweep: list[dict[str, Any]], out_dir: Path
              ) -> list[Path]:
    """Every plot that has data; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    rows = result.get("points", [])
    if fits:
        paths.append(energy_vs_accesses(rows, fits, result.get("levels", {}), out_dir / "energy_vs_accesses.png"))
        paths.append(eps_vs_threads(fits, out_dir / "eps_vs_threads.png"))
    if sweep:
        paths.append(miss_rate(sweep, out_dir / "miss_rate.png"))
    return paths
