"""Fit the unaligned half-precision GEMM floor and the wide half-precision product model
(gpurec.model.gemm) into trained models.

Why: `gpurec train` fits them with everything else (over an hour here); this fits only them, in
seconds, from the training architectures' rows with the targets training gives them, and writes
them into the manifest.  The boosters, the lookup and the network correction stay as trained.
Returns the held-out sequence networks' errors before and after
(gpurec.tools.recurrent.evaluate_held_out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

AFTER_TRAINING_KEY = "unaligned_gemm_floor_fitted_after_training"
WIDE_AFTER_TRAINING_KEY = "wide_half_gemm_fitted_after_training"


def fit_gemm_floor_into(model_dir: Path | str, data_root: Path | str | None = None,
                        evaluate: bool = True) -> dict[str, Any]:
    """Fit the floor and the wide model and write them into ``model_dir``'s manifest (atomically).
    Returns the fit reports and, with ``evaluate``, the held-out sequence networks' MAPE before and
    after."""
    from gpurec.model.features import FeatureBuilder, FeatureConfig
    from gpurec.model.fitting.gemm_fit import fit_floor_on_data, fit_wide_on_data
    from gpurec.model.gemm import GEMM_FLOOR_KEY, WIDE_KEY
    from gpurec.model.persist import IncompatibleModel, read_manifest, write_manifest
    from gpurec.tools.recurrent import evaluate_held_out

    manifest = read_manifest(model_dir)
    builder = FeatureBuilder(manifest["kind_categories"], FeatureConfig.from_dict(manifest["feature_config"]),
                             manifest.get("extra_columns", []))
    floor, report = fit_floor_on_data(data_root, builder)
    wide, wide_report = fit_wide_on_data(data_root, builder)
    try:
        before = evaluate_held_out(model_dir, data_root) if evaluate else None
    except IncompatibleModel as e:  # a model saved under another rule: the refit is what mends it
        before = {"not evaluated": str(e)}
    manifest = dict(manifest)
    manifest[GEMM_FLOOR_KEY] = floor.as_dict() if floor is not None else None
    manifest[AFTER_TRAINING_KEY] = True
    manifest[WIDE_KEY] = wide.as_dict() if wide is not None else None
    manifest[WIDE_AFTER_TRAINING_KEY] = True
    write_manifest(model_dir, manifest)
    out: dict[str, Any] = {"fit": report, "wide_fit": wide_report}
    if evaluate:
        out["held_out_before"], out["held_out_after"] = before, evaluate_held_out(model_dir, data_root)
    return out
