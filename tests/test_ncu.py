"""gpurec.device.ncu, the one Nsight Compute adapter: lookup, clock control, the metric-list cache."""

from __future__ import annotations

import ast
import sys
import tempfile
from pathlib import Path

import pytest

from gpurec.device import ncu

ROOT = Path(__file__).resolve().parents[1]

QUERY_NCU = r'''
import os, sys
with open(os.environ["FAKE_NCU_CALLS"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")
if os.environ.get("FAKE_NCU_FAIL"):
    print("==ERROR== ERR_NVGPUCTRPERM: no permission to access GPU performance counters")
    sys.exit(1)
print("Device NVIDIA H100 (GH100)\nMetric Name   Metric Description")
print("smsp__cycles_elapsed   # of cycles elapsed\ndram__bytes_read   # of bytes read")
'''


@pytest.fixture
def query_ncu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    exe = tmp_path / "bin" / "ncu"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\n" + QUERY_NCU)
    exe.chmod(0o755)
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv("FAKE_NCU_CALLS", str(calls))
    monkeypatch.delenv("FAKE_NCU_FAIL", raising=False)
    return exe, calls


def _calls(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _temp_cache_files() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("gpurec_ncu_metrics_*")}


def test_exactly_one_module_defines_find_ncu() -> None:
    defining = [p.relative_to(ROOT).as_posix() for p in (ROOT / "gpurec").rglob("*.py")
                if any(isinstance(n, ast.FunctionDef) and n.name == "find_ncu" for n in ast.walk(ast.parse(p.read_text())))]
    assert defining == ["gpurec/device/ncu.py"]
    from gpurec.calibrate.errors import NcuError as CalibrateNcuError
    from gpurec.profile import NcuError as ProfileNcuError

    assert CalibrateNcuError is ProfileNcuError is ncu.NcuError and issubclass(ncu.NcuNotFound, ncu.NcuError)


def test_every_ncu_command_runs_without_clock_control() -> None:
    from gpurec.profile import ncu_io

    cmd = ncu.ncu_command("/x/ncu", ["python", "app.py"], Path("/tmp/r"), ["a.sum"], ["--nvtx"])
    assert cmd[cmd.index("--clock-control") + 1] == "none" and cmd[-2:] == ["python", "app.py"]
    prof = ncu_io.ncu_profile_command("/x/ncu", ["a.sum"], Path("/tmp/r"), ["python"], sampling="per-config")
    assert prof[prof.index("--clock-control") + 1] == "none" and prof.count("--clock-control") == 1
    for extra in (["--clock-control", "base"], ["--clock-control=base"]):
        with pytest.raises(ValueError, match="clock-control none"):
            ncu.ncu_command("/x/ncu", ["python"], Path("/tmp/r"), extra=extra)


def test_metric_list_is_cached_per_user_not_in_the_shared_temp_dir(query_ncu: tuple[Path, Path], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from gpurec.profile import ncu_io

    exe, calls = query_ncu
    before = _temp_cache_files()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("GPUREC_CACHE_DIR", raising=False)
    assert ncu.cache_dir() == tmp_path / "xdg" / "gpurec"
    assert ncu_io.query_available_metrics(str(exe)) == {"smsp__cycles_elapsed", "dram__bytes_read"}
    assert ncu_io.query_available_metrics(str(exe)) == {"smsp__cycles_elapsed", "dram__bytes_read"}
    assert _calls(calls) == 1  # the second answer came from the cache
    assert [p.name for p in (tmp_path / "xdg" / "gpurec").iterdir()][0].startswith("ncu_metrics_")
    assert _temp_cache_files() == before
    # an explicit directory (e.g. the run's output) wins
    assert ncu.available_metrics(exe, directory=tmp_path / "run") == {"smsp__cycles_elapsed", "dram__bytes_read"}
    assert _calls(calls) == 2 and any((tmp_path / "run").iterdir())
    monkeypatch.setenv("GPUREC_CACHE_DIR", str(tmp_path / "own"))
    assert ncu.cache_dir() == tmp_path / "own"


def test_a_failed_metric_query_is_not_cached_for_good(query_ncu: tuple[Path, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    exe, calls = query_ncu
    cache = tmp_path / "cache"
    monkeypatch.setenv("FAKE_NCU_FAIL", "1")
    assert ncu.available_metrics(exe, directory=cache) is None
    assert ncu.available_metrics(exe, directory=cache) is None
    assert _calls(calls) == 1  # remembered for a while: a batch of runs does not repeat a slow failure
    monkeypatch.delenv("FAKE_NCU_FAIL")
    assert ncu.available_metrics(exe, directory=cache, failure_ttl_s=0.0) == {"smsp__cycles_elapsed",
                                                                            "dram__bytes_read"}
    assert _calls(calls) == 2
    monkeypatch.setenv("FAKE_NCU_FAIL", "1")  # the success is kept
    assert ncu.available_metrics(exe, directory=cache, failure_ttl_s=0.0) == {"smsp__cycles_elapsed",
                                                                            "dram__bytes_read"}
    assert _calls(calls) == 2


def test_query_metrics_raises_ncu_error_with_ncus_message(query_ncu: tuple[Path, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    exe, _ = query_ncu
    monkeypatch.setenv("FAKE_NCU_FAIL", "1")
    with pytest.raises(ncu.NcuError, match="ERR_NVGPUCTRPERM"):
        ncu.query_metrics(exe)
    with pytest.raises(ncu.NcuError, match="could not run"):
        ncu.query_metrics(exe.parent / "missing-ncu")
