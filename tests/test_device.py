"""gpurec.device against a fake pynvml (tests/fakes.py): units, errors, sampler, clock locks."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fakes import FakeBoard, FakeNVML, FakeNVMLError

from gpurec.device import (
    ClockLockNotPermitted,
    GPUNotFound,
    NVMLError,
    NVMLUnavailable,
    list_gpus,
    nvml,
    open_gpu,
)
from gpurec.device.clocks import locked_sm_clock, parse_clock_list
from gpurec.device.sampler import Sampler

ROOT = Path(__file__).resolve().parents[1]


def _use(fake: FakeNVML) -> FakeNVML:
    nvml.set_backend(fake)
    return fake


@pytest.fixture(autouse=True)
def _restore_backend():
    yield
    nvml.set_backend(None)


def _wait_for(cond, timeout_s: float = 10.0) -> None:
    """Poll until ``cond()`` (generous timeout; nothing here asserts on durations)."""
    t_end = time.perf_counter() + timeout_s
    while not cond():
        assert time.perf_counter() < t_end, "condition not reached"
        time.sleep(0.005)


# -- units -------------------------------------------------------------------------------------

def test_units_are_converted_once(nvml_fake: FakeNVML) -> None:
    nvml_fake.boards[0].power_w = 123.456
    gpu = open_gpu(0)
    assert gpu.power_w() == pytest.approx(123.456)  # NVML mW -> W
    assert gpu.sm_clock_mhz() == 1980
    assert gpu.mem_clock_mhz() == 2619
    assert gpu.temperature_c() == 40
    assert isinstance(gpu.energy_mj(), float)
    info = gpu.info()
    assert info.name == "NVIDIA H100 80GB HBM3"
    assert info.uuid == "GPU-fake-0000"
    assert info.power_limit_w == pytest.approx(700.0)  # 700000 mW
    assert info.memory_total_mib == pytest.approx(80 * 1024)
    assert info.cuda_driver_version == "13.0"
    assert info.driver_version == "580.00.00"
    assert (info.max_sm_clock_mhz, info.max_mem_clock_mhz) == (1980, 2619)
    assert json.loads(json.dumps(info.as_dict()))["index"] == 0
    s = gpu.sample()
    assert s.power_w == pytest.approx(123.456) and s.sm_clock_mhz == 1980 and s.throttle_mask == 0


def test_bytes_from_old_bindings_are_decoded() -> None:
    fake = _use(FakeNVML())
    fake.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # type: ignore[method-assign]
    assert open_gpu(0).info().name == "NVIDIA H200"


def test_energy_counter_counts_up_in_mj(nvml_fake: FakeNVML) -> None:
    board = nvml_fake.boards[0]
    board.update_period_s = 0.01
    gpu = open_gpu(0)
    e0 = gpu.energy_mj()
    _wait_for(lambda: gpu.energy_mj() > e0)
    step = gpu.energy_mj() - e0
    # one 10 ms update at 100 W is 1000 mJ: whole updates only
    assert step > 0 and step % 1000.0 == pytest.approx(0.0, abs=1e-6)


def test_missing_energy_counter_is_a_typed_error() -> None:
    fake = _use(FakeNVML())

    def no_energy(h: FakeBoard) -> int:
        raise FakeNVMLError("Not Supported")

    fake.nvmlDeviceGetTotalEnergyConsumption = no_energy  # type: ignore[method-assign]
    with pytest.raises(NVMLError, match="Volta or newer"):
        open_gpu(0).energy_mj()


def test_optional_readings_degrade_to_none() -> None:
    fake = _use(FakeNVML())

    def refused(*a: object) -> int:
        raise FakeNVMLError("Not Supported")

    fake.nvmlDeviceGetEnforcedPowerLimit = refused  # type: ignore[method-assign]
    fake.nvmlDeviceGetMaxClockInfo = refused  # type: ignore[method-assign]
    fake.nvmlDeviceGetCurrentClocksEventReasons = refused  # type: ignore[method-assign]
    gpu = open_gpu(0)
    info = gpu.info()
    assert info.power_limit_w is None and info.max_sm_clock_mhz is None
    assert gpu.throttle_mask() == 0


def test_throttle_decoding() -> None:
    assert nvml.decode_throttle(0) == []
    assert nvml.decode_throttle(0x1 | 0x4 | 0x40) == ["gpu_idle", "sw_power_cap", "hw_thermal"]


# -- errors ------------------------------------------------------------------------------------

def test_init_failure_is_nvml_unavailable_with_a_helpful_message() -> None:
    _use(FakeNVML(fail_init=True))
    with pytest.raises(NVMLUnavailable) as ei:
        open_gpu(0)
    msg = str(ei.value)
    assert "NVML Shared Library Not Found" in msg  # the driver's own reason
    assert "NVIDIA" in msg and "driver" in msg  # what is missing
    assert "prediction and recommendation work without one" in msg  # what still works
    assert isinstance(ei.value, NVMLError)


def test_failed_init_is_retried_on_next_call() -> None:
    fake = _use(FakeNVML(fail_init=True))
    with pytest.raises(NVMLUnavailable):
        list_gpus()
    fake.fail_init = False
    assert [g.name for g in list_gpus()] == ["NVIDIA H100 80GB HBM3"]


def test_gpu_not_found_says_what_exists() -> None:
    _use(FakeNVML([FakeBoard(), FakeBoard(uuid="GPU-fake-0001")]))
    assert [g.index for g in list_gpus()] == [0, 1]
    assert open_gpu(1).info().uuid == "GPU-fake-0001"
    with pytest.raises(GPUNotFound, match=r"GPU index 2 does not exist: this machine has 2 GPU\(s\), 0..1"):
        open_gpu(2)
    with pytest.raises(GPUNotFound):
        open_gpu(-1)


# -- sampler -----------------------------------------------------------------------------------

def test_sampler_records_ticks_and_states(nvml_fake: FakeNVML) -> None:
    nvml_fake.boards[0].update_period_s = 0.01
    gpu = open_gpu(0)
    before = sys.getswitchinterval()
    with Sampler(gpu, poll_s=0.0005, state_every_s=0.005) as s:
        assert sys.getswitchinterval() <= 0.0005
        _wait_for(lambda: s.n_ticks() >= 4 and len(s.states) >= 2)
    assert sys.getswitchinterval() == before  # restored
    assert s._thread is not None and not s._thread.is_alive()
    ticks = s.ticks
    assert all(b.t_s >= a.t_s for a, b in zip(ticks, ticks[1:], strict=False))
    assert all(b.energy_mj > a.energy_mj for a, b in zip(ticks[1:], ticks[2:], strict=False))  # only changes
    assert s.last_tick() is ticks[-1]
    assert s.ticks_between(ticks[1].t_s, ticks[-1].t_s) == ticks[1:]
    assert all(st.power_w == pytest.approx(100.0) and st.sm_clock_mhz == 1980 for st in s.states)
    assert s.states_between(s.states[0].t_s, s.states[-1].t_s) == s.states
    s.trim(ticks[-1].t_s + 1.0)  # everything is older: the last sample is kept
    assert s.ticks == ticks[-1:] and len(s.states) == 1


# -- clock locks -------------------------------------------------------------------------------

def test_lock_is_paired_with_reset(nvml_fake: FakeNVML) -> None:
    gpu = open_gpu(0)
    with locked_sm_clock(gpu, 1410, owned=True) as mhz:
        assert mhz == 1410
        assert gpu.sm_clock_mhz() == 1410
        assert nvml_fake.events == [("lock", 0, 1410)]
    assert nvml_fake.events == [("lock", 0, 1410), ("reset", 0, None)]
    assert gpu.sm_clock_mhz() == 1980


def test_reset_when_the_body_raises_and_handlers_are_restored(nvml_fake: FakeNVML) -> None:
    gpu = open_gpu(0)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(RuntimeError, match="boom"), locked_sm_clock(gpu, 1095, owned=True):
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
        raise RuntimeError("boom")
    assert nvml_fake.events == [("lock", 0, 1095), ("reset", 0, None)]
    assert {s: signal.getsignal(s) for s in before} == before


def test_refused_lock_is_typed_and_still_reset() -> None:
    fake = _use(FakeNVML(refuse_lock=True))
    gpu = open_gpu(0)
    body_ran = False
    with pytest.raises(ClockLockNotPermitted, match="Insufficient Permissions") as ei:
        with locked_sm_clock(gpu, 1410, owned=True):
            body_ran = True
    assert not body_ran
    assert "drop --sm-clocks" in str(ei.value)
    assert fake.events == [("lock", 0, 1410), ("reset", 0, None)]


def test_not_owned_refuses_without_touching_nvml(nvml_fake: FakeNVML) -> None:
    gpu = open_gpu(0)
    with pytest.raises(ClockLockNotPermitted, match="--i-own-this-gpu"):
        with locked_sm_clock(gpu, 1410, owned=False):
            pass
    assert nvml_fake.events == []
    assert gpu.sm_clock_mhz() == 1980


def test_sigterm_in_the_block_resets_then_reaches_the_previous_handler(nvml_fake: FakeNVML) -> None:
    gpu = open_gpu(0)
    seen: list[list[tuple]] = []

    class Terminated(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        seen.append(list(nvml_fake.events))
        raise Terminated

    old = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(Terminated), locked_sm_clock(gpu, 1410, owned=True):
            signal.raise_signal(signal.SIGTERM)
        # the clock was reset before the previous handler ran
        assert seen == [[("lock", 0, 1410), ("reset", 0, None)]]
        assert nvml_fake.events[0] == ("lock", 0, 1410)
        assert nvml_fake.events[-1] == ("reset", 0, None)
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, old)


def test_sigterm_with_default_handler_kills_the_process_after_reset(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import signal, sys
        sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests")!r}]
        from fakes import FakeNVML
        from gpurec.device import nvml
        from gpurec.device.clocks import locked_sm_clock

        class LoudFake(FakeNVML):
            def nvmlDeviceSetGpuLockedClocks(self, h, lo, hi):
                super().nvmlDeviceSetGpuLockedClocks(h, lo, hi)
                print("lock", lo, flush=True)

            def nvmlDeviceResetGpuLockedClocks(self, h):
                super().nvmlDeviceResetGpuLockedClocks(h)
                print("reset", flush=True)

        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        nvml.set_backend(LoudFake())
        with locked_sm_clock(nvml.open_gpu(0), 1410, owned=True):
            signal.raise_signal(signal.SIGTERM)
            print("survived", flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGTERM, p.stderr
    assert p.stdout.split("\n")[:2] == ["lock 1410", "reset"]
    assert "survived" not in p.stdout


def test_parse_clock_list() -> None:
    assert parse_clock_list(None) == [] and parse_clock_list("") == []
    assert parse_clock_list("1095, 1410,1980") == [1095, 1410, 1980]
    with pytest.raises(ValueError, match="MHz"):
        parse_clock_list("fast")
    with pytest.raises(ValueError, match="positive"):
        parse_clock_list("0,1410")
