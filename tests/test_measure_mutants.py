"""Tests written to kill realistic mutations of the measurement code (``tests/mutants.py`` re-runs
them): idle power subtracted from dynamic energy, the grad mode each mode runs in, median and
inter-quartile range, the network's host time, the power check, the window's closing deadline,
unthreaded tick waiting, the timed blocks inside the energy window, and the host-bound ratio."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from fakes import FakeBoard, FakeNVML
from test_measure import BUSY_W, CFG, GPU_S, HOST_S, IDLE_W, FakeGraphs, _spin, _step

from gpurec.collect import measure as measure_mod
from gpurec.collect.measure import _median_iqr, _power_ok, measure_network, measure_op
from gpurec.device import nvml, open_gpu
from gpurec.device.graphs import Paced
from gpurec.device.sampler import Sampler
from gpurec.device.window import EnergyMonitor, Measurement
from gpurec.model.timeline import HOST_BOUND_RATIO, bound_of, simulate


@pytest.fixture
def board() -> Iterator[FakeBoard]:
    b = FakeBoard(power_w=BUSY_W, idle_power_w=IDLE_W, update_period_s=0.02)
    nvml.set_backend(FakeNVML([b]))
    yield b
    nvml.set_backend(None)


# -- statistics ----------------------------------------------------------------------------------

def test_median_and_inter_quartile_range_on_known_values() -> None:
    med, iqr = _median_iqr([1.0, 2.0, 3.0, 4.0, 100.0])
    q = statistics.quantiles([1.0, 2.0, 3.0, 4.0, 100.0], n=4)  # 1.5, 3.0, 52.0
    assert med == 3.0  # a mean (22) would follow the outlier
    assert iqr == pytest.approx(q[2] - q[0]) == pytest.approx(50.5)
    assert _median_iqr([2.0, 5.0]) == (3.5, 3.0)


# -- the power check ------------------------------------------------------------------------------

def _m(power_w: float) -> Measurement:
    return Measurement(0.3, power_w * 300.0, power_w, 3, 0.0, 1980, 1980, 2619, 50, "", power_w, 1)


@pytest.mark.parametrize("power_w, ok", [(200.0, True), (79.0, False), (701.0, False), (float("nan"), False),
                                         (80.0, True), (700.0, True)])
def test_power_outside_idle_and_limit_is_not_ok(power_w: float, ok: bool) -> None:
    assert _power_ok(_m(power_w), IDLE_W, 700.0) is ok
    assert _power_ok(_m(power_w), None, None) is (power_w == power_w)  # NaN is never ok


# -- rows: dynamic energy, grad mode, host time, timed work inside the window ----------------------

class _RecordingGraphs(FakeGraphs):
    """Records when each paced (in-window) timed block ran, in the sampler's clock."""

    def __init__(self, board: FakeBoard):
        super().__init__(board)
        self.paced_blocks: list[tuple[float, float]] = []

    def time_gpu_ms(self, fn: Callable[[], None], calls: int) -> float:
        t0 = time.perf_counter()
        ms = super().time_gpu_ms(fn, calls)
        if isinstance(fn, Paced):
            self.paced_blocks.append((t0, time.perf_counter()))
        return ms


class _RecordingMonitor(EnergyMonitor):
    """Records each measured window's opening and closing tick times."""

    def __init__(self, sampler: Sampler, timeout_s: float):
        super().__init__(sampler, timeout_s)
        self.windows: list[tuple[float, float]] = []

    def _measure(self, a, b, calls):  # noqa: ANN001, ANN202
        self.windows.append((a.t_s, b.t_s))
        return super()._measure(a, b, calls)


def test_op_row_dynamic_energy_grad_mode_and_window_order(board: FakeBoard) -> None:
    seen: list[tuple[bool, bool]] = []
    graphs = _RecordingGraphs(board)
    inner = _step(board, graphs)

    def step() -> None:
        seen.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        inner()

    with Sampler(open_gpu(0)) as s:
        monitor = _RecordingMonitor(s, 10.0)
        row = measure_op(step, monitor, CFG, graphs, inference=True, idle_power_w=IDLE_W, power_limit_w=700.0)
    assert seen and all(mode == (True, False) for mode in seen)  # every call in inference mode
    assert row["gpu_dynamic_energy_mj"] == pytest.approx((row["gpu_power_w"] - IDLE_W) * row["gpu_time_ms"])
    assert row["gpu_dynamic_energy_mj"] < 0.8 * row["gpu_energy_mj"]
    # every timed block of the host-free phase ran inside the energy window it is divided by
    (w0, w1), = monitor.windows
    assert graphs.paced_blocks and all(w0 <= a and b <= w1 for a, b in graphs.paced_blocks), (monitor.windows,
                                                                                              graphs.paced_blocks)


def test_training_rows_run_with_grad_enabled(board: FakeBoard) -> None:
    seen: list[tuple[bool, bool]] = []
    graphs = FakeGraphs(board)
    inner = _step(board, graphs)

    def step() -> None:
        seen.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        inner()

    with torch.no_grad(), Sampler(open_gpu(0)) as s:  # the caller's mode must not leak in
        measure_op(step, EnergyMonitor(s, 10.0), CFG, graphs, inference=False, idle_power_w=IDLE_W,
                   power_limit_w=700.0)
    assert seen and all(mode == (False, True) for mode in seen)


class _AsyncGraphs(FakeGraphs):
    """Like a GPU: a call returns once the host has enqueued its work, which runs at the next
    synchronise (so a step's enqueue time and its total time differ)."""

    def __init__(self, board: FakeBoard):
        super().__init__(board)
        self.pending = 0.0

    def step(self) -> None:
        _spin(HOST_S)
        if self.recording is not None:
            self.recording.append(GPU_S)
        else:
            self.pending += GPU_S

    def sync(self) -> None:
        work, self.pending = self.pending, 0.0
        if work:
            self.board.run(work)

    def time_gpu_ms(self, fn: Callable[[], None], calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        self.sync()
        return (time.perf_counter() - t0) * 1e3

    def mark(self):  # noqa: ANN201
        return self._Mark(self)

    class _Mark:
        def __init__(self, backend: _AsyncGraphs):
            self.backend = backend

        def synchronize(self) -> None:
            self.backend.sync()


def test_network_row_dynamic_energy_and_host_time(board: FakeBoard, monkeypatch: pytest.MonkeyPatch) -> None:
    """The network's host time is the median enqueue time of single steps (9 of them with the
    default 5 eager blocks), never the blocks' total time."""
    calls: list[tuple[int, int, list[float]]] = []
    real = measure_mod.timed_blocks

    def spy(step, backend, n, blocks):  # noqa: ANN001, ANN202
        host, total = real(step, backend, n, blocks)
        calls.append((n, blocks, host))
        return host, total

    monkeypatch.setattr(measure_mod, "timed_blocks", spy)
    graphs = _AsyncGraphs(board)
    with Sampler(open_gpu(0)) as s:
        row = measure_network(graphs.step, EnergyMonitor(s, 10.0), CFG, graphs, inference=True,
                              idle_power_w=IDLE_W, power_limit_w=700.0)
    assert row["dynamic_energy_mj"] == pytest.approx((row["power_w"] - IDLE_W) * row["time_ms"])
    assert row["dynamic_energy_mj"] < 0.8 * row["energy_mj"]
    # the enqueue alone: about HOST_S, well below a step's total (HOST_S + GPU_S)
    assert HOST_S * 1e3 * 0.9 <= row["host_ms"] < (HOST_S + 0.5 * GPU_S) * 1e3 < row["time_ms"]
    n, blocks, host = calls[-1]  # the single-step blocks come after the eager ones
    assert n == 1 and blocks == CFG.eager_blocks + 4 and len(host) == blocks
    assert row["host_ms"] == statistics.median(host) and row["host_min_ms"] == min(host)
    assert np.isfinite(row["host_iqr_ms"])


# -- the window on a simulated board in simulated time (unthreaded sampler) -------------------------

class _SimBoard:
    """A board whose counter updates every ``period_s`` of simulated time at ``power_w``; reading
    the clock takes 1 us (time moves between two reads, as it does on a real host)."""

    def __init__(self, power_w: float = 200.0, period_s: float = 0.1):
        self.t, self.power_w_, self.period_s = 0.0, power_w, period_s

    def clock(self) -> float:
        self.t += 1e-6
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def energy_mj(self) -> float:
        return int(self.t / self.period_s) * self.period_s * self.power_w_ * 1e3

    def power_w(self) -> float:
        return self.power_w_

    def sm_clock_mhz(self) -> int:
        return 1980

    def mem_clock_mhz(self) -> int:
        return 2619

    def temperature_c(self) -> int:
        return 50

    def throttle_mask(self) -> int:
        return 0


def _sim() -> tuple[_SimBoard, EnergyMonitor]:
    board = _SimBoard()
    sampler = Sampler(board, clock=board.clock, threaded=False, poll_s=0.001)  # type: ignore[arg-type]
    sampler.start()
    return board, EnergyMonitor(sampler, 2.0, sleep=board.advance)


def test_an_unthreaded_window_does_not_open_on_a_stale_tick() -> None:
    """Work done since the last poll hides counter updates; the first poll finds the change but not
    when it happened, so the window must open on the next update, not on that poll."""
    board, monitor = _sim()
    board.advance(0.25)  # updates at 0.1 and 0.2 happened unseen
    busy = lambda: board.advance(0.001)  # noqa: E731
    start = monitor.begin_window(busy)
    assert start.tick.t_s >= 0.3
    m = monitor.end_window(start, busy, 0.3)
    assert m.power_w == pytest.approx(200.0, rel=0.02)  # a stale opening tick reads ~14% high
    assert m.window_s >= 0.3


def test_the_window_closes_after_not_before_s() -> None:
    board, monitor = _sim()
    busy = lambda: board.advance(0.001)  # noqa: E731
    start = monitor.begin_window(busy)
    m = monitor.end_window(start, busy, min_window_s=0.2, not_before_s=start.tick.t_s + 0.75)
    assert m.window_s >= 0.75 and m.power_w == pytest.approx(200.0, rel=0.02)


# -- the host-bound rule ----------------------------------------------------------------------------

@pytest.mark.parametrize("time_ms, gpu_ms, bound", [(1.5, 1.0, "host"), (1.2, 1.0, "host"), (1.19, 1.0, "gpu"),
                                                    (1.0, 1.0, "gpu")])
def test_a_step_20_percent_longer_than_the_gpu_alone_is_host_bound(time_ms: float, gpu_ms: float, bound: str) -> None:
    assert HOST_BOUND_RATIO == pytest.approx(1.2)
    assert bound_of(time_ms, gpu_ms) == bound


@pytest.mark.parametrize("host_ms, bound", [(0.5, "host"), (0.1, "gpu")])
def test_the_timeline_uses_the_same_ratio(host_ms: float, bound: str) -> None:
    """One GPU operation of 1 ms behind ``host_ms`` of dispatch: the step takes 1 + host_ms."""
    tl = simulate(np.array([1.0]), np.array([host_ms]), np.array([0, 1]))
    assert float(tl.time_ms[0]) == pytest.approx(1.0 + host_ms) and float(tl.gpu_time_ms[0]) == 1.0
    assert list(tl.bound) == [bound]
