"""GPU-side commands live in cli.py; the library has no argument parsers.

Subprocess entries that ncu or the profiler run take one JSON spec file instead of argv.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cli

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
# Parsers other sessions are moving into cli.py (collect's runner and training); nothing else may parse.
NOT_YET_MOVED: set[str] = set()


def _imports_argparse(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "argparse":
            return True
    return False


def test_no_argument_parser_in_the_library() -> None:
    parsers = {p.relative_to(ROOT).as_posix() for p in (ROOT / "gpurec").rglob("*.py") if _imports_argparse(p)}
    assert parsers <= NOT_YET_MOVED, sorted(parsers - NOT_YET_MOVED)
    assert not (ROOT / "gpurec" / "calibrate" / "__main__.py").exists()
    assert not (ROOT / "gpurec" / "profile" / "__main__.py").exists()


def test_device_scripts_use_the_cli() -> None:
    for script in ("device_calibrate.sh", "device_profile.sh", "device_smoke.sh", "device_x4.sh"):
        text = (ROOT / "scripts" / script).read_text()
        for old in ("-m gpurec.calibrate", "-m gpurec.profile", "-m gpurec.collect.counters",
                    "-m gpurec.collect.probe"):
            assert old not in text, (script, old)


@pytest.mark.parametrize("command", ["calibrate", "calibrate-build", "counters", "probe", "profile",
                                     "profile-summary"])
def test_gpu_side_commands_have_help(command: str) -> None:
    res = runner.invoke(cli.app, [command, "--help"])
    assert res.exit_code == 0 and "Usage" in res.output


# -- counters: the command, and the spec file of the process ncu runs ------------------------------

@pytest.fixture
def plan(tmp_path: Path) -> Path:
    items = [{"item": "op", "key": f"{i:016x}", "mode": "inference", "kind": "ReLU", "set_key": "resnet18:b1:r32",
              "model_sets": ["resnet18:b1:r32"]} for i in range(3)]
    items.append({"item": "network", "key": "resnet18:b1:r32", "mode": "inference", "kind": "network",
                  "set_key": "resnet18:b1:r32", "model_sets": []})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"items": items}))
    return path


def test_counters_command_runs_ncu_on_a_spec_file(plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpurec.device import ncu

    runs: list[tuple[list[str], list[str], dict, list[str]]] = []

    def fake_run_ncu(cmd, metrics, out_csv, extra=(), timeout_s=0.0, env=None, **kw):  # noqa: ANN001, ANN003
        spec = json.loads(Path(cmd[-1]).read_text())
        runs.append((list(cmd), list(extra), spec, json.loads(Path(spec["ids"]).read_text())))
        raise ncu.NcuError("ERR_NVGPUCTRPERM (fake)")

    monkeypatch.setattr(ncu, "query_metrics", lambda *a, **k: {"dram__sectors_read"})
    monkeypatch.setattr(ncu, "run_ncu", fake_run_ncu)
    out = tmp_path / "out"
    res = runner.invoke(cli.app, ["counters", "--plan", str(plan), "--out", str(out), "--budget-s", "60",
                                  "--chunk", "2"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["failed"] == 3 and summary["profiled"] == 0 and summary["chunks"] == 2
    cmd, extra, spec, ids = runs[0]
    assert cmd == [sys.executable, "-m", "gpurec.collect.counters", str(out / "chunk_spec.json")]
    assert extra == ["--profile-from-start", "off"]
    assert spec["plan"] == str(plan) and len(ids) == 2 and len(runs[1][3]) == 1
    assert set(ids + runs[1][3]) == {f"op:{i:016x}:inference" for i in range(3)}  # the network item is not profiled
    assert spec["order"].endswith("chunk_order_0.jsonl") and spec["deadline_unix"] > 0


def test_counters_child_reads_its_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpurec.collect import counters

    seen = []
    monkeypatch.setattr(counters, "child", lambda *a: seen.append(a) or 0)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"plan": "p.json", "ids": "ids.json", "order": "o.jsonl", "deadline_unix": 12.5}))
    assert counters.child_from_spec(spec) == 0
    assert seen == [(Path("p.json"), Path("ids.json"), Path("o.jsonl"), 12.5)]


def test_counters_command_errors(plan: Path, tmp_path: Path) -> None:
    res = runner.invoke(cli.app, ["counters", "--plan", str(tmp_path / "nope.json"), "--out", str(tmp_path)])
    assert res.exit_code == 1 and "does not exist" in res.output
    res = runner.invoke(cli.app, ["counters", "--plan", str(plan), "--out", str(tmp_path), "--shard", "3/2"])
    assert res.exit_code == 2 and "out of range" in res.output


# -- calibrate's ncu probe and profile's worker take spec files ------------------------------------

def test_microbench_probe_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpurec.calibrate import checks, microbench

    calls = []
    monkeypatch.setattr(microbench, "run_probe", lambda lib, configs, device: calls.append((lib, configs, device))
                        or [{"ok": True}])
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"lib": "/x/lib.so", "configs": [{"level": "l2"}], "device": 1,
                                "result": str(tmp_path / "r.json")}))
    assert microbench.run_probe_spec(spec) == [{"ok": True}]
    assert calls == [(Path("/x/lib.so"), [{"level": "l2"}], 1)]
    assert json.loads((tmp_path / "r.json").read_text()) == [{"ok": True}]
    assert checks._probe_cmd(spec) == [sys.executable, "-m", "gpurec.calibrate.microbench", str(spec)]


def test_profile_worker_spec(tmp_path: Path) -> None:
    from gpurec.profile.api import _worker_cmd
    from gpurec.profile.worker import WorkerSpec

    cmd = _worker_cmd("resnet18", None, 2, 32, "training", "fp32", "cpu", tmp_path, "ncu", warmup_iters=7)
    assert cmd[:3] == [sys.executable, "-m", "gpurec.profile.worker"]
    spec = WorkerSpec.read(cmd[3])
    assert (spec.model, spec.batch_size, spec.resolution, spec.mode, spec.phase, spec.warmup_iters) == (
        "resnet18", 2, 32, "training", "ncu", 7)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": "resnet18", "batch_size": 2, "batchsize": 3}))
    with pytest.raises(ValueError, match="unknown worker spec field"):
        WorkerSpec.read(bad)
    with pytest.raises(ValueError, match="phase"):
        WorkerSpec(model="resnet18", batch_size=2, phase="both", out_dir=str(tmp_path))
    with pytest.raises(ValueError, match="out_dir"):
        WorkerSpec(model="resnet18", batch_size=2, phase="trace")


def test_profile_command_input_errors() -> None:
    res = runner.invoke(cli.app, ["profile", "-m", "resnet18", "--precision", "fp64", "--no-ncu"])
    assert res.exit_code == 2 and "--precision" in res.output
    res = runner.invoke(cli.app, ["profile", "-m", "resnet18", "--ncu-sampling", "some"])
    assert res.exit_code == 2 and "--ncu-sampling" in res.output
    res = runner.invoke(cli.app, ["profile", "-m", "resnet18", "--device", "cpu"])  # counters need CUDA
    assert res.exit_code == 2 and "CUDA device" in res.output


def test_profile_summary_command(tmp_path: Path) -> None:
    good = tmp_path / "a" / "result.json"
    good.parent.mkdir()
    good.write_text(json.dumps({"meta": {"model": "resnet50", "batch_size": 8, "mode": "training"},
                                "iteration": {"total_time_ms": 12.5, "throughput_samples_per_s": 640.0,
                                              "gpu_utilization": 0.9}}))
    res = runner.invoke(cli.app, ["profile-summary", str(good), str(tmp_path / "missing.json")])
    assert res.exit_code == 0
    lines = res.output.splitlines()
    assert lines[1].startswith("resnet50 bs8 training") and "12.50" in lines[1] and "90.0" in lines[1]
    assert "unreadable" in lines[2]
