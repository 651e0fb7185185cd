"""gpurec host-bench: the host profile is measured, saved, loaded, checked and compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpurec.host import DISPATCH_CALLS, DISPATCH_MODES, HostProfile, HostProfileError, run_host_bench


@pytest.fixture(scope="module")
def profile() -> HostProfile:
    return run_host_bench(use_gpu=False, blocks=3, calls_per_block=5)


def test_cpu_bench_measures_every_call(profile: HostProfile) -> None:
    assert set(profile.dispatch_cpu_us) == {f"{c}:{m}" for c in DISPATCH_CALLS for m in DISPATCH_MODES}
    assert all(v > 0 for v in profile.dispatch_cpu_us.values()) and profile.python_loop_us > 0
    # forward + backward issues more work than forward alone
    assert all(profile.dispatch_cpu_us[f"{c}:training"] > profile.dispatch_cpu_us[f"{c}:inference"]
               for c in DISPATCH_CALLS)
    assert profile.dispatch_cuda_us is None and profile.launch_us is None and profile.gpu is None
    assert set(profile.spread) >= {"python_loop", "cpu:conv2d:training"}


def test_profile_round_trips_and_rescales(profile: HostProfile, tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(profile.to_dict()))
    back = HostProfile.load(path)
    assert back == profile and back.dispatch_scale(profile) == pytest.approx(1.0)
    slower = HostProfile.from_dict({**profile.to_dict(),
                                    "dispatch_cpu_us": {k: 2 * v for k, v in profile.dispatch_cpu_us.items()}})
    assert slower.dispatch_scale(profile) == pytest.approx(2.0)
    assert profile.dispatch_scale(slower) == pytest.approx(0.5)


def test_bad_profiles_say_how_to_make_one(tmp_path: Path, profile: HostProfile) -> None:
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(HostProfileError, match="gpurec host-bench"):
        HostProfile.load(tmp_path / "x.json")
    with pytest.raises(HostProfileError, match="schema"):
        HostProfile.from_dict({**profile.to_dict(), "schema": "other/1"})
    bare = {k: v for k, v in profile.to_dict().items() if k != "dispatch_cpu_us"}
    with pytest.raises(HostProfileError, match="dispatch_cpu_us"):
        HostProfile.from_dict(bare)
    other = HostProfile.from_dict({**profile.to_dict(), "dispatch_cpu_us": {"other:inference": 1.0}})
    with pytest.raises(HostProfileError, match="share no dispatch"):
        other.dispatch_scale(profile)


def test_cli_host_bench_writes_a_loadable_profile(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import cli

    out = tmp_path / "h.json"
    res = CliRunner().invoke(cli.app, ["host-bench", "--no-gpu", "--out", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert HostProfile.load(out).dispatch_cpu_us
