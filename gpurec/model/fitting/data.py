"""Training data: load, choose targets, clean, and build the feature matrices.

Targets. The GPU-side models learn what the GPU does, apart from the host:

* ``time_target='auto'`` (default): host-free ``gpu_time_ms`` / ``gpu_power_w`` when the data
  has them (CUDA-graph replays), else the eager ``time_ms`` / ``power_w`` (all data
  collected before host-free measurement). Host-free and eager rows are never mixed: with host-free data,
  rows without it (not captured, or older runs) are left out and counted.
* ``gpu_time_source='in_network'`` (default): where the in-network table attributes kernel
  time to an operation inside a real network (median over its positions and sets), that is
  the time target, because it sees the caches and ordering of the real step; isolated
  host-free time elsewhere. ``'isolated'`` uses isolated rows only.
* Host dispatch: ``host_ms`` (CPU ms to issue one call) divided by the dispatch scale of the
  run's host profile against the reference host, so the model predicts the reference host's
  dispatch and rescales to any other profile. The in-network table's ``host_ms`` is measured
  under torch.profiler, whose own overhead inflates it, so the host model uses the isolated
  operation rows' ``host_ms`` only.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpurec.model._sets import dataset_arch_names, test_arch_names
from gpurec.model.features import (
    FeatureBuilder,
    FeatureConfig,
    SetExtractor,
    fp16_as_bf16_kinds,
    hardware_matrix,
    masked,
    network_blocks,
    operations_of_rows,
    resolve_extra_columns,
    target_mask,
)
from gpurec.model.fitting.evaluate import arch_of, family, row_families
from gpurec.model.fitting.graph_gap import fit_measured_gap
from gpurec.model.network import correction_mode
from gpurec.ops.precision import precision_column

TIME_TARGETS = ("auto", "host_free", "eager")
GPU_TIME_SOURCES = ("in_network", "isolated")
# With host-free targets, an eager-only row (a GPU measured before host-free measurement, e.g. the H200)
# stands in for a host-free one when its eager time is at least this long: on the H100, rows
# measured both ways had host-free / eager time 0.986 (10th-90th percentile 0.93-1.00) and
# power 0.98 at >= 1 ms, against 0.25 between 0.1 and 0.3 ms (datasets/h100, 2026-11-26).
EAGER_PROXY_MIN_MS = 1.0
RECURRENT_KINDS = ("LSTM", "GRU", "RNN")  # whole cuDNN recurrent layers (gpurec.ops.extract)


def load_tables(data_root: Path | str | None) -> tuple[Any, Any, Any]:
    """Operations, networks and (when collected) in-network tables; missing ones are empty."""
    import pandas as pd

    from gpurec.dataset import load_dataset

    ops = load_dataset(root=data_root, table="operations")
    out = []
    for table in ("networks", "in_network"):
        try:
            out.append(load_dataset(root=data_root, table=table))
        except FileNotFoundError:
            out.append(pd.DataFrame(columns=["gpu", "set_key", "mode", "time_ms", "power_w", "energy_mj"]))
    return ops, out[0], out[1]


def _num(df: Any, col: str) -> np.ndarray:
    if col not in df:
        return np.full(len(df), np.nan)
    import pandas as pd

    return pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _ok(v: np.ndarray) -> np.ndarray:
    return np.isfinite(v) & (v > 0)


def resolve_time_target(df: Any, time_target: str) -> str:
    """'host_free' or 'eager' for a table under the ``time_target`` option."""
    if time_target not in TIME_TARGETS:
        raise ValueError(f"time_target must be one of {', '.join(TIME_TARGETS)}, not {time_target!r}")
    if time_target == "auto":
        return "host_free" if _ok(_num(df, "gpu_time_ms")).any() else "eager"
    return time_target


def with_targets(ops: Any, nets: Any, in_net: Any, time_target: str = "auto", gpu_time_source: str = "in_network",
                 recurrent_elapsed: bool = True) -> tuple[Any, Any, dict[str, Any], dict[str, int]]:
    """Add target columns ``_t_gpu`` (ms), ``_p_gpu`` (W), ``_t_source`` and ``_host_ms`` to the
    operation rows and ``_t_gpu``/``_p_gpu`` to the network rows; drop (and count) rows without
    usable targets. Returns ops, nets, what was chosen, dropped-row counts.  ``recurrent_elapsed``
    (False: as models trained before it) keeps recurrent layers' host-free time over the
    in-network kernel sum."""
    if gpu_time_source not in GPU_TIME_SOURCES:
        raise ValueError(f"gpu_time_source must be one of {', '.join(GPU_TIME_SOURCES)}, not {gpu_time_source!r}")
    dropped: dict[str, int] = {}
    op_source = resolve_time_target(ops, time_target)
    if op_source == "host_free":
        t, w = _num(ops, "gpu_time_ms"), _num(ops, "gpu_power_w")
        if "captured" in ops:
            not_captured = ~ops["captured"].fillna(False).astype(bool).to_numpy()
            dropped["not captured as a CUDA graph (eager timing only)"] = int((not_captured & _ok(t)).sum())
            t = np.where(not_captured, np.nan, t)
    else:
        t, w = _num(ops, "time_ms"), _num(ops, "power_w")
    source = np.full(len(ops), op_source, dtype=object)
    if op_source == "host_free":
        eager_t, eager_w = _num(ops, "time_ms"), _num(ops, "power_w")
        schema = _num(ops, "schema")
        proxy = (~_ok(t)) & (np.nan_to_num(schema, nan=1.0) < 2) & _ok(eager_t) & _ok(eager_w) \
            & (eager_t >= EAGER_PROXY_MIN_MS)
        t = np.where(proxy, eager_t, t)
        w = np.where(proxy, eager_w, w)
        source = np.where(proxy, "eager_proxy", source)
    in_net_rows = 0
    if op_source == "host_free" and gpu_time_source == "in_network" and len(in_net) and "kernel_ms" in in_net:
        k = in_net.assign(_k=_num(in_net, "kernel_ms"))
        # in-network times of the unseen test architectures never become training targets
        k = k[_ok(k["_k"].to_numpy()) & ~k["set_key"].map(lambda s: arch_of(s) in test_arch_names()).to_numpy(bool)]
        med = k.groupby(["gpu", "mode", "op_signature"])["_k"].median()
        keys = list(zip(ops["gpu"], ops["mode"], ops["op_signature"], strict=True))
        kern = np.array([med.get(key, np.nan) for key in keys], dtype=np.float64)
        # cuDNN runs a recurrent layer's layers and directions on concurrent streams, so its
        # in-network kernel sum exceeds its elapsed time (1.3-1.5x for 2-3 layers or two
        # directions on the H100 rows): those rows keep their host-free (elapsed) time where measured
        recurrent = ops["op_kind"].isin(RECURRENT_KINDS).to_numpy(dtype=bool) if "op_kind" in ops and \
            recurrent_elapsed else np.zeros(len(ops), dtype=bool)
        use = _ok(kern) & ~(recurrent & _ok(t))
        t = np.where(use, kern, t)
        source = np.where(use, "in_network", source)
        in_net_rows = int(use.sum())
    ops = ops.assign(_t_gpu=t, _p_gpu=w, _t_source=source, _host_ms=_num(ops, "host_ms"))
    ok = _ok(t) & _ok(w)
    dropped[f"no usable {op_source} time/power"] = int((~ok).sum())
    ops = ops[ok]
    test = ops["set_key"].map(lambda s: arch_of(s) in test_arch_names()).to_numpy(dtype=bool)
    dropped["test-architecture set (never trained on)"] = int(test.sum())
    ops = ops[~test]
    ops = ops.sort_values(["gpu", "op_signature", "mode"]).drop_duplicates(["gpu", "op_signature", "mode"],
                                                                            keep="last").reset_index(drop=True)
    # Networks take the operations' kind of target, or the network correction would fold the host's
    # share of eager time into the GPU's work (networks without it are dropped and counted).
    net_source = op_source
    if len(nets):
        if net_source == "host_free":
            nt, nw = _num(nets, "gpu_time_ms"), _num(nets, "gpu_power_w")
        else:
            nt, nw = _num(nets, "time_ms"), _num(nets, "power_w")
        nets = nets.assign(_t_gpu=nt, _p_gpu=nw)
        nok = _ok(nt) & _ok(nw)
        dropped[f"networks without usable {net_source} time/power"] = int((~nok).sum())
        nets = nets[nok].sort_values(["gpu", "set_key", "mode"]).reset_index(drop=True)
    info = {"operations": op_source, "networks": net_source, "gpu_time_source": gpu_time_source,
            "recurrent_elapsed": recurrent_elapsed,
            "operation_rows_by_source": {str(k): int(v) for k, v in
                                         zip(*np.unique(ops["_t_source"].astype(str), return_counts=True),
                                             strict=True)} if len(ops) else {},
            "in_network_rows": in_net_rows,
            "eager_proxy_min_ms": EAGER_PROXY_MIN_MS if op_source == "host_free" else None,
            "host_ms_rows": int(_ok(ops["_host_ms"].to_numpy(dtype=np.float64)).sum()) if len(ops) else 0}
    if op_source == "eager":
        info["note"] = ("no host-free (gpu_time_ms) rows in the data: the GPU models learn eager time_ms, which "
                        "includes the collection hosts' dispatch; retrain once issue 12's data is in")
    return ops, nets, info, dropped


def data_hash(ops: Any, nets: Any) -> str:
    """sha256 over the sorted key columns and targets of the rows trained on."""
    h = hashlib.sha256()
    for name, df, keys in (("operations", ops, ["gpu", "op_signature", "mode"]),
                           ("networks", nets, ["gpu", "set_key", "mode"])):
        h.update(name.encode())
        if len(df) == 0:
            continue
        cols = ["_t_gpu", "_p_gpu", *(["_host_ms"] if "_host_ms" in df else [])]
        part = df[[*keys, *cols]].sort_values(keys)
        for row in part.itertuples(index=False):
            h.update(("|".join(str(v) for v in row[:3]) + "|" + "|".join(repr(float(v)) for v in row[3:])
                      + "\n").encode())
    return h.hexdigest()


def current_data_hash(data_root: Path | str | None = None, time_target: str = "auto",
                      gpu_time_source: str = "in_network", recurrent_elapsed: bool = True) -> str:
    """Hash of the data a training run on ``data_root`` would use (cheap: no extraction)."""
    ops, nets, _, _ = with_targets(*load_tables(data_root), time_target, gpu_time_source, recurrent_elapsed)
    return data_hash(ops, nets)


def check_models(model_dir: Path | str | None = None, data_root: Path | str | None = None) -> dict[str, Any]:
    """Whether the models in ``model_dir`` were trained on the data now under ``data_root``.

    Loading a predictor never hashes the dataset (seconds of work, and this training module);
    this is the explicit check (``gpurec models check``).  Returns ``match``, both hashes,
    and the model's creation date and training row counts."""
    from gpurec.model.persist import REFRESH_KEY, default_model_dir, read_manifest

    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    manifest = read_manifest(model_dir)
    trained = manifest.get("training_data", {})
    digest = current_data_hash(data_root)
    out = {"models": str(model_dir), "match": digest == trained.get("sha256"),
           "model_data_sha256": trained.get("sha256"), "data_sha256": digest,
           "created": manifest.get("created"),
           "training_rows": {k: v for k, v in trained.items() if k != "sha256"}}
    refreshed = manifest.get(REFRESH_KEY)
    if refreshed:  # `gpurec tools refresh-lookup` rebuilt the measured-operation lookup since training
        out |= {"lookup_refreshed": refreshed.get("refreshed"), "lookup_data_sha256": refreshed.get("data_sha256"),
                "lookup_matches_data": refreshed.get("data_sha256") == digest}
    return out


def kind_rows(data_root: Path | str | None, kinds: Any, builder: FeatureBuilder) -> tuple[Any, np.ndarray, Any, Any]:
    """The operation rows of ``kinds`` with the targets training gives them (with_targets: never a
    test architecture's), matched to their operations, with an ``_kind`` column; their unmasked
    feature rows; and the operation and network tables they came from."""
    raw_ops, raw_nets, in_net = load_tables(data_root)
    ops, nets, _, _ = with_targets(raw_ops, raw_nets, in_net, "auto", "in_network")
    rows = ops[ops["op_kind"].isin(kinds)].reset_index(drop=True)
    matched = operations_of_rows(rows, SetExtractor(None))
    rows = rows.iloc[matched.row_index].reset_index(drop=True).assign(_kind=matched.block.kinds)
    return rows, builder.build(matched.block, hardware_matrix(rows["gpu"].tolist())).X, ops, nets


def reference_host(data_root: Path | str | None, ops: Any, nets: Any) -> tuple[Any, str, dict[str, list[Any]]]:
    """The reference host profile, where it comes from, and the profiles by run.

    Reference = per-field median of the host profiles of the collection runs whose rows are
    trained on. Until the data carries ``host_bench``, the fallback is this training
    machine's CPU-side profile (``run_host_bench(use_gpu=False)``), said so in its name."""
    from gpurec.host import reference_profile, run_host_bench
    from gpurec.model.provenance import host_profiles_by_run

    by_run = host_profiles_by_run(data_root)
    runs: set[str] = set()
    for df in (ops, nets):
        if len(df) and "run_id" in df:
            runs |= {str(r) for r in df["run_id"].dropna().unique()}
    profiles = [p for r in sorted(runs) for p in by_run.get(r, [])]
    if profiles:
        n_runs = sum(1 for r in runs if r in by_run)
        return (reference_profile(profiles, name=f"reference: median of {len(profiles)} host profiles of "
                                                  f"{n_runs} collection runs"),
                f"median of the host_bench profiles of {n_runs} collection runs", by_run)
    prof = run_host_bench(use_gpu=False, name="fallback reference: the training machine's CPU (the data's "
                                              "provenance has no host_bench yet)")
    return prof, "fallback: no host_bench in the data's provenance; this training machine, CPU side", by_run


def host_scales(df: Any, by_run: dict[str, list[Any]], reference: Any) -> tuple[np.ndarray, int]:
    """Per row, its run's dispatch scale against ``reference`` (1 where the run has no profile),
    and the number of rows that had none."""
    from gpurec.host import reference_profile

    scale_of: dict[str, float] = {}
    for run, profiles in by_run.items():
        scale_of[run] = reference_profile(profiles, name=run).dispatch_scale(reference)
    runs = df["run_id"].astype(str).to_numpy() if "run_id" in df else np.full(len(df), "")
    scales = np.array([scale_of.get(r, np.nan) for r in runs], dtype=np.float64)
    missing = int(np.isnan(scales).sum())
    return np.where(np.isnan(scales), 1.0, scales), missing


@dataclass
class Prepared:
    """Everything the training run needs, as arrays aligned with ``ops`` and ``nets``."""

    ops: Any  # cleaned, matched operation rows (DataFrame) with target columns
    nets: Any  # network rows with extracted operations (DataFrame)
    builder: FeatureBuilder
    X: dict[str, np.ndarray]  # per target ('time', 'power', 'host'), with that target's hidden columns NaN
    margin: dict[str, np.ndarray]
    y: dict[str, np.ndarray]  # log targets: time (ms), power (W)
    modes: np.ndarray
    gpus: np.ndarray
    groups: np.ndarray  # kind-group index per row (host prior)
    families: list[frozenset[str]]
    kinds: np.ndarray  # operation kind per row (as extracted)
    range_values: np.ndarray  # (rows, len(range_features)) raw values for the coverage ranges
    host_rows: np.ndarray  # rows with a host dispatch target
    host_y: np.ndarray  # log(host_ms / run scale) of host_rows: dispatch on the reference host
    net_X: dict[str, np.ndarray]
    net_margin: dict[str, np.ndarray]
    net_modes_ops: np.ndarray
    net_groups: np.ndarray
    net_offsets: np.ndarray
    net_signatures: list[str]
    net_kernel_free: np.ndarray | None  # per network operation: launches no kernel (None: not known)
    net_host_scale: np.ndarray  # per network row: its run's dispatch scale against the reference
    reference: Any  # HostProfile
    reference_source: str
    targets: dict[str, Any]
    report: dict[str, Any]
    net_kinds: np.ndarray | None = None  # per network operation: its kind (recurrent power class; consumer-held casts get no time)
    kernel_free: np.ndarray | None = None  # per operation row: launches no kernel (None: not known)
    # graph_gap.fit_measured_gap of the raw network and in-network tables: the gap per looked-up
    # operation (Correction.measured_gap_ms) and its report
    measured_gap: tuple[dict[str, float], dict[str, Any]] = field(default_factory=lambda: ({}, {}))


def prepare(data_root: Path | str | None, feature: FeatureConfig, time_target: str, gpu_time_source: str,
            cache_dir: str | None, log: Callable[[str], None]) -> Prepared:
    """Load, choose targets, match rows to their operations and build all feature matrices."""
    import pandas as pd

    raw_ops, raw_nets, in_net = load_tables(data_root)
    ops, nets, targets, dropped = with_targets(raw_ops, raw_nets, in_net, time_target, gpu_time_source)
    digest = data_hash(ops, nets)
    extractor = SetExtractor(cache_dir)
    t0 = time.perf_counter()
    matched = operations_of_rows(ops, extractor)
    ops = ops.iloc[matched.row_index].reset_index(drop=True)
    dropped.update({f"unmatched: {k}": v for k, v in matched.unmatched.items()})
    kinds = sorted(set(matched.block.kinds.tolist()))
    extra_cols = resolve_extra_columns(ops.columns, feature.extra_columns)
    feature = replace(feature, fp16_as_bf16_kinds=fp16_as_bf16_kinds(
        matched.block.kinds.tolist(), matched.block.column("math_mode").tolist()))
    builder = FeatureBuilder(kinds, feature, extra_cols)
    extra = ops[extra_cols].to_numpy(dtype=np.float64, na_value=np.nan) if extra_cols else None
    feats = builder.build(matched.block, hardware_matrix(ops["gpu"].tolist()), extra)
    test_archs, train_archs = set(test_arch_names()), set(dataset_arch_names())
    if len(nets):
        # Every precision's networks are extracted at their precision: the network correction is
        # fitted per correction_mode (step mode and precision); the network reports stay fp32 (is_fp32).
        prec = precision_column(nets)
        nets = nets.assign(precision=prec, arch=nets["set_key"].map(arch_of))
        nets = nets[nets["arch"].isin(train_archs | test_archs)].reset_index(drop=True)
        nets = nets.assign(family=nets["arch"].map(family), is_test=nets["arch"].isin(test_archs),
                           is_fp32=nets["precision"] == "fp32",
                           correction_mode=[correction_mode(m, q) for m, q in
                                            zip(nets["mode"], nets["precision"], strict=True)])
    keys = list(zip(nets["set_key"], nets["mode"], nets["precision"], strict=True)) if len(nets) else []
    block, offsets, kept = network_blocks(keys, extractor)
    nets = nets.iloc[kept].reset_index(drop=True) if len(nets) else nets
    extractor.save()
    hw_rows = hardware_matrix(nets["gpu"].tolist()) if len(nets) else np.zeros((0, 12))
    counts = np.diff(offsets)
    net_feats = builder.build(block, np.repeat(hw_rows, counts, axis=0) if len(nets) else hw_rows)
    gone = ", ".join(f"{v} {k}" for k, v in dropped.items() if v) or "none"
    log(f"features: {len(ops)} operation rows ({targets['operations']} targets; dropped: {gone}), "
        f"{len(nets)} networks, {builder.n_features} features, {len(kinds)} kinds, "
        f"{time.perf_counter() - t0:.0f} s extracting")
    reference, ref_source, by_run = reference_host(data_root, ops, nets)
    scales, no_profile = host_scales(ops, by_run, reference)
    host_ms = ops["_host_ms"].to_numpy(dtype=np.float64)
    host_rows = np.flatnonzero(_ok(host_ms))
    runs = ops["run_id"].astype(str).to_numpy() if "run_id" in ops else np.full(len(ops), "")
    targets["host_rows_without_run_profile"] = int(sum(runs[i] not in by_run for i in host_rows))
    targets["rows_without_run_profile"] = no_profile
    net_scales = host_scales(nets, by_run, reference)[0] if len(nets) else np.zeros(0)
    prov: dict[str, dict[str, Any]] = {}
    both = pd.concat([ops.assign(_table="operations"), nets.assign(_table="networks")], ignore_index=True) \
        if len(nets) else ops.assign(_table="operations")
    for gpu, part in both.groupby("gpu"):
        prov[str(gpu)] = {c: sorted({str(v) for v in part[c].dropna().unique()})[:5]
                          for c in ("driver", "torch", "cuda_runtime", "host_cpu", "gpu_uuid") if c in part}
        prov[str(gpu)]["rows"] = {str(k): int(v) for k, v in part["_table"].value_counts().items()}
    report = {"data_sha256": digest, "provenance": prov, "dropped_rows": dropped, "targets": targets,
              "extraction_errors": {f"{k[0]}|{k[1]}": v for k, v in extractor.errors.items()}}
    masks = {t: target_mask(t, builder.feature_names) for t in ("time", "power", "host")}
    return Prepared(
        ops=ops, nets=nets, builder=builder, X={t: masked(feats.X, m) for t, m in masks.items()},
        margin={"time": feats.margin_time, "power": feats.margin_power},
        y={"time": np.log(ops["_t_gpu"].to_numpy(dtype=np.float64)),
           "power": np.log(ops["_p_gpu"].to_numpy(dtype=np.float64))},
        modes=ops["mode"].to_numpy().astype(str), gpus=ops["gpu"].to_numpy().astype(str),
        groups=builder.group_index(matched.block.kinds),
        families=[row_families(s, m) for s, m in zip(ops["set_key"], ops.get("model_sets", ops["set_key"]),
                                                     strict=True)],
        kinds=matched.block.kinds.astype(str),
        kernel_free=matched.block.kernel_free,
        range_values=np.stack([matched.block.column(f) for f in feature.range_features], axis=1)
        if len(ops) else np.zeros((0, len(feature.range_features))),
        host_rows=host_rows, host_y=np.log(host_ms[host_rows] / scales[host_rows]),
        net_X={t: masked(net_feats.X, m) for t, m in masks.items()}, net_margin={"time": net_feats.margin_time, "power": net_feats.margin_power},
        net_modes_ops=np.repeat(nets["mode"].to_numpy().astype(str), counts) if len(nets) else np.zeros(0, str),
        net_groups=builder.group_index(block.kinds), net_offsets=offsets, net_signatures=block.signatures,
        net_kernel_free=block.kernel_free,
        net_kinds=block.kinds,
        net_host_scale=net_scales, reference=reference, reference_source=ref_source, targets=targets,
        report=report, measured_gap=fit_measured_gap(raw_nets, in_net),
    )
