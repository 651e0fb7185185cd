"""The gpurec command: output shapes and one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cli
from gpurec.ops import reference_flops

runner = CliRunner()


def run(*args: str):
    return runner.invoke(cli.app, list(args))


def test_ops_json_shape_and_flop_coverage() -> None:
    res = run("ops", "--model", "vit_b_16", "--batch-size", "2", "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["model"] == "vit_b_16" and data["input_shape"] == [2, 3, 224, 224] and data["mode"] == "inference"
    op = data["operations"][0]
    assert {"kind", "signature", "flops", "bytes"} <= set(op)
    total = sum(o["flops"] for o in data["operations"])
    assert total == data["totals"]["flops"]
    assert abs(total / reference_flops("vit_b_16", (2, 3, 224, 224)) - 1) < 0.01


def test_ops_table_and_csv() -> None:
    assert "Conv2d" in run("ops", "-m", "resnet18", "-b", "1").output
    csv = run("ops", "-m", "resnet18", "-b", "1", "--format", "csv", "--mode", "training").output
    assert csv.splitlines()[0].count(",") > 10 and "op_signature" in csv.splitlines()[0]


@pytest.mark.parametrize("args, needle", [
    (("ops", "--model", "resnet5"), "Did you mean"),
    (("ops", "--model", "resnet50", "--batch-size", "0"), "at least 1"),
    (("ops", "--model", "vit_b_16", "--resolution", "100"), "cannot take input shape"),
    (("ops", "--model", "resnet50", "--mode", "train"), "inference or training"),
    (("recommend", "--model", "resnet18", "--objective", "energi"), "time, energy, edp"),
    (("recommend", "--model", "resnet18", "--gpus", "H100,X999"), "Valid choices"),
    (("recommend", "--model", "not_a_net"), "Unknown model"),
    (("predict", "--model", "resnet18", "--gpu", "Z1"), "Valid choices"),
    (("predict", "--model", "resnet18", "--seq-len", "128"), "takes images"),
    (("predict", "--model", "bert_d384_pre", "--seq-len", "0"), "--seq-len must be at least 1"),
    (("validate", "--model", "gpt_d768", "--precision", "bf17"), "--precision must be one of"),
    (("profile", "--model", "gpt_d768"), "profile takes torchvision classifiers"),
])
def test_bad_input_exits_2_with_one_line(args: tuple[str, ...], needle: str) -> None:
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert "Traceback" not in res.output


def test_gpus_lists_catalogue() -> None:
    data = json.loads(run("gpus", "--format", "json").output)
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} <= {g["nvml_name"] for g in data}


def test_recommend_json_shape() -> None:
    res = run("recommend", "--model", "resnet18", "--batch-size", "2", "--gpus", "H100,H200,A100",
              "--objective", "edp", "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["model"] == "resnet18" and data["objective"] == "edp"
    rows = data["ranking"]
    assert [r["rank"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert {"gpu", "time_ms", "energy_mj", "power_w", "measured", "low", "high"} <= set(r)
        assert r["low"] <= r["time_ms"] * r["energy_mj"] <= r["high"]
    measured = {r["gpu"]: r["measured"] for r in rows}
    assert measured["NVIDIA H100 80GB HBM3"] and measured["NVIDIA H200"]
    assert not measured["NVIDIA A100-SXM4-80GB"]
    edp = [r["edp_mj_ms"] for r in rows]
    assert edp == sorted(edp)


def test_validate_without_gpu_is_a_message_not_a_traceback() -> None:
    res = run("validate", "--model", "resnet18", "--batch-size", "1")
    assert res.exit_code == 2
    assert "GPU" in res.output and "Traceback" not in res.output


def test_predict_reports_uncovered_operations() -> None:
    res = run("predict", "--model", "maxvit_t", "--batch-size", "1", "--gpu", "H100")
    assert res.exit_code == 0, res.output
    assert "time" in res.output and "energy" in res.output
    assert "not covered by the training data" in res.output and "% of FLOPs" in res.output


def test_table_numbers_keep_about_four_significant_digits() -> None:
    _fmt = cli._fmt
    assert [_fmt(v) for v in (65.4, 271.23, 4616.04, 1.0, 0.01234, 0.0, 3.2e7)] == [
        "65.40", "271.2", "4,616", "1.000", "0.0123", "0", "32,000,000"]
    assert _fmt(float("nan")) == "-" and _fmt(12) == "12" and _fmt(True) == "yes"


def test_recommend_marks_gpus_that_cannot_hold_the_step() -> None:
    """Issue 14's acceptance: resnet50 training at batch 512 fits an H100 (80 GB), not an L4 (24 GB)."""
    res = runner.invoke(cli.app, ["recommend", "--model", "resnet50", "--batch-size", "512", "--mode", "training",
                                  "--gpus", "L4, H100,H100", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    fits = {r["short_name"]: r["fits"] for r in data["ranking"]}
    assert fits == {"H100": True, "L4": False}  # one row per GPU, however often it is named
    assert data["ranking"][-1]["short_name"] == "L4"
    for r in data["ranking"]:
        assert {"gpu_time_ms", "gpu_energy_mj", "time_ms", "energy_mj", "bound", "memory_gb", "fits",
                "tie_with_best", "time_low_ms", "time_high_ms", "vs_best_pct"} <= set(r)
    assert data["measured_gpus"] and "NVIDIA L4" not in data["measured_gpus"]


def test_recommend_table_says_what_the_band_is_and_that_energy_is_per_step() -> None:
    res = run("recommend", "--model", "resnet18", "--batch-size", "2", "--gpus", "H100,L4")
    assert res.exit_code == 0, res.output
    assert "percentile" in res.output and "per step" in res.output and "fits" in res.output
    # defect 6: the caveat names the GPUs measured in the training data, not those asked for
    assert "trained on 2 measured GPU(s) (H100, H200)" in res.output
    assert "Operations behind" not in res.output  # defect 3: removed, it disagreed with the table


def test_predict_json_has_bands_and_bound() -> None:
    res = runner.invoke(cli.app, ["predict", "--model", "resnet18", "--batch-size", "2", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert {"time_low_ms", "time_high_ms", "bound", "gpu_time_ms", "energy_low_mj"} <= set(data)
    assert data["time_low_ms"] <= data["time_ms"] <= data["time_high_ms"]
    text = run("predict", "--model", "resnet18", "--batch-size", "2").output
    assert "band" in text and "per step" in text


def test_a_sequence_model_by_name_takes_token_ids_of_its_sequence_length() -> None:
    """gpurec's sequence models are named like the classifiers: --seq-len sets the tokens per
    sequence (default 128), the input is (batch, seq_len), and --precision reaches them."""
    res = run("predict", "--model", "gpt_d768", "-b", "2", "--seq-len", "64", "--precision", "bf16-mixed",
              "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["input_shape"] == [2, 64] and data["gpu_time_ms"] > 0
    ops = json.loads(run("ops", "--model", "bert_d384_pre", "-b", "2", "--format", "json").stdout)
    assert ops["input_shape"] == [2, 128]
    assert "gpt_d768" in run("ops", "--list-models").output.split()


@pytest.mark.parametrize("command", ["predict", "recommend"])
def test_host_must_be_a_host_bench_file_or_local(command: str) -> None:
    """Defect 7: --host-cpu banana was accepted and changed nothing."""
    res = run(command, "--model", "resnet18", "--host", "banana")
    assert res.exit_code == 2 and "host-bench" in res.output and "Traceback" not in res.output
    assert run(command, "--model", "resnet18", "--host-cpu", "x").exit_code == 2  # the old option is gone


def _copy_models(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage", ["missing", "empty", "no_manifest", "truncated_booster", "bad_json"])
def test_unusable_models_exit_3_with_the_train_hint(damage: str, tmp_path: Path) -> None:
    """Defect 9: a missing manifest exited 1, a truncated booster 2; the hint named a module path."""
    from gpurec.model.persist import default_model_dir

    d = tmp_path / "models"
    if damage == "empty":
        d.mkdir()
    elif damage != "missing":
        _copy_models(default_model_dir(), d)
        if damage == "no_manifest":
            (d / "manifest.json").unlink()
        elif damage == "truncated_booster":
            booster = next(d.glob("time_*.ubj"))
            booster.write_bytes(booster.read_bytes()[:100])
        else:
            (d / "manifest.json").write_text("{")
    log = tmp_path / "log.jsonl"
    log.write_text("")
    for args in (("predict", "--model", "resnet18"), ("recommend", "--model", "resnet18"),
                 ("validate", "--complete", str(log))):
        res = run(*args, "--models", str(d))
        assert res.exit_code == 3, (damage, res.output)
        assert "gpurec train" in res.output and "Traceback" not in res.output
        assert len(res.output.strip().splitlines()) == 1


def test_a_copied_checkout_uses_its_own_models_or_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 9: a copied checkout with no manifest silently used another checkout's models."""
    from gpurec.model.persist import default_model_dir

    copy = tmp_path / "copy"
    (copy / "gpurec").mkdir(parents=True)
    (copy / "pyproject.toml").write_text((Path(cli.__file__).parent / "pyproject.toml").read_text())
    (copy / "models").mkdir()
    monkeypatch.delenv("GPUREC_MODELS", raising=False)
    monkeypatch.chdir(copy / "gpurec")
    assert default_model_dir() == copy / "models"
    res = run("predict", "--model", "resnet18")
    assert res.exit_code == 3 and str(copy / "models") in res.output


def test_profile_without_gpu_is_one_line_and_exit_2() -> None:
    """Defect 8: a 54-62 line traceback before."""
    res = run("profile", "--model", "resnet18", "--batch-size", "1", "--no-ncu")
    assert res.exit_code == 2, res.output
    assert "needs an NVIDIA GPU" in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["ops", "predict", "recommend", "validate", "profile"])
def test_unknown_model_is_rejected_before_torch_is_imported(command: str) -> None:
    """Defect 11: an unknown model took 6 s to reject (torch and torchvision were imported first)."""
    import subprocess
    import sys

    code = ("import sys, cli\n"
            f"try: cli.app(['{command}', '--model', 'resnet5'])\n"
            "except SystemExit as e: print('exit', e.code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         cwd=Path(cli.__file__).parent)
    assert out.stdout.split() == ["exit", "2", "False"], out.stdout + out.stderr
    assert "Did you mean: resnet50" in out.stderr


def test_progress_shows_on_a_terminal_only() -> None:
    import io

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        with cli._Progress(stream) as say:
            say("predicting on H100")
    assert "predicting on H100" in tty.getvalue() and pipe.getvalue() == ""


def _commands() -> list[tuple[str, object]]:
    """Every leaf command of the app (typer may vendor click: no isinstance checks on click's classes)."""
    import typer

    out: list[tuple[str, object]] = []

    def walk(cmd: object, prefix: str) -> None:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, f"{prefix} {name}".strip())
        else:
            out.append((prefix, cmd))

    walk(typer.main.get_command(cli.app), "")
    return out


def test_every_option_has_a_description() -> None:
    """Defect 10: many options had no description."""
    commands = dict(_commands())
    assert {"recommend", "predict", "ops", "validate", "dataset build"} <= set(commands)
    options = [(name, p) for name, cmd in commands.items() for p in cmd.params  # type: ignore[attr-defined]
               if p.param_type_name == "option"]
    assert len(options) > 40
    assert [f"{name} {p.opts[0]}" for name, p in options if not p.help] == []


def test_measure_network_help_is_its_own_and_validate_model_is_marked_required() -> None:
    """Defect 10: measure-network --help printed collect's argparse help."""
    res = run("measure-network", "--help")
    assert res.exit_code == 0 and "Whole-network measurements" in res.output and "usage:" not in res.output
    text = " ".join(run("validate", "--help").output.replace("│", " ").split())
    assert "required unless --complete" in text


def test_gpus_table_shows_its_sources() -> None:
    """Defect 10: `gpus` promised sources but showed none."""
    out = run("gpus").output
    assert "sources" in out and "https://" in out


def test_tests_leave_no_files_in_the_shared_temp_folder() -> None:
    """Defect 13: tests left gpurec_ncu_metrics_*.txt in the machine's temp folder."""
    from conftest import SYSTEM_TMP

    from gpurec.profile.ncu_io import query_available_metrics

    assert query_available_metrics("/nonexistent/ncu-for-a-test") is None
    assert not list(SYSTEM_TMP.glob("gpurec_ncu_metrics_*nonexistent_ncu_for_a_test*"))


def test_readme_install_command_brings_the_test_runner() -> None:
    """Defect 12: the README's test command failed after its install command (no pytest)."""
    import re

    root = Path(cli.__file__).parent
    readme = (root / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## Tests")]
    blocks = re.findall(r"```bash\n(.*?)\n```", quick, re.S)
    # the CPU-only torch comes first, so a newcomer without a GPU never downloads the CUDA build
    assert "download.pytorch.org/whl/cpu" in blocks[0]
    assert blocks[1].startswith("pip install -e '.[dev]' && gpurec recommend")
    tests = readme[readme.index("## Tests"):]
    assert re.search(r"```bash\n(.*?)\n```", tests, re.S).group(1) == "python -m pytest"  # type: ignore[union-attr]
    dev = re.search(r"^dev = \[(.*?)\]", (root / "pyproject.toml").read_text(), re.M)
    assert dev is not None and '"pytest' in dev.group(1)
    assert "download.pytorch.org/whl/cpu" in quick  # a CPU-only torch for machines without a GPU


_USER_FILE = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(16, 10))

    def forward(self, x):
        return self.body(x)


def lm():
    return nn.Sequential(nn.Embedding(100, 64), nn.Linear(64, 100))


class NeedsWidth(nn.Module):
    def __init__(self, width):
        super().__init__()


made = Net()  # a module the file makes itself, as scripts and notebooks do
'''


def test_your_own_network_from_a_python_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--model FILE.py:NAME predicts, ranks and validates your own nn.Module: the same figures as
    the Python API on that module, token ids (torch.long) with --seq-len, one-line errors that say
    how to fix a bad spec."""
    import torch

    import gpurec
    import gpurec.validate.run as val_run

    path = tmp_path / "mynet.py"
    path.write_text(_USER_FILE)
    res = run("predict", "--model", f"{path}:Net", "-b", "4", "-r", "32", "--gpu", "H100", "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    from gpurec.ops.user_module import load_user_module

    est = gpurec.load_predictor().predict(load_user_module(f"{path}:Net"), (4, 3, 32, 32), gpu="H100")
    assert data["input_shape"] == [4, 3, 32, 32] and data["gpu_time_ms"] == pytest.approx(est.gpu_time_ms)
    made = run("predict", "--model", f"{path}:made", "-b", "4", "-r", "32", "--gpu", "H100", "--format", "json")
    assert made.exit_code == 0, made.output  # the instance itself, not called with no input
    assert json.loads(made.stdout)["gpu_time_ms"] == pytest.approx(est.gpu_time_ms)
    lm = json.loads(run("predict", "--model", f"{path}:lm", "-b", "2", "-s", "16", "--format", "json").stdout)
    assert lm["input_shape"] == [2, 16] and lm["gpu_time_ms"] > 0  # an Embedding takes only integer ids
    ops = json.loads(run("ops", "--model", f"{path}:lm", "-b", "2", "-s", "16", "--format", "json").stdout)
    assert [o["kind"] for o in ops["operations"]] == ["Embedding", "Linear"]
    ranked = json.loads(run("recommend", "--model", f"{path}:Net", "-b", "4", "-r", "32", "--gpus", "H100,L4",
                            "--format", "json").stdout)
    assert {r["short_name"] for r in ranked["ranking"]} == {"H100", "L4"}
    for spec, needle in ((f"{path}:Nope", "callables defined there: NeedsWidth, Net, lm, made"),
                         (f"{path}:NeedsWidth", "needs no arguments"),
                         (f"{tmp_path}/missing.py:Net", "does not exist")):
        bad = run("predict", "--model", spec)
        assert bad.exit_code == 2 and needle in bad.output and "Traceback" not in bad.output
    seen: list = []

    def measure(model, example_inputs, mode, gpu_index=0, min_window_s=1.0, precision="fp32"):
        seen.append((type(model).__name__, example_inputs, mode))
        return {"gpu": "NVIDIA H100 80GB HBM3", "time_ms": 1.0, "energy_mj": 100.0, "power_w": 100.0,
                "gpu_time_ms": 0.5, "gpu_energy_mj": 60.0, "captured": True}

    monkeypatch.setattr(cli, "_require_gpu", lambda *a: None)
    monkeypatch.setattr(val_run, "measure_module", measure)
    res = run("validate", "--model", f"{path}:lm", "-b", "2", "-s", "16", "--mode", "training", "--format", "json")
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout)
    ((name, (ids,), mode),) = seen
    assert name == "Sequential" and mode == "training" and ids.dtype == torch.long and list(ids.shape) == [2, 16]
    assert rec["model"] == f"{path}:lm" and rec["input_shapes"] == [[2, 16]] and "gpu_time_error_pct" in rec
    text = run("validate", "--model", f"{path}:Net", "-b", "2", "-r", "32").output
    assert f"{path}:Net inputs [[2, 3, 32, 32]], inference on NVIDIA H100 80GB HBM3" in text and "host-free" in text
