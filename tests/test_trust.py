"""Issue 24 and issue 20 part 4: a recommendation a user can trust, with the evidence behind it.

The fake predictor of test_recommend stands in for the trained models; ranking, evidence,
ties, memory and rendering are the real code."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import cli
from gpurec.recommend import recommend
from gpurec.recommend.evidence import (
    EAGER,
    HOST_FREE,
    PUBLIC,
    SPECS,
    EvidenceSets,
    band_exponent,
    evidence_of,
    load_evidence,
)
from gpurec.recommend.names import resolve_noted, split_gpus
from gpurec.recommend.ties import DifferenceSpreads, is_tie, paired_spreads
from tests.test_recommend import A100, H100, H200, L4, FakePredictor

runner = CliRunner()
T4 = "Tesla T4"
NONE = EvidenceSets()
NO_PAIRS = DifferenceSpreads()


def test_gpus_may_be_one_comma_separated_string() -> None:
    r = recommend("resnet18", (8, 3, 224, 224), gpus="H100,H200", predictor=FakePredictor(), evidence=NONE,
                  spreads=NO_PAIRS, batch_search=False)
    assert {row.gpu for row in r} == {H100, H200}
    assert split_gpus(" H100 , ,L4") == ["H100", "L4"]
    with pytest.raises(TypeError, match="comma-separated"):
        split_gpus(5)  # type: ignore[arg-type]


def test_to_dict_is_the_dict_and_to_json_the_text() -> None:
    r = recommend("resnet18", (8, 3, 224, 224), gpus=["H100"], predictor=FakePredictor(), evidence=NONE,
                  spreads=NO_PAIRS, batch_search=False)
    assert isinstance(r.to_dict(), dict) and isinstance(r.to_json(), str)
    assert json.loads(r.to_json())["ranking"][0]["gpu"] == H100


def test_when_no_gpu_fits_none_is_best_and_one_line_says_so() -> None:
    p = FakePredictor(speed={L4: 1.0, T4: 2.0})
    r = recommend("resnet50", (1024, 3, 224, 224), mode="training", objective="time", gpus=["L4", "T4"],
                  predictor=p, evidence=NONE, spreads=NO_PAIRS, batch_search=False)
    assert not r.fits_any and r.best is None and r.to_dict()["best"] is None
    assert not any(row.tie_with_best for row in r)
    out = _render(r)
    assert "best" not in [line.split()[-2] for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert sum("No GPU here can hold the step" in line for line in out.splitlines()) == 1


def _render(r: object, width: int = 80) -> str:
    import io

    from rich.console import Console

    buf = io.StringIO()
    orig = Console.__init__

    def init(self: Console, *a: object, **k: object) -> None:
        k.setdefault("file", buf)
        k.setdefault("width", width)
        orig(self, *a, **k)  # type: ignore[arg-type]

    Console.__init__ = init  # type: ignore[method-assign]
    try:
        import contextlib

        with contextlib.redirect_stdout(buf):
            cli._render_ranking(r)
    finally:
        Console.__init__ = orig  # type: ignore[method-assign]
    return buf.getvalue()


def test_ties_come_from_the_error_of_the_difference_not_band_overlap() -> None:
    """Wide bands overlapped for a GPU 3.2x slower: that is no tie when the paired errors are small."""
    p = FakePredictor(speed={H100: 1.0, H200: 3.18}, band=0.7)  # bands 0.3x-1.7x overlap widely
    spreads = DifferenceSpreads({tuple(sorted((H100, H200))): {"time": 0.1, "energy": 0.1, "edp": 0.2}},
                                {tuple(sorted((H100, H200))): 50}, "fake pairs")
    r = recommend("resnet18", (4096, 3, 224, 224), objective="time", gpus=["H100", "H200"], predictor=p,
                  evidence=NONE, spreads=spreads, batch_search=False)
    assert [row.tie_with_best for row in r] == [False, False]
    near = FakePredictor(speed={H100: 1.0, H200: 1.05}, band=0.7)
    r = recommend("resnet18", (4096, 3, 224, 224), objective="time", gpus=["H100", "H200"], predictor=near,
                  evidence=NONE, spreads=spreads, batch_search=False)
    assert [row.tie_with_best for row in r] == [False, True]
    assert is_tie(1.1, 1.0, math.log(1.2)) and not is_tie(1.3, 1.0, math.log(1.2))


def test_paired_spreads_see_correlated_errors() -> None:
    """Two GPUs wrong by the same factor on each network: their ratio is right, the spread small."""
    recs = []
    for i in range(40):
        err = 1.0 + 0.5 * ((i % 5) - 2) / 2  # 0.5x .. 1.5x, the same on both GPUs
        for gpu in (H100, H200):
            recs.append({"model": f"m{i}", "batch_size": 8, "resolution": 224, "mode": "inference", "gpu": gpu,
                         "measured_time_ms": 10 * err, "predicted_time_ms": 10.0,
                         "measured_energy_mj": 100 * err, "predicted_energy_mj": 100.0})
    s = paired_spreads(recs)
    assert s.spread(H100, H200, "time") == pytest.approx(0.0, abs=1e-12)
    assert s.pairs[tuple(sorted((H100, H200)))] == 40
    recs[0] = {**recs[0], "predicted_time_ms": None}  # a pending prediction is left out, not a crash
    assert paired_spreads(recs).pairs[tuple(sorted((H100, H200)))] == 39


def test_cuda_graphs_show_host_free_figures_only() -> None:
    p = FakePredictor()
    r = recommend("resnet18", (8, 3, 224, 224), objective="energy", gpus=["H100", "A100"], predictor=p,
                  cuda_graphs=True, evidence=NONE, spreads=NO_PAIRS)
    assert r.advice is None  # no "with CUDA graphs it would take" under --cuda-graphs
    for row in r:
        assert row.gpu_power_w == pytest.approx(row.gpu_energy_mj / row.gpu_time_ms)
    out = _render(r, 120)
    assert "with CUDA graphs it would take" not in out and "bound" not in out.split("Energy is per step")[0]
    assert "host-free" in out


def test_host_bound_advice_does_not_call_a_large_change_small() -> None:
    p = FakePredictor(speed={H100: 1.0, L4: 60.0})
    r = recommend("resnet18", (8, 3, 224, 224), objective="time", gpus=["H100", "L4"], predictor=p,
                  evidence=NONE, spreads=NO_PAIRS, batch_search=False)
    line = r.advice.sentence() if r.advice else ""
    assert "Host-bound on H100" in line and "only" not in line and "would take" not in line


def test_evidence_levels_and_their_bands() -> None:
    sets = EvidenceSets(frozenset({H100}), frozenset({H200}), frozenset({T4}))
    assert [evidence_of(g, sets) for g in (H100, H200, T4, L4)] == [HOST_FREE, EAGER, PUBLIC, SPECS]
    assert band_exponent(HOST_FREE, "gpu_time") == 1 < band_exponent(EAGER, "gpu_time") < band_exponent(SPECS, "time")
    assert band_exponent(EAGER, "time") == 1 and band_exponent(PUBLIC, "energy") == band_exponent(SPECS, "energy")
    p = FakePredictor(speed={H100: 1.0, H200: 1.0})
    r = recommend("resnet18", (4096, 3, 224, 224), objective="time", gpus=["H100", "H200"], predictor=p,
                  evidence=sets, spreads=NO_PAIRS, cuda_graphs=True, batch_search=False)
    by = {row.gpu: row for row in r}
    assert by[H100].evidence == HOST_FREE and by[H200].evidence == EAGER
    # the same estimate, less evidence: a wider host-free band for the eager-only GPU
    assert by[H200].high - by[H200].low > by[H100].high - by[H100].low
    assert r.to_dict()["ranking"][0]["evidence"] in (HOST_FREE, EAGER)


def test_evidence_is_read_from_the_data_present(tmp_path: Path) -> None:
    (tmp_path / "h100").mkdir()
    pd.DataFrame({"gpu": [H100, H100], "gpu_time_ms": [1.0, None]}).to_parquet(tmp_path / "h100" / "operations.parquet")
    (tmp_path / "h200").mkdir()
    pd.DataFrame({"gpu": [H200], "time_ms": [1.0]}).to_parquet(tmp_path / "h200" / "operations.parquet")
    sets = load_evidence(tmp_path)
    assert sets.host_free == {H100} and sets.eager == {H200} and sets.public == frozenset()
    public = tmp_path / "external" / "neusight"
    public.mkdir(parents=True)
    pd.DataFrame({"gpu": [T4, "Tesla V100-SXM2-16GB"], "time_ms": [1.0, 2.0]}).to_csv(public / "ops.csv", index=False)
    assert load_evidence(tmp_path).public == {T4, "Tesla V100-SXM2-16GB"}
    manifest = {"gpus_measured": [H100, H200], "gpus_networks_measured": [H100],
                "target_sources": {"networks": "host_free"}}
    fallback = load_evidence(tmp_path / "missing", manifest)
    assert fallback.host_free == {H100} and fallback.eager == {H200}


def test_ambiguous_names_resolve_with_a_visible_note() -> None:
    spec, note = resolve_noted("A100")
    assert spec.nvml_name == A100 and note and "A100-40GB" in note and "used A100-80GB" in note
    assert resolve_noted("A10")[1] is None and resolve_noted("H200")[1] is None
    r = recommend("resnet18", (8, 3, 224, 224), gpus="a100,H200", predictor=FakePredictor(), evidence=NONE,
                  spreads=NO_PAIRS, batch_search=False)
    assert len(r.notes) == 1 and "'a100' fits 4" in r.notes[0]
    res = runner.invoke(cli.app, ["predict", "-m", "resnet18", "-b", "1", "--gpu", "A100"])
    assert res.exit_code == 0, res.output
    assert "note: 'A100' fits 4 catalogue GPUs: used A100-80GB" in res.output


def test_predict_shows_memory_fit_and_the_bound_rule() -> None:
    res = runner.invoke(cli.app, ["predict", "-m", "resnet50", "-b", "4096", "--mode", "training", "--gpu", "H100"])
    assert res.exit_code == 0, res.output
    assert "DOES NOT FIT" in res.output and "GB" in res.output
    assert "rule: host-bound when the eager step takes at least 1.2x the GPU's own time" in res.output
    graphs = runner.invoke(cli.app, ["predict", "-m", "resnet18", "-b", "8", "--gpu", "H200", "--cuda-graphs",
                                     "-f", "json"])
    data = json.loads(graphs.stdout)
    assert data["gpu_power_w"] == pytest.approx(data["gpu_energy_mj"] / data["gpu_time_ms"])
    assert data["evidence"] == HOST_FREE and data["fits"] is True  # host-free H200 rows since 2026-11-27


def test_table_fits_80_columns_and_has_no_scientific_notation() -> None:
    p = FakePredictor(speed={H100: 1.0, H200: 0.8, A100: 1.6, L4: 3000.0})
    r = recommend("resnet18", (4096, 3, 224, 224), objective="edp", gpus=["H100-SXM", "H200", "A100-80GB", "L4"],
                  predictor=p, evidence=NONE, spreads=NO_PAIRS, batch_search=False)
    table = _render(r, 80).split("Note:")[0].split("Energy is per step")[0]
    assert all(len(line) <= 80 for line in table.splitlines()), table
    assert "e+" not in table and "+-" not in table
    assert cli._fmt(1.73e6) == "1,730,000" and cli._fmt(3.2e7) == "32,000,000"


def test_choices_ignore_case_and_flags_take_true() -> None:
    res = runner.invoke(cli.app, ["recommend", "-m", "resnet18", "-b", "2", "--gpus", "H100-SXM", "--objective",
                                  "EDP", "--mode", "Training", "-f", "JSON"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["objective"] == "edp" and data["mode"] == "training"
    assert cli.fold_flag_values(["recommend", "-m", "x", "--cuda-graphs", "true"]) == ["recommend", "-m", "x",
                                                                                       "--cuda-graphs"]
    assert cli.fold_flag_values(["predict", "--cuda-graphs", "False", "-m", "x"]) == ["predict", "-m", "x"]
    assert cli.fold_flag_values(["predict", "--model", "true"]) == ["predict", "--model", "true"]  # not a flag
    assert "<bool>" not in runner.invoke(cli.app, ["recommend", "--help"]).output


def test_singular_operation() -> None:
    assert cli._plural(1, "operation") == "1 operation" and cli._plural(2, "operation") == "2 operations"


@pytest.mark.parametrize("command", [("validate", "-m", "resnet18"), ("collect", "--out", "x", "--models", "resnet18"),
                                     ("profile", "-m", "resnet18", "--no-ncu")])
def test_gpu_commands_exit_2_without_a_gpu(command: tuple[str, ...]) -> None:
    res = runner.invoke(cli.app, list(command))
    assert res.exit_code == 2, res.output
    assert "needs an NVIDIA GPU" in res.output


def test_ops_training_shows_forward_plus_backward_flops() -> None:
    res = runner.invoke(cli.app, ["ops", "-m", "resnet18", "-b", "1", "--mode", "training"])
    assert res.exit_code == 0, res.output
    assert "GFLOPs forward + backward" in " ".join(res.output.split())


def test_broken_models_dir_names_the_real_directory_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUREC_MODELS", str(tmp_path))
    res = runner.invoke(cli.app, ["predict", "-m", "resnet18"])
    assert res.exit_code == 3
    assert str(tmp_path) in res.output and "default models/" not in res.output
    assert res.output.count("gpurec train") == 1 and ")Train" not in res.output and ") Train" not in res.output


def test_host_bench_warns_on_a_busy_or_unsteady_host() -> None:
    from gpurec.host import HostBusy, HostProfile, load_warnings

    quiet = HostProfile(name="h", cpu="c", cores=2, python="3", torch="2", measured_at="now", python_loop_us=1.0,
                        dispatch_cpu_us={"conv2d:training": 150.0}, spread={"python_loop": 0.02})
    assert load_warnings(quiet, 0.1) == []
    assert "load average" in load_warnings(quiet, 3.5)[0]
    quiet.spread["cpu:conv2d:training"] = 0.8
    assert "varied by more than" in load_warnings(quiet, 0.1)[0]
    assert issubclass(HostBusy, Exception)


def test_memory_report_shows_measured_peaks_once_rows_carry_them(tmp_path: Path) -> None:
    from gpurec.ops.memory import MemoryFit
    from gpurec.reports.accuracy import memory_rows, memory_section

    (tmp_path / "h100").mkdir()
    nets = pd.DataFrame({"gpu": [H100, H100], "set_key": ["resnet18:b2:r224", "resnet18:b4:r224"],
                         "mode": ["inference", "inference"], "time_ms": [1.0, 1.0], "item": ["network"] * 2})
    nets.to_parquet(tmp_path / "h100" / "networks.parquet")
    assert any("No measured peaks yet" in line for line in memory_section(tmp_path))
    nets["peak_memory_bytes"] = [60e6, None]
    nets["memory_allocated_before_bytes"] = [1e6, None]  # collected first: a trusted peak
    nets.to_parquet(tmp_path / "h100" / "networks.parquet")
    rows = memory_rows(tmp_path)
    assert len(rows) == 1 and rows[0]["measured_gb"] == pytest.approx(0.06)
    assert rows[0]["error_pct"] == pytest.approx((rows[0]["estimated_gb"] / 0.06 - 1) * 100)
    assert rows[0]["estimated_gb"] == rows[0]["analytic_gb"]  # no fit: the analytic part alone
    coefs = {"floor_bytes": 50e6, "activations": 1.0, "largest": 0.0, "conv_io": 0.0, "matmul_io": 0.0, "rnn": 0.0}
    fit = MemoryFit({"inference": coefs, "training": {**coefs, "largest": 1.0}}, {"rows": {}})
    fitted = memory_rows(tmp_path, fit)[0]
    assert fitted["estimated_gb"] == pytest.approx(fitted["analytic_gb"] + 0.05)
    text = "\n".join(memory_section(tmp_path, fit))
    assert "No measured peaks yet" not in text and "1 rows with a measured peak: 1 trusted" in text
    assert "* training architectures: " in text and "### Leftover-suspect" not in text
    nets["memory_allocated_before_bytes"] = [3e9, None]  # an earlier row's 3 GB still allocated
    nets.to_parquet(tmp_path / "h100" / "networks.parquet")
    text = "\n".join(memory_section(tmp_path, fit))
    assert "0 trusted, 1 that may include memory" in text and "### Leftover-suspect peaks" in text


class _Anchored(FakePredictor):
    """A predictor that says how it extrapolates: every GPU but the H100 and H200 is the H100's
    estimate times a cross-GPU ratio whose own error is +-10%."""

    def cross_band(self) -> tuple[tuple[float, float], tuple[float, float]]:
        return (0.9, 1.1), (0.9, 1.1)

    def cross_anchor(self, gpu: str) -> str | None:
        return None if gpu in (H100, H200) else H100


def test_unmeasured_bands_widen_with_less_evidence_and_ties_see_only_the_ratio_error() -> None:
    assert band_exponent(PUBLIC, "time", measured_gpu=False) == 1 < band_exponent(SPECS, "time", measured_gpu=False)
    assert band_exponent(PUBLIC, "energy", measured_gpu=False) == band_exponent(SPECS, "energy", measured_gpu=False) > 1
    sets = EvidenceSets(frozenset({H100}), frozenset(), frozenset({T4}))
    kw = {"objective": "time", "gpus": ["H100", "L4", "T4"], "evidence": sets, "spreads": NO_PAIRS,
          "cuda_graphs": True, "batch_search": False}
    r = recommend("resnet18", (512, 3, 224, 224), predictor=_Anchored(speed={H100: 1.0, L4: 1.5, T4: 1.6}, band=0.6),
                  **kw)
    by = {row.gpu: row for row in r}
    assert all(row.fits for row in r)
    width = {g: math.log(row.high / row.low) for g, row in by.items()}
    # specifications only, public times, measured (the fake's own band is one for all; the real
    # predictor's compounds the cross-GPU error into an extrapolated GPU's, as the test below checks)
    assert width[L4] > width[T4] == width[H100]
    # the wide bands overlap, yet the L4 at +50% is resolved: the H100's own error is in both figures
    assert not by[L4].tie_with_best and not by[T4].tie_with_best
    plain = recommend("resnet18", (512, 3, 224, 224), predictor=FakePredictor(speed={H100: 1.0, L4: 1.5, T4: 1.6},
                                                                              band=0.6), **kw)
    assert all(row.tie_with_best for row in plain.rows[1:])  # no ratio band: the bands as independent errors


def test_an_extrapolated_gpu_carries_the_measured_band_and_the_cross_gpu_error() -> None:
    from gpurec.model import load_predictor
    from gpurec.model.bands import compound

    p = load_predictor()
    measured, extrapolated = (p.predict("resnet18", (8, 3, 224, 224), gpu=g) for g in ("H100", "L4"))
    for est in (measured, extrapolated):
        assert est.gpu_time_low_ms <= est.gpu_time_ms <= est.gpu_time_high_ms
    for v, lo, hi in (("gpu_time_ms", "gpu_time_low_ms", "gpu_time_high_ms"),
                      ("gpu_energy_mj", "gpu_energy_low_mj", "gpu_energy_high_mj")):
        m, x = (tuple(getattr(e, k) / getattr(e, v) for k in (lo, hi)) for e in (measured, extrapolated))
        assert x[0] < m[0] and x[1] > m[1]
    cross_t, _ = p.cross_band()
    public = p.crossgpu.info["public_model_band"]["time_ratio"]
    assert cross_t[0] <= public[0] and cross_t[1] >= public[1]
    lo, hi = compound((0.5, 2.0), (0.5, 2.0))
    assert lo == pytest.approx(0.5 ** math.sqrt(2)) and hi == pytest.approx(2.0 ** math.sqrt(2))
