"""CPU tests of gpurec.profile: trace attribution, ncu CSV parsing, kernel matching,
Table 4.1 arithmetic, missing ncu, and a CPU dry run of the worker.

Fixtures: tests/fixtures/profile/synthetic/ (hand-made, exact numbers; regenerate with
make_synthetic.py) and, when present, tests/fixtures/profile/real/ (from the device run;
checked for invariants, plus a few facts of that run). Each fixture folder holds
trace.json[.gz], meta.json and optionally ncu.csv[.gz].
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

import pytest

from gpurec.profile import (
    NcuNotFound,
    analyze,
    ncu_io,
    parse_ncu_csv,
    profile_network,
    render_table,
    save_plots,
)
from gpurec.profile.matching import align, match_kernels, normalize_kernel_name
from gpurec.profile.trace import load_trace
from gpurec.profile.worker import first_stable_iteration

FIX = Path(__file__).parent / "fixtures" / "profile"
SYN = FIX / "synthetic"


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """ncu's metric-list cache goes to a test folder, never the user's cache or the shared temp dir."""
    monkeypatch.setenv("GPUREC_CACHE_DIR", str(tmp_path_factory.mktemp("gpurec_cache")))


def _fixture_files(folder: Path) -> tuple[Path, Path | None, Path | None]:
    trace = next(p for p in (folder / "trace.json.gz", folder / "trace.json") if p.is_file())
    ncu = next((p for p in (folder / "ncu.csv", folder / "ncu.csv.gz") if p.is_file()), None)
    meta = next((p for p in (folder / "meta.json", folder / "worker_trace.json") if p.is_file()), None)
    return trace, ncu, meta


REAL_DIRS = sorted(p for p in FIX.glob("real*") if p.is_dir())  # real: H200 inference; real_h100_training
FIXTURE_DIRS = [SYN, *REAL_DIRS]


@pytest.fixture(scope="module")
def syn():
    trace, ncu, meta = _fixture_files(SYN)
    return analyze(trace, ncu, meta)


# ----------------------------------------------------------------------------- parsing


def test_parse_ncu_csv_units_separators_and_order():
    df = parse_ncu_csv(SYN / "ncu.csv")
    assert list(df["ncu_id"]) == list(range(10))
    first = df.iloc[0]
    assert first["name"].startswith("void cudnn::conv_fwd")
    assert first["grid"] == (64, 1, 1) and first["block"] == (128, 1, 1)
    assert first["gpu__time_duration.sum"] == pytest.approx(110_000.0)  # usecond -> ns
    assert first["smsp__cycles_elapsed.sum"] == 400_000.0  # "400,000"
    assert first["launch__grid_size"] == 64
    assert "device__attribute_display_name" not in df.columns
    # also accepts the text itself
    assert len(parse_ncu_csv((SYN / "ncu.csv").read_text())) == 10


def test_parse_query_metrics_and_select():
    text = (
        "Device NVIDIA H100 (GH100)\n-------- ------\nMetric Name   Metric Description\n"
        "smsp__cycles_elapsed   # of cycles elapsed\nsm__pipe_tensor_op_hmma_cycles_active  # cycles\n"
        "gpu__time_duration   duration\n"
    )
    names = ncu_io.parse_query_metrics(text)
    assert names == {"smsp__cycles_elapsed", "sm__pipe_tensor_op_hmma_cycles_active", "gpu__time_duration"}
    chosen = ncu_io.select_metrics(names)
    assert "smsp__cycles_elapsed.sum" in chosen and "smsp__cycles_elapsed.avg" in chosen
    assert "sm__pipe_tensor_op_hmma_cycles_active.sum" in chosen
    assert "sm__pipe_tensor_op_gmma_cycles_active.sum" not in chosen
    assert "launch__grid_size" in chosen and "smsp__inst_issued.sum" in chosen  # core: always kept
    assert ncu_io.select_metrics(None) == list(ncu_io.FALLBACK_METRICS)


def test_ncu_command_never_locks_clocks():
    cmd = ncu_io.ncu_profile_command("ncu", ["a.sum"], Path("/tmp/r"), ["python", "-m", "x"])
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert cmd[-3:] == ["python", "-m", "x"]


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
         "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
         "at::native::vectorized_elementwise_kernel"),
        ("at::native::vectorized_elementwise_kernel<4, F, A>(int, F, A)", "at::native::vectorized_elementwise_kernel"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, float const*, int)",
         "at::native::anon::cunn_SoftMaxForward"),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"),
        # the H100 trace kept cuDNN's CUTLASS kernels mangled while ncu demangled them
        ("_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblockE",
         "cutlass__5x_cudnn::Kernel"),
        ("void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::conv::kernel::K>(T1::Params)", "cutlass__5x_cudnn::Kernel"),
        ("_Z9my_kernelPfi", "my_kernel"),
        ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
         "(cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, float const*, float*)",
         "cudnn::engines_precompiled::nchwToNhwcKernel"),
    ],
)
def test_normalize_kernel_name(raw, norm):
    assert normalize_kernel_name(raw) == norm


# ----------------------------------------------------------------------------- trace


def test_trace_window_and_attribution():
    t = load_trace(SYN / "trace.json")
    k = t.kernels
    assert t.iteration_name == "gpurec_iter#8"
    assert t.total_time_ms == pytest.approx(1.0)
    assert len(k) == 10  # the kernel launched before the iteration range is excluded
    got = list(zip(k["layer"], k["layer_type"], k["phase"], k["op"], strict=True))
    assert got == [
        ("conv1", "Conv2d", "forward", "aten::conv2d"),
        ("conv1", "Conv2d", "forward", "aten::conv2d"),  # launched through cuLaunchKernelEx
        ("relu", "ReLU", "forward", "aten::relu"),
        ("fc", "Linear", "forward", "aten::linear"),
        ("loss", "CrossEntropyLoss", "forward", "aten::cross_entropy_loss"),
        ("(unattributed)", "aten::ones_like", "other", "aten::ones_like"),
        ("fc", "Linear", "backward", "AddmmBackward0"),  # autograd thread, via sequence number
        ("conv1", "Conv2d", "backward", "ConvolutionBackward0"),
        ("conv1", "Conv2d", "backward", "ConvolutionBackward0"),
        ("optimizer", "Optimizer(SGD)", "optimizer", "aten::_foreach_add_"),
    ]
    assert len(t.gpu_events) == 11  # plus the memset


def test_kernel_without_launch_event_uses_external_id():
    from gpurec.profile.trace import extract, load_trace_events

    data = load_trace_events(SYN / "trace.json")
    ev = data["traceEvents"]
    ev[:] = [e for e in ev if not (e.get("cat") == "cuda_driver" and e["args"].get("correlation") == 4)]
    for e in ev:
        if e.get("cat") == "kernel" and e["args"].get("correlation") == 4:
            e["args"]["External id"] = 77
        if e.get("name") == "aten::addmm":
            e["args"]["External id"] = 77
    k = extract(data).kernels
    row = k[k["correlation"] == 4].iloc[0]
    assert (row["layer"], row["phase"], row["op"]) == ("fc", "forward", "aten::linear")


def test_unit_prefixes_scale_to_base_units():
    from gpurec.device.ncu import unit_scale

    assert unit_scale("usecond") == ("nsecond", 1e3)
    assert unit_scale("msecond") == ("nsecond", 1e6)
    assert unit_scale("Kcycle") == ("cycle", 1e3)
    assert unit_scale("Minst") == ("inst", 1e6)
    assert unit_scale("Kbyte") == ("byte", 1e3)
    assert unit_scale("cycle") == ("cycle", 1.0)


# ----------------------------------------------------------------------------- matching


def test_matching_reports_missing_and_extra_kernels():
    t = load_trace(SYN / "trace.json")
    n = parse_ncu_csv(SYN / "ncu.csv")
    m = match_kernels(t.kernels, n)
    assert [(i, j) for i, j, _ in m.pairs] == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (6, 5), (7, 7), (8, 8),
                                               (9, 9)]
    assert m.unmatched_trace == [5]  # the grad-seed fill kernel ncu did not report
    assert m.unmatched_ncu == [6]  # the extra reduce kernel


def test_matching_tolerates_namespace_differences():
    t = load_trace(SYN / "trace.json")
    n = parse_ncu_csv(SYN / "ncu.csv")
    n["name"] = [normalize_kernel_name(x).rsplit("::", 1)[-1] for x in n["name"]]  # function names only
    m = match_kernels(t.kernels, n)
    assert len(m.pairs) == 9 and m.unmatched_trace == [5] and m.unmatched_ncu == [6]


def test_alignment_keeps_order_with_repeated_kernels():
    import numpy as np

    # trace: A B A B A ; ncu: A B B A (trace #2 missing in ncu) -> 4 order-preserving pairs
    trace = ["A", "B", "A", "B", "A"]
    ncu = ["A", "B", "B", "A"]
    score = np.array([[1.0 if t == c else -np.inf for c in ncu] for t in trace])
    pairs = [(i, j) for i, j, _ in align(score)]
    assert len(pairs) == 4
    assert all(p[0] < q[0] and p[1] < q[1] for p, q in zip(pairs, pairs[1:], strict=False))
    assert all(trace[i] == ncu[j] for i, j in pairs)
    assert align(np.zeros((0, 3))) == []


# ----------------------------------------------------------------------------- metrics


def test_iteration_metrics_table_4_1(syn):
    it = syn.iteration
    assert it["total_time_ms"] == pytest.approx(1.0)
    assert it["gpu_kernel_time_ms"] == pytest.approx(0.777)
    assert it["gpu_busy_time_ms"] == pytest.approx(0.782)
    assert it["gpu_utilization"] == pytest.approx(0.782)
    assert it["throughput_samples_per_s"] == pytest.approx(4000.0)
    assert it["untraced_throughput_samples_per_s"] == pytest.approx(4 / 0.0009)
    # framework overhead = GPU idle inside the iteration = leading + bubbles + short gaps + trailing
    assert it["framework_overhead_ms"] == pytest.approx(0.218)
    assert it["leading_idle_ms"] == pytest.approx(0.045)
    assert it["trailing_idle_ms"] == pytest.approx(0.040)
    assert it["bubble_count"] == 7
    assert it["bubble_time_ms"] == pytest.approx(0.130)
    assert it["small_gap_time_ms"] == pytest.approx(0.003)
    # counters: sums over all ncu kernels (the report covers the whole iteration)
    assert it["smsp_cycles_elapsed"] == 3_124_000
    assert it["smsp_cycles_active"] == 2_620_000
    assert it["smsp_issue_cycles"] == 788_000
    assert it["sm_cycles_elapsed"] == 781_000
    assert it["tc_active_cycles"] == 270_000  # hmma + gmma pipes
    assert it["tc_issue"] == 41_000
    assert it["smsp_active_util"] == pytest.approx(2_620_000 / 3_124_000)
    assert it["smsp_issue_util"] == pytest.approx(788_000 / 3_124_000)
    # TC pipe counters are SMSP sums (real H200 reports exceed SM elapsed cycles): Table 4.1's
    # SMSP elapsed cycles are the denominator, SMSP active cycles for the text's bound
    assert it["tc_active_util"] == pytest.approx(270_000 / 3_124_000)
    assert it["tc_active_over_smsp_active"] == pytest.approx(270_000 / 2_620_000)
    assert it["tc_issue_util"] == pytest.approx(41_000 / 3_124_000)
    assert it["tc_issue_over_smsp_issue"] == pytest.approx(41_000 / 788_000)
    assert it["smsp_active_util_of_iteration"] == pytest.approx(2_620_000 / 3_124_000 * 0.777)
    assert it["n_kernels_ncu"] == 10 and it["n_kernels_trace"] == 10


def test_layer_type_and_kernel_metrics(syn):
    lt = syn.layer_types.set_index("layer_type")
    conv = lt.loc["Conv2d"]
    assert conv["n_kernels"] == 4
    assert conv["time_ms"] == pytest.approx(0.51)
    assert conv["smsp_active_util"] == pytest.approx(1_760_000 / 2_040_000)
    assert conv["tc_active_util"] == pytest.approx(180_000 / 2_040_000)
    assert conv["tc_issue_util"] == pytest.approx(27_000 / 2_040_000)
    assert lt.loc["aten::ones_like", "counter_time_share"] == 0.0  # unmatched: time but no counters
    k = syn.kernels
    xmma = k[k["name"].str.startswith("sm90_xmma")].iloc[0]
    assert xmma["smsp_issue_util"] == pytest.approx(0.25)
    assert xmma["tc_active_util"] == pytest.approx(0.6 / 4)  # 0.6 of SM cycles = 0.15 of SMSP cycles
    assert xmma["tc_issue_util"] == pytest.approx(0.02)
    assert xmma["sm_clock_mhz"] == pytest.approx(2000 / 210_000 * 1e3)
    extra = k[k["source"] == "ncu"]
    assert len(extra) == 1 and extra.iloc[0]["time_ms"] == pytest.approx(0.005)
    phases = syn.phases.set_index("phase")
    assert phases.loc["backward", "n_kernels"] == 3


def test_first_stable_iteration():
    assert first_stable_iteration([10, 5, 4, 4, 4, 4, 4.05]) == 5
    assert first_stable_iteration([10, 8, 6, 4, 4, 4.5, 4, 4, 4], window=5, tol=0.02) == 7
    assert first_stable_iteration([10, 5, 4]) is None


def test_table_json_and_plots(syn, tmp_path):
    text = render_table(syn)
    for needle in ("Total execution time", "GPU utilization", "SMSP issue slot utilization",
                   "TC issue slot utilization", "unmatched_trace", "unmatched_ncu", "Conv2d"):
        assert needle in text
    data = json.loads(json.dumps(syn.to_json(), allow_nan=False))
    assert data["matching"]["n_matched"] == 9
    assert len(data["matching"]["unmatched_trace"]) == 1 and len(data["matching"]["unmatched_ncu"]) == 1
    assert data["iteration"]["gpu_utilization"] == pytest.approx(0.782)
    files = save_plots(syn, tmp_path)
    assert set(files) == {"utilization_levels", "tc_issue_cdf", "layer_types"}
    assert all(Path(p).stat().st_size > 1000 for p in files.values())


def test_trace_only_analysis_has_no_counters():
    trace, _, meta = _fixture_files(SYN)
    r = analyze(trace, None, meta)
    assert r.matching == {} and "smsp_cycles_elapsed" not in r.iteration
    assert "not collected" in render_table(r)


@pytest.mark.parametrize("folder", FIXTURE_DIRS, ids=lambda p: p.name)
def test_fixture_invariants(folder):
    """Holds for synthetic and for real device fixtures dropped into fixtures/profile/real/."""
    trace, ncu, meta = _fixture_files(folder)
    r = analyze(trace, ncu, meta)
    it = r.iteration
    assert it["total_time_ms"] > 0 and len(r.kernels) > 0
    assert 0 < it["gpu_utilization"] <= 1.0 + 1e-9
    assert it["framework_overhead_ms"] >= -1e-9
    attributed = r.kernels[r.kernels["layer"] != "(unattributed)"]["time_ms"].sum()
    assert attributed >= 0.9 * r.kernels["time_ms"].sum()
    if ncu is not None:
        mt = r.matching
        assert mt["n_matched"] >= 0.9 * min(mt["n_trace"], mt["n_ncu"])
        for u in ("smsp_active_util", "smsp_issue_util", "tc_active_util", "tc_issue_util"):
            assert math.isnan(it[u]) or 0.0 <= it[u] <= 1.0 + 1e-6
        assert it["smsp_issue_util"] <= it["smsp_active_util"] + 1e-9
        assert it["smsp_active_util_of_iteration"] <= it["gpu_kernel_utilization"] + 1e-9


def test_real_h200_fixture_parses_and_matches_every_kernel():
    """resnet50 batch 8 inference on an H200 (ncu 2025.3.1, 305 columns incl. device attributes)."""
    folder = FIX / "real"
    if not folder.is_dir():
        pytest.skip("no real fixture")
    trace, ncu, meta = _fixture_files(folder)
    df = parse_ncu_csv(ncu)
    assert len(df) == 232 and list(df["ncu_id"]) == list(range(232))
    for m in ("gpu__time_duration.sum", "smsp__cycles_elapsed.sum", "smsp__cycles_active.sum",
              "smsp__inst_issued.sum", "sm__cycles_elapsed.sum", "sm__pipe_tensor_op_hmma_cycles_active.sum",
              "smsp__inst_executed_pipe_tensor_op_hmma.sum"):
        assert df[m].dtype == float and df[m].notna().all(), m
    assert (df["smsp__cycles_elapsed.sum"] == 4 * df["sm__cycles_elapsed.sum"]).all()  # 4 SMSPs per SM
    # the SM-prefixed tensor counter sums the 4 SMSPs: above SM elapsed cycles on some kernels
    assert (df["sm__pipe_tensor_op_hmma_cycles_active.sum"] > df["sm__cycles_elapsed.sum"]).any()
    assert (df["sm__pipe_tensor_op_hmma_cycles_active.sum"] <= df["smsp__cycles_elapsed.sum"]).all()
    r = analyze(trace, ncu, meta)
    assert r.meta["device_name"] == "NVIDIA H200" and r.meta["batch_size"] == 8
    assert r.matching["n_matched"] == 232 and not r.matching["unmatched_trace"] and not r.matching["unmatched_ncu"]
    assert (r.kernels["tc_active_util"].dropna() <= 1.0).all()
    it = r.iteration
    assert it["smsp_issue_util"] < 0.5 and it["tc_issue_util"] < 0.05  # the method's takeaways hold here
    assert 1500 < it["sm_clock_mhz_weighted"] < 2000  # default clocks, not locked


def test_real_h100_training_fixture_matches_and_annotates_backward_and_optimizer():
    """resnet50 batch 8 training on an H100, every kernel profiled: forward, backward and the
    optimizer step match one to one, and every kernel of the three phases has its layer (the
    few outside them, such as the input copy, take under 1 % of kernel time)."""
    folder = FIX / "real_h100_training"
    if not folder.is_dir():
        pytest.skip("no real training fixture")
    trace, ncu, meta = _fixture_files(folder)
    r = analyze(trace, ncu, meta)
    assert r.meta["device_name"] == "NVIDIA H100 80GB HBM3" and r.meta["mode"] == "training"
    mt = r.matching
    assert mt["n_trace"] == mt["n_ncu"] == mt["n_matched"] == 699
    assert not mt["unmatched_trace"] and not mt["unmatched_ncu"]
    k = r.kernels
    by_phase = k.groupby("phase")["time_ms"].sum()
    assert by_phase["backward"] > by_phase["forward"] > by_phase["optimizer"] > 0
    tagged = k[k["phase"].isin(["forward", "backward", "optimizer"])]
    assert (tagged["layer"] != "(unattributed)").all()
    assert tagged["time_ms"].sum() >= 0.99 * k["time_ms"].sum()
    bwd = k[k["phase"] == "backward"].groupby("layer_type")["time_ms"].sum()
    assert bwd.idxmax() == "Conv2d" and {"BatchNorm2d", "ReLU", "Linear"} <= set(bwd.index)
    assert set(k.loc[k["phase"] == "optimizer", "layer_type"]) == {"Optimizer(SGD)"}
    it = r.iteration
    assert it["smsp_issue_util"] < 0.5 and it["tc_issue_util"] < 0.05


# ----------------------------------------------------------------------------- missing ncu / processes


def test_missing_ncu_raises_clear_error(monkeypatch, tmp_path):
    monkeypatch.delenv("NCU", raising=False)
    monkeypatch.delenv("GPUREC_NCU", raising=False)
    from gpurec.device import ncu as device_ncu  # the one ncu lookup of the package

    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(device_ncu.shutil, "which", lambda _name: None)
    monkeypatch.setattr(device_ncu.glob, "glob", lambda _pattern: [])
    with pytest.raises(NcuNotFound) as err:
        ncu_io.find_ncu()
    assert "ncu=False" in str(err.value) and "PATH" in str(err.value)
    t0 = time.perf_counter()
    with pytest.raises(NcuNotFound):
        profile_network("resnet18", 2, mode="inference", out_dir=tmp_path / "p", ncu=True)
    assert time.perf_counter() - t0 < 5  # fails before running anything
    assert not (tmp_path / "p").exists()


def test_ncu_on_cpu_is_refused(tmp_path):
    with pytest.raises(ValueError, match="ncu=False"):
        profile_network("resnet18", 2, device="cpu", ncu=True, out_dir=tmp_path)


def test_process_group_killed_on_timeout(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        ncu_io.run_process_group(["sleep", "30"], tmp_path / "log.txt", timeout_s=0.5)
    assert (tmp_path / "log.txt").read_text().startswith("$ sleep 30")


def test_cpu_dry_run_of_worker(tmp_path):
    """The full pipeline without a GPU: worker child traces one CPU iteration."""
    r = profile_network("resnet18", 2, resolution=32, mode="training", out_dir=tmp_path, ncu=False,
                        device="cpu", trace_timeout_s=300)
    assert r.meta["device_name"] == "cpu" and r.meta["profiled_iteration"] >= 2
    assert r.iteration["total_time_ms"] > 0
    assert (tmp_path / "trace.json.gz").is_file() and (tmp_path / "result.json").is_file()
    events = json.loads(__import__("gzip").open(tmp_path / "trace.json.gz", "rt").read())["traceEvents"]
    names = {e["name"] for e in events if e.get("cat") == "user_annotation"}
    assert "module::conv1::Conv2d" in names and "module::loss::CrossEntropyLoss" in names
    assert any(n.startswith("Optimizer.step#") for n in names)
    assert any(n.startswith("gpurec_iter#") for n in names)


FAKE_NCU = r'''
import os, subprocess, sys
argv = sys.argv[1:]
if "--query-metrics" in argv:
    print("Device Fake (GH100)\nMetric Name   Metric Description")
    for m in ("smsp__cycles_elapsed", "smsp__cycles_active", "smsp__inst_issued", "sm__cycles_elapsed",
              "sm__cycles_active", "gpu__time_duration", "sm__pipe_tensor_op_hmma_cycles_active",
              "smsp__inst_executed_pipe_tensor_op_hmma"):
        print(f"{m}   # a counter")
    sys.exit(0)
if "--import" in argv:
    sys.stdout.write(open(os.environ["FAKE_NCU_CSV"]).read())
    sys.exit(0)
metrics = argv[argv.index("--metrics") + 1]
if os.environ.get("FAKE_NCU_FAIL"):
    print("==ERROR== the application crashed")
    sys.exit(3)
if os.environ.get("FAKE_NCU_REJECT") and "tensor_op" in metrics:
    print("==ERROR== Failed to find metric sm__pipe_tensor_op_hmma_cycles_active")
    sys.exit(1)
i = argv.index("--export")
open(argv[i + 1] + ".ncu-rep", "wb").write(b"fake")
sys.exit(subprocess.call(argv[i + 2:]))
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    import sys

    exe = tmp_path / "bin" / "ncu"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\n" + FAKE_NCU)
    exe.chmod(0o755)
    monkeypatch.setenv("FAKE_NCU_CSV", str(SYN / "ncu.csv"))
    monkeypatch.setenv("NCU", str(exe))
    return str(exe)


def test_collect_counters_with_fake_ncu(fake_ncu, tmp_path):
    import sys

    from gpurec.profile.api import collect_counters

    assert str(ncu_io.find_ncu()) == fake_ncu
    out = tmp_path / "run"
    out.mkdir()
    csv_path, metrics, err = collect_counters(fake_ncu, [sys.executable, "-c", "print('target ran')"], out, 60)
    assert err is None and csv_path is not None and len(parse_ncu_csv(csv_path)) == 10
    assert "sm__pipe_tensor_op_hmma_cycles_active.sum" in metrics
    assert "sm__pipe_tensor_op_gmma_cycles_active.sum" not in metrics  # not listed for this GPU
    log = (out / "ncu.log").read_text()
    assert "target ran" in log and "--clock-control none" in log


def test_collect_counters_retries_without_rejected_metrics(fake_ncu, tmp_path, monkeypatch):
    import sys

    from gpurec.profile.api import collect_counters

    monkeypatch.setenv("FAKE_NCU_REJECT", "1")
    csv_path, metrics, err = collect_counters(fake_ncu, [sys.executable, "-c", "pass"], tmp_path, 60)
    assert err is None and csv_path is not None
    assert metrics == list(ncu_io.CORE_METRICS)


def test_collect_counters_reports_failure(fake_ncu, tmp_path, monkeypatch):
    import sys

    from gpurec.profile.api import collect_counters

    monkeypatch.setenv("FAKE_NCU_FAIL", "1")
    csv_path, metrics, err = collect_counters(fake_ncu, [sys.executable, "-c", "pass"], tmp_path, 60)
    assert csv_path is None and metrics == [] and "exited with 3" in err


# ----------------------------------------------------------------------------- per-config sampling


def test_per_config_sampling_command():
    cmd = ncu_io.ncu_profile_command("ncu", ["a.sum"], Path("/tmp/r"), ["python"], sampling="per-config")
    assert cmd[cmd.index("--filter-mode") + 1] == "per-launch-config"
    assert cmd[cmd.index("--launch-count") + 1] == "1"
    assert "--filter-mode" not in ncu_io.ncu_profile_command("ncu", ["a.sum"], Path("/tmp/r"), ["python"])
    with pytest.raises(ValueError, match="sampling"):
        ncu_io.ncu_profile_command("ncu", ["a.sum"], Path("/tmp/r"), ["python"], sampling="some")


@pytest.mark.parametrize("folder", REAL_DIRS, ids=lambda p: p.name)
def test_per_config_sampling_imputes_repeats_close_to_full_profile(tmp_path, folder):
    """On the real runs (inference and training): profiling one launch per configuration and
    imputing the repeats gives every kernel counters and iteration utilizations close to the
    full profile."""
    trace, ncu, meta = _fixture_files(folder)
    full = analyze(trace, ncu, meta)
    sampled_csv = tmp_path / "ncu.csv"
    sampled_csv.write_text(ncu_io.first_launch_per_config(ncu_io.read_text(ncu)))
    meta_d = json.loads(Path(meta).read_text())
    meta_d["ncu_sampling"] = "per-config"
    sampled = analyze(trace, sampled_csv, meta_d)
    n_ncu = sampled.matching["n_ncu"]
    assert n_ncu < full.matching["n_ncu"]
    assert set(sampled.kernels["source"]) <= {"both", "imputed"}
    assert (sampled.kernels["source"] == "imputed").sum() == len(sampled.kernels) - n_ncu
    assert sampled.iteration["imputed_time_share"] > 0
    # the same analysis without imputation leaves the repeats without counters
    plain = analyze(trace, sampled_csv, {**meta_d, "ncu_sampling": "all"})
    assert (plain.kernels["source"] == "trace").sum() == len(plain.kernels) - n_ncu
    for u in ("smsp_active_util", "smsp_issue_util", "tc_active_util", "tc_issue_util"):
        f, s = full.iteration[u], sampled.iteration[u]
        assert abs(s - f) <= 0.1 * f + 1e-3, (u, f, s)
