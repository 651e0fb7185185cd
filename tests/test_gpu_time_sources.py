"""The GPU-time-source comparison is written with its provenance and rendered in the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpurec.reports.accuracy import host_gpu_section


def test_comparison_is_written_with_provenance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpurec.model.fitting.data as data
    import gpurec.model.fitting.evaluate as evaluate
    from gpurec.tools import gpu_time_sources

    seen = {}

    def fake_compare(root, out_root, log=None, **kw):  # noqa: ANN001
        seen.update(kw)
        return {"in_network": {"test_archs_network": {"n": 36, "time_mape": 8.0, "energy_mape": 9.0},
                               "lofo_network": {"n": 192, "time_mape": 12.0, "energy_mape": 12.4},
                               "kfold_per_op": {"n": 5000, "time_mape": 15.0, "energy_mape": 18.0}}}

    monkeypatch.setattr(evaluate, "compare_gpu_time_sources", fake_compare)
    monkeypatch.setattr(data, "current_data_hash", lambda root: "abc")
    doc = gpu_time_sources.write(tmp_path, tmp_path / "s.json", tune_trials=0)
    assert seen == {"tune_trials": 0, "baselines": False}
    back = json.loads((tmp_path / "s.json").read_text())
    assert back["data_sha256"] == "abc" and back["sources"] == doc["sources"] and back["machine"]
    lines = "\n".join(host_gpu_section(None, {"targets": {}}, back))
    assert "| in_network | 8.0% / 9.0% (36) | 12.0% / 12.4% (192) | 15.0% / 18.0% (5000) |" in lines
