"""Live check of how gpurec extracts recurrent networks as users write them (session 37).

Four LSTM/GRU networks of the families issue 22 names (language models and classifiers), written as
users write them rather than as gpurec.seqmodels builds them: a classifier that packs its batch
(``pack_padded_sequence``, every length at the full padded length, which is what gpurec assumes, and
lengths uniform in [8, 64], to see how far above the measurement that upper bound lies),
the same classifier on the padded batch, and LSTMCell / GRUCell language models stepped in Python.

On the GPU machine (no xgboost there), measure each the way ``gpurec validate`` measures a network
(eager window and host-free as one CUDA graph, gpurec.collect.measure.measure_network):

    PYTHONPATH=. python3 scripts/user_rnn_probe.py measure OUT.jsonl [NAME,NAME...]

Here, add gpurec's prediction (reference host) beside each measurement:

    PYTHONPATH=. python3 scripts/user_rnn_probe.py compare OUT.jsonl

Or through ``gpurec.validate.validate_module`` (which also records the machine's host-bench
profile): ``... validate OUT.jsonl`` there, ``... complete OUT.jsonl`` here.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
from torch import nn

BATCH, STEPS, WIDTH, VOCAB = 32, 64, 512, 8000


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


NETWORKS = {"lstm_cls_packed": lambda: PackedClassifier(True), "lstm_cls_padded": lambda: PackedClassifier(False),
            "lstmcell_lm": lambda: CellLM(nn.LSTMCell), "grucell_lm": lambda: CellLM(nn.GRUCell)}


NETWORKS["lstm_cls_packed_varlen"] = NETWORKS["lstm_cls_packed"]  # lengths uniform in [8, STEPS]


def example_inputs(device: Any = "cpu", name: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (BATCH, STEPS), generator=gen).to(device)
    lengths = (torch.randint(8, STEPS + 1, (BATCH,), generator=gen) if name.endswith("_varlen")
               else torch.full((BATCH,), STEPS, dtype=torch.int64))
    return ids, lengths  # lengths stay on the host, as packing wants


def measure(out_path: str, only: str = "") -> None:
    from gpurec.collect.measure import WindowConfig, measure_idle, measure_network
    from gpurec.collect.runner import match_nvml_index
    from gpurec.device import open_gpu
    from gpurec.device.graphs import CudaBackend
    from gpurec.device.sampler import Sampler
    from gpurec.device.window import EnergyMonitor

    device = torch.device("cuda", 0)
    gpu = open_gpu(match_nvml_index(0))
    info = gpu.info()
    with Sampler(gpu) as sampler, open(out_path, "a") as out:
        idle = measure_idle(sampler, 1.0)["idle_power_w"]
        for name, build in NETWORKS.items():
            if only and name not in only.split(","):
                continue
            for mode in ("inference", "training"):
                torch.manual_seed(0)
                with torch.device(device):
                    model = build().train(mode == "training")
                inputs = example_inputs(device, name)
                grad = None
                if mode == "training":
                    grad = torch.randn_like(model(*inputs))
                    model.zero_grad(set_to_none=True)

                def step(model: nn.Module = model, inputs: Any = inputs, grad: Any = grad) -> None:
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
                out.write(json.dumps(row, default=str) + "\n")
                out.flush()
                print(name, mode, row.get("status"), row.get("time_ms"), row.get("gpu_time_ms"), row.get("captured"),
                      row.get("error", ""), flush=True)


def validate(out_path: str) -> None:
    """gpurec.validate.validate_module on each network and mode (its records, prediction pending
    where xgboost is missing; ``complete`` fills it in with the record's own host profile)."""
    from gpurec.validate import validate_module

    with open(out_path, "a") as out:
        for name, build in NETWORKS.items():
            for mode in ("inference", "training"):
                try:
                    rec = validate_module(build(), example_inputs("cpu", name), mode, label=name)
                except Exception as exc:  # one network's failure is recorded, not lost
                    rec = {"model": name, "mode": mode, "status": "failed", "error": f"{type(exc).__name__}: {exc}"[:500]}
                out.write(json.dumps(rec, default=str) + "\n")
                out.flush()
                print(name, mode, rec.get("measured_time_ms"), rec.get("measured_gpu_time_ms"), rec.get("error", ""),
                      flush=True)


def complete(path: str) -> None:
    """Predict validate's records with the shipped models, for the measuring GPU and that
    machine's host-bench profile, and print measured against predicted."""
    import warnings

    import gpurec
    from gpurec.host import HostProfile
    from gpurec.validate.compare import prediction_fields

    predictor = gpurec.load_predictor()
    for line in open(path):
        rec = json.loads(line)
        if "measured_time_ms" not in rec:
            print(rec["model"], rec["mode"], rec.get("status"), rec.get("error"))
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", gpurec.PackedSequenceWarning)
            est = predictor.predict(NETWORKS[rec["model"]](), example_inputs=example_inputs("cpu", rec["model"]),
                                    mode=rec["mode"], gpu=rec["gpu"], host=HostProfile.from_dict(rec["host_bench"]))
        got = prediction_fields(est, rec["measured_time_ms"], rec["measured_energy_mj"], rec)
        host_free = (f"host-free {rec['measured_gpu_time_ms']:.3f} ms, predicted {got['gpu_time_error_pct']:+.0f}%; "
                     f"energy {got['gpu_energy_error_pct']:+.0f}%" if rec.get("measured_captured") else "not captured")
        print(f"{rec['model']:22s} {rec['mode']:9s} eager {rec['measured_time_ms']:.3f} ms, predicted "
              f"{got['time_error_pct']:+.0f}% (bound {rec.get('measured_bound')} / {got['predicted_bound']}); {host_free}")


def compare(path: str) -> None:
    import warnings

    import gpurec

    predictor = gpurec.load_predictor()
    for line in open(path):
        row = json.loads(line)
        if row.get("status") != "ok":
            print(row["network"], row["mode"], row.get("status"), row.get("error"))
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", gpurec.PackedSequenceWarning)
            est = predictor.predict(NETWORKS[row["network"]](), example_inputs=example_inputs("cpu", row["network"]),
                                    mode=row["mode"], gpu=row["gpu"])
        measured_gpu = row.get("gpu_time_ms") if row.get("captured") else None
        measured_gpu_mj = row.get("gpu_energy_mj") if row.get("captured") else None
        parts = [f"{row['network']:16s} {row['mode']:9s}", f"eager {row['time_ms']:7.3f} ms vs {est.time_ms:7.3f}",
                 f"({est.time_ms / row['time_ms'] - 1:+.0%})"]
        if measured_gpu:
            parts += [f"host-free {measured_gpu:7.3f} ms vs {est.gpu_time_ms:7.3f} ({est.gpu_time_ms / measured_gpu - 1:+.0%})",
                      f"energy {measured_gpu_mj:8.1f} mJ vs {est.gpu_energy_mj:8.1f} "
                      f"({est.gpu_energy_mj / measured_gpu_mj - 1:+.0%})"]
        else:
            parts.append(f"not captured as a graph ({row.get('capture_error', row.get('eager_reason', '?'))})")
        print("  ".join(parts))


if __name__ == "__main__":
    {"measure": measure, "compare": compare, "validate": validate, "complete": complete}[sys.argv[1]](*sys.argv[2:])
