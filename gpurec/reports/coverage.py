"""Extraction coverage over every torchvision classification model.

For each of ``gpurec.ops.classification_models()`` (80 in torchvision 0.26-0.29), at batch 1
and the model's resolution (224, or the largest ``min_size`` of its published weights when
that is bigger, e.g. 256 for Swin V2; 299 for inception_v3), in both modes, records:
extraction time, operation count, distinct operations, the sum of the operations' forward
FLOPs against ``FlopCounterMode`` over the same forward (``gpurec.ops.reference_flops``),
and any failure.

The sweep (``measure``, about two minutes on 2 cores) writes ``benchmarks/coverage.json``
with the machine it ran on; ``render`` turns that JSON into ``docs/coverage.md``, so the
document can be regenerated (and checked) without re-running the sweep:

    gpurec report coverage --measure   # sweep, then render
    gpurec report coverage             # render the committed JSON
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpurec.dataset.store import atomic_write_text
from gpurec.reports.machine import describe
from gpurec.reports.markdown import table

JSON_PATH = Path("benchmarks") / "coverage.json"

TOLERANCE = 0.01  # |ours / FlopCounterMode - 1|


def resolution_of(name: str) -> int:
    """224, 299 for inception_v3, or the model's minimum input size where that is larger.

    The minimum is the smallest ``min_size`` over the model's published weights (ViT's
    SWAG end-to-end weights need 384-518, but the default-built model takes 224; Swin V2's
    only weights need 256)."""
    if name == "inception_v3":
        return 299
    import torchvision.models as tvm

    try:
        sizes = [int(max(w.meta["min_size"])) for w in tvm.get_model_weights(name) if w.meta.get("min_size")]
    except Exception:
        sizes = []
    return max(224, min(sizes)) if sizes else 224


def sweep_one(name: str, batch: int = 1) -> list[dict[str, Any]]:
    from gpurec.ops import build_torchvision_meta, extract_operations, reference_flops

    res = resolution_of(name)
    shape = (batch, 3, res, res)
    t0 = time.perf_counter()
    build_error = None
    try:
        build_torchvision_meta(name)
    except Exception as exc:
        build_error = f"{type(exc).__name__}: {exc}"
    build_s = time.perf_counter() - t0
    rows = []
    for mode in ("inference", "training"):
        row: dict[str, Any] = {"model": name, "resolution": res, "mode": mode, "build_s": build_s, "batch": batch}
        if build_error:
            row["error"] = f"build: {build_error}"
            rows.append(row)
            continue
        try:
            t0 = time.perf_counter()
            try:
                ops = extract_operations(name, shape, mode=mode, keep_sources=False)
            except Exception as exc:
                # BatchNorm cannot train on one value per channel (inception_v3's auxiliary
                # classifier at batch 1 is 1x1): PyTorch itself refuses, so batch 2 is the minimum.
                if mode != "training" or "more than 1 value per channel" not in str(exc):
                    raise
                row["batch"] = 2
                shape = (2, 3, res, res)
                t0 = time.perf_counter()
                ops = extract_operations(name, shape, mode=mode, keep_sources=False)
            row["extract_s"] = time.perf_counter() - t0
            row["ops"] = len(ops)
            row["distinct"] = len({op.signature for op in ops})
            row["flops"] = sum(op.flops for op in ops)
            row["kinds"] = len({op.kind for op in ops})
        except Exception as exc:
            row["error"] = f"extract: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            row["trace"] = traceback.format_exc(limit=4)
            rows.append(row)
            continue
        try:
            ref = reference_flops(name, shape, mode=mode)
            row["ref_flops"] = ref
            row["ratio"] = row["flops"] / ref if ref else (1.0 if row["flops"] == 0 else float("inf"))
        except Exception as exc:
            row["error"] = f"reference: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        rows.append(row)
    return rows


def within(row: dict[str, Any]) -> bool:
    return "error" not in row and abs(row.get("ratio", 0.0) - 1.0) <= TOLERANCE


def measure(models: list[str] | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Sweep ``models`` (default: every torchvision classifier); returns the JSON-able result.
    ``progress`` hears one line per model, and the traceback of any failure."""
    from gpurec.ops import classification_models
    from gpurec.reports.machine import machine_info

    say = progress or (lambda msg: None)
    machine = machine_info()
    models = list(models) if models else list(classification_models())
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, m in enumerate(models):
        t_m = time.perf_counter()
        out = sweep_one(m)
        status = "; ".join(r["error"] for r in out if "error" in r) or " ".join(
            f"{r['mode'][:3]}={r.get('ratio', float('nan')):.4f}" for r in out)
        say(f"[{i + 1}/{len(models)}] {m}: {status} ({time.perf_counter() - t_m:.1f} s)")
        for r in out:
            if "trace" in r:
                say(r.pop("trace"))
        rows.extend(out)
    return {"machine": machine, "wall_s": time.perf_counter() - t0, "tolerance": TOLERANCE, "models": models,
            "rows": rows}


def render(data: dict[str, Any]) -> str:
    """docs/coverage.md from a ``measure`` result."""
    rows, models, wall_s, machine = data["rows"], data["models"], data["wall_s"], data["machine"]
    by_model: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    ok_models = [m for m in models if by_model.get(m) and all(within(r) for r in by_model[m])]
    failed = [r for r in rows if "error" in r]
    off = [r for r in rows if "error" not in r and not within(r)]
    lines = [
        "# Extraction coverage",
        "",
        "Generated by `gpurec report coverage` from `benchmarks/coverage.json` (do not edit by hand; "
        "`gpurec report coverage --measure` re-runs the sweep): every torchvision",
        "classification model (`gpurec.ops.classification_models()`), batch 1, both modes.",
        "Resolution is 224, 299 for inception_v3, or the model's minimum input size where that is",
        "larger (the smallest `min_size` over its published weights: 256 for the Swin V2 family).",
        "",
        "`ratio` is the sum of the extracted operations' forward FLOPs divided by",
        "`torch.utils.flop_counter.FlopCounterMode`'s count over the same forward",
        "(`gpurec.ops.reference_flops`); coverage requires it within "
        f"{TOLERANCE:.0%} in both modes.",
        "`extract s` is one extraction on a warm process (the meta-device model already built;",
        "`build s` is building it once, shared by both modes), measured on "
        f"{describe(machine)}.",
        "",
        f"**{len(ok_models)}/{len(models)} models within {TOLERANCE:.0%} of FlopCounterMode in both modes; "
        f"{len({r['model'] for r in failed})} failed; sweep took {wall_s:.0f} s.**",
        "",
    ]
    header = ["model", "res", "build s", "inference: extract s", "ops", "distinct", "GFLOPs", "ratio",
              "training: extract s", "ops", "distinct", "GFLOPs", "ratio", "status"]
    table_rows = []

    def cells(r: dict[str, Any] | None) -> list[str]:
        if r is None or "ops" not in r:
            return ["-"] * 5
        ratio = f"{r['ratio']:.4f}" if "ratio" in r else "-"
        return [f"{r['extract_s']:.2f}", str(r["ops"]), str(r["distinct"]), f"{r['flops'] / 1e9:.3f}", ratio]

    for m in models:
        rs = {r["mode"]: r for r in by_model.get(m, [])}
        inf, tr = rs.get("inference"), rs.get("training")
        any_r = inf or tr or {}
        errs = [f"{mode}: {r['error']}" for mode, r in rs.items() if "error" in r]
        status = "ok" if not errs and all(within(r) for r in rs.values()) else ("; ".join(errs) or "off")
        bumped = [mode for mode, r in rs.items() if r.get("batch", 1) != 1]
        if bumped:
            status += f" ({', '.join(bumped)} at batch 2: BatchNorm cannot train on 1 value per channel at batch 1)"
        table_rows.append([m, str(any_r.get("resolution", "-")), f"{any_r.get('build_s', 0.0):.2f}",
                           *cells(inf), *cells(tr), status])
    lines += [table(header, table_rows, align="l" + "r" * 12 + "l"), ""]
    if failed or off:
        lines.append("## Failures and deviations")
        lines.append("")
        for r in failed:
            lines.append(f"- {r['model']} ({r['mode']}): {r['error']}")
        for r in off:
            lines.append(f"- {r['model']} ({r['mode']}): ratio {r['ratio']:.4f}")
        lines.append("")
    return "\n".join(lines)


def generate(root: Path | str = ".", measure_first: bool = False, models: list[str] | None = None,
             progress: Callable[[str], None] | None = None) -> str:
    """docs/coverage.md under the repository ``root`` from benchmarks/coverage.json; with
    ``measure_first`` the sweep runs first and rewrites that JSON.  Returns the text."""
    root = Path(root)
    path = root / JSON_PATH
    if measure_first:
        atomic_write_text(path, json.dumps(measure(models, progress), indent=1) + "\n")
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `gpurec report coverage --measure` (about two minutes)")
    text = render(json.loads(path.read_text())) + "\n"
    atomic_write_text(root / "docs" / "coverage.md", text)
    return text
