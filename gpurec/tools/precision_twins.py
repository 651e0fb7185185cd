"""Record, in models trained before `gpurec train` did, which operation kinds their rows held at
bf16 and never at fp16 (FeatureConfig.fp16_as_bf16_kinds, gpurec.model.features.fp16_as_bf16_kinds).

Why: the time and power boosters read an operation's math mode; for a kind they never saw at
fp16, that feature moves the prediction by whatever the trees learnt for other kinds (the fp16
GPT head, an F.linear seen only at bf16, came out 40% below its bf16 twin), while on GPUs with
equal fp16 and bf16 peaks the two run alike.  The training rows are the models' own: the
signatures of their measured-operation lookup as trained (one per training row), matched to the committed
operation tables.  Their math mode is what the boosters saw, read off the half-precision rows'
operations extracted again (a label alone would be wrong: under autocast an add runs in its inputs'
dtype, a LayerNorm in fp32, and under bf16 autocast cuDNN's LSTM and GRU run in fp16).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class TrainingRowsNotFound(ValueError):
    """The committed tables no longer hold every training row of the models."""


def fp16_twins_into(model_dir: Path | str, data_root: Path | str | None = None) -> dict[str, Any]:
    """Write the kinds into ``model_dir``'s manifest (atomically) and return them with their
    evidence: the training rows, and each half-precision label's kinds by the math mode they ran."""
    import pandas as pd

    from gpurec.dataset import load_dataset
    from gpurec.model.features import HALF_TWINS, SetExtractor, fp16_as_bf16_kinds, operations_of_rows
    from gpurec.model.persist import LOOKUP, TRAINED_LOOKUP_KEY, read_manifest, write_manifest
    from gpurec.ops.features import MATH_MODES
    from gpurec.ops.precision import precision_column

    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    # the lookup as trained where `gpurec tools refresh-lookup` rebuilt it from later rows
    trained = manifest.get(TRAINED_LOOKUP_KEY) or LOOKUP
    lookup = pd.read_parquet(model_dir / trained, columns=["gpu", "mode", "op_signature"])
    ops = load_dataset(root=data_root, table="operations")
    ops = ops.assign(precision=precision_column(ops))
    cols = ["gpu", "mode", "op_signature", "op_kind", "precision", "set_key", "model_sets"]
    rows = lookup.merge(ops[[c for c in cols if c in ops]].drop_duplicates(["gpu", "mode", "op_signature"]),
                        on=["gpu", "mode", "op_signature"], how="left")
    missing = int(rows["op_kind"].isna().sum())
    if missing:
        raise TrainingRowsNotFound(
            f"{missing} of the {len(rows)} training rows of {model_dir} are not in the operation tables of "
            f"{data_root or 'datasets/'}: run this against the data the models were trained on (a checkout of "
            "their commit), or retrain (`gpurec train`), which records the kinds itself")
    halves = [p for pair in HALF_TWINS for p in pair]
    half = rows[rows["precision"].isin(halves)].reset_index(drop=True)
    matched = operations_of_rows(half, SetExtractor(None))  # every set once: about a minute
    kinds, modes = matched.block.kinds.tolist(), matched.block.column("math_mode").tolist()
    found = half.iloc[matched.row_index]
    twins = fp16_as_bf16_kinds(kinds, modes)
    by_label = {p: {MATH_MODES[int(m)]: sorted({k for k, q, mm in zip(kinds, found["precision"], modes, strict=True)
                                                if q == p and mm == m}) for m in sorted(set(modes))}
                for p in halves}
    manifest = dict(manifest)
    manifest["feature_config"] = {**manifest["feature_config"], "fp16_as_bf16_kinds": list(twins)}
    manifest["fp16_as_bf16_fitted_after_training"] = {
        "training_rows": int(len(rows)), "rows_by_precision": {p: int((rows["precision"] == p).sum()) for p in halves},
        "half_precision_rows_not_extracted": matched.unmatched}
    write_manifest(model_dir, manifest)
    return {"fp16_as_bf16_kinds": list(twins), "training_rows": int(len(rows)),
            "kinds_by_precision_and_math_mode": by_label,
            "half_precision_rows_not_extracted": matched.unmatched}
