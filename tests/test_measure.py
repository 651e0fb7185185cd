"""Host-free measurement on the CPU: a fake board whose power accrues only while work runs,
and a fake capture path that, like a CUDA graph, replays the device work without the host's.

The fakes can notice a broken measurement: an energy window that does not cover the timed
replay reads idle power, a capture that kept the host's work reads the eager time, and the
window's clock, temperature and throttle aggregates are checked against known readings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakes import FakeBoard, FakeNVML

from gpurec.collect import measure as measure_mod
from gpurec.collect.in_network import attribute, columnar, host_times_us
from gpurec.collect.measure import WindowConfig, measure_network, measure_op
from gpurec.collect.runner import done_ids
from gpurec.dataset.store import JsonlShard
from gpurec.device import nvml, open_gpu
from gpurec.device.graphs import CaptureFailed, CpuBackend
from gpurec.device.sampler import Sampler, StateSample, Tick
from gpurec.device.window import EnergyMonitor

IDLE_W, BUSY_W = 80.0, 300.0
GPU_S, HOST_S = 0.002, 0.0015  # per call: device work, and the host's Python work before it
CFG = WindowConfig(min_window_s=0.3, eager_blocks=3, eager_min_block_s=0.004, target_replay_ms=12.0,
                   gpu_blocks=3, gpu_min_block_ms=12.0, tick_timeout_s=10.0)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class FakeGraphs(CpuBackend):
    """A capture backend: ``capture`` records the device work a call issues (``board.run``
    inside the step is recorded, not run), ``replay`` runs only that work."""

    def __init__(self, board: FakeBoard, fail: str | None = None):
        self.board = board
        self.fail = fail
        self.recording: list[float] | None = None
        self.captures = 0

    def capture(self, fn: Callable[[], None], reps: int) -> _Replay:
        if self.fail:
            raise CaptureFailed(self.fail)
        self.captures += 1
        self.recording = []
        try:
            for _ in range(reps):
                fn()
        finally:
            work, self.recording = self.recording, None
        return _Replay(self.board, sum(work))

    def mark(self) -> _Replay:
        return _Replay(self.board, 0.0)


class _Replay:
    def __init__(self, board: FakeBoard, seconds: float):
        self.board, self.seconds = board, seconds

    def replay(self) -> None:
        self.board.run(self.seconds)

    def synchronize(self) -> None:
        pass


def _step(board: FakeBoard, graphs: FakeGraphs) -> Callable[[], None]:
    def step() -> None:
        _spin(HOST_S)  # Python, dispatch, launch: not part of a replay
        if graphs.recording is not None:
            graphs.recording.append(GPU_S)
        else:
            board.run(GPU_S)

    return step


@pytest.fixture
def board() -> Iterator[FakeBoard]:
    b = FakeBoard(power_w=BUSY_W, idle_power_w=IDLE_W, update_period_s=0.02)
    nvml.set_backend(FakeNVML([b]))
    yield b
    nvml.set_backend(None)


def test_host_free_row_measures_the_replay_not_the_host(board: FakeBoard) -> None:
    graphs = FakeGraphs(board)
    with Sampler(open_gpu(0)) as s:
        row = measure_op(_step(board, graphs), EnergyMonitor(s, 10.0), CFG, graphs, inference=True,
                         idle_power_w=IDLE_W, power_limit_w=700.0)
    assert row["schema"] == 2 and row["captured"] is True and graphs.captures >= 1
    assert row["gpu_time_ms"] == pytest.approx(GPU_S * 1e3, rel=0.35)
    assert row["time_ms"] > row["gpu_time_ms"] + HOST_S * 1e3 * 0.6  # eager carries the host's work
    assert row["host_ms"] >= HOST_S * 1e3 * 0.9
    # the window covered replays only: busy power, not idle, not a mix with the eager phase
    assert row["gpu_power_w"] == pytest.approx(BUSY_W, rel=0.1)
    assert row["gpu_energy_mj"] == pytest.approx(row["gpu_power_w"] * row["gpu_time_ms"])
    assert row["gpu_window_s"] >= CFG.min_window_s and row["gpu_window_ticks"] >= 10
    assert row["gpu_timer_blocks"] == CFG.gpu_blocks and row["gpu_time_iqr_ms"] >= 0
    assert row["gpu_power_out_of_range"] is False
    assert row["gpu_window_retried"] is False  # a retry would hide a first window that missed the work


def test_a_window_that_misses_the_replay_reads_idle(board: FakeBoard, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake notices the break the issue names: measure the window while the board
    idles, before the timed replays, and the row's power reads idle, not busy."""
    def broken(busy, timed, monitor, cfg, idle_power_w, power_limit_w, extra_timeout_s=0.0):  # noqa: ANN001
        m = monitor.end_window(monitor.begin_window(None), None, cfg.min_window_s)
        return timed(), m, {"window_retried": False, "power_out_of_range": False}

    monkeypatch.setattr(measure_mod, "timed_window", broken)
    graphs = FakeGraphs(board)
    with Sampler(open_gpu(0)) as s:
        row = measure_op(_step(board, graphs), EnergyMonitor(s, 10.0), CFG, graphs, inference=True,
                         idle_power_w=IDLE_W, power_limit_w=700.0)
    assert row["gpu_power_w"] == pytest.approx(IDLE_W, rel=0.1)
    assert abs(row["gpu_power_w"] - BUSY_W) > 0.5 * (BUSY_W - IDLE_W)


def test_capture_failure_falls_back_to_eager_with_the_reason(board: FakeBoard) -> None:
    graphs = FakeGraphs(board, fail="operation not permitted when stream is capturing")
    with Sampler(open_gpu(0)) as s:
        row = measure_op(_step(board, graphs), EnergyMonitor(s, 10.0), CFG, graphs, inference=False,
                         idle_power_w=IDLE_W, power_limit_w=700.0)
    assert row["captured"] is False and "stream is capturing" in row["capture_error"]
    # eager timing: host work included, the row is still complete
    assert row["gpu_time_ms"] > (GPU_S + HOST_S * 0.6) * 1e3
    assert IDLE_W < row["gpu_power_w"] < BUSY_W and row["gpu_energy_mj"] > 0


def test_impossible_power_is_measured_again_and_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    b = FakeBoard(power_w=900.0, idle_power_w=IDLE_W, update_period_s=0.02)
    nvml.set_backend(FakeNVML([b]))
    try:
        graphs = FakeGraphs(b)
        with Sampler(open_gpu(0)) as s:
            row = measure_op(_step(b, graphs), EnergyMonitor(s, 10.0), CFG, graphs, inference=True,
                             idle_power_w=IDLE_W, power_limit_w=700.0)
    finally:
        nvml.set_backend(None)
    assert row["gpu_window_retried"] is True and row["gpu_power_out_of_range"] is True
    assert row["gpu_first_window_power_w"] > 700.0
    assert row["gpu_window_s"] >= CFG.min_window_s * CFG.retry_window_factor


def test_network_row_has_eager_and_host_free_figures(board: FakeBoard) -> None:
    graphs = FakeGraphs(board)
    with Sampler(open_gpu(0)) as s:
        row = measure_network(_step(board, graphs), EnergyMonitor(s, 10.0), CFG, graphs, inference=True,
                              idle_power_w=IDLE_W, power_limit_w=700.0)
    assert row["time_ms"] > row["gpu_time_ms"] and row["captured"] is True
    assert row["energy_mj"] == pytest.approx(row["power_w"] * row["time_ms"])
    assert IDLE_W < row["power_w"] < BUSY_W  # eager: the board idles while the host works
    assert row["gpu_power_w"] == pytest.approx(BUSY_W, rel=0.1)
    assert row["window_retried"] is False and row["gpu_window_retried"] is False
    assert row["host_ms"] >= HOST_S * 1e3 * 0.9 and row["host_min_ms"] <= row["host_ms"]


# -- the window's aggregates, on known readings ---------------------------------------------------

class _StubSampler:
    def __init__(self, ticks: list[Tick], states: list[StateSample]):
        self.ticks, self.states = ticks, states

    def ticks_between(self, t0: float, t1: float) -> list[Tick]:
        return [t for t in self.ticks if t0 <= t.t_s <= t1]

    def states_between(self, t0: float, t1: float) -> list[StateSample]:
        return [s for s in self.states if t0 <= s.t_s <= t1]


def test_window_aggregates_every_reading_inside_it() -> None:
    ticks = [Tick(0.1 * i, 40_000.0 * i) for i in range(6)]  # 400 W
    power_cap = 0x4  # sw_power_cap
    states = [StateSample(0.05 + 0.1 * i, 390.0, clk, 2619, temp, mask)
              for i, (clk, temp, mask) in enumerate([(1980, 50, 0), (1755, 58, power_cap), (1980, 61, 0),
                                                      (1980, 57, 0), (1900, 55, 0), (1980, 70, 0)])]
    m = EnergyMonitor(_StubSampler(ticks, states))._measure(ticks[0], ticks[5], calls=7)  # type: ignore[arg-type]
    assert m.power_w == pytest.approx(400.0) and m.window_ticks == 5 and m.window_s == pytest.approx(0.5)
    assert m.throttle_reasons == "sw_power_cap"  # seen mid-window, absent at its end
    assert m.sm_clock_min_mhz == 1755 and m.sm_clock_mhz == pytest.approx((1980 * 3 + 1755 + 1900) / 5)
    assert m.temperature_c == 61  # the hottest reading inside (the 70 C one is after the window)
    assert m.calls == 7 and m.nvml_power_1s_avg_w == pytest.approx(390.0)


def test_changing_board_readings_reach_the_row(board: FakeBoard) -> None:
    board.clock_dips = (0.1, 0.03, 1410)
    board.throttle_bursts = (0.1, 0.03, 0x4)
    board.temp_rise_c_per_s = 20.0
    graphs = FakeGraphs(board)
    with Sampler(open_gpu(0)) as s:
        row = measure_op(_step(board, graphs), EnergyMonitor(s, 10.0), CFG, graphs, inference=True,
                         idle_power_w=IDLE_W, power_limit_w=700.0)
    assert row["gpu_sm_clock_min_mhz"] == 1410 and row["gpu_sm_clock_mhz"] > 1410
    assert "sw_power_cap" in row["gpu_throttle_reasons"]
    assert row["gpu_temperature_c"] >= int(board.temp_start_c + board.temp_rise_c_per_s * 0.3)


# -- resuming: rows of the eager-only method are not done -----------------------------------------

def test_done_ids_skip_rows_of_an_older_method(tmp_path: Path) -> None:
    with JsonlShard(tmp_path / "rows-0.jsonl") as sh:
        sh.append({"id": "op:a:inference", "status": "ok"})  # schema 1: eager only
        sh.append({"id": "op:b:inference", "status": "ok", "schema": 2})
        sh.append({"id": "op:c:training", "status": "failed", "schema": 2})
    assert done_ids(tmp_path, min_schema=2) == {"op:b:inference", "op:c:training"}
    assert done_ids(tmp_path, retry_failed=True, min_schema=2) == {"op:b:inference"}
    assert done_ids(tmp_path) == {"op:a:inference", "op:b:inference", "op:c:training"}


# -- in-network attribution on a recorded trace --------------------------------------------------

class _Op:
    def __init__(self, node: str, kind: str, sig: str):
        self.node, self.kind, self.signature = node, kind, sig


def _trace() -> dict:
    """conv1 (forward kernel, backward kernel via sequence number 7), relu (one kernel), a
    bookkeeping node 'flatten' whose copy kernel is not an operation, and a kernel launched
    outside every range."""
    ev = []

    def x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: object) -> None:
        ev.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args})

    x("user_annotation", "gpurec_iter#0", 0, 1000)
    x("user_annotation", "module::conv1::Conv2d", 10, 100)
    x("cpu_op", "aten::conv2d", 20, 80, **{"Sequence number": 7, "Fwd thread id": 0})
    x("cuda_runtime", "cudaLaunchKernel", 30, 5, correlation=1)
    x("user_annotation", "module::relu::ReLU", 120, 30)
    x("cuda_runtime", "cudaLaunchKernel", 125, 5, correlation=2)
    x("user_annotation", "module::flatten::flatten", 160, 20)
    x("cuda_runtime", "cudaLaunchKernel", 165, 5, correlation=3)
    x("cuda_runtime", "cudaLaunchKernel", 200, 5, correlation=4)
    x("cpu_op", "autograd::engine::evaluate_function: ConvolutionBackward0", 300, 60, tid=2,
      **{"Sequence number": 7})
    x("cuda_runtime", "cudaLaunchKernel", 310, 5, tid=2, correlation=5)
    for corr, ts, dur in ((1, 40, 50), (2, 130, 10), (3, 170, 4), (4, 210, 6), (5, 320, 90)):
        ev.append({"ph": "X", "cat": "kernel", "name": f"k{corr}", "ts": ts, "dur": dur, "pid": 0, "tid": 7,
                   "args": {"correlation": corr, "grid": [1, 1, 1], "block": [32, 1, 1]}})
    return {"traceEvents": ev}


def test_attribution_assigns_forward_and_backward_kernels_and_host_time() -> None:
    ops = [_Op("conv1", "Conv2d", "s-conv"), _Op("relu", "ReLU", "s-relu"), _Op("fc", "Linear", "s-fc")]
    rows, summary = attribute(_trace(), ops)
    by = {r["node"]: r for r in rows}
    assert [r["position"] for r in rows] == [0, 1, 2]
    assert by["conv1"]["kernel_ms"] == pytest.approx(0.14) and by["conv1"]["kernels"] == 2
    assert by["conv1"]["host_fwd_ms"] == pytest.approx(0.1) and by["conv1"]["host_bwd_ms"] == pytest.approx(0.06)
    assert by["relu"]["kernel_ms"] == pytest.approx(0.01) and by["relu"]["host_ms"] == pytest.approx(0.03)
    assert by["fc"]["kernels"] == 0 and summary["ops_without_kernels"] == 1
    assert summary["kernel_count"] == 5 and summary["kernel_sum_ms"] == pytest.approx(0.16)
    # never silently dropped: the bookkeeping copy and the stray kernel are reported
    assert summary["unattributed_kernels"] == 2 and summary["unattributed_kernel_ms"] == pytest.approx(0.01)
    assert summary["attributed_kernel_ms"] + summary["unattributed_kernel_ms"] == pytest.approx(0.16)
    assert set(json.loads(summary["unattributed_by"])) == {"flatten", "(unattributed)"}
    cols = columnar(rows)
    assert cols["node"] == ["conv1", "relu", "fc"] and len(cols["kernel_ms"]) == 3


def test_backward_without_a_forward_owner_is_reported() -> None:
    trace = _trace()
    for e in trace["traceEvents"]:
        if e["name"].startswith("autograd::"):
            e["args"]["Sequence number"] = 99
    fwd, bwd = host_times_us(trace["traceEvents"])
    assert bwd == {"(unattributed)": 60.0} and fwd["conv1"] == 100.0


class _PeakGraphs(FakeGraphs):
    """A capture backend whose allocator peak is the number of calls it has seen times a step's
    bytes: a peak read over the wrong call (or none) gives another number."""

    STEP_BYTES = 1 << 20

    def __init__(self, board: FakeBoard):
        super().__init__(board)
        self.calls = 0

    def peak_memory_bytes(self, fn: Callable[[], None]) -> int | None:
        before = self.calls
        fn()
        return (self.calls - before) * self.STEP_BYTES


def test_network_row_records_the_peak_memory_of_one_step(board: FakeBoard) -> None:
    graphs = _PeakGraphs(board)
    step = _step(board, graphs)

    def counted() -> None:
        graphs.calls += 1
        step()

    with Sampler(open_gpu(0)) as s:
        row = measure_network(counted, EnergyMonitor(s, 10.0), CFG, graphs, inference=True,
                              idle_power_w=IDLE_W, power_limit_w=700.0)
    assert row["peak_memory_bytes"] == _PeakGraphs.STEP_BYTES


def test_peak_item_runs_a_first_call_then_reads_the_peak_over_one_step(board: FakeBoard) -> None:
    graphs = _PeakGraphs(board)
    seen: list[str] = []

    def step() -> None:
        seen.append("call")
        graphs.calls += 1

    row = measure_mod.measure_peak(step, graphs, inference=False)
    assert seen == ["call", "call"]  # the first call's allocations and workspaces come before the peak
    assert row["peak_memory_bytes"] == _PeakGraphs.STEP_BYTES and row["first_call_ms"] >= 0
    assert CpuBackend().peak_memory_bytes(lambda: None) is None  # the CPU has no device allocator
