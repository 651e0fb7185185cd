"""Shared test setup: import paths and a fake NVML backend (tests/fakes.py)."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
for _p in (str(ROOT), str(TESTS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from fakes import FakeBoard, FakeNVML  # noqa: E402

SYSTEM_TMP = Path(tempfile.gettempdir())


@pytest.fixture(autouse=True, scope="session")
def _private_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Code under test that writes to the temp folder (e.g. the ncu metric cache) writes into
    pytest's own folder, not the machine's shared one."""
    private = tmp_path_factory.mktemp("tempdir")
    saved = tempfile.tempdir
    tempfile.tempdir = str(private)
    try:
        yield private
    finally:
        tempfile.tempdir = saved


@pytest.fixture
def nvml_fake() -> Iterator[FakeNVML]:
    """gpurec.device talks to a FakeNVML (one H100-like board) for the test, then to pynvml again."""
    from gpurec.device import nvml

    fake = FakeNVML([FakeBoard()])
    nvml.set_backend(fake)
    try:
        yield fake
    finally:
        nvml.set_backend(None)


@pytest.fixture
def fast_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNVML]:
    """FakeNVML plus short idle / tick-period windows, so a whole run_worker takes about a second."""
    from gpurec.collect import measure as measure_mod
    from gpurec.collect import runner as runner_mod
    from gpurec.device import nvml

    fake = FakeNVML([FakeBoard(power_w=100.0, update_period_s=0.02)])
    nvml.set_backend(fake)
    monkeypatch.setattr(runner_mod, "measure_idle", lambda s, d=1.0: measure_mod.measure_idle(s, 0.1))
    monkeypatch.setattr(runner_mod, "tick_period_s", lambda s, d=1.0: measure_mod.tick_period_s(s, 0.1))
    try:
        yield fake
    finally:
        nvml.set_backend(None)
