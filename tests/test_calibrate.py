"""CPU tests of gpurec.calibrate: regression, ncu CSV parsing, features, tool errors, sweep logic.

The sweep runs against a fake NVML backend (an energy counter that advances by power x time
and only updates every 100 ms, like the real one) and a fake microbenchmark runner, in
simulated time: the window's sampler is polled by the waiting code (``threaded=False``).  One
test runs the sweep in real time with the sampler's thread, on a board that draws power only
while work runs, so a window that misses the launches reads idle.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fakes import FakeBoard, FakeNVML

from gpurec.calibrate import build, checks, fit
from gpurec.calibrate import calibrate as calib
from gpurec.calibrate import sweep as sweep_mod
from gpurec.calibrate.errors import NcuNotFound, ToolNotFound
from gpurec.calibrate.features import METRICS, memory_energy_features
from gpurec.calibrate.microbench import BenchConfig, DeviceProps, RunResult
from gpurec.calibrate.sweep import IdleModel, Sweeper, SweepSettings, finalize_rows
from gpurec.device import ncu, nvml
from gpurec.device.sampler import Sampler
from gpurec.device.window import CounterStalled, EnergyMonitor

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "calibrate" / "ncu_raw_handwritten.csv"
REAL_FIXTURE = ROOT / "tests" / "fixtures" / "calibrate" / "ncu_raw_real.csv"
REAL_COUNTS = ROOT / "tests" / "fixtures" / "calibrate" / "ncu_raw_real_counts.json"
A100_REF = {"shared": 82.1, "l1": 107.0, "l2": 368.0, "dram": 2090.0}
H100 = DeviceProps("NVIDIA H100 80GB HBM3", 9, 0, 132, 50 * 2**20, 228 * 1024, 48 * 1024, 227 * 1024, 1024,
                   80 * 2**30)


# -- regression --------------------------------------------------------------------------------

def test_linear_fit_recovers_eps_with_noise() -> None:
    rng = np.random.default_rng(0)
    sectors = np.repeat(np.linspace(1e8, 6e8, 6), 3)
    eps_pj, offset_mj = 107.0, 0.8
    energy_mj = sectors * eps_pj * 1e-9 + offset_mj
    noisy = energy_mj * (1 + rng.normal(0, 0.01, sectors.size))
    f = fit.linear_fit(sectors, noisy)
    assert f.slope * 1e9 == pytest.approx(eps_pj, rel=0.03)
    assert f.r2 > 0.99
    assert f.n == 18
    exact = fit.linear_fit(sectors, energy_mj)
    assert exact.r2 == pytest.approx(1.0)
    assert exact.intercept == pytest.approx(offset_mj, rel=1e-6)


def test_linear_fit_r2_low_for_pure_noise_and_nan_for_degenerate_x() -> None:
    rng = np.random.default_rng(1)
    x = np.arange(20.0)
    assert fit.linear_fit(x, rng.normal(0, 1, 20)).r2 < 0.3
    assert math.isnan(fit.linear_fit([1, 1, 1], [1, 2, 3]).slope)


def _fit(level: str, threads: int, pj: float, r2: float, div: bool = False, blocks: int = 132) -> dict:
    return {"config_id": f"{level}-{threads}-{div}", "level": level, "threads": threads, "blocks": blocks,
            "array_bytes": 1, "div": div, "pj_per_sector": pj, "offset_mj": 0.1, "r2": r2,
            **({"sectors_per_div_inst": 8.0} if div else {})}


def test_lower_bound_is_min_over_good_fits_with_exact_keys() -> None:
    fits = [_fit("l1", 1, 1600, 0.96), _fit("l1", 256, 110, 0.99), _fit("l1", 1024, 107, 0.995),
            _fit("l1", 512, 50, 0.2),  # noisy: excluded by r2
            _fit("l2", 4, 900, 0.5)]   # no good fit: best r2 is used
    lb = fit.lower_bounds(fits, ["l1", "l2", "dram"])
    assert lb["l1"] == {"pj_per_sector": 107, "offset_mj": 0.1, "r2": 0.995, "threads_per_block": 1024}
    assert lb["l2"]["pj_per_sector"] == 900
    assert lb["dram"] == {"pj_per_sector": None, "offset_mj": None, "r2": None, "threads_per_block": None}


def test_div_energy_from_load_and_load_div_fits() -> None:
    # 250 pJ more per sector, 8 sectors per warp DIV -> 2 nJ per DIV.
    fits = [_fit("l1", 1024, 107, 0.99), _fit("l1", 1024, 357, 0.99, div=True),
            _fit("l2", 1024, 368, 0.99), _fit("l2", 1024, 618, 0.99, div=True)]
    d = fit.div_energy(fits)
    assert d["div_nj"] == pytest.approx(2.0)
    assert set(d["per_config"]) == {"l1-t1024", "l2-t1024"}


def test_div_energy_normalisations() -> None:
    fits = [_fit("l1", 1024, 181.3, 0.99), _fit("l1", 1024, 3766.1, 0.99, div=True)]
    d = fit.div_energy(fits)
    assert d["div_nj"] == pytest.approx((3766.1 - 181.3) * 8 / 1000)  # per warp div.u64
    assert d["div_nj_per_sector"] == pytest.approx((3766.1 - 181.3) / 1000)
    assert d["div_nj_per_thread"] == pytest.approx((3766.1 - 181.3) / 1000 / 4)


def test_acceptance_criteria() -> None:
    from gpurec.calibrate import summary

    good = {"levels": {lv: {"pj_per_sector": v, "r2": 0.99} for lv, v in A100_REF.items()},
            "ncu_checks": {"passed": True, "configs": [{"passed": True}] * 2}}
    a = summary.acceptance(good)
    assert a["passed"] and a["r2"]["min"] == 0.99 and a["ncu"]["n_passed"] == 2
    bad = json.loads(json.dumps(good))
    bad["levels"]["l1"]["pj_per_sector"] = 80.0  # below shared
    bad["levels"]["dram"]["r2"] = 0.9
    bad["ncu_checks"] = {"passed": False, "error": "not run"}
    b = summary.acceptance(bad)
    assert not b["passed"] and not b["order"]["passed"] and not b["r2"]["passed"] and not b["ncu"]["passed"]
    assert b["r2"]["min"] == 0.9 and any("not run" in n for n in b["notes"])
    none = summary.acceptance({"levels": {}, "ncu_checks": {}})
    assert not none["passed"] and none["r2"]["min"] is None


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_acceptance_of_shipped_calibrations(gpu: str) -> None:
    from gpurec.calibrate import summary

    path = ROOT / "datasets" / gpu / "calibration" / "calibration.json"
    if not path.exists():
        pytest.skip(f"no {gpu} calibration")
    cal = json.loads(path.read_text())
    a = summary.acceptance(cal)
    assert a["passed"], a
    assert all(r["passed"] for r in summary.ncu_check_rows(cal))
    d = summary.div_summary(cal)
    assert d["div_nj_per_warp_inst"] == pytest.approx(cal["div_nj"])
    assert summary.observed(cal)["sm_clock_mhz_median"] > 1000


# -- ncu CSV -----------------------------------------------------------------------------------

def test_parse_ncu_csv_raw_fixture() -> None:
    df = ncu.parse_ncu_csv(FIXTURE)
    assert len(df) == 4
    assert list(df["id"]) == [0, 1, 2, 3]
    assert df["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"].dtype == np.float64
    assert df.loc[1, "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] == 1_622_016  # "1,622,016"
    assert math.isnan(df.loc[2, "dram__sectors_read.sum"])  # "n/a"
    assert df.attrs["units"]["dram__sectors_read.sum"] == "sector"
    assert df.loc[0, "kernel_name"].startswith("void chase_kernel<1, false>(")
    assert (df.loc[0, "block_x"], df.loc[0, "grid_x"], df.loc[0, "threads_per_block"]) == (1024, 132, 1024)
    assert (df.loc[3, "grid_x"], df.loc[3, "grid_y"], df.loc[3, "grid_blocks"]) == (8, 16, 128)
    assert df.loc[3, "nvtx_range"] == "aten::linear"
    assert df.loc[3, "nvtx_stack"] == "forward / aten::linear"
    assert df["nvtx_range"].isna()[0]
    assert set(ncu.metric_columns(df)) >= {"dram__sectors_read.sum", "smsp__cycles_elapsed.sum"}


def test_parse_real_ncu_export_without_fragmentation_warnings() -> None:
    """The real H100 safety-check export: 16 chase kernels x 365 columns, times in 'ns'."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pandas PerformanceWarning (fragmented frame) included
        df = ncu.parse_ncu_csv(REAL_FIXTURE)
    assert len(df) == 16 and list(df["id"]) == list(range(16))
    assert df["kernel_name"].str.startswith("void chase_kernel<").all()
    assert list(df["threads_per_block"]) == [1024] * 8 + [4] * 4 + [32] * 4
    assert (df["grid_blocks"] == 132).all()
    for m in [*checks.CHECK_METRICS, *METRICS]:
        assert df[m].dtype == np.float64 and df[m].notna().all(), m
    assert df.attrs["units"]["gpu__time_duration.sum"] == "ns"
    assert df.attrs["units"]["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] == "sector"
    assert df["device__attribute_display_name"].iloc[0] == "NVIDIA H100 80GB HBM3"  # text metric kept as text
    assert df["gpu__time_duration.sum"].iloc[1] > df["gpu__time_duration.sum"].iloc[0]  # full > warm-up only
    assert len(ncu.metric_columns(df)) > 300


def test_safety_checks_reproduce_on_real_export() -> None:
    """Re-evaluate the 8 recorded ncu checks offline: ideal hit rates and exact counts."""
    df = ncu.parse_ncu_csv(REAL_FIXTURE)
    spec = json.loads(REAL_COUNTS.read_text())["configs"]
    for i, e in enumerate(spec):
        res = checks.evaluate_check(df, i, {"iters": e["iters"]}, {"config": e["config"], "full": e["full"]})
        assert res["passed"], (i, res)
        assert res["count_ratio"] == pytest.approx(e["recorded"]["count_ratio"])
        assert res["hit_rate"] == pytest.approx(e["recorded"]["hit_rate"])
        assert abs(res["count_ratio"] - 1) < 1e-3 and res["hit_rate"] >= 0.999


def test_parse_ncu_csv_text_with_prof_lines_scaled_units_and_details_layout() -> None:
    raw = (
        "==PROF== Connected to process 1 (python)\n"
        '"ID","Process ID","Kernel Name","Block Size","Grid Size","gpu__time_duration.sum","dram__bytes.sum"\n'
        '"","","","","","usecond","Kbyte"\n'
        '"0","1","k(int, float)","(256, 1, 1)","(4, 1, 1)","1.50","2.5"\n'
        "==PROF== Disconnected from process 1\n"
    )
    df = ncu.parse_ncu_csv(raw)
    assert df.loc[0, "gpu__time_duration.sum"] == pytest.approx(1500.0)
    assert df.attrs["units"]["gpu__time_duration.sum"] == "nsecond"
    assert df.loc[0, "dram__bytes.sum"] == pytest.approx(2500.0)
    details = (
        '"ID","Process ID","Kernel Name","Block Size","Grid Size","Section Name","Metric Name","Metric Unit","Metric Value"\n'
        '"0","1","k","(32, 1, 1)","(1, 1, 1)","Command line profiler metrics","dram__sectors_read.sum","sector","1,024"\n'
        '"0","1","k","(32, 1, 1)","(1, 1, 1)","Command line profiler metrics","smsp__cycles_elapsed.sum","cycle","10"\n'
    )
    d = ncu.parse_ncu_csv(details)
    assert len(d) == 1 and d.loc[0, "dram__sectors_read.sum"] == 1024 and d.loc[0, "threads_per_block"] == 32
    assert ncu.parse_ncu_csv("==ERROR== no permission\n").empty


def test_run_ncu_always_disables_clock_control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    csv_text = FIXTURE.read_text()

    def fake_run(args, capture_output=True, text=True, timeout=None, env=None):  # noqa: ANN001
        calls.append(list(args))
        if "--export" in args:
            Path(args[args.index("--export") + 1] + ".ncu-rep").write_text("rep")
            return SimpleNamespace(returncode=0, stdout="", stderr="")
        return SimpleNamespace(returncode=0, stdout=csv_text, stderr="")

    monkeypatch.setattr(ncu.subprocess, "run", fake_run)
    out = tmp_path / "x.csv"
    df = ncu.run_ncu(["python", "app.py"], ["dram__sectors_read.sum"], out, nvtx_include=["fwd/"],
                     kernel_regex="chase", ncu=Path("/fake/ncu"))
    prof = calls[0]
    assert prof[prof.index("--clock-control") + 1] == "none"
    assert prof[-2:] == ["python", "app.py"]
    assert ["--nvtx-include", "fwd/"] == prof[prof.index("--nvtx-include"):prof.index("--nvtx-include") + 2]
    assert "--page" in calls[1] and "raw" in calls[1] and "--print-units" in calls[1]
    assert out.read_text() == csv_text and len(df) == 4
    with pytest.raises(ValueError, match="clock-control"):
        ncu.run_ncu(["x"], [], out, extra=["--clock-control", "base"], ncu=Path("/fake/ncu"))


def test_safety_check_on_fixture_rows() -> None:
    df = ncu.parse_ncu_csv(FIXTURE)
    counts = {"config": {"level": "l1", "blocks": 132, "threads": 1024, "array_bytes": 131072},
              "full": {"sectors_per_launch": 132 * 256 * 32.0, "meas_loads_per_thread": 32,
                       "wavefronts_per_launch": 0.0}}
    res = checks.evaluate_check(df.iloc[:2].reset_index(drop=True), 0, {"iters": 2}, counts)
    assert res["count_ratio"] == pytest.approx(1.0)
    assert res["hit_rate"] == pytest.approx(1_081_000 / 1_081_344)
    assert res["passed"] and res["grid_ok"]
    sweep = [{"level": "l1", "array_bytes": a, "hit_rate": h} for a, h in
             ((32768, 1.0), (65536, 0.999), (131072, 0.995), (196608, 0.6))]
    assert checks.choose_size(sweep, "l1", 131072) == (131072, "ncu miss-rate sweep")
    assert checks.choose_size(sweep, "l1", 100000)[0] == 65536
    assert checks.choose_size([], "l1", 100000)[0] == 100000


# -- features ----------------------------------------------------------------------------------

def test_memory_energy_features_numbers() -> None:
    df = ncu.parse_ncu_csv(FIXTURE)
    feats = memory_energy_features(df, {"levels": {k: {"pj_per_sector": v} for k, v in A100_REF.items()}})
    g = feats.loc[3]  # the GEMM row
    assert g["mem_energy_dram_mj"] == pytest.approx((2_097_152 + 1_048_576) * 2090e-9)
    assert g["mem_energy_l2_mj"] == pytest.approx(4_800_000 * 368e-9)
    assert g["mem_energy_l1_mj"] == pytest.approx(100_000 * 107e-9)
    assert g["mem_energy_shared_mj"] == pytest.approx(4_194_304 * 4 * 82.1e-9)
    assert g["mem_energy_total_mj"] == pytest.approx(
        g[["mem_energy_dram_mj", "mem_energy_l2_mj", "mem_energy_l1_mj", "mem_energy_shared_mj"]].sum())
    assert g["smsp_active_util"] == pytest.approx(150 / 160)
    assert g["smsp_issue_util"] == pytest.approx(48 / 160)
    # both tensor counters count SMSP cycles: over SMSP elapsed (20 / 40 would read as 50%)
    assert g["tc_active_util"] == pytest.approx(max(20 / 160, 25.6 / 160))
    assert g["tc_issue_util"] == pytest.approx(1.6 / 160)
    sh = feats.loc[2]  # dram read is n/a -> NaN, the rest still adds up
    assert math.isnan(sh["mem_energy_dram_mj"])
    assert sh["mem_energy_total_mj"] == pytest.approx(sh["mem_energy_l2_mj"] + sh["mem_energy_shared_mj"])


def test_features_fallbacks_and_missing_calibration() -> None:
    import pandas as pd

    c = pd.DataFrame({"lts__t_sectors.sum": [1000.0], "lts__t_sector_hit_rate.pct": [50.0],
                      "smsp__cycles_elapsed.sum": [0.0], "smsp__inst_issued.sum": [5.0]})
    f = memory_energy_features(c, {"levels": {"l2": {"pj_per_sector": 400.0}, "dram": {"pj_per_sector": None}}})
    assert f.loc[0, "mem_energy_l2_mj"] == pytest.approx(500 * 400e-9)
    assert math.isnan(f.loc[0, "smsp_issue_util"])  # zero elapsed cycles: undefined, not inf
    assert math.isnan(f.loc[0, "mem_energy_dram_mj"])
    assert all(m.count("__") == 1 and "." in m for m in METRICS)


# -- missing tools -----------------------------------------------------------------------------

def test_missing_nvcc_raises_tool_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    for v in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(build, "DEFAULT_CUDA_DIRS", ())
    with pytest.raises(ToolNotFound, match="nvcc.*PATH"):
        build.find_nvcc()


def test_missing_ncu_raises_ncu_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    for v in ("NCU", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(ncu, "DEFAULT_NCU_GLOBS", ())
    with pytest.raises(NcuNotFound, match="Nsight Compute"):
        ncu.find_ncu()
    assert issubclass(NcuNotFound, ToolNotFound)


def test_arch_flag() -> None:
    assert build.arch_flag("90") == "sm_90"
    assert build.arch_flag("sm_90a") == "sm_90a"
    assert build.arch_flag("native") == "native"
    with pytest.raises(ValueError):
        build.arch_flag("hopper")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_membench_compiles_for_sm90(tmp_path: Path) -> None:
    for extra in ([], ["-DMEMBENCH_MAIN"]):
        proc = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", *extra, "-c", str(ROOT / "cuda" / "membench.cu"),
                               "-o", str(tmp_path / "membench.o")], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_build_library_is_cached(tmp_path: Path) -> None:
    lib = build.build_library("sm_90", cache_dir=tmp_path)
    assert lib.exists() and lib.parent.name == "sm_90"
    mtime = lib.stat().st_mtime_ns
    assert build.build_library("sm_90", cache_dir=tmp_path) == lib and lib.stat().st_mtime_ns == mtime


# -- fake NVML + fake runner -------------------------------------------------------------------

class World:
    """Simulated time and board energy; the NVML counter only moves every ``period_s``."""

    def __init__(self, idle_w: float = 70.0, period_s: float = 0.1):
        self.idle_w, self.period_s = idle_w, period_s
        self.t = 0.0
        self.energy_mj = 0.0
        self.counter_mj = 0.0
        self.next_tick = period_s
        self.lock = threading.Lock()

    def advance(self, dt: float, power_w: float) -> None:
        with self.lock:
            end = self.t + dt
            while self.next_tick <= end:
                self.energy_mj += power_w * (self.next_tick - self.t) * 1000.0
                self.t = self.next_tick
                self.counter_mj = self.energy_mj
                self.next_tick += self.period_s
            self.energy_mj += power_w * (end - self.t) * 1000.0
            self.t = end

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.advance(s, self.idle_w)


def fake_nvml(world: World) -> SimpleNamespace:
    """The pynvml functions gpurec.device.nvml uses, backed by ``world``."""
    return SimpleNamespace(
        NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1, NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetTotalEnergyConsumption=lambda h: int(world.counter_mj),
        nvmlDeviceGetPowerUsage=lambda h: int(world.idle_w * 1000),
        nvmlDeviceGetClockInfo=lambda h, kind: 1980 if kind == 0 else 2619,
        nvmlDeviceGetMaxClockInfo=lambda h, kind: 1980 if kind == 0 else 2619,
        nvmlDeviceGetTemperature=lambda h, kind: 40,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0,
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: "GPU-fake",
        nvmlSystemGetDriverVersion=lambda: "580.00",
        nvmlSystemGetCudaDriverVersion=lambda: 13000,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 * 2**30),
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
    )


class FakeRunner:
    """Launch time and energy follow E = E_warm + eps x sectors + dE per launch.

    Sector rates are of the real order (1e11 per second and more), so dynamic power is tens
    to hundreds of watts, as on the GPU.
    """

    RATE = {"shared": 6e11, "l1": 4e11, "l2": 2e11, "dram": 8e10}

    def __init__(self, world: World, eps_pj: dict[str, float], offset_mj: float = 5.0,
                 warm_mj: float = 100.0, warm_ms: float = 1.0, props: DeviceProps = H100):
        self.world, self.eps_pj, self.offset_mj = world, eps_pj, offset_mj
        self.warm_mj, self.warm_ms = warm_mj, warm_ms
        self.props = props
        self.calls: list[tuple] = []
        self.spans: list[tuple[float, float]] = []  # (start, end) of every run, world time

    def device_props(self) -> DeviceProps:
        return self.props

    def prepare(self, cfg: BenchConfig) -> None:
        self.calls.append(("prepare", cfg))

    def release(self) -> None:
        pass

    def run(self, cfg: BenchConfig, iters: int, warmup_only: bool, launches: int = 1) -> RunResult:
        s = -(-cfg.threads // 4) * 4
        spp = max(1, cfg.array_bytes // 8 // s)
        steps = 0 if warmup_only else -(-iters * spp // 16) * 16
        sectors = cfg.blocks * -(-cfg.threads // 4) * steps
        t_launch_s = self.warm_ms / 1000.0 + sectors / self.RATE[cfg.level]
        e_launch = self.warm_mj + (0.0 if warmup_only else self.eps_pj[cfg.level] * 1e-9 * sectors + self.offset_mj)
        self.world.advance(launches * t_launch_s, self.world.idle_w + e_launch / t_launch_s / 1000.0)
        self.calls.append(("run", cfg, iters, warmup_only, launches))
        self.spans.append((self.world.t - launches * t_launch_s, self.world.t))
        return RunResult(
            elapsed_ms=launches * t_launch_s * 1000, launches=launches, steps_per_pass=spp,
            meas_loads_per_thread=steps, array_bytes_used=spp * s * 8, stride_bytes=s * 8,
            sectors_per_launch=float(sectors), warm_sectors_per_launch=float(cfg.blocks * -(-cfg.threads // 4) * spp),
            wavefronts_per_launch=float(sectors / 4), div_warp_insts_per_launch=0.0,
            loads_per_launch=float(cfg.blocks * cfg.threads * steps),
        )


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch):
    w = World()
    nvml.set_backend(fake_nvml(w))
    yield w
    nvml.set_backend(None)


@contextlib.contextmanager
def sim_monitor(world: World, settings: SweepSettings | None = None) -> Iterator[EnergyMonitor]:
    """The sweep's window in simulated time: a polled sampler on the world's clock and sleep."""
    st = settings or SweepSettings()
    sampler = Sampler(nvml.open_gpu(0), poll_s=st.tick_poll_s, state_every_s=st.sample_period_s,
                      clock=world.clock, threaded=False)
    with sampler:
        yield EnergyMonitor(sampler, st.tick_timeout_s, sleep=world.sleep)


def test_polled_sampler_opens_and_closes_on_fresh_ticks_in_simulated_time(world: World) -> None:
    """Without a thread, a counter change found late (the board was busy while nobody polled)
    has an unknown time: windows must open and close on later updates, or they would charge
    energy to the wrong interval."""
    switch = sys.getswitchinterval()
    with sim_monitor(world) as mon:
        assert mon.sampler._thread is None and sys.getswitchinterval() == switch
        world.advance(1.05, 300.0)
        start = mon.begin_window(None)
        assert start.tick.t_s == pytest.approx(1.1, abs=1e-3)
        world.advance(1.05, 300.0)  # busy inside the window, unpolled, past its minimum length
        busy = mon.end_window(start, None, min_window_s=0.5)
        idle = mon.end_window(mon.begin_window(None), None, min_window_s=1.0)
    assert busy.window_s == pytest.approx(1.1, abs=1e-3)  # closed on the update at 2.2, not on the stale one
    assert busy.power_w == pytest.approx((1.05 * 300.0 + 0.05 * world.idle_w) / 1.1, rel=1e-3)
    assert idle.power_w == pytest.approx(world.idle_w, rel=1e-3)
    assert idle.window_s >= 0.999 and idle.window_ticks == round(idle.window_s / world.period_s)
    assert idle.sm_clock_mhz == 1980 and idle.mem_clock_mhz == 2619 and idle.temperature_c == 40
    assert idle.throttle_reasons == "" and idle.nvml_power_1s_avg_w == pytest.approx(world.idle_w)


def test_stalled_counter_raises_on_the_simulated_clock(world: World) -> None:
    world.period_s = world.next_tick = 1e9  # the counter never updates
    t0 = time.perf_counter()
    with sim_monitor(world, SweepSettings(tick_timeout_s=0.6)) as mon, pytest.raises(CounterStalled):
        mon.begin_window(None)
    assert world.t == pytest.approx(0.6, abs=0.01)  # waited in simulated time
    assert time.perf_counter() - t0 < 5.0


def test_sweep_subtracts_warmup_and_idle_and_recovers_eps(world: World) -> None:
    runner = FakeRunner(world, A100_REF, offset_mj=5.0, warm_mj=100.0)
    st = SweepSettings(window_s=1.0, idle_s=2.0)
    with sim_monitor(world, st) as mon:
        sw = Sweeper(mon, runner, st)
        assert sw.measure_idle("before") == pytest.approx(world.idle_w, rel=2e-3)
        cfg = BenchConfig("l1", 128 * 1024, 132, 1024)
        rows = sw.run_config(cfg)
        sw.measure_idle("after")
    assert len(rows) == 3 * 7 and sum(r["warmup_only"] for r in rows) == 3
    assert len({r["iters"] for r in rows if not r["warmup_only"]}) == 6
    assert all(r["window_s"] >= 1.0 for r in rows)
    # every window opens before its launches and closes at least the tail after them
    for r, (run0, run1) in zip(rows, runner.spans[-len(rows):], strict=True):
        assert r["t_start_s"] <= run0 and r["t_end_s"] >= run1 + st.tail_s
        assert r["t_end_s"] - r["t_start_s"] == pytest.approx(r["window_s"])
    # the row carries the one window's measurement under its names
    for r in rows:
        assert (r["sm_clock_mhz"], r["temperature_c"], r["throttle_reasons"]) == (1980, 40, ""), r
        assert "energy_mj" not in r and r["window_ticks"] >= 1
    assert all(r["power_w"] == pytest.approx(r["window_energy_mj"] / 1000 / r["window_s"]) for r in rows)
    assert sw.counter_period_s() == pytest.approx(world.period_s, rel=0.02)
    done = finalize_rows(rows, sw.idle)
    warm = [r for r in done if r["warmup_only"]]
    assert all(r["dyn_energy_per_launch_mj"] == pytest.approx(100.0, rel=1e-3) for r in warm)
    full = [r for r in done if not r["warmup_only"]]
    for r in full:  # warm-up energy removed; what is left is eps x sectors + offset
        # polled, a tick is seen up to one poll late at either end: idle power x poll_s per window,
        # in the window and again in the idle power subtracted from it
        resolution_mj = world.idle_w * st.tick_poll_s * 1000.0 / r["launches"]
        assert r["meas_energy_mj"] == pytest.approx(107e-9 * r["sectors_per_launch"] + 5.0, rel=1e-3,
                                                    abs=2 * resolution_mj)
    (f,) = fit.fit_all(done)
    assert f["pj_per_sector"] == pytest.approx(107.0, rel=1e-3)
    assert f["offset_mj"] == pytest.approx(5.0, rel=5e-2)
    assert f["r2"] > 0.999 and f["n_points"] == 6
    # repeats alternate the order of the access counts
    order = [r["iters"] for r in rows if not r["warmup_only"]]
    assert order[:6] == sorted(order[:6]) and order[6:12] == sorted(order[6:12], reverse=True)


def test_a_window_that_misses_the_launches_is_noticed(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fakes can fail: a window opened after the launches holds idle power only, so the
    energy per access comes out near zero and the coverage check above fails."""
    def late(monitor, work, tail_s):  # noqa: ANN001, ANN202
        result = work()
        start = monitor.begin_window(None)
        end = monitor.end_window(start, None, min_window_s=0.0, not_before_s=monitor.sampler.clock() + tail_s)
        return result, start, end

    monkeypatch.setattr(sweep_mod, "window_around", late)
    runner = FakeRunner(world, A100_REF, offset_mj=5.0, warm_mj=100.0)
    with sim_monitor(world) as mon:
        sw = Sweeper(mon, runner, SweepSettings(window_s=1.0, idle_s=1.0))
        sw.measure_idle("before")
        rows = sw.run_config(BenchConfig("l1", 128 * 1024, 132, 1024))
    assert not all(r["t_start_s"] <= run0 for r, (run0, _) in zip(rows, runner.spans[-len(rows):], strict=True))
    (f,) = fit.fit_all(finalize_rows(rows, sw.idle))
    assert abs(f["pj_per_sector"]) < 5.0  # not the 107 pJ the launches spent


def test_sweep_without_warmup_subtraction_would_bias_offset(world: World) -> None:
    """Sanity of the method: the warm-up energy lands in the intercept, not the slope."""
    runner = FakeRunner(world, A100_REF, warm_mj=200.0)
    with sim_monitor(world) as mon:
        sw = Sweeper(mon, runner, SweepSettings(window_s=1.0, idle_s=1.0))
        sw.measure_idle("before")
        sw.run_config(BenchConfig("dram", 2 * 2**20, 132, 1024))
    done = [r for r in finalize_rows(sw.rows, sw.idle) if not r["warmup_only"]]
    raw = fit.linear_fit([r["sectors_per_launch"] for r in done], [r["dyn_energy_per_launch_mj"] for r in done])
    sub = fit.linear_fit([r["sectors_per_launch"] for r in done], [r["meas_energy_mj"] for r in done])
    assert raw.slope == pytest.approx(sub.slope, rel=1e-3) == pytest.approx(2090e-9, rel=1e-3)
    assert raw.intercept == pytest.approx(205.0, rel=1e-2) and sub.intercept == pytest.approx(5.0, rel=0.1)


def test_sweep_skips_configs_past_the_deadline(world: World) -> None:
    with sim_monitor(world) as mon:
        sw = Sweeper(mon, FakeRunner(world, A100_REF), SweepSettings(), deadline_s=30.0)
        done, skipped = sw.run_all([BenchConfig("l1", 131072, 132, 1024), BenchConfig("l2", 131072, 132, 1024)])
    assert len(done) == 1 and len(skipped) == 1


class BoardRunner:
    """Real-time runner: each launch keeps a fake board busy for ``warm_ms + iters x pass_ms``."""

    def __init__(self, board: FakeBoard, warm_ms: float = 0.5, pass_ms: float = 0.05):
        self.board, self.warm_ms, self.pass_ms = board, warm_ms, pass_ms
        self.spans: list[tuple[float, float, float]] = []  # (start, end, busy seconds), perf_counter

    def prepare(self, cfg: BenchConfig) -> None:
        pass

    def run(self, cfg: BenchConfig, iters: int, warmup_only: bool, launches: int = 1) -> RunResult:
        passes = 0 if warmup_only else iters
        t0, busy0 = time.perf_counter(), self.board.busy_s
        self.board.run(launches * (self.warm_ms + passes * self.pass_ms) / 1000.0)
        t1 = time.perf_counter()
        self.spans.append((t0, t1, self.board.busy_s - busy0))
        return RunResult(elapsed_ms=(t1 - t0) * 1000.0, launches=launches, steps_per_pass=1,
                         meas_loads_per_thread=passes, array_bytes_used=cfg.array_bytes, stride_bytes=8,
                         sectors_per_launch=1000.0 * passes, warm_sectors_per_launch=1000.0,
                         wavefronts_per_launch=0.0, div_warp_insts_per_launch=0.0, loads_per_launch=0.0)


def test_sweep_in_real_time_with_the_sampler_thread() -> None:
    """The GPU's path: the sampler's thread timestamps every counter update while the launches
    run.  The board draws busy power only while work runs, so each window's dynamic energy is
    the launches' and nothing else, and the window brackets the launches plus the tail."""
    idle_w, busy_w = 80.0, 300.0
    board = FakeBoard(power_w=busy_w, idle_power_w=idle_w, update_period_s=0.01)
    nvml.set_backend(FakeNVML([board]))
    st = SweepSettings(window_s=0.15, n_points=2, repeats=1, idle_s=0.2, settle_s=0.0, tail_s=0.03,
                       target_launch_ms=5.0, tick_timeout_s=1.0, sample_period_s=0.01)
    runner = BoardRunner(board)
    try:
        sampler = Sampler(nvml.open_gpu(0), poll_s=st.tick_poll_s, state_every_s=st.sample_period_s)
        with sampler:
            assert sampler._thread is not None
            sw = Sweeper(EnergyMonitor(sampler, st.tick_timeout_s), runner, st)
            assert sw.measure_idle("before") == pytest.approx(idle_w, rel=0.05)
            rows = sw.run_config(BenchConfig("l1", 131072, 132, 1024))
            sw.measure_idle("after")
    finally:
        nvml.set_backend(None)
    assert len(rows) == 3
    done = finalize_rows(rows, sw.idle)
    for r, (t0, t1, busy_s) in zip(done, runner.spans[-3:], strict=True):
        assert r["t_start_s"] <= t0 and r["t_end_s"] >= t1 + st.tail_s
        assert r["dyn_energy_mj"] == pytest.approx((busy_w - idle_w) * busy_s * 1000.0, rel=0.1)
        assert idle_w < r["power_w"] < busy_w
        assert r["window_ticks"] >= 10 and r["sm_clock_mhz"] == 1980
    assert sw.counter_period_s() == pytest.approx(0.01, rel=0.3)


def test_finalize_reads_rows_written_before_the_one_window() -> None:
    """The committed calibrations name the window energy ``energy_mj``; both names give the
    same dynamic energy, and the committed points' derived columns are reproduced."""
    idle = IdleModel([(0.0, 70.0)])
    new = {"config_id": "c", "warmup_only": False, "launches": 10, "t_start_s": 0.0, "t_end_s": 1.0,
           "window_s": 1.0, "window_energy_mj": 170_000.0}
    old = {k: v for k, v in new.items() if k != "window_energy_mj"} | {"energy_mj": 170_000.0}
    (a,), (b,) = finalize_rows([new], idle), finalize_rows([old], idle)
    assert a["dyn_energy_mj"] == b["dyn_energy_mj"] == pytest.approx(100_000.0)
    path = ROOT / "datasets" / "h100" / "calibration" / "calibration.json"
    if not path.exists():
        return
    cal = json.loads(path.read_text())
    derived = ("idle_power_w", "dyn_energy_mj", "dyn_energy_per_launch_mj", "warm_energy_per_launch_mj",
               "meas_energy_mj")
    raw = [{k: v for k, v in p.items() if k not in derived} for p in cal["points"]]
    model = IdleModel()
    for r in cal["provenance"]["idle"]:
        model.add(0.5 * (r["t_start_s"] + r["t_end_s"]), r["power_w"])
    for p, q in zip(cal["points"], finalize_rows(raw, model), strict=True):
        assert q["meas_energy_mj"] == pytest.approx(p["meas_energy_mj"], rel=1e-9, abs=1e-9)


def test_observed_reads_both_row_schemas() -> None:
    old = [{"sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0, "temperature_c_max": 51, "throttle_mask": 0x4}]
    new = [{"sm_clock_mhz": 1755.0, "mem_clock_mhz": 2619.0, "temperature_c": 60,
            "throttle_reasons": "sw_power_cap,sw_thermal"},
           {"sm_clock_mhz": float("nan"), "temperature_c": float("nan"), "throttle_reasons": ""}]
    o = calib._observed(old + new)
    assert o["sm_clock_mhz_min"] == 1755.0 and o["sm_clock_mhz_max"] == 1980.0
    assert o["temperature_c_max"] == 60 and o["mem_clock_mhz_median"] == 2619.0
    assert o["throttle_reasons_seen"] == ["sw_power_cap", "sw_thermal"]  # the mask's bit and the names, once


def test_idle_model_interpolates() -> None:
    m = IdleModel()
    m.add(0.0, 60.0)
    m.add(100.0, 80.0)
    assert m.power_at(-5) == 60.0 and m.power_at(50) == pytest.approx(70.0) and m.power_at(500) == 80.0


def test_iters_points_distinct_and_sized() -> None:
    sw = Sweeper(None, None, SweepSettings(n_points=6, target_launch_ms=30.0))  # type: ignore[arg-type]
    pts = sw.iters_points(t_warm_ms=2.0, t_pass_ms=0.5)
    assert len(set(pts)) == 6 and pts[-1] == 56
    assert sw.iters_points(t_warm_ms=50.0, t_pass_ms=50.0) == [1, 2, 3, 4, 5, 6]


# -- planning and the whole run on fakes ---------------------------------------------------------

def test_default_sizes_and_plan_for_h100() -> None:
    sizes = calib.default_sizes(H100)
    assert sizes["shared"] == 48 * 1024 and sizes["l1"] == 128 * 1024
    assert 10 * 2**20 <= sizes["l2_footprint"] <= 25 * 2**20
    assert sizes["dram_footprint"] >= 8 * H100.l2_bytes
    assert calib.array_bytes_for("l1", 264, sizes, 132) == 64 * 1024
    assert calib.array_bytes_for("l2", 132, sizes, 132) * 132 <= sizes["l2_footprint"]
    plan = calib.plan_configs(H100, sizes)
    assert [(c.level, c.threads, c.div) for c in plan[:5]] == [
        ("l1", 1024, False), ("shared", 1024, False), ("l2", 1024, False), ("dram", 1024, False), ("l1", 1024, True)]
    assert {c.threads for c in plan} >= {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
    assert any(c.blocks == 264 for c in plan) and len(set(plan)) == len(plan)
    assert len(calib.plan_configs(H100, sizes, quick=True)) == 5
    for s in calib.check_spec(H100, sizes) + calib.miss_sweep_spec(H100, sizes):
        assert s["array_bytes"] >= 8 * 1024


def test_run_calibration_on_fakes_writes_json_shape(world: World, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    runner = FakeRunner(world, A100_REF)
    monkeypatch.setattr(calib.build_mod, "find_nvcc", lambda: Path("/fake/nvcc"))
    monkeypatch.setattr(calib.build_mod, "nvcc_version", lambda nvcc=None: "13.0.88")
    monkeypatch.setattr(calib.build_mod, "build_library", lambda arch, nvcc=None: Path("/fake/libmembench.so"))
    monkeypatch.setattr(calib, "Microbench", lambda lib, device: runner)
    monkeypatch.setattr(calib, "_now", world.clock)
    monkeypatch.setattr(calib, "_sleep", world.sleep)
    monkeypatch.setattr(calib, "_sampler_thread", False)
    res = calib.run_calibration(0, tmp_path, budget_s=400.0, quick=True, use_ncu=False, window_s=1.0)
    on_disk = json.loads((tmp_path / "calibration.json").read_text())
    assert set(on_disk) == {"gpu", "levels", "div_nj", "ncu_checks", "points", "provenance"}
    assert on_disk["gpu"] == "NVIDIA H100 80GB HBM3"
    assert set(on_disk["levels"]) == {"shared", "l1", "l2", "dram"}
    for level, ref in A100_REF.items():
        entry = on_disk["levels"][level]
        assert set(entry) == {"pj_per_sector", "offset_mj", "r2", "threads_per_block"}
        assert entry["pj_per_sector"] == pytest.approx(ref, rel=1e-2)
        assert entry["threads_per_block"] == 1024
    assert on_disk["ncu_checks"]["passed"] is False and "skipped" in on_disk["ncu_checks"]["error"]
    prov = on_disk["provenance"]
    assert prov["clocks"] == "default (not locked; lent GPU)"
    assert prov["nvcc_version"] == "13.0.88" and prov["driver_version"] == "580.00"
    assert len(on_disk["points"]) == len(res["points"]) == 5 * 21
    assert (tmp_path / "plots" / "energy_vs_accesses.png").exists()
    assert (tmp_path / "plots" / "eps_vs_threads.png").exists()


def test_calibrate_command_on_fakes(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = FakeRunner(world, A100_REF)
    monkeypatch.setattr(calib.build_mod, "find_nvcc", lambda: Path("/fake/nvcc"))
    monkeypatch.setattr(calib.build_mod, "nvcc_version", lambda nvcc=None: "13.0.88")
    monkeypatch.setattr(calib.build_mod, "build_library", lambda arch, nvcc=None: Path("/fake/libmembench.so"))
    monkeypatch.setattr(calib, "Microbench", lambda lib, device: runner)
    monkeypatch.setattr(calib, "_now", world.clock)
    monkeypatch.setattr(calib, "_sleep", world.sleep)
    monkeypatch.setattr(calib, "_sampler_thread", False)
    from typer.testing import CliRunner

    import cli

    res = CliRunner().invoke(cli.app, ["calibrate", "--out", str(tmp_path), "--budget-s", "200", "--no-ncu",
                                       "--levels", "l2,dram", "--threads", "32", "--no-div", "--window-s", "1.0"])
    assert res.exit_code == 0, res.output
    d = json.loads((tmp_path / "calibration.json").read_text())
    assert d["levels"]["l2"]["pj_per_sector"] == pytest.approx(368, rel=1e-2)
    assert d["levels"]["l1"]["pj_per_sector"] is None  # not requested
    done = d["provenance"]["plan"]["done"]
    assert {(c["level"], c["threads"]) for c in done} <= {("l2", 1024), ("dram", 1024), ("l2", 32), ("dram", 32)}
    assert not any(c["div"] for c in done)
    assert (tmp_path / "calibrate.log").read_text().count("idle") >= 1
    bad = CliRunner().invoke(cli.app, ["calibrate", "--out", str(tmp_path), "--levels", "l3"])
    assert bad.exit_code == 2 and "unknown level(s) l3" in bad.output
    bad = CliRunner().invoke(cli.app, ["calibrate", "--out", str(tmp_path), "--threads", "32,x"])
    assert bad.exit_code == 2 and "--threads" in bad.output


def test_ncu_stage_with_perfect_fake_counters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ncu stage wiring: miss sweep picks sizes, checks pass on ideal counters, missing metrics listed."""
    import pandas as pd

    def fake_profile(lib, spec, metrics, out_csv, device=0, timeout_s=0.0, ncu=None):  # noqa: ANN001
        rows, analytic = [], []
        for e in spec:
            cfg = BenchConfig(e["level"], e["array_bytes"], e["blocks"], e["threads"])
            w = World()
            r = FakeRunner(w, A100_REF)
            warm, full = r.run(cfg, 0, True), r.run(cfg, e["iters"], False)
            analytic.append({"config": cfg.as_dict(), "warm": warm.__dict__, "full": full.__dict__})
            fits_l1 = e["array_bytes"] <= 192 * 1024
            fits_l2 = e["array_bytes"] * e["blocks"] <= 30 * 2**20
            for res in (warm, full):
                meas = res.sectors_per_launch
                row = {"grid_blocks": e["blocks"], "threads_per_block": e["threads"],
                       checks.M_L1_SECT: res.warm_sectors_per_launch + meas,
                       checks.M_L1_HIT: meas if fits_l1 else 0.0,
                       checks.M_L2_SECT: res.warm_sectors_per_launch + meas,
                       checks.M_L2_HIT: meas if fits_l2 else 0.0,
                       checks.M_DRAM: res.warm_sectors_per_launch + (0.0 if fits_l2 else meas),
                       checks.M_SH_WF: res.wavefronts_per_launch + res.warm_sectors_per_launch / 4,
                       checks.M_SH_INST: 0.0}
                if e["level"] == "shared":
                    row[checks.M_SH_WF] = full.wavefronts_per_launch if res is full else 0.0
                rows.append(row)
        out_csv.write_text("x")
        return pd.DataFrame(rows), analytic

    monkeypatch.setattr(calib.ncu_mod, "find_ncu", lambda: Path("/fake/ncu"))
    monkeypatch.setattr(calib.ncu_mod, "ncu_version", lambda ncu=None: "2025.3.0.0")
    available = {ncu.metric_base(m) for m in [*checks.CHECK_METRICS, *METRICS] if "gmma" not in m}
    monkeypatch.setattr(calib.ncu_mod, "query_metrics", lambda path=None, timeout_s=0: available)
    monkeypatch.setattr(checks, "profile_configs", fake_profile)
    sizes = calib.default_sizes(H100)
    res, sweep = calib._ncu_stage(Path("/fake/lib.so"), H100, sizes, 0, tmp_path, 60.0, quick=False)
    assert res["error"] is None, res["error"]
    assert res["passed"], [c for c in res["configs"] if not c["passed"]]
    assert res["feature_metrics_unavailable"] == ["smsp__inst_executed_pipe_tensor_op_gmma.sum"]
    assert sizes["l1"] == 128 * 1024 and res["size_source"]["l1"] == "ncu miss-rate sweep"
    l1 = [r for r in sweep if r["level"] == "l1"]
    assert [r["hit_rate"] for r in l1][:2] == [1.0, 1.0] and l1[-1]["hit_rate"] == 0.0
    assert {c["config"]["level"] for c in res["configs"]} == {"shared", "l1", "l2", "dram"}
