"""`gpurec tools refresh-lookup`: operations measured after training are looked up with the targets
training gives them (in-network kernel time where measured), only for the GPUs the models know;
the model directory stays sealed, and the tool that reads the lookup as the training rows refuses
a refreshed one."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SHIPPED = Path(__file__).resolve().parents[1] / "models"
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def test_rows_measured_after_training_are_looked_up_as_training_targets(tmp_path: Path) -> None:
    from gpurec.model import load_predictor
    from gpurec.model.fitting.data import load_tables, with_targets
    from gpurec.model.persist import LOOKUP, read_manifest, write_manifest
    from gpurec.tools.lookup import REFRESH_KEY, refresh_lookup_into
    from gpurec.tools.precision_twins import TrainingRowsNotFound, fp16_twins_into

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
    manifest = read_manifest(models)
    write_manifest(models, {**manifest, "gpus_measured": [H100]})  # the H200 rows are another GPU's now
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
    with pytest.raises(TrainingRowsNotFound, match="refreshed after training"):
        fp16_twins_into(models)
