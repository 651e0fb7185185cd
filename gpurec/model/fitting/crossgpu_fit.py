"""Fit and validate the cross-GPU operation time model (gpurec.model.crossgpu) on every GPU with data.

Training rows, one table:

* ``neusight``: NeuSight's public per-operation rows (Tesla P4, P100, T4, V100, A100-PCIe-40GB,
  A100-80GB-PCIe; FP32, TF32 off) that are not host-dominated, with the host floor subtracted
  (gpurec.dataset.external explains the floor);
* ``h100_host_free``: this project's H100 rows timed as CUDA-graph replays (``gpu_time_ms``);
* ``h200_host_free``: the H200's rows timed as CUDA-graph replays (``gpu_time_ms``, measured from
  session 11 on), the same method as the H100's;
* ``h200_eager``: the H200's eager-only rows where the GPU dominates the eager time.  Eager time over
  back-to-back calls is about max(host issue, GPU), so a row counts when, for the same operation
  and mode on the H100, host-free / eager >= ``GPU_DOMINATED_RATIO`` (the GPU was the bottleneck
  there) and the H200's eager time is at least ``GPU_DOMINATED_HOST_FACTOR`` times the H100
  host's issue time ``host_ms`` (it still is on the faster H200).

The operations of our rows come from re-extracting their model-input sets (as training does).
Fitting minimises the squared log error with every GPU weighted equally and, within a GPU, every
kind group equally, by L-BFGS through torch autograd (a few seconds).
"""

from __future__ import annotations

import ast
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpurec.model.crossgpu import (
    CROSSGPU_FILE,
    GEMM_GROUPS,
    GEMM_TILES,
    GPU_COLUMNS,
    K_MIN,
    OP_COLUMNS,
    PUBLIC_BAND_KEY,
    SPEC_EFFICIENCIES,
    SPEC_TERMS,
    CrossGPUModel,
    OpTable,
    gemm_tile_work,
    group_onehot,
    op_table,
    op_table_from_block,
    physical_group,
    spec_logs,
    spec_row,
    spec_weight_floor,
    tensor_peak,
    wave_factor,
)
from gpurec.model.features import KIND_GROUPS
from gpurec.ops.precision import rows_at_precision

GPU_DOMINATED_RATIO = 0.9
GPU_DOMINATED_HOST_FACTOR = 1.25
NEUSIGHT_CAP_PER_OP = 300
# Leave-one-GPU-out scores only rows whose measured GPU time is at least this, on every GPU alike:
# operations that launch no kernel or a tiny one (views, data movement) measure ~0 ms, and their
# relative error is not a statement about the GPU.  No public row that is not host-dominated is
# below it (those are >= 2x the ~7 µs host floor).
SCORED_MIN_GPU_MS = 0.01
# Weights of the H200/H100 log-ratio losses (operation pairs; whole networks of the training
# architectures), against 1.0 for all rows together.
PAIR_WEIGHT = 1.0
NETWORK_PAIR_WEIGHT = 10.0
# The residual booster over the roofline (gpurec.model.crossgpu, RESIDUAL_FEATURES): shallow trees and
# strong leaf shrinkage, so that it learns what operations of a kind share on every GPU, not one GPU.
# Chosen by leave-one-GPU-out (session 27): against the roofline alone, the specification-only MAPE
# fell on 7 of 8 GPUs (P4 rose) and the public whole-model error on 5 of 6 (V100 rose); with the GPU's own specifications
# (peak per SM, board power per TFLOPS, architecture) among its features it rose on the GPUs at the
# ends of their ranges (P4, T4, V100), so the residual sees only the operation and its fit to the die.
RESIDUAL_PARAMS = {"max_depth": 5, "eta": 0.08, "subsample": 0.8, "colsample_bytree": 0.8, "min_child_weight": 20,
                   "reg_lambda": 5.0, "objective": "reg:squarederror", "tree_method": "hist", "seed": 0}
RESIDUAL_ROUNDS = 200
H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"


@dataclass
class CrossTable:
    """Training/evaluation rows: a frame (source, gpu, group, kind, mode, target_ms, ...) and its OpTable."""

    frame: Any
    ops: OpTable
    specs: np.ndarray  # (n, len(GPU_COLUMNS))
    waves: np.ndarray  # (n,) wave factor of each row on its GPU
    tiles: np.ndarray | None = None  # (n, 2 x len(GEMM_TILES)) gemm_tile_work of each row on its GPU

    def take(self, idx: np.ndarray) -> CrossTable:
        return CrossTable(self.frame.iloc[idx].reset_index(drop=True), self.ops.take(idx), self.specs[idx],
                          self.waves[idx], None if self.tiles is None else self.tiles[idx])


def gpu_terms(ops: OpTable, gpus: np.ndarray, spec_of: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Wave factor and GEMM tile work of each row on its own GPU (``gpus``: the row's GPU name)."""
    waves = np.ones(len(ops))
    tiles = np.zeros((len(ops), 2 * len(GEMM_TILES)))
    for g, spec in spec_of.items():
        idx = np.flatnonzero(gpus == g)
        sms = float(spec[GPU_COLUMNS.index("sm_count")])
        waves[idx] = wave_factor(ops.raw[idx, 2], ops.raw[idx, 3], sms)
        tiles[idx] = gemm_tile_work(ops.raw[idx])
    return waves, tiles


def _neusight_rows(data_root: Path | str | None) -> tuple[Any, OpTable]:
    from gpurec.dataset import load_dataset

    d = load_dataset(source="neusight", root=data_root)
    d = d[~d["host_dominated"] & (d["gpu_time_ms"] > 0)].reset_index(drop=True)
    groups = [physical_group(k) for k in d["op_kind"]]
    # GEMM output columns and batch: linear (B*M) x K, bmm B x (M x K), conv (B*Ho*Wo) x C_out
    op = d["neusight_op"].to_numpy()
    gemm_n = np.where(np.isin(op, ["linear", "bmm"]), d["k"], np.where(op == "conv", d["output_channel"], np.nan))
    gemm_batch = np.where(op == "bmm", d["b"], 1.0)
    ops = op_table(d["flops"] + d["flops_elementwise"], d["bytes_read"] + d["bytes_written"], d["output_elements"],
                   groups, np.zeros(len(d)), np.zeros(len(d)),  # TF32 off in every NeuSight row
                   gemm_n=gemm_n.astype(np.float64), gemm_batch=gemm_batch.astype(np.float64))
    frame = d[["gpu", "op_kind", "neusight_op", "split", "latency_ms", "host_floor_ms"]].rename(
        columns={"op_kind": "kind"}).assign(source="neusight", group=groups, mode="inference",
                                            target_ms=d["gpu_time_ms"].to_numpy(), op_key=_neusight_op_keys(d))
    return frame, ops


# The columns that make one NeuSight operation the same operation on every GPU.
_NEUSIGHT_OP_COLUMNS = ("neusight_op", "op_kind", "b", "h", "m", "n", "k", "input_channel", "output_channel",
                        "input_size", "stride", "padding", "kernel_size", "flops", "bytes_read", "bytes_written")


def _neusight_op_keys(d: Any) -> np.ndarray:
    """An identity for each NeuSight row's operation (its shape columns), equal across GPUs."""
    import pandas as pd

    cols = [c for c in _NEUSIGHT_OP_COLUMNS if c in d]
    h = pd.util.hash_pandas_object(d[cols].astype(str), index=False).to_numpy()
    return np.char.add("neusight:", h.astype(str))


def gpu_dominated_h200(h100: Any, h200: Any) -> Any:
    """The H200 eager rows where the GPU dominates (module docstring), with the H100's figures beside."""
    a = h100[["op_signature", "mode", "gpu_time_ms", "time_ms", "host_ms"]].rename(
        columns={"gpu_time_ms": "h100_gpu_time_ms", "time_ms": "h100_time_ms", "host_ms": "h100_host_ms"})
    m = h200.merge(a, on=["op_signature", "mode"], how="inner")
    ratio = m["h100_gpu_time_ms"] / m["h100_time_ms"]
    keep = (ratio >= GPU_DOMINATED_RATIO) & (m["time_ms"] >= GPU_DOMINATED_HOST_FACTOR * m["h100_host_ms"]) \
        & (m["time_ms"] > 0)
    return m[keep.to_numpy()].reset_index(drop=True)


def h200_gpu_time_ms(pairs: Any) -> np.ndarray:
    """GPU time of GPU-dominated H200 eager rows: the eager time times the same operation's H100
    host-free / eager time.  Back-to-back eager calls leave gaps between kernels even where the GPU
    dominates (on the H100 the eager time is a median 4% above the graph-replayed GPU time), and
    the H200 runs the same kernels from a similar host, so its eager time carries the same share."""
    share = pairs["h100_gpu_time_ms"].astype(float) / pairs["h100_time_ms"].astype(float)
    return (pairs["time_ms"].astype(float) * np.minimum(share, 1.0)).to_numpy()


def host_free_mask(rows: Any) -> np.ndarray:
    """Rows timed as CUDA-graph replays: a positive ``gpu_time_ms`` and ``captured`` true."""
    import pandas as pd

    t = pd.to_numeric(rows["gpu_time_ms"], errors="coerce").to_numpy(dtype=np.float64) if "gpu_time_ms" in rows \
        else np.full(len(rows), np.nan)
    captured = rows["captured"].fillna(False).astype(bool).to_numpy() if "captured" in rows \
        else np.ones(len(rows), dtype=bool)
    return (np.nan_to_num(t, nan=0.0) > 0) & captured


def _own_rows(data_root: Path | str | None, cache_dir: str | None, log: Callable[[str], None]) -> tuple[Any, OpTable]:
    import pandas as pd

    from gpurec.dataset import load_dataset
    from gpurec.model._sets import test_arch_names
    from gpurec.model.features import SetExtractor, operations_of_rows
    from gpurec.model.fitting.evaluate import arch_of

    ops = load_dataset(root=data_root, table="operations")
    ops = ops[~ops["set_key"].map(lambda s: arch_of(s) in test_arch_names())]  # never trained on
    h100 = ops[(ops["gpu"] == H100).to_numpy() & host_free_mask(ops)]
    h100 = h100.drop_duplicates(["op_signature", "mode"], keep="last").reset_index(drop=True)
    h200_all = ops[ops["gpu"] == H200].drop_duplicates(["op_signature", "mode"], keep="last")
    hf = host_free_mask(h200_all)
    h200_hf = h200_all[hf].reset_index(drop=True)
    h200 = gpu_dominated_h200(h100, h200_all[~hf])
    rows = pd.concat([h100.assign(source="h100_host_free", target_ms=h100["gpu_time_ms"].astype(float)),
                      h200_hf.assign(source="h200_host_free", target_ms=h200_hf["gpu_time_ms"].astype(float)),
                      h200.assign(source="h200_eager", target_ms=h200_gpu_time_ms(h200))], ignore_index=True)
    t0 = time.perf_counter()
    extractor = SetExtractor(cache_dir)
    matched = operations_of_rows(rows, extractor)
    extractor.save()
    rows = rows.iloc[matched.row_index].reset_index(drop=True)
    log(f"cross-GPU: {len(rows)} own rows matched to their operations in {time.perf_counter() - t0:.0f} s "
        f"(unmatched: {matched.unmatched or 'none'})")
    table = op_table_from_block(matched.block, tf32_convs=True)  # the rows ran with cuDNN TF32 allowed
    groups = [physical_group(k) for k in matched.block.kinds]
    frame = rows[["gpu", "op_kind", "mode", "source", "target_ms", "op_signature", "set_key"]].rename(
        columns={"op_kind": "kind"}).assign(group=groups, split="train",
                                            op_key=(rows["op_signature"].astype(str) + "|" + rows["mode"].astype(str)).to_numpy())
    return frame, table


def build_table(data_root: Path | str | None = None, cache_dir: str | None = None,
                log: Callable[[str], None] = print) -> CrossTable:
    """Every row of every GPU with data (module docstring)."""
    import pandas as pd

    nf, no = _neusight_rows(data_root)
    of, oo = _own_rows(data_root, cache_dir, log)
    frame = pd.concat([nf, of], ignore_index=True)
    ops = OpTable(np.concatenate([no.raw, oo.raw]), np.concatenate([no.design, oo.design]))
    spec_of = {g: spec_row(g) for g in frame["gpu"].unique()}
    specs = np.stack([spec_of[g] for g in frame["gpu"]])
    waves, tiles = gpu_terms(ops, frame["gpu"].to_numpy(), spec_of)
    return CrossTable(frame, ops, specs, waves, tiles)


def training_rows(table: CrossTable, exclude_gpu: str | None = None, seed: int = 0) -> np.ndarray:
    """Rows to fit on: NeuSight rows capped per (GPU, operation, split), all of ours; minus one GPU."""
    f = table.frame
    rng = np.random.default_rng(seed)
    keep = []
    for (gpu, source, _op, _split), idx in f.groupby(["gpu", "source", "neusight_op", "split"], dropna=False).indices.items():
        if gpu == exclude_gpu:
            continue
        if source == "neusight" and len(idx) > NEUSIGHT_CAP_PER_OP:
            idx = rng.choice(idx, NEUSIGHT_CAP_PER_OP, replace=False)
        keep.append(np.asarray(idx))
    return np.sort(np.concatenate(keep))


@dataclass
class NetworkPairs:
    """Whole networks of the training architectures measured on both the H100 and the H200, host-free
    on both or GPU-bound eager on both (_gpu_bound_pairs): their operations (``ops``, ``net`` = the
    network each belongs to) and the measured H200/H100 time ratio of each network."""

    ops: OpTable
    net: np.ndarray  # (n_ops,) network index
    waves: np.ndarray  # (n_ops,) wave factor (the H100 and H200 have the same SM count)
    measured_ratio: np.ndarray  # (n_nets,)
    keys: list[str]
    tiles: np.ndarray | None = None  # (n_ops, 2T) gemm_tile_work


def network_pairs(data_root: Path | str | None = None, cache_dir: str | None = None) -> NetworkPairs:
    """The training architectures' H200/H100 network pairs (held-out architectures left out)."""
    from gpurec.model._sets import test_arch_names
    from gpurec.model.features import SetExtractor
    from gpurec.model.fitting.evaluate import arch_of

    nets = _gpu_bound_pairs(data_root)
    nets = nets[[arch_of(k) not in set(test_arch_names()) for k in nets["set_key"]]].reset_index(drop=True)
    extractor = SetExtractor(cache_dir)
    tables, index, ratios, keys = [], [], [], []
    for r in nets.itertuples(index=False):
        block = extractor.get(r.set_key, r.mode)
        if block is None or len(block) == 0:
            continue
        tables.append(op_table_from_block(block))
        index.append(np.full(len(block), len(ratios)))
        ratios.append(r.h200_basis_time_ms / r.h100_basis_time_ms)
        keys.append(f"{r.set_key}|{r.mode}")
    extractor.save()
    if not tables:
        return NetworkPairs(OpTable(np.zeros((0, len(OP_COLUMNS))), np.zeros((0, 0))), np.zeros(0, dtype=np.int64),
                            np.zeros(0), np.zeros(0), [], np.zeros((0, 2 * len(GEMM_TILES))))
    ops = OpTable(np.concatenate([t.raw for t in tables]), np.concatenate([t.design for t in tables]))
    sms = float(spec_row(H100)[GPU_COLUMNS.index("sm_count")])
    return NetworkPairs(ops, np.concatenate(index), wave_factor(ops.raw[:, 2], ops.raw[:, 3], sms),
                        np.array(ratios), keys, gemm_tile_work(ops.raw))


def fit(table: CrossTable, rows: np.ndarray, max_iter: int = 100, info: dict[str, Any] | None = None,
        networks: NetworkPairs | None = None, tiles: bool = False, spec_terms: bool = False,
        residual: bool = True) -> CrossGPUModel:
    """Fit the parameters on ``rows`` of ``table`` (squared log error, GPUs and kind groups weighted
    equally), plus the log H200/H100 ratios of the operation pairs among the rows and of
    ``networks`` (whole networks measured on both).  ``tiles``: the tile-and-wave structure of
    GEMM-like operations (gemm_tile_work; needs ``table.tiles``), else the single-tile wave factor.
    ``spec_terms``: efficiencies that depend on the GPU's specifications (SPEC_TERMS).  ``residual``:
    also a boosted-tree residual over the fitted roofline, on the same rows (fit_residual)."""
    import torch

    torch.set_num_threads(1)  # small problem; more threads only contend on a shared machine
    sub = table.take(rows)
    f = sub.frame
    per_group = f.groupby(["gpu", "group"])["target_ms"].transform("size").to_numpy(dtype=np.float64)
    groups_of_gpu = f.groupby("gpu")["group"].transform("nunique").to_numpy(dtype=np.float64)
    w = 1.0 / (per_group * groups_of_gpu)
    w = w / w.sum()
    dt = torch.float64
    y = torch.tensor(np.log(f["target_ms"].to_numpy(dtype=np.float64)), dtype=dt)
    wt = torch.tensor(w, dtype=dt)
    n_design = sub.ops.design.shape[1]
    params = {name: torch.zeros(n_design, dtype=dt, requires_grad=True) for name in ("ff", "tc", "m", "s", "p", "k")}
    scalars = {name: torch.tensor(v, dtype=dt, requires_grad=True)
               for name, v in (("l2", -2.0), ("wave", -1.0), ("c0", -6.0), ("beta", 4.0), ("rho", 1.0))}
    sp = torch.nn.functional.softplus
    use_tiles = tiles and table.tiles is not None
    t_count = len(GEMM_TILES)
    tile_logit = torch.full((t_count,), 2.0, dtype=dt, requires_grad=True)
    floor = torch.tensor(spec_weight_floor(), dtype=dt)[:, None, :]
    spec_raw = torch.full((len(SPEC_EFFICIENCIES), len(KIND_GROUPS), len(SPEC_TERMS)), -4.0, dtype=dt,
                          requires_grad=True)

    # only GEMM-like groups' efficiencies take the GPU's specifications: elementwise, normalisation
    # and activation rows transfer better without them (leave-one-GPU-out on the public GPUs)
    spec_mask = torch.tensor([g in GEMM_GROUPS for g in KIND_GROUPS], dtype=dt)[None, :, None]

    def spec_w() -> torch.Tensor:
        # never below the floor (0 where unused, itself above it): monotone in every specification
        return (floor + sp(spec_raw)) * spec_mask

    def inputs(ops: OpTable, specs: np.ndarray, waves: np.ndarray,
               tile_work: np.ndarray | None = None) -> dict[str, torch.Tensor]:
        col = {c: torch.tensor(specs[:, GPU_COLUMNS.index(c)], dtype=dt) for c in (
            "fp32_tflops", "memory_bandwidth_gbs", "l2_cache_mb", "sm_count", "max_sm_clock_mhz", "tdp_w")}
        by = torch.tensor(ops.raw[:, 1], dtype=dt)
        return {"x": torch.tensor(ops.design, dtype=dt), "fl": torch.tensor(ops.raw[:, 0], dtype=dt), "by": by,
                "tc": torch.tensor(tensor_peak(ops.raw[:, 4], specs), dtype=dt),
                "waves": torch.tensor(np.log(waves), dtype=dt),
                "l2_fit": torch.clamp(torch.log2(col["l2_cache_mb"] * 2**20 / by), 0.0, 8.0), **col,
                "gemm": torch.tensor(ops.raw[:, 3] == 1, dtype=torch.bool),
                "spec_logs": torch.tensor(spec_logs(specs), dtype=dt),
                "onehot": torch.tensor(group_onehot(ops.design), dtype=dt),
                **({"tiles": torch.tensor(tile_work, dtype=dt)} if use_tiles else {})}

    def predict_log(d: dict[str, torch.Tensor]) -> torch.Tensor:
        x, fl, by = d["x"], d["fl"], d["by"]
        if spec_terms:
            w = spec_w()
            z = {e: torch.einsum("ng,gt,nt->n", d["onehot"], w[i], d["spec_logs"]) for i, e in enumerate(SPEC_EFFICIENCIES)}
        else:
            z = {e: torch.zeros((), dtype=dt) for e in SPEC_EFFICIENCIES}
        u_ff, u_tc = torch.sigmoid(x @ params["ff"] + z["ff"]), torch.sigmoid(x @ params["tc"])
        u_m = torch.sigmoid(x @ params["m"] + sp(scalars["l2"]) * d["l2_fit"] + z["m"])
        gamma = torch.sigmoid(x @ params["p"])
        peak = torch.maximum(d["fp32_tflops"] * u_ff, d["tc"] * u_tc)
        tdp = d["tdp_w"]
        rate_c = peak * (tdp / (tdp + sp(scalars["rho"]) * peak)) ** gamma * 1e9
        rate_m = d["memory_bandwidth_gbs"] * u_m * 1e6
        rate_s = d["sm_count"] * d["max_sm_clock_mhz"] * 1e3 * sp(scalars["beta"]) * torch.sigmoid(x @ params["s"] + z["s"])
        k = K_MIN + sp(x @ params["k"])
        # log of (a^k + b^k + c^k)^(1/k) via logsumexp, stable over five orders of magnitude
        la = torch.log(torch.clamp(fl, min=1e-30) / rate_c)
        la = torch.where(fl > 0, la, torch.full_like(la, -1e3))
        lb = torch.log(by / rate_m)
        ls = torch.log(by / rate_s)
        if use_tiles:
            # per candidate tile: padded FLOPs at the tile's efficiency, tile panel loads through the
            # SMs; the fastest tile wins (gpurec.model.crossgpu.CrossGPUModel.predict_ms_rows)
            tw = d["tiles"]
            log_eff = torch.where(d["gemm"][:, None], torch.nn.functional.logsigmoid(tile_logit)[None, :],
                                  torch.zeros((), dtype=dt))
            la_t = la[:, None] + torch.log(tw[:, :t_count]) - log_eff
            ls_t = torch.log((by[:, None] + fl[:, None] * tw[:, t_count:]) / rate_s[:, None])
            kk = k[:, None]
            roofs = torch.logsumexp(torch.stack([kk * la_t, (kk * lb[:, None]).expand_as(la_t), kk * ls_t]), dim=0) / kk
            tiled = roofs.min(dim=1).values
        roof = torch.logsumexp(torch.stack([k * la, k * lb, k * ls]), dim=0) / k + sp(scalars["wave"]) * d["waves"]
        if use_tiles:
            roof = torch.where(d["gemm"], tiled, roof)  # matmul-like GEMMs: tile-and-wave instead
        return torch.logaddexp(roof, torch.log(sp(scalars["c0"])))

    rows_in = inputs(sub.ops, sub.specs, sub.waves, sub.tiles)
    # Pairs: an operation measured on the H200 (GPU-dominated eager) and on the H100 (host-free).
    # Their measured ratio is the only direct evidence of what bandwidth alone buys, and the
    # predictor uses this model as a ratio to the H100, so the pairs' log ratio is fitted too.
    pa, pb = _pairs(f)
    pa_t, pb_t = torch.tensor(pa, dtype=torch.long), torch.tensor(pb, dtype=torch.long)
    use_nets = networks is not None and len(networks.measured_ratio) > 0
    if use_nets:
        net_in = {g: inputs(networks.ops, np.broadcast_to(spec_row(g), (len(networks.ops), len(GPU_COLUMNS))),
                            networks.waves, networks.tiles) for g in (H100, H200)}
        net_idx = torch.tensor(networks.net, dtype=torch.long)
        n_nets = len(networks.measured_ratio)
        net_y = torch.tensor(np.log(networks.measured_ratio), dtype=dt)

    def network_log_ratio() -> torch.Tensor:
        sums = {}
        for g in (H100, H200):
            t = torch.exp(predict_log(net_in[g]))
            sums[g] = torch.zeros(n_nets, dtype=dt).index_add(0, net_idx, t)
        return torch.log(sums[H200]) - torch.log(sums[H100])

    everything = [*params.values(), *scalars.values(), *([tile_logit] if use_tiles else []),
                  *([spec_raw] if spec_terms else [])]
    opt = torch.optim.LBFGS(everything, lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        pred = predict_log(rows_in)
        loss = (wt * (pred - y) ** 2).sum() + 1e-4 * sum((p ** 2).sum() for p in params.values())
        if len(pa):
            loss = loss + PAIR_WEIGHT * (((pred[pa_t] - pred[pb_t]) - (y[pa_t] - y[pb_t])) ** 2).mean()
        if use_nets:
            loss = loss + NETWORK_PAIR_WEIGHT * ((network_log_ratio() - net_y) ** 2).mean()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        loss = float((wt * (predict_log(rows_in) - y) ** 2).sum())
        net_info = {}
        if use_nets:
            err = network_log_ratio() - net_y
            net_info = {"network_pairs": n_nets, "network_pair_rms_log_ratio_error": float(torch.sqrt((err ** 2).mean()))}
        model = CrossGPUModel(
            theta_ff=params["ff"].detach().numpy().copy(), theta_tc=params["tc"].detach().numpy().copy(),
            theta_m=params["m"].detach().numpy().copy(), theta_s=params["s"].detach().numpy().copy(),
            theta_p=params["p"].detach().numpy().copy(), theta_k=params["k"].detach().numpy().copy(),
            sm_bytes_per_clock=float(sp(scalars["beta"])),
            watts_per_tflops=float(sp(scalars["rho"])), l2_weight=float(sp(scalars["l2"])),
            wave_exponent=float(sp(scalars["wave"])), c0_ms=float(sp(scalars["c0"])),
            tile_efficiency=torch.sigmoid(tile_logit).detach().numpy().copy() if use_tiles else None,
            spec_weights=spec_w().detach().numpy().copy() if spec_terms else None,
            info={**(info or {}), "rows": int(len(rows)), "weighted_log_mse": loss, **net_info,
                  "gemm_tiles": [list(t) for t in GEMM_TILES] if use_tiles else None,
                  "spec_terms": list(SPEC_TERMS) if spec_terms else None,
                  "rows_by_gpu": {str(g): int(n) for g, n in f["gpu"].value_counts().sort_index().items()}})
    if residual:
        model.residual = fit_residual(model, sub, w)
        model.info["residual"] = {"params": RESIDUAL_PARAMS, "rounds": RESIDUAL_ROUNDS,
                                  "target": "log(measured / roofline) on the same rows and weights"}
    return model


def fit_residual(model: CrossGPUModel, sub: CrossTable, weights: np.ndarray) -> Any:
    """The residual booster: the log of each row's measured time over ``model``'s roofline (its own
    residual left out), weighted as the roofline's fit (GPUs and kind groups equally)."""
    import xgboost as xgb

    from gpurec.model.crossgpu import RESIDUAL_CLIP, RESIDUAL_FEATURES, residual_features

    base = model.predict_ms_rows(sub.ops, sub.specs, sub.waves, sub.tiles)  # no residual yet
    y = np.clip(np.log(sub.frame["target_ms"].to_numpy(dtype=np.float64) / base), -RESIDUAL_CLIP, RESIDUAL_CLIP)
    w = np.asarray(weights, dtype=np.float64)
    d = xgb.DMatrix(residual_features(sub.ops, sub.specs), y, weight=w / w.mean(), feature_names=list(RESIDUAL_FEATURES))
    booster = xgb.train({**RESIDUAL_PARAMS, "nthread": 2}, d, RESIDUAL_ROUNDS)
    booster.set_param({"nthread": 1})
    return booster


def _pairs(f: Any) -> tuple[np.ndarray, np.ndarray]:
    """Positions (H200 row, H100 row) of the same (operation, mode) in ``f`` (both sources present)."""
    if "op_signature" not in f:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    pos = np.arange(len(f))
    h100 = {(s, m): i for s, m, i, src in zip(f["op_signature"], f["mode"], pos, f["source"], strict=True)
            if src == "h100_host_free"}
    pairs = [(i, h100[(s, m)]) for s, m, i, src in zip(f["op_signature"], f["mode"], pos, f["source"], strict=True)
             if src in ("h200_eager", "h200_host_free") and (s, m) in h100]
    if not pairs:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    a, b = zip(*pairs, strict=True)
    return np.array(a, dtype=np.int64), np.array(b, dtype=np.int64)


def predict_rows(model: CrossGPUModel, table: CrossTable, idx: np.ndarray | None = None) -> np.ndarray:
    """Predicted GPU time (ms) of rows of the table, each on its own GPU, as ``predict`` answers it
    (with a residual, the lower envelope over the catalogue: CrossGPUModel.predict_ms)."""
    sub = table if idx is None else table.take(idx)
    if model.residual is None:
        return model.predict_ms_rows(sub.ops, sub.specs, sub.waves, sub.tiles)
    out = np.empty(len(sub.frame))
    gpus = sub.frame["gpu"].to_numpy()
    for g in np.unique(gpus):
        i = np.flatnonzero(gpus == g)
        out[i] = model.predict_ms(sub.ops.take(i), sub.specs[i[0]])
    return out


def leave_one_gpu_out(table: CrossTable, gpus: list[str] | None = None, log: Callable[[str], None] = print,
                      networks: NetworkPairs | None = None, tiles: bool = False,
                      residual: bool = True) -> tuple[Any, dict[str, CrossGPUModel]]:
    """Per held-out GPU, a model fitted without it (and without the H200/H100 network pairs when
    it is one of those two); returns a frame of every row of that GPU with its prediction
    (columns of ``table.frame`` + ``pred_ms``) and the fold models."""
    import pandas as pd

    gpus = gpus or sorted(table.frame["gpu"].unique())
    parts, models = [], {}
    for g in gpus:
        t0 = time.perf_counter()
        rows = training_rows(table, exclude_gpu=g)
        m = fit(table, rows, info={"held_out": g},
                networks=None if g in (H100, H200) else networks, tiles=tiles, spec_terms=tiles, residual=residual)
        idx = np.flatnonzero(table.frame["gpu"].to_numpy() == g)
        seen = set(table.frame["group"].to_numpy()[rows])
        part = table.frame.iloc[idx].reset_index(drop=True).assign(pred_ms=predict_rows(m, table, idx))
        # a kind group no other GPU measured has nothing to transfer from: scored apart
        part = part.assign(group_seen=part["group"].isin(seen).to_numpy())
        parts.append(part)
        models[g] = m
        ape = np.abs(part["pred_ms"] / part["target_ms"] - 1)
        log(f"cross-GPU leave out {g}: MAPE {100 * ape.mean():.1f}% over {len(part)} rows "
            f"({time.perf_counter() - t0:.0f} s)")
    return pd.concat(parts, ignore_index=True), models


CROSSGPU_REPORT_FILE = "crossgpu_report.json"


def fit_and_save(data_root: Path | str | None = None, out_dir: Path | str = "models", cache_dir: str | None = None,
                 validate: bool = True, log: Callable[[str], None] = print, tiles: bool = False,
                 residual: bool = True) -> CrossGPUModel:
    """Fit on every GPU with data and write ``out_dir/crossgpu.json``; with ``validate``, also the
    leave-one-GPU-out evaluation ``out_dir/crossgpu_report.json`` (docs/accuracy.md reads it).

    ``tiles``: the tile structure of matmul-like GEMMs and spec-dependent efficiencies (fit's
    ``tiles`` and ``spec_terms``).  Off by default: on the public rows alone it lowers the
    leave-one-GPU-out error, but fitted with this project's H100/H200 rows its V100 fold diverged and
    the H200/H100 time ratio error rose (1.5 -> 2.1 pp), so it is not yet the saved model's form."""
    from gpurec.dataset.store import atomic_write_text

    t0 = time.perf_counter()
    table = build_table(data_root, cache_dir, log)
    networks = network_pairs(data_root, cache_dir)
    counts = table.frame.groupby(["source", "gpu"]).size()
    model = fit(table, training_rows(table), networks=networks, tiles=tiles, spec_terms=tiles, residual=residual, info={
        "sources": {f"{s}|{g}": int(n) for (s, g), n in counts.items()},
        "gpu_dominated_h200": {"h100_host_free_over_eager_min": GPU_DOMINATED_RATIO,
                               "h200_eager_over_h100_host_ms_min": GPU_DOMINATED_HOST_FACTOR},
        "neusight_cap_per_op": NEUSIGHT_CAP_PER_OP,
        "h200_target": "H200 host-free GPU time where measured, else (GPU-dominated eager rows) the H200 eager "
                       "time x the same operation's H100 host-free / eager time",
        "pair_weights": {"operations": PAIR_WEIGHT, "networks": NETWORK_PAIR_WEIGHT}})
    out = Path(out_dir)
    atomic_write_text(out / CROSSGPU_FILE, json.dumps(model.to_dict(), indent=1, sort_keys=True) + "\n")
    log(f"cross-GPU model: weighted log MSE {model.info['weighted_log_mse']:.4f} on {model.info['rows']} rows, "
        f"saved to {out / CROSSGPU_FILE} ({time.perf_counter() - t0:.0f} s)")
    predictor = load_energy_predictor(out, log)
    fitted = fit_memory_energy(model, predictor, data_root, log)
    model.memory_energy_pj_per_byte, model.memory_energy_by_type_pj_per_byte = fitted or (None, None)
    model.info["memory_energy"] = ("DRAM pJ/byte fitted on the training architectures' H200/H100 network "
                                   "energy ratios, host-free where both are, one value and then one per memory "
                                   "type (fit_memory_energy)")
    model.info["memory_energy_pj_per_byte"] = model.memory_energy_pj_per_byte
    model.info["memory_energy_by_type_pj_per_byte"] = model.memory_energy_by_type_pj_per_byte
    atomic_write_text(out / CROSSGPU_FILE, json.dumps(model.to_dict(), indent=1, sort_keys=True) + "\n")
    if validate:
        report = evaluate(table, data_root, cache_dir, log, model=model, networks=networks, predictor=predictor,
                          tiles=tiles, residual=residual)
        model.info[PUBLIC_BAND_KEY] = public_model_band(report["public_models"])
        atomic_write_text(out / CROSSGPU_FILE, json.dumps(model.to_dict(), indent=1, sort_keys=True) + "\n")
        report["model_info"] = model.info
        report["seconds"] = time.perf_counter() - t0
        atomic_write_text(out / CROSSGPU_REPORT_FILE, json.dumps(_json_ready(report), indent=1, sort_keys=True)
                          + "\n")
        log(f"cross-GPU validation saved to {out / CROSSGPU_REPORT_FILE}")
    return model


def _json_ready(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _json_ready(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_ready(x) for x in v]
    if isinstance(v, (np.floating, float)):
        return None if not np.isfinite(v) else round(float(v), 6)
    if isinstance(v, np.integer):
        return int(v)
    return v


# -- whole public models: NeuSight's one-layer traces, full depth -------------------------------

_LAYER = re.compile(r"(?:^|[._])(?:layer|layers|h|block|blocks)[._]0(?:[._]|$)")
_ELEMENTWISE_FN = ("add", "mul", "sub", "truediv", "div", "pow", "tanh", "neg", "rsub", "where", "masked_fill")


def _shapes(text: str) -> list[list[int]]:
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    if isinstance(v, tuple):
        v = [list(v)]
    return [list(s) for s in v if isinstance(s, (list, tuple)) and all(isinstance(x, int) for x in s)]


def node_operation(op: str, target: str, name: str, inputs: list[list[int]], output: list[int],
                   training: bool) -> tuple[str, float, float, float] | None:
    """(kind group, FLOPs, bytes, output elements) of one traced node, or None when it launches
    no GPU work we model (shape queries, views, dropout in inference, placeholders)."""
    out_el = float(np.prod(output)) if output else 0.0
    low = f"{target} {name}".lower()
    if op in ("placeholder", "get_attr", "output") or out_el <= 1:
        return None
    big = [s for s in inputs if len(s) >= 2]
    in_el = float(sum(np.prod(s) for s in big))
    if "addmm" in low and len(inputs) >= 3:
        (m, k), n = inputs[1][-2:], inputs[2][-1]
        return "matmul", 2.0 * m * k * n, 4.0 * (m * k + k * n + m * n + n), out_el
    if any(w in low for w in ("matmul", "bmm", "baddbmm")) and len(big) >= 2:
        a, b = big[0], big[1]
        batch = float(np.prod(a[:-2])) if len(a) > 2 else 1.0
        m, k, n = a[-2], a[-1], b[-1]
        return "matmul", 2.0 * batch * m * k * n, 4.0 * (float(np.prod(a)) + float(np.prod(b)) + out_el), out_el
    if "softmax" in low:
        return "activation", 5.0 * out_el, 8.0 * out_el, out_el
    if any(w in low for w in ("layernorm", "layer_norm", "ln_", "_ln", "norm")):
        return "norm", 8.0 * out_el, 8.0 * out_el, out_el
    if any(w in low for w in ("wte", "wpe", "embed")):
        return "data_movement", 0.0, 8.0 * out_el, out_el
    if "drop" in low:
        return ("elementwise", out_el, 8.0 * out_el, out_el) if training else None
    if any(w in low for w in ("gelu", "relu", "act")):
        return "activation", 8.0 * out_el, 8.0 * out_el, out_el
    if op == "call_module" and len(big) == 1 and len(output) >= 2:  # a Linear (q/k/v, dense, fc, proj)
        din, dout = big[0][-1], output[-1]
        rows = out_el / dout
        return "matmul", 2.0 * rows * din * dout, 4.0 * (in_el + din * dout + out_el), out_el
    if "contiguous" in low:
        return "data_movement", 0.0, 8.0 * out_el, out_el
    fn = target.rsplit(" ", 1)[-1].strip("<>'") if op == "call_function" else target
    if op in ("call_function", "call_method") and any(fn.endswith(w) for w in _ELEMENTWISE_FN) and big:
        return "elementwise", out_el, 4.0 * (in_el + out_el), out_el
    return None


def public_model_table(nodes: Any, models: Any) -> tuple[Any, OpTable, np.ndarray]:
    """Operations of each traced public model (one row per modelled node) with its multiplicity:
    a node of transformer layer 0 counts ``num_layer`` times, the rest (embeddings, head) once."""
    import pandas as pd

    rows, feats = [], []
    for key, part in nodes.groupby(["gpu", "model", "mode", "seq_len", "batch"], sort=True):
        meta = models[(models["gpu"] == key[0]) & (models["model"] == key[1]) & (models["mode"] == key[2])
                      & (models["seq_len"] == key[3]) & (models["batch"] == key[4]) & (models["variant"] == "")]
        if meta.empty or not np.isfinite(meta["num_layer"].iloc[0]) or meta["num_layer"].iloc[0] <= 0:
            continue
        layers = float(meta["num_layer"].iloc[0])
        training = key[2] == "training"
        part = part.sort_values("position")
        # layer 0 spans from its first to its last named node (unnamed nodes between, e.g. addmm, belong to it)
        marked = np.flatnonzero(part["node"].map(lambda n: bool(_LAYER.search(n))).to_numpy())
        first, last = (marked[0], marked[-1]) if len(marked) else (1, 0)
        for j, r in enumerate(part.itertuples(index=False)):
            got = node_operation(r.op, r.target, r.node, _shapes(r.input_shapes),
                                 (_shapes(r.output_shape) or [[]])[0], training)
            if got is None:
                continue
            group, flops, nbytes, out_el = got
            rows.append({"gpu": key[0], "model": key[1], "mode": key[2], "seq_len": key[3], "batch": key[4],
                         "node": r.node, "group": group, "mult": layers if first <= j <= last else 1.0,
                         "e2e_latency_ms": float(meta["e2e_latency_ms"].iloc[0])})
            feats.append((flops, nbytes, out_el, group, training))
    frame = pd.DataFrame(rows)
    f = np.array([x[0] for x in feats]) * np.where([x[4] for x in feats], 3.0, 1.0)
    b = np.array([x[1] for x in feats]) * np.where([x[4] for x in feats], 3.0, 1.0)
    ops = op_table(f, b, np.array([x[2] for x in feats]), [x[3] for x in feats],
                   np.array([x[4] for x in feats], dtype=float), np.zeros(len(feats)))  # TF32 off
    return frame, ops, frame["mult"].to_numpy(dtype=np.float64)


def public_model_errors(models_by_gpu: dict[str, CrossGPUModel], data_root: Path | str | None = None) -> Any:
    """Each traced public model on its GPU, predicted by the model fitted without that GPU:
    sum over nodes of predicted GPU time x multiplicity, against the measured full-depth e2e latency."""
    from gpurec.dataset import load_dataset

    nodes = load_dataset(source="neusight", root=data_root, table="nodes")
    models = load_dataset(source="neusight", root=data_root, table="models")
    frame, ops, mult = public_model_table(nodes, models)
    frame = frame.assign(pred_ms=np.nan)
    for gpu, idx in frame.groupby("gpu").indices.items():
        model = models_by_gpu.get(str(gpu))
        if model is None:
            continue
        frame.loc[idx, "pred_ms"] = model.predict_ms(ops.take(idx), str(gpu)) * mult[idx]
    out = frame.groupby(["gpu", "model", "mode", "seq_len", "batch"], as_index=False).agg(
        pred_ms=("pred_ms", "sum"), measured_ms=("e2e_latency_ms", "first"), nodes=("node", "size"))
    return out.assign(ape=np.abs(out["pred_ms"] / out["measured_ms"] - 1))


def public_model_band(rows: Sequence[dict[str, Any]], quantiles: tuple[float, float] = (0.05, 0.95)
                      ) -> dict[str, Any] | None:
    """The band of the public whole models' measured / predicted time, each predicted by the model
    fitted without its GPU (``evaluate``'s ``public_models``): the error of a GPU that the fit has
    no rows of, on GPUs far from the H100 (the H200/H100 networks validate one compute die only).
    None with fewer than 5 models."""
    ratios = np.array([r["measured_ms"] / r["pred_ms"] for r in rows
                       if np.isfinite(r.get("pred_ms", np.nan)) and r.get("pred_ms", 0) > 0], dtype=np.float64)
    if len(ratios) < 5:
        return None
    lo, hi = (float(np.quantile(ratios, q)) for q in quantiles)
    return {"time_ratio": [min(lo, 1.0), max(hi, 1.0)], "quantiles": list(quantiles), "models": int(len(ratios)),
            "gpus": sorted({str(r["gpu"]) for r in rows}),
            "source": "public whole transformer models, each GPU left out of the cross-GPU fit"}


def store_public_band(model_dir: Path | str) -> dict[str, Any] | None:
    """Write the public whole models' band (``public_model_band``) of ``model_dir``'s
    crossgpu_report.json into its crossgpu.json (the predictor widens extrapolated GPUs' bands to
    it); returns it.  ``fit_and_save`` does this itself; this serves models fitted before."""
    from gpurec.dataset.store import atomic_write_text

    out = Path(model_dir)
    for name in (CROSSGPU_FILE, CROSSGPU_REPORT_FILE):
        if not (out / name).exists():
            raise FileNotFoundError(f"no {name} in {out}: run `gpurec train-crossgpu --out {out}` (with validation)")
    report = json.loads((out / CROSSGPU_REPORT_FILE).read_text(encoding="utf-8"))
    saved = json.loads((out / CROSSGPU_FILE).read_text(encoding="utf-8"))
    band = public_model_band(report.get("public_models", []))
    saved.setdefault("info", {})[PUBLIC_BAND_KEY] = band
    atomic_write_text(out / CROSSGPU_FILE, json.dumps(saved, indent=1, sort_keys=True) + "\n")
    return band


# -- H200 against H100 on whole networks ---------------------------------------------------------

def _gpu_bound_pairs(data_root: Path | str | None, precision: str = "fp32") -> Any:
    """Networks (fp32 unless ``precision``) measured on the H100 and the H200 that tell the GPUs apart, with the time and
    energy to compare (``h100_basis_time_ms``/``h200_basis_time_ms``, ``h100_basis_energy_mj``/
    ``h200_basis_energy_mj``) and their
    ``basis``: ``host_free`` where both were timed as CUDA-graph replays (GPU time and GPU energy
    on both; the host is out of either number), else ``eager`` where the eager steps are GPU-bound
    on both: on the H100, host-free / eager >= GPU_DOMINATED_RATIO, and the H200's eager time is >=
    GPU_DOMINATED_HOST_FACTOR x the H100's single-step host time (as for operation rows)."""
    import pandas as pd

    from gpurec.dataset import load_dataset

    nets = rows_at_precision(load_dataset(root=data_root, table="networks"), precision)
    cols = ["gpu_time_ms", "time_ms", "host_ms", "energy_mj", "gpu_energy_mj", "captured"]
    # the card of each measurement: cards of one model differ in power (gpurec.reports.accuracy.energy_error_by_card)
    nets = nets.assign(**{c: nets[c] if c in nets else np.nan for c in cols},
                       gpu_uuid=nets["gpu_uuid"] if "gpu_uuid" in nets else "")
    keep = ["set_key", "mode", *cols, "gpu_uuid"]
    a = nets[nets["gpu"] == H100][keep].rename(columns={c: f"h100_{c}" for c in keep[2:]})
    b = nets[nets["gpu"] == H200][keep].rename(columns={c: f"h200_{c}" for c in keep[2:]})
    a = a.drop_duplicates(["set_key", "mode"], keep="last")
    b = b.drop_duplicates(["set_key", "mode"], keep="last")
    m = a.merge(b, on=["set_key", "mode"])
    for g in ("h100", "h200"):
        for c in cols[:-1]:
            m[f"{g}_{c}"] = pd.to_numeric(m[f"{g}_{c}"], errors="coerce")
    host_free = np.ones(len(m), dtype=bool)
    for g in ("h100", "h200"):
        host_free &= host_free_mask(m[[f"{g}_gpu_time_ms", f"{g}_captured"]].set_axis(
            ["gpu_time_ms", "captured"], axis=1)) & (m[f"{g}_gpu_energy_mj"].fillna(0).to_numpy() > 0)
    bound = ((m["h100_gpu_time_ms"] / m["h100_time_ms"] >= GPU_DOMINATED_RATIO)
             & (m["h200_time_ms"] >= GPU_DOMINATED_HOST_FACTOR * m["h100_host_ms"])).to_numpy()
    m = m.assign(basis=np.where(host_free, "host_free", "eager"),
                 h100_basis_time_ms=np.where(host_free, m["h100_gpu_time_ms"], m["h100_time_ms"]),
                 h200_basis_time_ms=np.where(host_free, m["h200_gpu_time_ms"], m["h200_time_ms"]),
                 h100_basis_energy_mj=np.where(host_free, m["h100_gpu_energy_mj"], m["h100_energy_mj"]),
                 h200_basis_energy_mj=np.where(host_free, m["h200_gpu_energy_mj"], m["h200_energy_mj"]))
    return m[host_free | bound].reset_index(drop=True)


def h200_network_errors(model: CrossGPUModel, data_root: Path | str | None = None, cache_dir: str | None = None,
                        predictor: Any = None) -> Any:
    """The collected fp32 networks measured on the H100 and the H200 (_gpu_bound_pairs: host-free on
    both, else GPU-bound eager on both), with the H200/H100 time ratio measured (on that ``basis``)
    and predicted (the model's op-sum ratio), and the H200's time
    predicted as the H100's host-free network time times that ratio (``pred_h200_ms``, what the
    predictor does) and directly as the model's summed operation times (``direct_h200_ms``).
    ``held_out_arch`` marks networks of the held-out test architectures (never trained on).

    With ``predictor`` (a gpurec Predictor; its cross-GPU model is replaced by ``model`` for the
    call), also what a user gets: its H200/H100 GPU time ratio (``product_ratio``: the H100's
    per-operation times weighted by the model's per-operation ratios) and GPU energy ratio
    (``pred_energy_ratio``, its power model's power times those times), against the measured
    energy ratio on the pair's basis (``measured_energy_ratio``).  ``h200_basis_time_ms`` is the H200
    time on that basis (GPU time where host-free, else eager time, about the GPU time when GPU-bound)."""
    from gpurec.model._sets import parse_set, test_arch_names
    from gpurec.model.features import SetExtractor
    from gpurec.model.fitting.evaluate import arch_of

    m = _gpu_bound_pairs(data_root)
    extractor = SetExtractor(cache_dir)
    ratio, direct = np.full(len(m), np.nan), np.full(len(m), np.nan)
    for i, r in enumerate(m.itertuples(index=False)):
        block = extractor.get(r.set_key, r.mode)
        if block is None or len(block) == 0:
            continue
        ops = op_table_from_block(block)
        direct[i] = model.predict_ms(ops, H200).sum()
        ratio[i] = direct[i] / model.predict_ms(ops, H100).sum()
    extractor.save()
    held_out = set(test_arch_names())
    m = m.assign(pred_ratio=ratio, measured_ratio=m["h200_basis_time_ms"] / m["h100_basis_time_ms"],
                 direct_h200_ms=direct,
                 measured_energy_ratio=m["h200_basis_energy_mj"] / m["h100_basis_energy_mj"],
                 held_out_arch=[arch_of(k) in held_out for k in m["set_key"]])
    m = m.assign(pred_h200_ms=m["h100_gpu_time_ms"] * m["pred_ratio"])
    if predictor is not None:
        m = m.assign(**_product_ratios(predictor, model, m, parse_set))
        m = m.assign(energy_ratio_error_pp=100 * (m["pred_energy_ratio"] - m["measured_energy_ratio"]),
                     product_ratio_error_pp=100 * (m["product_ratio"] - m["measured_ratio"]))
    return m.assign(ape=np.abs(m["pred_h200_ms"] / m["h200_basis_time_ms"] - 1),
                    direct_ape=np.abs(m["direct_h200_ms"] / m["h200_basis_time_ms"] - 1),
                    ratio_error_pp=100 * (m["pred_ratio"] - m["measured_ratio"]))


def _product_ratios(predictor: Any, model: CrossGPUModel, nets: Any, parse_set: Callable[[str], Any],
                    precision: str | None = None) -> dict[str, np.ndarray]:
    """The predictor's H200/H100 GPU time and GPU energy ratios of each network (at ``precision``;
    None: fp32), with ``model`` as its cross-GPU model (restored afterwards).  A network the predictor
    cannot estimate keeps NaN, which the reports count apart."""
    saved = predictor.crossgpu
    predictor.crossgpu = model
    predictor.clear_cache()
    t_ratio, e_ratio = np.full(len(nets), np.nan), np.full(len(nets), np.nan)
    try:
        for mode in sorted(set(nets["mode"])):  # one predict_many per mode and GPU: the boosters run once
            idx = np.flatnonzero((nets["mode"] == mode).to_numpy())
            cands = [(s.arch, s.input_shape) for s in (parse_set(k) for k in nets["set_key"].iloc[idx])]
            a = predictor.predict_many(cands, mode=mode, gpu=H100, precision=precision)
            b = predictor.predict_many(cands, mode=mode, gpu=H200, precision=precision)
            for i, ea, eb in zip(idx, a, b, strict=True):
                if hasattr(ea, "gpu_time_ms") and hasattr(eb, "gpu_time_ms"):
                    t_ratio[i] = eb.gpu_time_ms / ea.gpu_time_ms
                    e_ratio[i] = eb.gpu_energy_mj / ea.gpu_energy_mj
    finally:
        predictor.crossgpu = saved
        predictor.clear_cache()
    return {"product_ratio": t_ratio, "pred_energy_ratio": e_ratio}


PAIRED_PRECISIONS = ("bf16-mixed", "bf16", "fp16-mixed")  # besides fp32: precisions whose networks both GPUs measured


def h200_network_errors_at(predictor: Any, model: CrossGPUModel, precision: str,
                           data_root: Path | str | None = None) -> Any:
    """The networks measured at ``precision`` on the H100 and the H200 (_gpu_bound_pairs), with the
    H200/H100 GPU time and energy ratios measured and predicted by what a user gets at that precision
    (``predictor`` with ``model`` as its cross-GPU model: its per-operation times and power at that
    precision; ``product_ratio``, ``pred_energy_ratio``).  The cross-GPU model's network pairs are
    fp32 alone (its operation rows are of every precision); ``held_out_arch`` marks the architectures
    no model trained on, the honest check."""
    from gpurec.model._sets import parse_set, test_arch_names
    from gpurec.model.fitting.evaluate import arch_of

    m = _gpu_bound_pairs(data_root, precision)
    held_out = set(test_arch_names())
    m = m.assign(precision=precision,
                 measured_ratio=m["h200_basis_time_ms"] / m["h100_basis_time_ms"],
                 measured_energy_ratio=m["h200_basis_energy_mj"] / m["h100_basis_energy_mj"],
                 held_out_arch=[arch_of(k) in held_out for k in m["set_key"]])
    if m.empty:
        return m
    m = m.assign(**_product_ratios(predictor, model, m, parse_set, precision))
    return m.assign(product_ratio_error_pp=100 * (m["product_ratio"] - m["measured_ratio"]),
                    energy_ratio_error_pp=100 * (m["pred_energy_ratio"] - m["measured_energy_ratio"]))


MEMORY_ENERGY_MAX_PJ_PER_BYTE = 200.0  # search bound: HBM is a few pJ per bit, GDDR about twice that


def fit_memory_energy(model: CrossGPUModel, predictor: Any, data_root: Path | str | None = None,
                      log: Callable[[str], None] = print) -> tuple[float, dict[str, float] | None] | None:
    """DRAM energy per byte (pJ) that best explains the measured H200/H100 energy ratio of the training
    architectures' network pairs (_gpu_bound_pairs; squared log error), the H200's power carried from
    the H100's (gpurec.model.crossgpu.transfer_power_w): one value for both GPUs, then one per memory
    type (the H100's HBM3 and the H200's HBM3e), started from it and held in the same bounds.  Held-out
    architectures are left out.  None when there is no predictor or no such network; the per-type
    table is None where both GPUs have one memory type."""
    from scipy.optimize import minimize, minimize_scalar

    from gpurec.catalog import resolve_gpu
    from gpurec.model._sets import parse_set, test_arch_names
    from gpurec.model.fitting.evaluate import arch_of

    if predictor is None:
        return None
    nets = _gpu_bound_pairs(data_root)
    nets = nets[[arch_of(k) not in set(test_arch_names()) for k in nets["set_key"]]].reset_index(drop=True)
    if nets.empty:
        return None
    measured = np.log((nets["h200_basis_energy_mj"] / nets["h100_basis_energy_mj"]).to_numpy(dtype=np.float64))
    types = (resolve_gpu(H100).memory_type, resolve_gpu(H200).memory_type)
    saved = (predictor.crossgpu, model.memory_energy_pj_per_byte, model.memory_energy_by_type_pj_per_byte)
    predictor.crossgpu = model
    predictor.clear_cache()
    try:
        # the H100 side does not depend on the energy per byte: predicted once
        h100 = np.array([predictor.predict_many([(parse_set(k).arch, parse_set(k).input_shape)], mode=m, gpu=H100)[0]
                         .gpu_energy_mj for k, m in zip(nets["set_key"], nets["mode"], strict=True)])

        def loss(shared_pj: float, by_type: dict[str, float] | None = None) -> float:
            model.memory_energy_pj_per_byte = float(shared_pj)
            model.memory_energy_by_type_pj_per_byte = by_type
            h200 = np.array([predictor.predict_many([(parse_set(k).arch, parse_set(k).input_shape)], mode=m,
                                                    gpu=H200)[0].gpu_energy_mj
                             for k, m in zip(nets["set_key"], nets["mode"], strict=True)])
            return float(np.mean((np.log(h200 / h100) - measured) ** 2))

        best = minimize_scalar(loss, bounds=(0.0, MEMORY_ENERGY_MAX_PJ_PER_BYTE), method="bounded",
                               options={"xatol": 0.25})
        shared, by_type = float(best.x), None
        log(f"cross-GPU: DRAM energy {shared:.1f} pJ/byte from {len(nets)} H200/H100 network pairs "
            f"(rms log energy ratio error {np.sqrt(best.fun):.4f})")
        if types[0] != types[1]:
            pair = minimize(lambda e: loss(shared, dict(zip(types, (float(e[0]), float(e[1])), strict=True))),
                            x0=[shared, shared], method="L-BFGS-B",
                            bounds=[(0.0, MEMORY_ENERGY_MAX_PJ_PER_BYTE)] * 2, options={"eps": 0.5, "maxiter": 30})
            if pair.fun < best.fun:
                by_type = dict(zip(types, (float(pair.x[0]), float(pair.x[1])), strict=True))
                log(f"cross-GPU: DRAM energy per memory type {', '.join(f'{k} {v:.1f}' for k, v in by_type.items())} "
                    f"pJ/byte (rms log energy ratio error {np.sqrt(pair.fun):.4f})")
    finally:
        predictor.crossgpu, model.memory_energy_pj_per_byte, model.memory_energy_by_type_pj_per_byte = saved
        predictor.clear_cache()
    return shared, by_type


def _kind_unseen(part: Any) -> dict[str, Any]:
    """One GPU's rows of kind groups no other GPU measured (None: none): count, MAPE, kinds."""
    if part is None:
        return {"rows_kind_unseen": 0, "kind_unseen_mape": None, "kinds_unseen": []}
    return {"rows_kind_unseen": int(len(part)), "kind_unseen_mape": float(part["ape"].mean()),
            "kinds_unseen": sorted(part["kind"].unique().tolist()) if "kind" in part else []}


def score_leave_one_gpu_out(logo: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """MAPE per (GPU, kind group) and per GPU of leave-one-GPU-out predictions (columns gpu, group,
    source, target_ms, pred_ms), over rows measuring at least SCORED_MIN_GPU_MS; the rows below it
    are counted per GPU (``rows_below_floor``), not dropped silently.  Rows of a kind group that no
    other GPU measured (``group_seen`` False: nothing to transfer from, e.g. the H100's recurrent
    layers) are scored apart (``rows_kind_unseen``, ``kind_unseen_mape``, ``kinds_unseen``)."""
    logo = logo.assign(ape=np.abs(logo["pred_ms"] / logo["target_ms"] - 1))
    below = logo[logo["target_ms"] < SCORED_MIN_GPU_MS].groupby("gpu").size()
    logo = logo[logo["target_ms"] >= SCORED_MIN_GPU_MS]
    seen = logo["group_seen"].to_numpy(dtype=bool) if "group_seen" in logo else np.ones(len(logo), dtype=bool)
    unseen = dict(tuple(logo[~seen].groupby("gpu")))
    logo = logo[seen]
    per_op = [{"gpu": gpu, "group": group, "rows": int(len(part)), "mape": float(part["ape"].mean()),
               "median_ape": float(part["ape"].median())} for (gpu, group), part in logo.groupby(["gpu", "group"])]
    per_gpu = [{"gpu": g, "rows": int(len(p)), "mape": float(p["ape"].mean()), "median_ape": float(p["ape"].median()),
                "sources": sorted(p["source"].unique().tolist()), "rows_below_floor": int(below.get(g, 0)),
                **_kind_unseen(unseen.get(g))}
               for g, p in logo.groupby("gpu")]
    return per_op, per_gpu


def score_in_sample(table: CrossTable, model: CrossGPUModel) -> list[dict[str, Any]]:
    """Per GPU, the error of ``model`` (fitted with every GPU) on that GPU's rows, scored as the
    leave-one-GPU-out rows are, and again with each (GPU, kind group)'s median log error removed.
    Beside the leave-one-GPU-out error it says how much of that error is transfer (the gap) and how
    much the form cannot fit on any GPU (the in-sample error), and how much a per-GPU, per-kind
    offset (what better specification terms could move at best) would remove."""
    f = table.frame.assign(pred_ms=predict_rows(model, table))
    f = f[f["target_ms"] >= SCORED_MIN_GPU_MS]
    log_err = np.log(f["pred_ms"] / f["target_ms"])
    offset = log_err.groupby([f["gpu"], f["group"]]).transform("median")
    f = f.assign(ape=np.abs(np.exp(log_err) - 1), ape_offset_removed=np.abs(np.exp(log_err - offset) - 1))
    return [{"gpu": g, "rows": int(len(p)), "mape": float(p["ape"].mean()),
             "mape_offset_removed": float(p["ape_offset_removed"].mean())} for g, p in f.groupby("gpu")]


def score_anchored(rows: Any, held_out: str) -> list[dict[str, Any]]:
    """Leave one GPU out, anchored: each operation of ``held_out`` predicted as the same operation's
    time measured on another GPU times the fold model's ratio of the two GPUs, the way ``predict``
    reaches a GPU it has not measured (from its anchor, gpurec.model.predictor).  ``rows``: columns
    gpu, op_key, group, target_ms and pred_ms (the fold model's prediction of every row on its own
    GPU).  Both rows of a pair must measure at least SCORED_MIN_GPU_MS; an operation measured
    several times on one GPU counts once (medians).  Per anchor GPU: pairs, anchored MAPE and
    median APE, and the fold model's own (specification-only) MAPE on the same operations."""
    r = rows[rows["target_ms"] >= SCORED_MIN_GPU_MS]
    r = r.groupby(["gpu", "op_key"], as_index=False).agg(group=("group", "first"), target_ms=("target_ms", "median"),
                                                          pred_ms=("pred_ms", "median"))
    held = r[r["gpu"] == held_out]
    out = []
    for anchor, part in r[r["gpu"] != held_out].groupby("gpu", sort=True):
        j = held.merge(part[["op_key", "target_ms", "pred_ms"]], on="op_key", suffixes=("", "_anchor"))
        if j.empty:
            continue
        pred = j["target_ms_anchor"] * j["pred_ms"] / j["pred_ms_anchor"]
        ape = np.abs(pred / j["target_ms"] - 1)
        out.append({"gpu": held_out, "anchor": str(anchor), "rows": int(len(j)), "mape": float(ape.mean()),
                    "median_ape": float(ape.median()),
                    "spec_only_mape": float(np.abs(j["pred_ms"] / j["target_ms"] - 1).mean()),
                    "by_group": {str(k): float(v) for k, v in ape.groupby(j["group"].to_numpy()).mean().items()}})
    return out


def anchored_leave_one_gpu_out(table: CrossTable, models: dict[str, CrossGPUModel]) -> list[dict[str, Any]]:
    """score_anchored for every fold model of leave_one_gpu_out, with whether the two GPUs share a
    compute die (gpurec.model.crossgpu.same_compute_die)."""
    from gpurec.model.crossgpu import same_compute_die

    f = table.frame
    if "op_key" not in f:
        return []
    gpus = f["gpu"].to_numpy()
    out = []
    for g, model in models.items():
        # only operations the held-out GPU measured can pair (pandas' hash-based isin: numpy's sorts
        # strings and took minutes here)
        idx = np.flatnonzero(f["op_key"].isin(set(f["op_key"].to_numpy()[gpus == g])).to_numpy())
        rows = f.iloc[idx][["gpu", "op_key", "group", "target_ms"]].assign(pred_ms=predict_rows(model, table, idx))
        for r in score_anchored(rows, g):
            r["same_die"] = same_compute_die(spec_row(g), spec_row(r["anchor"]))
            out.append(r)
    return out


def evaluate(table: CrossTable, data_root: Path | str | None = None, cache_dir: str | None = None,
             log: Callable[[str], None] = print, model: CrossGPUModel | None = None,
             networks: NetworkPairs | None = None, predictor: Any = None, tiles: bool = False,
             residual: bool = True) -> dict[str, Any]:
    """Leave one GPU out per operation kind group (specification-only, and anchored on each other GPU's
    measurement of the same operation) and on whole public models; the H200/H100 ratio
    on the collected GPU-bound networks, by ``model`` (fitted with the H200 rows and network pairs
    of the training architectures; ``held_out_arch`` marks the networks it never saw) and, for
    reference, by the leave-the-H200-out model; JSON-ready tables for docs/accuracy.md.  With a
    ``predictor`` the networks also get the predicted GPU energy ratio."""
    logo, models = leave_one_gpu_out(table, log=log, networks=networks, tiles=tiles, residual=residual)
    per_op, per_gpu = score_leave_one_gpu_out(logo)
    public = public_model_errors(models, data_root)
    out: dict[str, Any] = {
        "per_op": per_op, "per_gpu": per_gpu, "scored_min_gpu_ms": SCORED_MIN_GPU_MS,
        "public_models": public.drop(columns=[]).to_dict(orient="records"),
        "anchored": anchored_leave_one_gpu_out(table, models),
    }
    cols = ["set_key", "mode", "held_out_arch", "basis", "h100_gpu_time_ms", "h100_time_ms", "h200_time_ms",
            "h200_basis_time_ms", "pred_ratio", "measured_ratio", "pred_h200_ms", "ape", "direct_h200_ms", "direct_ape",
            "ratio_error_pp", "h100_energy_mj", "h200_energy_mj", "measured_energy_ratio", "h100_gpu_uuid",
            "h200_gpu_uuid"]
    extra = ["product_ratio", "product_ratio_error_pp", "pred_energy_ratio", "energy_ratio_error_pp"]
    if model is not None:
        out["per_gpu_in_sample"] = score_in_sample(table, model)
        h200 = h200_network_errors(model, data_root, cache_dir, predictor=predictor)
        out["h200_networks"] = h200[[c for c in cols + extra if c in h200]].to_dict(orient="records")
        out["h200_networks_method"] = {
            "model": "fitted on every GPU's rows, the H200's GPU-dominated eager operation rows and "
                     "H200/H100 network pairs of the training architectures included",
            "network_pairs": int(len(networks.keys)) if networks is not None else 0,
            "energy": "predictor (its power model) with this cross-GPU model" if predictor is not None else None}
    if model is not None and predictor is not None:
        keep = ["set_key", "mode", "precision", "held_out_arch", "basis", "measured_ratio", "product_ratio",
                "product_ratio_error_pp", "measured_energy_ratio", "pred_energy_ratio", "energy_ratio_error_pp",
                "h100_basis_time_ms", "h200_basis_time_ms", "h200_gpu_uuid"]
        out["h200_networks_by_precision"] = {}
        for precision in PAIRED_PRECISIONS:
            at = h200_network_errors_at(predictor, model, precision, data_root)
            log(f"cross-GPU: {len(at)} {precision} H200/H100 network pairs")
            out["h200_networks_by_precision"][precision] = at[[c for c in keep if c in at]].to_dict(orient="records")
    if H200 in models:
        logo_h200 = h200_network_errors(models[H200], data_root, cache_dir)
        out["h200_networks_leave_h200_out"] = logo_h200[["set_key", "mode", "held_out_arch", "basis", "pred_ratio",
                                                         "measured_ratio", "ratio_error_pp"]].to_dict(orient="records")
    return out


def load_energy_predictor(model_dir: Path | str | None, log: Callable[[str], None] = print) -> Any:
    """The trained predictor (``model_dir``, else the default models) that turns the cross-GPU
    times into energy, or None (logged) when none loads (e.g. xgboost missing)."""
    from gpurec.model import load_predictor

    reasons = []
    for where in ([model_dir] if model_dir is not None else []) + [None]:
        try:
            return load_predictor(where, check_data=False)
        except Exception as exc:  # any unusable model directory: try the next, say why at the end
            reasons.append(f"{where or 'default'}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    log("cross-GPU: no predictor loads, so the H200/H100 energy ratio is left out (" + "; ".join(reasons) + ")")
    return None
