"""The run side of validation (GPU layer): measure a whole network on the GPU at hand the three
ways collection measures (eager, host-free, in-network), predict it with this host's profile and
log the comparison (``gpurec.validate.compare``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpurec.validate.compare import (
    DEFAULT_LOG,
    DEFAULT_PRECISION,
    input_of,
    load_predictor_or_none,
    measured_fields,
    predicted_fields,
    prediction_fields,
    set_key_of,
    sum_of_measured_ops,
)


def measure_network(model: str, input_shape: tuple[int, ...], mode: str, gpu_index: int = 0,
                    min_window_s: float = 1.0, in_network: bool = True,
                    precision: str = DEFAULT_PRECISION, checkpoint_blocks: bool = False) -> dict[str, Any]:
    """Whole-network figures on local GPU ``gpu_index``, measured the three ways collection
    measures them (eager, host-free as one CUDA graph, in-network attribution) at ``precision``
    (a mixed one inside its autocast scope, as collection runs it), plus this host's
    ``host-bench`` profile.  With ``checkpoint_blocks`` (gpurec.ops.checkpointing) the repeated
    blocks run inside torch.utils.checkpoint and the in-network pass is left out: it attributes
    kernels to the plain network's operations, and backward runs the blocks' forwards again."""
    from gpurec.collect.runner import NetworkUnit

    def unit(device: Any) -> Any:
        return NetworkUnit(model, input_shape, mode, device, precision=precision, checkpoint_blocks=checkpoint_blocks)

    return _measure(unit, mode, gpu_index, min_window_s,
                    set_key_of(model, input_shape) if in_network and not checkpoint_blocks else None, precision)


def measure_module(model: Any, example_inputs: Any, mode: str, gpu_index: int = 0, min_window_s: float = 1.0,
                   precision: str = DEFAULT_PRECISION) -> dict[str, Any]:
    """measure_network for a caller's nn.Module and its example inputs (a copy of both on the
    GPU; the inputs' values are kept): eager and host-free, without the in-network pass, which
    looks operations up by a named set's key."""
    from gpurec.collect.runner import ModuleUnit

    def unit(device: Any) -> Any:
        return ModuleUnit(model, example_inputs, mode, device, precision=precision)

    return _measure(unit, mode, gpu_index, min_window_s, None, precision)


def _measure(make_unit: Any, mode: str, gpu_index: int, min_window_s: float, in_network_key: str | None,
             precision: str) -> dict[str, Any]:
    import torch

    from gpurec.collect.measure import WindowConfig, measure_idle
    from gpurec.collect.measure import measure_network as measure_three_ways
    from gpurec.collect.runner import OperationSource, in_network_fields, match_nvml_index
    from gpurec.device import NVMLUnavailable, open_gpu
    from gpurec.device.graphs import CudaBackend
    from gpurec.device.sampler import Sampler
    from gpurec.device.window import EnergyMonitor
    from gpurec.host import host_cpu, run_host_bench

    if not torch.cuda.is_available():
        raise NVMLUnavailable("No CUDA GPU is visible to torch: `gpurec validate` measures on the GPU at hand. "
                              "Use `gpurec predict` or `gpurec recommend` on machines without one.")
    torch.cuda.set_device(gpu_index)
    device = torch.device("cuda", gpu_index)
    gpu = open_gpu(match_nvml_index(gpu_index))
    info = gpu.info()
    host = run_host_bench(use_gpu=True)
    unit = make_unit(device)
    inference = mode == "inference"
    with Sampler(gpu) as sampler, unit.scope():
        idle = measure_idle(sampler, 1.0)
        row = measure_three_ways(unit.step, EnergyMonitor(sampler), WindowConfig(min_window_s=min_window_s),
                                 CudaBackend(), inference, idle["idle_power_w"], info.power_limit_w)
        if in_network_key is not None:
            row.update(in_network_fields(unit, OperationSource(), in_network_key, mode, precision))
    row.update({"gpu": info.name, "driver": info.driver_version, "torch": torch.__version__,
                "host_cpu": host_cpu(), "host_bench": host.to_dict()})
    return row


def validate(model: str, batch_size: int, resolution: int = 224, mode: str = "inference", gpu_index: int = 0,
             log_path: Path | str | None = DEFAULT_LOG, predictor: Any = None,
             measurement: dict[str, Any] | None = None, seq_len: int | None = None,
             precision: str = DEFAULT_PRECISION, checkpoint_blocks: bool = False) -> dict[str, Any]:
    """Measure (eager, host-free, in-network), predict with this host's profile, compare field
    by field; append the record to ``log_path`` (JSON lines).  A sequence model takes
    ``batch_size`` sequences of ``seq_len`` token ids; a classifier images of ``resolution``.
    With ``checkpoint_blocks`` its repeated blocks run inside torch.utils.checkpoint
    (gpurec.ops.checkpointing), measured and predicted so; the record says so and carries no sum
    of measured operations (the rows are the plain network's, without the recomputation)."""
    from gpurec.dataset.store import JsonlShard

    shape = input_of(model, batch_size, resolution, seq_len)
    meas = measurement if measurement is not None else measure_network(model, shape, mode, gpu_index,
                                                                        precision=precision,
                                                                        checkpoint_blocks=checkpoint_blocks)
    if predictor is None:
        predictor = load_predictor_or_none()
    size = {"seq_len": shape[1]} if len(shape) == 2 else {"resolution": resolution}
    record: dict[str, Any] = {
        "t_unix": time.time(), "model": model, "batch_size": batch_size, **size, "mode": mode,
        "precision": precision, **({"checkpoint_blocks": True} if checkpoint_blocks else {}),
        "gpu": meas["gpu"], "measured_time_ms": meas["time_ms"], "measured_energy_mj": meas["energy_mj"],
        "measured_power_w": meas["power_w"], "sm_clock_mhz": meas.get("sm_clock_mhz"),
        "provenance": {k: meas.get(k) for k in ("driver", "torch", "host_cpu")},
        **measured_fields(meas),
    }
    if meas.get("host_bench"):
        record["host_bench"] = meas["host_bench"]
    if meas.get("in_network"):
        record["in_network"] = meas["in_network"]
    if predictor is not None:
        record.update(predicted_fields(predictor, record))
    else:
        record["prediction"] = "pending: the predictors need xgboost, which is not installed here"
    sums = {} if checkpoint_blocks else sum_of_measured_ops(model, shape, mode, meas["gpu"], precision=precision)
    record.update({f"opsum_{k}": v for k, v in sums.items()})
    for f in ("time_ms", "energy_mj", "gpu_time_ms", "gpu_energy_mj"):
        if f"sum_{f}" in sums and meas.get(f):
            record[f"opsum_{f.rsplit('_', 1)[0]}_error_pct"] = (sums[f"sum_{f}"] / meas[f] - 1.0) * 100.0
    if log_path is not None:
        with JsonlShard(log_path) as log:
            log.append(record)
    return record


def validate_module(model: Any, example_inputs: Any, mode: str = "inference", gpu_index: int = 0,
                    predictor: Any = None, measurement: dict[str, Any] | None = None,
                    precision: str = DEFAULT_PRECISION, label: str | None = None) -> dict[str, Any]:
    """``validate`` for your own nn.Module: measure it on this GPU (eager and host-free, as
    ``gpurec validate`` measures a named network; ``measure_module``), predict it for this
    GPU and this host's ``host-bench`` profile, and compare field by field.

    ``example_inputs`` as ``predict`` takes them (their values are used for the measurement:
    lengths to pack, token ids).  Returns the record (``time_error_pct``, ``gpu_time_error_pct``,
    ``gpu_energy_error_pct``, ``bound_right``, ...); it is not written to the named-network log,
    whose records are re-created by name.  Without xgboost the record says the prediction is
    pending: predict it where xgboost is, with the record's ``gpu`` and ``host_bench``."""
    import torch

    from gpurec.host import HostProfile

    meas = measurement if measurement is not None else measure_module(model, example_inputs, mode, gpu_index,
                                                                        precision=precision)
    inputs = example_inputs if isinstance(example_inputs, (tuple, list, dict)) else (example_inputs,)
    shapes = {k: list(v.shape) for k, v in inputs.items() if isinstance(v, torch.Tensor)} if isinstance(inputs, dict) \
        else [list(t.shape) for t in inputs if isinstance(t, torch.Tensor)]
    record: dict[str, Any] = {
        "t_unix": time.time(), "model": label or type(model).__name__, "module": True, "input_shapes": shapes,
        "mode": mode, "precision": precision, "gpu": meas["gpu"], "measured_time_ms": meas["time_ms"],
        "measured_energy_mj": meas["energy_mj"], "measured_power_w": meas["power_w"],
        "sm_clock_mhz": meas.get("sm_clock_mhz"),
        "provenance": {k: meas.get(k) for k in ("driver", "torch", "host_cpu")}, **measured_fields(meas),
    }
    if meas.get("host_bench"):
        record["host_bench"] = meas["host_bench"]
    if predictor is None:
        predictor = load_predictor_or_none()
    if predictor is None:
        record["prediction"] = ("pending: the predictors need xgboost, which is not installed here; predict the "
                                "module with the record's gpu and host_bench where it is")
        return record
    host = HostProfile.from_dict(meas["host_bench"]) if meas.get("host_bench") else None
    extra = {} if precision == DEFAULT_PRECISION else {"precision": precision}
    est = predictor.predict(model, example_inputs=example_inputs, mode=mode, gpu=meas["gpu"], host=host, **extra)
    record.update(prediction_fields(est, meas["time_ms"], meas["energy_mj"], record))
    return record
