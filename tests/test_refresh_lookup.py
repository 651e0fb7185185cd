"""`gpurec tools refresh-lookup`: operations measured after training are looked up with the targets
training gives them (in-network kernel time where measured), only for the GPUs the models know;
the model directory stays sealed and keeps the lookup as trained (its signatures are the training
rows `gpurec tools fp16-twins` reads)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SHIPPED = Path(__file__).resolve().parents[1] / "models"
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def _as_trained(models: Path, **changes: object) -> None:
    """Make a copy of the shipped models look as trained: never refreshed, no kept lookup (and
    ``changes`` to the manifest)."""
    from gpurec.model.persist import (
        REFRESH_KEY,
        TRAINED_LOOKUP,
        TRAINED_LOOKUP_KEY,
        read_manifest,
        write_manifest,
    )

    manifest = {k: v for k, v in read_manifest(models).items() if k not in (TRAINED_LOOKUP_KEY, REFRESH_KEY)}
    (models / TRAINED_LOOKUP).unlink(missing_ok=True)
    write_manifest(models, {**manifest, **changes})


def test_rows_measured_after_training_are_looked_up_as_training_targets(tmp_path: Path) -> None:
    from gpurec.model import load_predictor
    from gpurec.model.fitting.data import load_tables, with_targets
    from gpurec.model.persist import LOOKUP, TRAINED_LOOKUP, TRAINED_LOOKUP_KEY, read_manifest
    from gpurec.tools.lookup import REFRESH_KEY, refresh_lookup_into

    models = Path(shutil.copytree(SHIPPED, tmp_path / "m"))
    ops, _, _, _ = with_targets(*load_tables(None), "auto", "in_network")
    h100 = ops[ops["gpu"] == H100]
    # As models trained before some H100 rows were measured: their lookup lacks them.  Both kinds
    # of target are among them, so a refresh that looked up isolated times would be caught.
    later = pd.concat([h100[h100["_t_source"] == s].sample(40, random_state=0) for s in ("in_network", "host_free")])
    assert (later["_t_gpu"] != later["gpu_time_ms"]).any()
    table = pd.read_parquet(models / LOOKUP)
    gone = set(zip(later["mode"], later["op_signature"], strict=True))
    keep = [not (g == H100 and (m, s) in gone) for g, m, s in
            zip(table["gpu"], table["mode"], table["op_signature"], strict=True)]
    table[keep].to_parquet(models / LOOKUP, index=False)
    before = int((table[keep]["gpu"] == H100).sum())
    _as_trained(models, gpus_measured=[H100])  # the H200 rows are another GPU's now
    assert len(load_predictor(models, check_data=False).lookup.table[(H100, "inference")]) < \
        int((h100["mode"] == "inference").sum())

    record = refresh_lookup_into(models)
    got = load_predictor(models, check_data=False).lookup  # still sealed: it loads
    for mode, sig, t, w in zip(later["mode"], later["op_signature"], later["_t_gpu"], later["_p_gpu"], strict=True):
        assert got.table[(H100, mode)][sig] == (pytest.approx(t), pytest.approx(w))
    assert sum(len(v) for v in got.table.values()) == len(h100)
    assert not any(g == H200 for g, _ in got.table)
    assert record["rows_of_other_gpus_not_used"] == {H200: int((ops["gpu"] == H200).sum())}
    added = sum(v["added"] for k, v in record["by_gpu_mode"].items() if k.startswith(H100))
    assert added == len(h100) - before and record["by_gpu_mode"][f"{H200}|inference"]["after"] == 0
    assert np.isfinite([v[0] for d in got.table.values() for v in d.values()]).all()
    assert REFRESH_KEY in read_manifest(models)

    def as_trained() -> set[tuple[str, str, str]]:
        t = pd.read_parquet(models / read_manifest(models)[TRAINED_LOOKUP_KEY])
        return set(zip(t["gpu"], t["mode"], t["op_signature"], strict=True))

    trained = set(zip(table[keep]["gpu"], table[keep]["mode"], table[keep]["op_signature"], strict=True))
    assert read_manifest(models)[TRAINED_LOOKUP_KEY] == TRAINED_LOOKUP and as_trained() == trained
    refresh_lookup_into(models)  # a second refresh keeps the lookup as trained, not the first refresh's
    assert as_trained() == trained
    load_predictor(models, check_data=False)


def test_an_interrupted_first_refresh_keeps_the_lookup_as_trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    """Stopped after both lookup files were written but before the manifest sealed them, a rerun
    keeps the lookup the manifest had sealed as the trained one, not the refreshed table; a lookup
    changed by hand with no kept copy is refused."""
    import hashlib

    import gpurec.model.persist as persist
    from gpurec.model.persist import FILES_KEY, LOOKUP, TRAINED_LOOKUP, read_manifest
    from gpurec.tools.lookup import LookupNotTrained, refresh_lookup_into

    models = Path(shutil.copytree(SHIPPED, tmp_path / "m"))
    pd.read_parquet(models / LOOKUP).iloc[::2].to_parquet(models / LOOKUP, index=False)  # an older one: half the rows
    _as_trained(models)
    sealed = read_manifest(models)[FILES_KEY][LOOKUP]
    original = (models / LOOKUP).read_bytes()

    def stop(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(persist, "write_manifest", stop)
    with pytest.raises(KeyboardInterrupt):
        refresh_lookup_into(models)
    assert (models / LOOKUP).read_bytes() != original  # the new table is on disk, unsealed
    monkeypatch.undo()
    refresh_lookup_into(models)
    assert (models / TRAINED_LOOKUP).read_bytes() == original
    assert hashlib.sha256((models / TRAINED_LOOKUP).read_bytes()).hexdigest() == sealed

    other = Path(shutil.copytree(SHIPPED, tmp_path / "o"))
    _as_trained(other)
    pd.read_parquet(other / LOOKUP).iloc[1:].to_parquet(other / LOOKUP, index=False)  # edited after sealing
    with pytest.raises(LookupNotTrained, match="not the lookup"):
        refresh_lookup_into(other)
