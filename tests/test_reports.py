"""`gpurec report`: the committed documents are exactly what the report code makes from the
committed data, models and benchmark JSON; and the pieces those reports rest on."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cli
from gpurec.reports import OUTPUTS, REPORTS, generate

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report inputs copied to a temporary root, so regenerating never touches the checkout."""
    root = tmp_path_factory.mktemp("repo")
    for part in ("datasets", "models", "benchmarks", "tests/fixtures/profile/real"):
        shutil.copytree(ROOT / part, root / part)
    return root


def _regenerated_files(name: str) -> list[str]:
    """Text files (relative to the root) a report writes besides its document."""
    if name == "profile":
        return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "datasets/h100/profile/runs").glob("*.json"))
    return []


@pytest.mark.parametrize("name", REPORTS)
def test_committed_report_is_what_gpurec_report_makes(repo_copy: Path, name: str) -> None:
    if name == "validation":
        pytest.importorskip("xgboost")  # its "now" column predicts with the shipped models
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = generate(name, repo_copy, progress=lambda msg: None)
    assert path == repo_copy / OUTPUTS[name]
    for rel in [OUTPUTS[name], *_regenerated_files(name)]:
        committed = (ROOT / rel).read_text(encoding="utf-8")
        assert (repo_copy / rel).read_text(encoding="utf-8") == committed, (
            f"{rel} differs from what `gpurec report {name}` makes from the committed data: "
            f"run `gpurec report {name}` and commit the result")
    for img in ("docs/img", "datasets/img"):  # every image a document links to was drawn
        doc = (repo_copy / OUTPUTS[name]).read_text(encoding="utf-8")
        for line in doc.splitlines():
            if f"]({Path(img).name}/" in line or "](img/" in line:
                target = line.split("](", 1)[1].split(")", 1)[0]
                assert (repo_copy / OUTPUTS[name]).parent.joinpath(target).exists(), target


def test_every_report_has_a_committed_document() -> None:
    assert set(OUTPUTS) == set(REPORTS)
    for rel in OUTPUTS.values():
        assert (ROOT / rel).exists(), rel
    assert not list((ROOT / "scripts").glob("*.py")), "scripts/ keeps only the shell scripts"


def _speed_data(vit_ms: float) -> dict:
    machine = {"host_cpu": "Fake CPU", "machine": "x86_64", "cores": 2, "torch_threads": 2,
               "load_avg_1_5_15_min": [3.5, 2.0, 1.0], "python": "3.11", "torch": "2.x", "torchvision": "0.x",
               "date_utc": "2099-01-01 00:00"}
    results = [{"label": "vit_b_16 later calls, median", "value": vit_ms, "unit": "ms", "target": 50.0,
                "met": vit_ms <= 50.0},
               {"label": "predict_many, 60 cached candidates", "value": 400.0, "unit": "cand/s", "target": 50.0,
                "met": True}]
    return {"machine": machine, "models_dir": "models",
            "prediction": {"gpu": "H100", "import_ms": 1.0, "load_predictor_ms": 900.0, "results": results,
                           "fresh_candidate": {"operations": 10, "stages_ms": {"a": 1.0, "b": 3.0}},
                           "fresh_extraction_split": {"candidates": 2, "ms_per_candidate": 4.0,
                                                      "stages_ms": {"x": 1.0, "y": 3.0}},
                           "vit_b_16_estimate": "est"},
            "extraction": {"batch": 32, "repeat": 5, "import_torch_torchvision_s": 2.0,
                           "rows": [{"model": "vit_b_16", "mode": "inference", "ops": 105, "distinct": 14,
                                     "cold_s": 0.5, "warm_s": 1.5}]}}


def test_speed_render_names_the_machine_and_the_missed_targets() -> None:
    from gpurec.reports.speed import render

    text = render(_speed_data(vit_ms=70.0))
    assert "Fake CPU (x86_64, 2 cores" in text and "load average 3.50" in text
    assert "| vit_b_16 later calls, median | 70.0 | ms | ≤ 50 | **not met** |" in text
    assert "targets not met on this run: vit_b_16 later calls, median." in text
    assert "vit_b_16 warm: 1.500 s, target **not met**" in text
    assert "| b | 3.0 | 75.0% |" in text  # shares of the fresh candidate's stages
    assert "Every prediction target is met" in render(_speed_data(vit_ms=5.0))


def test_coverage_render_reports_deviations() -> None:
    from gpurec.reports.coverage import render

    machine = {"host_cpu": "Fake CPU", "cores": 2}
    rows = [{"model": "a", "mode": "inference", "resolution": 224, "build_s": 0.1, "batch": 1, "extract_s": 0.2,
             "ops": 3, "distinct": 2, "flops": 2e9, "ratio": 1.0},
            {"model": "a", "mode": "training", "resolution": 224, "build_s": 0.1, "batch": 1, "extract_s": 0.2,
             "ops": 3, "distinct": 2, "flops": 2e9, "ratio": 1.5},
            {"model": "b", "mode": "inference", "resolution": 224, "build_s": 0.1, "batch": 1,
             "error": "extract: boom"}]
    text = render({"machine": machine, "wall_s": 3.0, "models": ["a", "b"], "rows": rows})
    assert "**0/2 models within 1% of FlopCounterMode in both modes; 1 failed; sweep took 3 s.**" in text
    assert "- a (training): ratio 1.5000" in text and "- b (inference): extract: boom" in text
    assert "Fake CPU" in text


def test_sum_operations_counts_multiplicity_and_coverage() -> None:
    from gpurec.validate import sum_operations

    measured = {"s1": (0.01, 1.0, 0.5), "s2": (1.0, 100.0, 60.0)}
    s = sum_operations([("s1", 10.0), ("s1", 10.0), ("s2", 30.0), ("s3", 50.0)], measured, tiny_ms=0.02)
    assert (s["ops"], s["covered_ops"], s["coverage"]) == (4, 3, 0.75)
    assert s["flops_coverage"] == pytest.approx(0.5)
    assert s["sum_time_ms"] == pytest.approx(1.02) and s["sum_energy_mj"] == pytest.approx(102.0)
    assert s["sum_dynamic_energy_mj"] == pytest.approx(61.0)
    assert s["tiny_time_share"] == pytest.approx(0.02 / 1.02)


def test_counters_features_rebuild_the_committed_table() -> None:
    import pandas as pd

    from gpurec.tools.counters import build

    committed = pd.read_parquet(ROOT / "datasets/h200/counters/op_features.parquet")
    rebuilt = build(ROOT / "datasets/h200", root=ROOT)
    pd.testing.assert_frame_equal(rebuilt.reset_index(drop=True), committed.reset_index(drop=True),
                                  check_dtype=False)


def test_snapshot_compare_finds_a_changed_list(tmp_path: Path) -> None:
    from gpurec.tools import snapshot

    a = tmp_path / "a.json"
    assert snapshot.write(a, ["alexnet"]) == 4
    data = json.loads(a.read_text())
    assert snapshot.compare(a, a) == (4, 4, [])
    data["alexnet|inference|name"][0][2] += 1  # one operation's FLOPs changed
    b = tmp_path / "b.json"
    b.write_text(json.dumps(data))
    assert snapshot.compare(a, b) == (4, 4, ["alexnet|inference|name"])
    res = runner.invoke(cli.app, ["tools", "snapshot", "compare", str(a), str(b)])
    assert res.exit_code == 1 and "1 differ" in res.output


def test_report_cli(repo_copy: Path) -> None:
    assert runner.invoke(cli.app, ["report", "--help"]).exit_code == 0
    res = runner.invoke(cli.app, ["report", "nonsense"])
    assert res.exit_code == 2 and "choose one of" in res.output
    res = runner.invoke(cli.app, ["report", "accuracy", "--root", str(repo_copy / "models")])
    assert res.exit_code == 1 and "no datasets/ folder" in res.output
    res = runner.invoke(cli.app, ["report", "coverage", "--root", str(repo_copy)])
    assert res.exit_code == 0, res.output
    assert (repo_copy / "docs/coverage.md").read_text() == (ROOT / "docs/coverage.md").read_text()
