"""Collection under faults, on the CPU with the fake board: a worker process killed with
SIGKILL between rows or in the middle of writing one resumes with every earlier row kept as
measured and no row lost or duplicated; a lost CUDA context stops the
worker with the row recorded (its parent restarts it); repeated out-of-memory rows are
recorded and stop the run after the configured number; the collect API plans and shards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fakes import FakeNVML

from gpurec.collect import runner as runner_mod
from gpurec.collect.__main__ import main as worker_main
from gpurec.collect.api import CONTEXT_LOST_EXIT, CollectOptions, collect
from gpurec.collect.measure import WindowConfig
from gpurec.collect.plan import build_plan
from gpurec.collect.runner import CollectConfig, ContextLost, OperationSource, TooManyFailures, run_worker
from gpurec.dataset.store import read_jsonl
from gpurec.sets import ModelInputSet

ROOT = Path(__file__).resolve().parents[1]
SET = ModelInputSet("resnet18", 2, 32)
FAST = WindowConfig(min_window_s=0.05, tick_timeout_s=10.0, gpu_blocks=2, gpu_min_block_ms=1.0)


def _cfg(**kw: object) -> CollectConfig:
    base: dict[str, object] = {"window": FAST, "repeat_every": 0, "max_consecutive_failures": 3,
                               "host_bench_blocks": 0}
    base.update(kw)
    return CollectConfig(**base)  # type: ignore[arg-type]


def _rows(out: Path) -> list[dict]:
    return [r for p in sorted(out.glob("rows-*.jsonl")) for r in read_jsonl(p) if r.get("item") != "idle"]


def test_lost_cuda_context_records_the_row_and_stops_the_worker(tmp_path: Path, fast_worker: FakeNVML,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    items = [w for w in build_plan([SET], ("inference",)) if w.item == "op"][:3]
    real = runner_mod._measure_item
    calls = []

    def measure(w, ctx, idle):  # noqa: ANN001
        calls.append(w.id)
        if len(calls) == 2:
            return {"id": w.id, "item": w.item, "mode": w.mode, "status": "failed", "fatal": True,
                    "error": "RuntimeError: CUDA error: device-side assert triggered"}
        return real(w, ctx, idle)

    monkeypatch.setattr(runner_mod, "_measure_item", measure)
    with pytest.raises(ContextLost, match="device-side assert"):
        run_worker(items, tmp_path, _cfg(), device="cpu", log=lambda m: None)
    rows = _rows(tmp_path)
    assert [r["status"] for r in rows] == ["ok", "failed"] and rows[1]["fatal"] is True
    # the worker entry turns it into the exit code its parent restarts on
    monkeypatch.setattr("gpurec.collect.__main__.collect", lambda opts: (_ for _ in ()).throw(ContextLost("x")))
    spec = CollectOptions(out=str(tmp_path)).write(tmp_path / "spec.json")
    assert worker_main(str(spec)) == CONTEXT_LOST_EXIT


def test_repeated_out_of_memory_is_recorded_then_stops(tmp_path: Path, fast_worker: FakeNVML,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    items = [w for w in build_plan([SET], ("inference",)) if w.item == "op"][:6]

    def oom(**kw: object) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    monkeypatch.setattr(OperationSource, "get", lambda self, s, m, sig: SimpleNamespace(
        params=0, dtype="float32", materialize=oom))
    with pytest.raises(TooManyFailures, match="3 consecutive failures"):
        run_worker(items, tmp_path, _cfg(), device="cpu", log=lambda m: None)
    rows = _rows(tmp_path)
    assert len(rows) == 3 and all(r["status"] == "failed" and r["error"].startswith("CUDA out of memory")
                                  for r in rows)


def test_collect_api_plans_and_shards(tmp_path: Path) -> None:
    opts = CollectOptions(out=str(tmp_path), models=["resnet18"], batch_sizes=[2], resolutions=[32],
                          modes=["inference"], shard="1/2", plan_only=True)
    summary = collect(opts)
    other = collect(CollectOptions(**{**opts.__dict__, "shard": "0/2"}))
    whole = build_plan([SET], ("inference",))
    assert summary["of"] == len(whole) and 0 < summary["items"] < len(whole)
    assert summary["items"] + other["items"] == len(whole)
    with pytest.raises(ValueError, match="--what"):
        CollectOptions(out="x", what="everything")
    back = CollectOptions.read(opts.write(tmp_path / "o.json"))
    assert back == opts


WORKER = """
import os, sys, time
sys.path[:0] = [{root!r}, {tests!r}]
from fakes import FakeBoard, FakeNVML
from gpurec.device import nvml
nvml.set_backend(FakeNVML([FakeBoard(power_w=100.0, update_period_s=0.02)]))
from gpurec.collect import measure, runner
runner.measure_idle = lambda s, d=1.0: measure.measure_idle(s, 0.1)
runner.tick_period_s = lambda s, d=1.0: measure.tick_period_s(s, 0.1)
tear_at = int(os.environ.get("TEAR_AT_OP_ROW", "0"))
if tear_at:  # die in the middle of writing that row: half a line on disk, then SIGKILL
    import json, signal
    from gpurec.dataset import store
    real_append, ops = store.JsonlShard.append, [0]
    def append(self, row):
        if row.get("item") == "op":
            ops[0] += 1
            if ops[0] == tear_at:
                line = json.dumps(row, separators=(",", ":"), default=str).encode()
                with open(self.path, "ab") as fh:
                    fh.write(line[: len(line) // 2])
                    fh.flush()
                    os.fsync(fh.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
        real_append(self, row)
    store.JsonlShard.append = append
from gpurec.collect.__main__ import main
sys.exit(main({spec!r}))
"""


def _start(spec: Path, tear_at_op_row: int = 0) -> subprocess.Popen[bytes]:
    code = WORKER.format(root=str(ROOT), tests=str(ROOT / "tests"), spec=str(spec))
    env = dict(os.environ, TEAR_AT_OP_ROW=str(tear_at_op_row))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def _op_lines(shard: Path) -> list[dict]:
    return [r for r in read_jsonl(shard) if r.get("item") == "op"]


def _kept_as_measured(before: list[dict], after: list[dict]) -> None:
    """Rows measured before a kill are still there, first, byte for byte the same row (run_id and
    t_unix included): a resume that wiped the shard and measured again would differ."""
    assert after[:len(before)] == before


def test_killed_worker_process_resumes_keeping_every_row_it_measured(tmp_path: Path) -> None:
    """Killed twice: from outside between rows, then in the middle of writing a row; each resume
    keeps every earlier row as it was, moves the torn fragment aside, and the plan ends measured
    exactly once."""
    out = tmp_path / "out"
    plan = [w for w in build_plan([SET], ("inference",)) if w.item == "op"][:10]
    out.mkdir()
    (tmp_path / "plan.json").write_text(json.dumps({"items": [w.as_dict() for w in plan]}))
    spec = CollectOptions(out=str(out), plan=str(tmp_path / "plan.json"), device="cpu", min_window_s=0.05,
                          repeat_every=0, in_network=False).write(tmp_path / "spec.json")
    shard = out / "rows-0of1.jsonl"

    # 1. SIGKILL from outside once three rows are written
    proc = _start(spec)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if shard.exists() and len(_op_lines(shard)) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = _op_lines(shard)
    assert 3 <= len(first) < len(plan) - 2

    # 2. killed in the middle of writing its second row: half a line left on disk
    proc = _start(spec, tear_at_op_row=2)
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    assert not shard.read_bytes().endswith(b"\n")  # the torn row
    second = _op_lines(shard)  # the torn line is not a row
    assert len(second) == len(first) + 1
    _kept_as_measured(first, second)
    assert second[-1]["run_id"] != first[-1]["run_id"]

    # 3. the last run resumes after the torn row and measures the rest
    proc = _start(spec)
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    final = _op_lines(shard)
    _kept_as_measured(second, final)
    assert sorted(r["id"] for r in final) == sorted(w.id for w in plan)  # nothing lost, nothing measured twice
    torn = (out / "rows-0of1.jsonl.torn").read_text().splitlines()
    assert len(torn) == 1 and torn[0].startswith('{"id":"op:')  # the fragment, kept aside
    assert len({r["run_id"] for r in final}) == 3
    provs = sorted(out.glob("provenance-*.json"))
    assert len(provs) == 3 and all(json.loads(p.read_text())["host_bench"]["dispatch_cpu_us"] for p in provs)
