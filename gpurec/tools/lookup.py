"""Rebuild the measured-operation lookup of trained models from the rows on disk, without a retrain.

Why: a measurement beats a prediction (gpurec.model.features.MeasuredLookup), but the lookup is
written once, by `gpurec train`, and a full retrain takes over an hour here.  Rows measured since
(a sweep aimed at shapes the boosters miss, or a user's own measurements of a GPU the models know)
reach predictions only through it.  The boosters, the network correction and the recorded
precision twins stay as trained; the rows get their targets exactly as training gives them
(gpurec.model.fitting.data.with_targets: in-network kernel time where measured, the unseen test
architectures' rows never), so a looked-up operation means the same before and after.  The
lookup as trained is kept beside it (persist.TRAINED_LOOKUP): its signatures are the training rows,
which `gpurec tools fp16-twins` reads.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpurec.model.persist import REFRESH_KEY

__all__ = ["REFRESH_KEY", "LookupNotTrained", "refresh_lookup_into"]


class LookupNotTrained(ValueError):
    """The models hold no measured-operation lookup as trained (none was trained, or it was changed),
    so there is none to refresh."""


def refresh_lookup_into(model_dir: Path | str, data_root: Path | str | None = None) -> dict[str, Any]:
    """Write the lookup of every usable row of the GPUs the models were trained on into
    ``model_dir`` (atomically, the manifest re-sealed; the first refresh keeps the lookup as trained
    in TRAINED_LOOKUP) and return what changed per GPU and mode.
    Rows of other GPUs are counted, not used: the models' bands and corrections know only theirs."""
    from gpurec.dataset.store import atomic_write_set
    from gpurec.model.features import MeasuredLookup
    from gpurec.model.fitting.data import data_hash, load_tables, with_targets
    from gpurec.model.persist import LOOKUP, TRAINED_LOOKUP, TRAINED_LOOKUP_KEY, read_manifest, write_manifest

    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    if not manifest.get("measured_lookup"):
        raise LookupNotTrained(f"{model_dir} was trained without a measured-operation lookup (use_measured off); "
                               "retrain with it (`gpurec train`) to look measured operations up")
    before = _lookup_before(model_dir, manifest)
    cfg, sources = manifest.get("train_config", {}), manifest.get("target_sources", {})
    raw_ops, raw_nets, in_net = load_tables(data_root)
    ops, nets, _, dropped = with_targets(raw_ops, raw_nets, in_net, cfg.get("time_target", "auto"),
                                      cfg.get("gpu_time_source", "in_network"),
                                      recurrent_elapsed=bool(sources.get("recurrent_elapsed", True)))
    known = set(manifest.get("gpus_measured", []))
    other = ops[~ops["gpu"].isin(known)]
    new = MeasuredLookup.from_frame(ops[ops["gpu"].isin(known)], "_t_gpu", "_p_gpu")
    old = MeasuredLookup.read_parquet(before)
    changes: dict[str, dict[str, int]] = {}
    for key in sorted(set(old.table) | set(new.table)):
        a, b = old.table.get(key, {}), new.table.get(key, {})
        changes["|".join(key)] = {"before": len(a), "after": len(b), "added": len(b.keys() - a.keys()),
                                  "removed": len(a.keys() - b.keys()),
                                  "changed": sum(1 for s in a.keys() & b.keys() if a[s] != b[s])}
    writes: dict[Path, Any] = {model_dir / LOOKUP: new.to_parquet}
    kept = {}
    if not manifest.get(TRAINED_LOOKUP_KEY):  # the first refresh keeps the lookup as trained
        trained = before.read_bytes()  # byte for byte: its sha256 is the one the manifest sealed
        writes[model_dir / TRAINED_LOOKUP] = lambda path: Path(path).write_bytes(trained)
        kept = {TRAINED_LOOKUP_KEY: TRAINED_LOOKUP}
    atomic_write_set(writes)  # both files renamed together
    record = {"refreshed": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "data_sha256": data_hash(ops, nets), "rows": len(new), "by_gpu_mode": changes,
              "rows_of_other_gpus_not_used": {str(g): int(n) for g, n in other["gpu"].value_counts().items()},
              "rows_dropped": {k: int(v) for k, v in dropped.items() if v}}
    write_manifest(model_dir, {**manifest, **kept, REFRESH_KEY: record})  # last: it seals both files
    return record


def _lookup_before(model_dir: Path, manifest: dict[str, Any]) -> Path:
    """The lookup the manifest seals, to compare with (and, on a first refresh, to keep as trained).

    A first refresh interrupted after writing the new files but before the manifest leaves the
    lookup as trained only in TRAINED_LOOKUP: it is taken from there, so a rerun never keeps the
    refreshed table as the trained one."""
    from gpurec.model.persist import FILES_KEY, LOOKUP, TRAINED_LOOKUP, TRAINED_LOOKUP_KEY, _sha256

    def sealed(path: Path) -> bool:
        want = manifest.get(FILES_KEY, {}).get(LOOKUP)
        return path.is_file() and want is not None and _sha256(path) == want

    if manifest.get(TRAINED_LOOKUP_KEY):
        return model_dir / LOOKUP  # the trained one is kept already: this only counts the changes
    for path in (model_dir / LOOKUP, model_dir / TRAINED_LOOKUP):
        if sealed(path):
            return path
    raise LookupNotTrained(f"{model_dir / LOOKUP} is not the lookup {model_dir}'s manifest seals, and no kept copy "
                           "is: restore the model directory (e.g. `git checkout models/`) or retrain (`gpurec train`)")
