"""Live probes of extraction paths that no collected set exercises (``gpurec tools probe-rnn`` and
``gpurec tools probe-norms``; their rows are in ``datasets/probes/``, not training data).

``probe-rnn``: recurrent networks of the families issue 22 names (LSTM/GRU language models and
classifiers), written as users write them rather than as gpurec.seqmodels builds them: an LSTM
classifier that packs its batch (``pack_padded_sequence``, all lengths 64, which is what gpurec
assumes, and lengths uniform in [8, 64] in ``_varlen``), the same classifier on the padded batch,
and LSTMCell / GRUCell language models stepped in Python.  ``measure`` measures them the way
``gpurec validate`` measures a network (GPU machine); ``validate`` goes through
``gpurec.validate.validate_module`` (GPU machine, with that machine's host profile);
``compare`` / ``complete`` add the shipped models' predictions (here, with xgboost).

``probe-norms``: which CUDA kernels nn.RMSNorm launches beside nn.LayerNorm's, and their times
(whether LayerNorm's rows may stand for RMSNorm).

``probe-small``: networks far smaller than any measured whole (MLPs and CNNs on 32x32 images, one
Linear layer; the size a NAS loop or a test builds), through ``validate_module``: the network time
correction was fitted on networks of 0.06 ms of op sum and more, and how it should behave below
(session 38's floor) had no measurement.
"""

from __future__ import annotations

import json
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

BATCH, STEPS, WIDTH, VOCAB = 32, 64, 512, 8000
NORM_SHAPES = [(8192, 768), (16384, 1024), (4096, 4096), (32768, 2048)]


def _classes() -> dict[str, Any]:
    import torch
    from torch import nn

    class PackedClassifier(nn.Module):
        def __init__(self, packed: bool) -> None:
            super().__init__()
            self.packed = packed
            self.emb = nn.Embedding(VOCAB, WIDTH)
            self.rnn = nn.LSTM(WIDTH, WIDTH, num_layers=2, batch_first=True)
            self.head = nn.Linear(WIDTH, 4)

        def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            x = self.emb(ids)
            if self.packed:
                x = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
            _, (h, _) = self.rnn(x)
            return self.head(h[-1])

    class CellLM(nn.Module):
        def __init__(self, cell: type[nn.Module]) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, WIDTH)
            self.cell = cell(WIDTH, WIDTH)
            self.head = nn.Linear(WIDTH, VOCAB)

        def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            x, state, outs = self.emb(ids), None, []
            for t in range(x.shape[1]):
                state = self.cell(x[:, t], state)
                outs.append(state[0] if isinstance(state, tuple) else state)
            return self.head(torch.stack(outs, 1))

    return {"lstm_cls_packed": lambda: PackedClassifier(True), "lstm_cls_padded": lambda: PackedClassifier(False),
            "lstmcell_lm": lambda: CellLM(nn.LSTMCell), "grucell_lm": lambda: CellLM(nn.GRUCell),
            "lstm_cls_packed_varlen": lambda: PackedClassifier(True)}


RNN_NETWORKS = ("lstm_cls_packed", "lstm_cls_padded", "lstmcell_lm", "grucell_lm", "lstm_cls_packed_varlen")


def rnn_network(name: str) -> Any:
    """A fresh module of probe network ``name`` (RNN_NETWORKS)."""
    builders = _classes()
    if name not in builders:
        raise KeyError(f"unknown probe network {name!r}; one of {', '.join(RNN_NETWORKS)}")
    return builders[name]()


def rnn_example_inputs(name: str, device: Any = "cpu") -> tuple[Any, Any]:
    """Token ids (on ``device``) and lengths (on the host, as packing wants them): all STEPS long,
    or uniform in [8, STEPS] for a ``_varlen`` network."""
    import torch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, STEPS), generator=gen).to(device)
    lengths = (torch.randint(8, STEPS + 1, (BATCH,), generator=gen) if name.endswith("_varlen")
               else torch.full((BATCH,), STEPS, dtype=torch.int64))
    return ids, lengths


def _append(path: Path | str, row: dict[str, Any]) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(row, default=str) + "\n")


def _selected(only: list[str] | None) -> list[str]:
    names = list(only or RNN_NETWORKS)
    unknown = [n for n in names if n not in RNN_NETWORKS]
    if unknown:
        raise KeyError(f"unknown probe network(s) {', '.join(unknown)}; one of {', '.join(RNN_NETWORKS)}")
    return names


def measure_rnn(out_path: Path | str, only: list[str] | None = None,
                log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Measure each network in both modes on GPU 0 as ``gpurec validate`` measures a network
    (gpurec.collect.measure.measure_network); each row is appended to ``out_path`` as it is measured,
    a failure as a row with its error."""
    import torch

    from gpurec.collect.measure import WindowConfig, measure_idle, measure_network
    from gpurec.collect.runner import match_nvml_index
    from gpurec.device import open_gpu
    from gpurec.device.graphs import CudaBackend
    from gpurec.device.sampler import Sampler
    from gpurec.device.window import EnergyMonitor

    device = torch.device("cuda", 0)
    gpu = open_gpu(match_nvml_index(0))
    info = gpu.info()
    rows = []
    with Sampler(gpu) as sampler:
        idle = measure_idle(sampler, 1.0)["idle_power_w"]
        for name in _selected(only):
            for mode in ("inference", "training"):
                torch.manual_seed(0)
                with torch.device(device):
                    model = rnn_network(name).train(mode == "training")
                inputs = rnn_example_inputs(name, device)
                grad = None
                if mode == "training":
                    grad = torch.randn_like(model(*inputs))
                    model.zero_grad(set_to_none=True)

                def step(model: Any = model, inputs: Any = inputs, grad: Any = grad) -> None:
                    y = model(*inputs)
                    if grad is not None:
                        y.backward(grad)
                        model.zero_grad(set_to_none=True)

                try:
                    row = measure_network(step, EnergyMonitor(sampler), WindowConfig(min_window_s=1.0), CudaBackend(),
                                          mode == "inference", idle, info.power_limit_w)
                    row["status"] = "ok"
                except Exception as exc:  # one network's failure is recorded, not lost
                    row = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:500]}
                row.update({"network": name, "mode": mode, "batch": BATCH, "steps": STEPS, "gpu": info.name,
                            "gpu_uuid": info.uuid, "driver": info.driver_version, "torch": torch.__version__,
                            "t_unix": time.time()})
                _append(out_path, row)
                rows.append(row)
                if log:
                    log(f"{name} {mode}: {row['status']}")
    return rows


def validate_rnn(out_path: Path | str, only: list[str] | None = None,
                 log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """gpurec.validate.validate_module on each network and mode; each record appended to
    ``out_path`` (prediction pending where xgboost is missing: ``complete_rnn`` fills it in)."""
    from gpurec.validate import validate_module

    recs = []
    for name in _selected(only):
        for mode in ("inference", "training"):
            try:
                rec = validate_module(rnn_network(name), rnn_example_inputs(name), mode, label=name)
            except Exception as exc:  # one network's failure is recorded, not lost
                rec = {"model": name, "mode": mode, "status": "failed", "error": f"{type(exc).__name__}: {exc}"[:500]}
            _append(out_path, rec)
            recs.append(rec)
            if log:
                log(f"{name} {mode}: {rec.get('status', 'ok')}")
    return recs


def _predict(predictor: Any, name: str, mode: str, gpu: str, host: Any = None) -> Any:
    import gpurec

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpurec.PackedSequenceWarning)
        return predictor.predict(rnn_network(name), example_inputs=rnn_example_inputs(name), mode=mode, gpu=gpu,
                                 host=host)


def compare_rnn(path: Path | str, predictor: Any = None) -> list[dict[str, Any]]:
    """measure_rnn's rows against the shipped models' estimate for their GPU (reference host),
    field by field as a validation record compares them (gpurec.validate.compare.prediction_fields:
    host-free errors only where the step was captured as a graph)."""
    from gpurec.model import load_predictor
    from gpurec.validate.compare import measured_fields, prediction_fields

    predictor = predictor or load_predictor()
    out = []
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        res: dict[str, Any] = {"network": row["network"], "mode": row["mode"], "status": row.get("status")}
        if row.get("status") == "ok":
            est = _predict(predictor, row["network"], row["mode"], row["gpu"])
            measured = measured_fields(row)
            res.update({"measured_time_ms": row["time_ms"], "measured_energy_mj": row["energy_mj"], **measured,
                        **prediction_fields(est, row["time_ms"], row["energy_mj"], measured)})
        else:
            res["error"] = row.get("error")
        out.append(res)
    return out


def _complete(path: Path | str, predictor: Any, predict: Callable[[Any, dict[str, Any], Any],
                                                          tuple[Any, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A probe log's records, each measured one with ``predict(predictor, record, host)``'s estimate
    (for the record's GPU and measuring host) compared field by field (prediction_fields) and its
    extra fields; the file is not rewritten."""
    from gpurec.model import load_predictor
    from gpurec.validate.compare import host_of, prediction_fields

    predictor = predictor or load_predictor()
    out = []
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        if "measured_time_ms" in rec:
            est, extra = predict(predictor, rec, host_of(rec))
            rec = {**rec, **prediction_fields(est, rec["measured_time_ms"], rec["measured_energy_mj"], rec), **extra}
            rec.pop("prediction", None)
        out.append(rec)
    return out


def complete_rnn(path: Path | str, predictor: Any = None) -> list[dict[str, Any]]:
    """validate_rnn's records with the shipped models' prediction for their GPU and the measuring
    machine's host profile (gpurec.validate.compare.prediction_fields), without rewriting the file."""
    return _complete(path, predictor, lambda p, rec, host: (_predict(p, rec["model"], rec["mode"], rec["gpu"], host),
                                                            {}))


def probe_norms(out_path: Path | str) -> dict[str, Any]:
    """nn.RMSNorm beside nn.LayerNorm on GPU 0 at NORM_SHAPES, fp32 and bf16, both modes: the CUDA
    kernels the profiler saw in one step and the median step time over CUDA-event-timed blocks (no
    graph: each step takes tens of microseconds or more).  Written to ``out_path`` (JSON)."""
    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile

    def timed(step: Callable[[], None], calls: int = 50, blocks: int = 7) -> float:
        for _ in range(5):
            step()
        times = []
        for _ in range(blocks):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / calls)
        return statistics.median(times)

    rows = []
    for n_rows, d in NORM_SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            for training in (False, True):
                for name, norm in (("RMSNorm", nn.RMSNorm(d)), ("LayerNorm", nn.LayerNorm(d))):
                    norm = norm.to("cuda", dtype)
                    with torch.inference_mode(not training):
                        x = torch.randn(n_rows, d, device="cuda", dtype=dtype, requires_grad=training)
                        grad = torch.randn_like(x)

                        def step(norm: Any = norm, x: Any = x, grad: Any = grad, training: bool = training) -> None:
                            y = norm(x)
                            if training:
                                y.backward(grad)
                                x.grad = None
                                norm.zero_grad(set_to_none=True)

                        step()
                        torch.cuda.synchronize()
                        with profile(activities=[ProfilerActivity.CUDA]) as prof:
                            step()
                            torch.cuda.synchronize()
                        kernels = [e.name for e in prof.events()
                                   if e.device_type.name == "CUDA" and "Memset" not in e.name]
                        rows.append({"module": name, "rows": n_rows, "d": d, "dtype": str(dtype).replace("torch.", ""),
                                     "mode": "training" if training else "inference", "kernels": kernels,
                                     "time_ms": timed(step)})
    from gpurec.dataset.store import atomic_write_json

    result = {"meta": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}, "rows": rows}
    atomic_write_json(out_path, result)
    return result


SMALL_NETWORKS = ("linear512", "mlp256", "mlp2048", "cnn16", "cnn128")
SMALL_BATCHES = (1, 8, 64, 256)


def small_network(name: str) -> Any:
    """A fresh module of small probe network ``name`` (SMALL_NETWORKS), seeded."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "linear512":
        return nn.Sequential(nn.Linear(512, 512))
    if name.startswith("mlp"):
        w = int(name[3:])
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                             nn.Linear(w, 10))
    if name.startswith("cnn"):
        c = int(name[3:])
        return nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * c, 10))
    raise KeyError(f"unknown small probe network {name!r}; one of {', '.join(SMALL_NETWORKS)}")


def small_inputs(name: str, batch: int) -> tuple[Any]:
    """The network's input: (batch, 512) features for linear512, else (batch, 3, 32, 32) images."""
    import torch

    gen = torch.Generator().manual_seed(0)
    shape = (batch, 512) if name == "linear512" else (batch, 3, 32, 32)
    return (torch.randn(shape, generator=gen),)


def validate_small(out_path: Path | str, budget_s: float = 480.0,
                   log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """gpurec.validate.validate_module on every small network, batch and mode (GPU machine), each
    record appended to ``out_path`` as it is measured (a failure as a record with its error); stops
    starting new ones after ``budget_s``."""
    from gpurec.validate import validate_module

    start, recs = time.monotonic(), []
    for batch in SMALL_BATCHES:
        for name in SMALL_NETWORKS:
            for mode in ("inference", "training"):
                if time.monotonic() - start > budget_s:
                    return recs
                try:
                    rec = validate_module(small_network(name), small_inputs(name, batch), mode,
                                          label=f"{name}:b{batch}")
                except Exception as exc:  # one network's failure is recorded, not lost
                    rec = {"model": f"{name}:b{batch}", "mode": mode, "status": "failed",
                           "error": f"{type(exc).__name__}: {exc}"[:500]}
                rec |= {"network": name, "batch": batch}
                _append(out_path, rec)
                recs.append(rec)
                if log:
                    log(f"{name} b{batch} {mode}: {rec.get('status', 'ok')}")
    return recs


def complete_small(path: Path | str, predictor: Any = None) -> list[dict[str, Any]]:
    """validate_small's records with the shipped models' prediction for their GPU and measuring
    host (prediction_fields), and beside it the host-free time the same models gave with their
    network time correction as training fitted it (``as_trained_gpu_time_ms``: one correction for
    every network and no floor, both added after training in session 38) and the operations' sum
    with no network correction (``op_sum_gpu_time_ms``); the file is not rewritten."""

    def predict(p: Any, rec: dict[str, Any], host: Any) -> tuple[Any, dict[str, Any]]:
        net, inputs = small_network(rec["network"]), small_inputs(rec["network"], rec["batch"])
        est = p.predict(net, example_inputs=inputs, mode=rec["mode"], gpu=rec["gpu"], host=host)
        c = p.correction
        added = c.time_floor_ms, c.nonrecurrent_time_coef
        c.time_floor_ms, c.nonrecurrent_time_coef = {}, {}
        try:
            as_trained = p.predict(net, example_inputs=inputs, mode=rec["mode"], gpu=rec["gpu"], host=host)
        finally:
            c.time_floor_ms, c.nonrecurrent_time_coef = added
        return est, {"as_trained_gpu_time_ms": as_trained.gpu_time_ms, "op_sum_gpu_time_ms": est.op_sum_time_ms}

    return _complete(path, predictor, predict)
