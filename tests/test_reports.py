"""`gpurec report`: the tables the reports compute, checked as data, and the pieces those reports
rest on.  Whether the committed documents are exactly what the code makes is a separate CI step
(`.ci/check_docs`, a readable diff), so prose, data or a library upgrade never breaks these tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cli
from gpurec.reports import OUTPUTS, REPORTS

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report inputs copied to a temporary root, so regenerating never touches the checkout."""
    root = tmp_path_factory.mktemp("repo")
    for part in ("datasets", "models", "benchmarks", "tests/fixtures/profile/real"):
        shutil.copytree(ROOT / part, root / part)
    return root


def _summary(n: int, t: float, e: float, p: float) -> dict:
    return {"n": n, "time": {"mape": t, "within10": 0.5}, "energy": {"mape": e, "within10": 0.25},
            "power": {"mape": p}}


def _fake_report() -> dict:
    gpu = "NVIDIA H100 80GB HBM3"
    b = {"overall": _summary(10, 4.0, 6.0, 2.0),
         "by_gpu_mode": {f"{gpu}|training": _summary(4, 5.0, 7.0, 3.0),
                         f"{gpu}|inference": _summary(6, 3.0, 5.0, 1.0)}}
    return {"test_set": {"available": True, "measured_lookup": False, "corrected": b, "raw": b},
            "grouped_kfold": {"folds": 5, "xgboost": b},
            "leave_one_family_out": {"xgboost": {"per_op": b, "network_raw": b, "network_corrected": b}},
            "leave_one_gpu_out": {"available": True, "gpus": {gpu: {"xgboost": {"per_op": b}},
                                                              "NVIDIA H200": {"skipped": "too few rows"}}}}


def test_accuracy_error_tables_are_records_of_report_json() -> None:
    from gpurec.reports.accuracy import error_tables, render_error_rows

    tabs = error_tables(_fake_report())
    unseen = tabs["unseen"]
    assert [r["estimate"] for r in unseen] == ["summed ops + correction"] * 3 + ["same, before the network correction"] * 3
    # overall first, then GPU+mode sorted by key (inference before training)
    assert [(r["gpu"], r["mode"], r["rows"]) for r in unseen[:3]] == [
        ("all", "all", 10), ("NVIDIA H100 80GB HBM3", "inference", 6), ("NVIDIA H100 80GB HBM3", "training", 4)]
    assert unseen[1]["time_mape_pct"] == pytest.approx(3.0) and unseen[1]["energy_within10"] == pytest.approx(0.25)
    assert [(r["validation"], r["model"]) for r in tabs["per_operation"][::3]] == [
        ("k-fold (5)", "XGBoost"), ("leave-one-family-out", "XGBoost")]
    assert [r["estimate"] for r in tabs["whole_network"][::3]] == ["sum of ops", "sum + correction"]
    logo = tabs["leave_one_gpu_out"]
    assert logo[-1] == {"validation": "held out H200", "held_out_gpu": "NVIDIA H200", "skipped": "too few rows"}
    assert {r["level"] for r in logo[:-1]} == {"per op"}
    lines = render_error_rows(logo, ("validation", "model", "level"))
    assert lines[0] == "| held out H100 | XGBoost | per op | all | all | 10 | 4.0% | 50% | 6.0% | 25% | 2.0% |"
    assert lines[-1].startswith("| held out H200 | — | too few rows |")


def test_accuracy_tables_of_the_shipped_models_add_up() -> None:
    """The committed report.json's tables: every overall row count is the sum of its GPU+mode
    rows, errors are finite percentages, and the rendered document lists every record."""
    from gpurec.reports.accuracy import error_tables, render_error_rows

    rep = json.loads((ROOT / "models/report.json").read_text())
    tabs = error_tables(rep)
    assert tabs["unseen"] and tabs["per_operation"] and tabs["whole_network"]
    for name, recs in tabs.items():
        groups: list[list[dict]] = []
        for r in recs:
            if r.get("skipped"):
                continue
            if r["gpu"] == "all":
                groups.append([r])
            else:
                groups[-1].append(r)
        for g in groups:
            assert g[0]["rows"] == sum(r["rows"] for r in g[1:]) > 0, (name, g[0])
            for r in g:
                for k in ("time_mape_pct", "energy_mape_pct", "power_mape_pct"):
                    assert r[k] is None or 0 <= r[k] < 1000, (name, r)
                for k in ("time_within10", "energy_within10"):
                    assert r[k] is None or 0 <= r[k] <= 1, (name, r)
    doc = (ROOT / "docs/accuracy.md").read_text(encoding="utf-8")
    # the committed document shows the unseen-architecture table the code computes now
    for line in render_error_rows(tabs["unseen"], ("estimate",)):
        assert line in doc, line


@pytest.fixture(scope="module")
def committed_gpus() -> list:
    from gpurec.reports.dataset import load_all

    return load_all(ROOT / "datasets")


def test_dataset_host_free_tables_match_the_committed_tables(committed_gpus: list) -> None:
    import pandas as pd

    from gpurec.reports.dataset import (
        host_free_counts_table,
        host_free_repeatability_tables,
        in_network_vs_isolated_table,
        load_plan,
        sum_vs_network_table,
    )

    plan = load_plan(ROOT / "datasets/plans/main.json")
    counts = {r["gpu"]: r for r in host_free_counts_table(committed_gpus, plan)}
    assert set(counts) == {g.tag for g in committed_gpus}
    for g in committed_gpus:
        ops = g.t("operations")
        hf = ops[(ops["status"] == "ok") & (pd.to_numeric(ops["schema"], errors="coerce") >= 2)]
        r = counts[g.tag]
        assert r["operation_rows"] == len(hf)
        assert r["planned_operations"] == sum(1 for w in plan if w.get("item") == "op")
        assert r["captured_share"] is None or 0 <= r["captured_share"] <= 1
        assert r["attributed_training_sets"] <= r["training_sets"]
    assert counts["h100"]["operation_rows"] > 1000 and counts["h100"]["captured_share"] > 0.9
    rep = host_free_repeatability_tables(committed_gpus)
    assert rep["operations"], "the committed data has host-free repeat pairs"
    for r in rep["operations"]:
        assert r["pairs"] > 0 and 0 <= r["gpu_time_within"] <= 1 and r["gpu_time_median"] >= 0
    for r in rep["networks"]:
        # a network's host-free (graph) time is about its CUPTI kernel sum on the same machine
        assert 0.8 < r["host_free_over_kernel_sum_median"] < 1.25, r
        assert r["host_free_over_kernel_sum_p10"] <= r["host_free_over_kernel_sum_p90"]
    sums = [r for r in sum_vs_network_table(committed_gpus) if r["networks"]]
    assert sums
    for r in sums:
        assert r["full_networks"] <= r["networks"] and r["p10_ratio"] <= r["median_ratio"] <= r["p90_ratio"]
        assert 0.5 < r["median_ratio"] < 2.0, r  # isolated operations sum to about the network
    kinds = in_network_vs_isolated_table(committed_gpus)
    assert kinds and all(r["pairs"] > 0 and r["p25_ratio"] <= r["median_ratio"] <= r["p75_ratio"] for r in kinds)
    assert len({(r["gpu"], r["kind"]) for r in kinds}) == len(kinds)


def test_dataset_networks_across_table_pairs_the_gpus(committed_gpus: list) -> None:
    from gpurec.reports.dataset import networks_across_table, ok

    recs = networks_across_table(committed_gpus)
    assert {(r["first"], r["second"]) for r in recs} == {("h100", "h200")}
    h100, h200 = (ok(g.t("networks")) for g in sorted(committed_gpus, key=lambda g: g.tag))
    both = h100.merge(h200, on=["set_key", "mode"])
    assert sum(r["sets"] for r in recs) == len(both)
    for r in recs:
        assert 0 <= r["second_faster_share"] <= 1 and r["median_time_ratio"] > 0
        # the H200 is never much slower than the H100 on the same network
        assert r["median_time_ratio"] < 1.1, r


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
    text = (repo_copy / "docs/coverage.md").read_text()
    assert text.startswith("# ") and "FlopCounterMode" in text  # rendered; .ci/check_docs compares it whole


# The GPU layer: the CPU core (reports among it) never loads these.
GPU_LAYER = ("gpurec.device", "gpurec.collect", "gpurec.calibrate.calibrate", "gpurec.calibrate.build",
             "gpurec.calibrate.checks", "gpurec.calibrate.errors", "gpurec.calibrate.microbench",
             "gpurec.calibrate.sweep", "gpurec.profile.api", "gpurec.profile.ncu_io", "gpurec.profile.worker",
             "gpurec.validate.run")


def test_importing_every_report_module_loads_no_gpu_side_module() -> None:
    """A fresh interpreter imports every gpurec.reports module (and the offline parsers they
    read committed runs with); none of the GPU layer may come along."""
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys\n"
        "import gpurec.reports as r\n"
        "names = [f'gpurec.reports.{m.name}' for m in pkgutil.iter_modules(r.__path__)]\n"
        "names += ['gpurec.parsers.ncu', 'gpurec.profile.analysis', 'gpurec.validate.compare', 'gpurec.calibrate.summary']\n"
        "for n in names: importlib.import_module(n)\n"
        "from gpurec.profile import analyze, save_plots\n"
        "from gpurec.validate import sum_operations\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({GPU_LAYER!r}))\n"
        "print(len(names))\n"
        "sys.exit(f'GPU-side modules loaded: {bad}' if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.split()[-1]) >= 10


def test_layer_contract_holds() -> None:
    """`lint-imports` (the contracts in pyproject.toml) passes: the CPU core never imports the
    GPU layer, and model prediction never imports model training."""
    import shutil
    import subprocess

    exe = shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    r = subprocess.run([exe], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "broken" in r.stdout and " 0 broken" in r.stdout


def test_counters_features_join_the_eager_figures_of_superseded_rows() -> None:
    import pandas as pd

    from gpurec.tools.counters import eager_figures

    ops = pd.DataFrame({"time_ms": [1.0, 2.0], "energy_mj": [float("nan"), 5.0], "v1_time_ms": [3.0, float("nan")],
                        "v1_energy_mj": [30.0, float("nan")], "v1_power_w": [10.0, float("nan")]})
    got = eager_figures(ops)
    # the host-free row takes its eager predecessor's figures; the eager-only row keeps its own
    assert got["time_ms"].tolist() == [3.0, 2.0] and got["energy_mj"].tolist() == [30.0, 5.0]
    assert got["power_w"].iloc[0] == 10.0 and pd.isna(got["power_w"].iloc[1])


def test_unseen_before_and_after_say_how_many_networks_and_split_the_gpus() -> None:
    """The snapshot before scored fewer networks than the shipped models now do (test sets grow as
    GPUs measure them), and pooling H100 and H200 hides which GPU misses: both are shown."""
    from gpurec.reports.accuracy import energy_section, unseen_by_gpu

    def rec(gpu: str, key: str, t: float, w: float) -> dict:
        return {"gpu": gpu, "mode": "inference", "set_key": key, "measured_time_ms": 10.0, "measured_power_w": 100.0,
                "pred_time_ms": 10.0 * t, "pred_power_w": 100.0 * w}

    rep = {"test_set": {"records": [rec("NVIDIA H100 80GB HBM3", "a:b8:r224", 1.02, 1.0),
                                    rec("NVIDIA H200", "a:b8:r224", 1.30, 1.0)]}}
    by_gpu = unseen_by_gpu(rep)
    assert by_gpu["NVIDIA H100 80GB HBM3"]["inference"]["time_mape"] == pytest.approx(2.0)
    assert by_gpu["NVIDIA H200"]["inference"]["over_15pct"] == ["a:b8:r224"]
    from gpurec.model.fitting.kind_errors import unseen_summary

    energy = {"bounds": {"estimates": 1, "above_limit": 0, "below_idle": 0, "max_power_over_limit": 0.5}, "grid": [],
              "before": {"unseen": {"inference": {"n": 1, "time_mape": 3.0, "energy_mape": 4.0}}},
              "after": {"unseen": unseen_summary(rep), "per_kind": [], "unseen_by_gpu": by_gpu}}
    text = "\n".join(energy_section(energy, {}))
    assert "| inference | 1 → 2 | 3.0% | 16.0% |" in text
    assert "| H100 inference | 1 | — | 2.0% |" in text and "| H200 inference | 1 | — | 30.0% |" in text


def test_sequence_accuracy_scores_the_unseen_sequence_networks_against_their_targets() -> None:
    """Only the unseen sequence architectures' networks count; families and the LSTM-LM rule are
    read per GPU; the H100 verdict fails on one LSTM LM outside 10% although the MAPEs pass."""
    import pandas as pd

    from gpurec.model.fitting.evaluate import sequence_accuracy
    from gpurec.reports.accuracy import _sequence_section

    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"

    def rec(gpu: str, key: str, t: float, e: float, eager: float = 1.0) -> dict:
        return {"gpu": gpu, "set_key": key, "mode": "inference", "measured_gpu_time_ms": 10.0,
                "pred_gpu_time_ms": 10.0 * t, "measured_gpu_energy_mj": 100.0, "pred_gpu_energy_mj": 100.0 * e,
                "measured_time_ms": 20.0, "pred_time_ms": 20.0 * eager}

    records = pd.DataFrame([rec(h100, "lstm_lm_3x768:b8:s96", 1.02, 0.95), rec(h100, "lstm_lm_3x768:b64:s96", 1.0, 1.12),
                            rec(h100, "gpt_d768:b2:s256", 1.04, 1.0, 1.3), rec(h100, "resnet18:b8:r224", 2.0, 2.0),
                            rec(h200, "gru_cls_bi_2x384:b8:s96", 0.9, 0.9)])
    out = {(r["gpu"], r["family"]): r for r in sequence_accuracy(records)}
    assert set(out) == {(h100, "all"), (h100, "recurrent"), (h100, "transformer"), (h200, "all"), (h200, "recurrent")}
    a = out[(h100, "all")]
    assert a["n"] == 3 and a["archs"] == ["gpt_d768", "lstm_lm_3x768"]
    assert a["gpu_time_mape"] == pytest.approx(2.0) and a["gpu_energy_mape"] == pytest.approx(17 / 3)
    assert a["eager_time_mape"] == pytest.approx(10.0)
    assert (a["lstm_lm_networks"], a["lstm_lm_within"]) == (2, 1)
    assert a["worst"]["set_key"] == "lstm_lm_3x768:b64:s96" and a["worst"]["energy_error_pct"] == pytest.approx(12.0)
    doc = "\n".join(_sequence_section(sequence_accuracy(records)))
    assert "| H100 | all | 3 | 2.0% | 5.7% | 10.0% |" in doc and "| 1 of 2 | **not met** |" in doc
    fixed = records.assign(pred_gpu_energy_mj=lambda d: d["pred_gpu_energy_mj"].where(d["pred_gpu_energy_mj"] < 110, 105.0))
    assert "| 2 of 2 | met |" in "\n".join(_sequence_section(sequence_accuracy(fixed)))


def test_the_precision_section_lists_the_sequence_models_at_that_precision_without_a_verdict() -> None:
    import pandas as pd

    from gpurec.model.fitting.evaluate import sequence_accuracy
    from gpurec.reports.accuracy import precision_section

    h200 = "NVIDIA H200"
    records = pd.DataFrame([{"gpu": h200, "set_key": "lstm_lm_3x768:b8:s96", "mode": "inference",
                             "measured_gpu_time_ms": 10.0, "pred_gpu_time_ms": 13.0, "measured_gpu_energy_mj": 100.0,
                             "pred_gpu_energy_mj": 90.0, "measured_time_ms": 20.0, "pred_time_ms": 20.0}])
    group = {"gpu": h200, "archs": "unseen test", "mode": "inference", "n_time": 1, "n_energy": 1, "time_mape": 30.0,
             "energy_mape": 10.0, "architectures": ["lstm_lm_3x768"]}
    p = {"groups": [group], "records": records.iloc[:0], "sequence": sequence_accuracy(records)}
    doc = "\n".join(precision_section({"targets_pct": {"time": 8, "energy": 10}, "precisions": {"bf16-mixed": p}}))
    assert "the sequence models at bf16-mixed" in doc and "(lstm_lm_3x768)" in doc
    assert "| H200 | all | 1 | 30.0% | 10.0% | 0.0% |" in doc and "met |" not in doc.split("sequence models at")[1]
    p["sequence"] = []
    assert "sequence models at" not in "\n".join(precision_section({"targets_pct": {"time": 8, "energy": 10},
                                                                      "precisions": {"bf16-mixed": p}}))
    assert "bf16 twins" not in doc
    p["bf16_twins"] = [{"gpu": h200, "archs": "unseen test", "mode": "inference", "n": 1, "time_before": 30.0,
                        "time_after": 12.5, "energy_before": 10.0, "energy_after": 9.0}]
    doc = "\n".join(precision_section({"targets_pct": {"time": 8, "energy": 10}, "precisions": {"fp16-mixed": p}}))
    assert "read as their bf16 twins" in doc and "| H200 | unseen test | inference | 1 | 30.0% | 12.5% | 10.0% | 9.0% |" in doc



def test_the_precision_sections_per_network_table_names_each_networks_gpu() -> None:
    """Once both GPUs measured a network at a precision, its two rows differed only in their numbers:
    every row names the GPU it was measured on."""
    import pandas as pd

    from gpurec.reports.accuracy import precision_section

    rec = {"set_key": "gpt_d768:b8:s256", "mode": "training", "is_test": True, "arch": "gpt_d768", "error": "",
           "measured_gpu_time_ms": 9.0, "pred_gpu_time_ms": 8.8, "measured_gpu_energy_mj": 4700.0,
           "pred_gpu_energy_mj": 3900.0}
    records = pd.DataFrame([{**rec, "gpu": "NVIDIA H200"}, {**rec, "gpu": "NVIDIA H100 80GB HBM3",
                                                            "measured_gpu_time_ms": 9.2}])
    doc = "\n".join(precision_section({"targets_pct": {"time": 8, "energy": 10},
                                       "precisions": {"bf16-mixed": {"groups": [], "records": records}}}))
    rows = [line for line in doc.splitlines() if "gpt_d768:b8:s256" in line]
    assert [line.split(" | ")[0] for line in rows] == ["| H100", "| H200"]
    assert "| GPU | network | mode |" in doc

def test_targeted_sentence_says_which_gpus_measured_the_targeted_sets() -> None:
    """The per-kind section used to say the targeted sets were 'not measured yet' long after both
    GPUs had measured them: the sentence now follows the rows."""
    from gpurec.reports.accuracy import targeted_sentence

    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    none = targeted_sentence({h100: {"operations": 0, "networks": 0}})
    assert "not measured yet" in none and targeted_sentence(None) == none
    one = targeted_sentence({h100: {"operations": 0, "networks": 0}, h200: {"operations": 1801, "networks": 30}})
    assert "H200 1,801 operation rows and 30 network rows" in one and "Not yet measured on the H100" in one
    both = targeted_sentence({h100: {"operations": 5, "networks": 1}, h200: {"operations": 7, "networks": 2}})
    assert "not measured yet" not in both and "Not yet" not in both and "H100 5 operation rows" in both


def test_recard_table_pairs_each_card_row_with_the_committed_row_of_its_id(tmp_path) -> None:
    import gzip
    import json

    import pandas as pd

    from gpurec.reports.dataset import GpuData, recard_table, section_cards

    def net(id_: str, set_key: str, energy: float, uuid: str) -> dict:
        return {"id": id_, "item": "network", "mode": "inference", "set_key": set_key, "status": "ok",
                "gpu_time_ms": 2.0, "gpu_energy_mj": energy, "gpu_power_w": energy / 2.0, "gpu_uuid": uuid}

    committed = pd.DataFrame([net("network:resnet18:b32:r224:inference", "resnet18:b32:r224", 100.0, "GPU-aaaaaaaa-1"),
                              net("network:gpt_d512:b32:s512:inference", "gpt_d512:b32:s512", 200.0, "GPU-bbbbbbbb-1")])
    new = [net("network:resnet18:b32:r224:inference", "resnet18:b32:r224", 103.0, "GPU-cccccccc-1"),
           net("network:gpt_d512:b32:s512:inference", "gpt_d512:b32:s512", 202.0, "GPU-cccccccc-1"),
           {**net("network:gpt_d512:b32:s512:inference", "gpt_d512:b32:s512", 900.0, "GPU-cccccccc-1"), "repeat": True},
           net("network:vgg11:b32:r224:inference", "vgg11:b32:r224", 50.0, "GPU-cccccccc-1"),  # no committed row
           {"item": "idle", "idle_power_w": 120.0, "repeat": True}]
    (tmp_path / "cards").mkdir()
    with gzip.open(tmp_path / "cards" / "rows-x-0of1.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in new))
    recs = recard_table([GpuData(tag="h200", path=tmp_path, tables={"networks": committed})])
    by_family = {r["family"]: r for r in recs}
    assert set(by_family) == {"CNN", "sequence"} and all(r["networks"] == 1 for r in recs)
    assert abs(by_family["CNN"]["median_energy_ratio"] - 1.03) < 1e-9
    assert abs(by_family["sequence"]["median_energy_ratio"] - 1.01) < 1e-9  # the repeat row is not the measurement
    assert by_family["CNN"]["idle_power_w"] == 120.0 and by_family["CNN"]["card"] == "GPU-cccccccc"
    assert "`GPU-cccccccc` (x) +2.0 pp" in section_cards([GpuData(tag="h200", path=tmp_path, tables={"networks": committed})])
    # a second run on the same card is its own line, not pooled with the first
    second = [{**r, "gpu_energy_mj": r["gpu_energy_mj"] * 1.1} if r.get("set_key", "").startswith("resnet18")
              and not r.get("repeat") else r for r in new]
    with gzip.open(tmp_path / "cards" / "rows-y-0of1.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in second))
    text = section_cards([GpuData(tag="h200", path=tmp_path, tables={"networks": committed})])
    assert "`GPU-cccccccc` (x) +2.0 pp" in text and "`GPU-cccccccc` (y) +12.3 pp" in text


def test_the_checkpointing_section_pairs_plain_and_checkpointed_steps_and_scores_the_cost(monkeypatch) -> None:
    """Cost = checkpointed / plain GPU time - 1, measured and predicted, per pair of one log; a step
    whose checkpointed run failed stays in the table as plain only and out of the averages."""
    import gpurec.validate.compare as compare
    from gpurec.reports.validation import _checkpointing

    gpu = "NVIDIA H100 80GB HBM3"

    def rec(model: str, ck: bool, ms: float, mj: float, gb: float) -> dict:
        return {"_file": "checkpoint_h100.jsonl", "gpu": gpu, "model": model, "batch_size": 32, "mode": "training",
                "precision": "fp32", "checkpoint_blocks": ck, "measured_gpu_time_ms": ms,
                "measured_gpu_energy_mj": mj, "measured_peak_memory_gb": gb}

    recs = [rec("resnet50", False, 10.0, 100.0, 4.0), rec("resnet50", True, 13.0, 130.0, 2.0),
            rec("vit_b_16", False, 20.0, 200.0, 5.0), rec("vit_b_16", True, 24.0, 240.0, 1.0),
            rec("densenet121", False, 30.0, 300.0, 3.0)]
    predicted = {("resnet50", False): (10.0, 100.0, 4.0), ("resnet50", True): (12.0, 117.0, 2.2),
                 ("vit_b_16", False): (20.0, 200.0, 5.0), ("vit_b_16", True): (26.0, 264.0, 1.5),
                 ("densenet121", False): (30.0, 300.0, 3.0)}

    def fake(_predictor, r):
        ms, mj, gb = predicted[(r["model"], bool(r["checkpoint_blocks"]))]
        return {"predicted_gpu_time_ms": ms, "predicted_gpu_energy_mj": mj, "predicted_peak_memory_gb": gb,
                "peak_memory_error_pct": 100 * (gb / r["measured_peak_memory_gb"] - 1)}

    monkeypatch.setattr(compare, "predicted_fields", fake)
    text = "\n".join(_checkpointing(recs, None, lambda m: None))
    assert "| H100 | resnet50 | 32 | training | 10.00 -> 13.00 | +30% | +20% | -7.7% | -10.0% | 4.00 -> 2.00 | 2.20 (+10.0%) |" in text
    assert "| H100 | vit_b_16 | 32 | training | 20.00 -> 24.00 | +20% | +30% | +8.3% | +10.0% |" in text
    assert "| H100 | densenet121 | 32 | training | plain only | — | — | — | — | — | — |" in text
    # cost off by |20 - 30| and |30 - 20| points; checkpointed MAPEs over the two pairs
    assert "Over 2 pairs: the predicted cost is off by 10.0 points on average (+0.0 mean, signed)" in text
    assert "MAPE is 8.0% in GPU time, 10.0% in GPU energy and 30.0% in peak memory" in text


def test_the_noise_floor_table_says_dash_where_no_repeat_pair_has_power(tmp_path: Path) -> None:
    """Operation rows measured host-free carry no eager power: their power cell is '—', not 'nan%';
    networks' pairs keep their figures."""
    import pandas as pd

    from gpurec.reports.accuracy import repeatability_section
    from gpurec.reports.dataset import GpuData

    gpu = "NVIDIA H100 80GB HBM3"
    base = {"gpu": gpu, "status": "ok", "mode": "inference", "run_id": "r"}
    ops = pd.DataFrame([{**base, "id": "op:a:inference", "item": "op", "time_ms": 1.0}])
    nets = pd.DataFrame([{**base, "id": "network:n", "item": "network", "time_ms": 10.0, "power_w": 400.0}])
    reps = pd.DataFrame([{**base, "id": "op:a:inference:rep", "item": "op", "time_ms": 1.1},
                         {**base, "id": "network:n:rep", "item": "network", "time_ms": 12.0, "power_w": 440.0}])
    g = GpuData(tag="h100", path=tmp_path, tables={"operations": ops, "networks": nets, "repeats": reps})
    text = "\n".join(repeatability_section(gpus=[g]))
    assert "| H100 | network | 1 | 20.0% / 20.0% | 10.0% / 10.0% |" in text
    assert "| H100 | operation | 1 | 10.0% / 10.0% | — |" in text and "nan" not in text
