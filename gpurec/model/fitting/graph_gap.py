"""The gap between kernels of a network replayed as one CUDA graph, per operation that launches
kernels (gpurec.model.network.Correction.measured_gap_ms).

Why: a looked-up operation's time is its kernels' time inside the network (the in-network
table), and a network's host-free time is that sum plus the gaps between kernels, which the time
correction only adds to predicted operations.  The gap is measured, not learnt: per network, the
host-free time less the in-network kernel sum, over the operations that launched a kernel.
Training architectures only (the test ones stay unseen), and no network with a whole recurrent
layer (cuDNN overlaps its kernels: their sum exceeds the step).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# A correction mode's own gap needs this many networks; fewer fall back to the step mode's.
MIN_GAP_NETWORKS = 12
_KEYS = ["gpu", "run_id", "network_id", "precision"]
# What the tables need to hold (tables collected before in-network attribution or host-free
# timing give no samples); precision is optional (fp32 where absent)
_NET_COLUMNS = {"id", "gpu", "run_id", "set_key", "mode", "status", "gpu_time_ms"}
_IN_NETWORK_COLUMNS = {"gpu", "run_id", "network_id", "kernels", "kernel_ms"}


def gap_samples(nets: Any, in_net: Any) -> Any:
    """One row per usable network: its correction mode key ("*|mode"), host-free time, kernel sum,
    operations that launched kernels and the gap per such operation (``gap_ms``)."""
    import pandas as pd

    from gpurec.model._sets import test_arch_names
    from gpurec.model.fitting.evaluate import arch_of
    from gpurec.model.network import correction_mode
    from gpurec.ops.precision import precision_column
    from gpurec.seqmodels import has_recurrent_layers

    cols = ["key", "gpu", "set_key", "mode", "gpu_time_ms", "kernel_ms", "kernel_ops", "gap_ms"]
    if (not len(nets) or not len(in_net) or not _NET_COLUMNS <= set(nets.columns)
            or not _IN_NETWORK_COLUMNS <= set(in_net.columns)):
        return pd.DataFrame(columns=cols)
    inn = in_net.assign(precision=precision_column(in_net),
                        _k=pd.to_numeric(in_net["kernels"], errors="coerce").fillna(0) > 0,
                        _ms=pd.to_numeric(in_net["kernel_ms"], errors="coerce"))
    per = inn.groupby(_KEYS, sort=False).agg(kernel_ops=("_k", "sum"), kernel_ms=("_ms", "sum")).reset_index()
    n = nets.assign(precision=precision_column(nets),
                    network_id=nets["id"], arch=nets["set_key"].map(lambda k: arch_of(str(k))))
    n = n[(n["status"] == "ok") & ~n["arch"].isin(test_arch_names())]
    recurrent = n["arch"].map(has_recurrent_layers)
    n = n[~recurrent.astype(bool)].merge(per, on=_KEYS, how="inner")
    n["gpu_time_ms"] = pd.to_numeric(n["gpu_time_ms"], errors="coerce")
    n = n[np.isfinite(n["gpu_time_ms"]) & (n["gpu_time_ms"] > 0) & (n["kernel_ops"] > 0) & (n["kernel_ms"] > 0)]
    n["key"] = ["*|" + correction_mode(str(m), str(p)) for m, p in zip(n["mode"], n["precision"], strict=True)]
    n["gap_ms"] = (n["gpu_time_ms"] - n["kernel_ms"]) / n["kernel_ops"]
    return n[cols].reset_index(drop=True)


def fit_measured_gap(nets: Any, in_net: Any, min_networks: int = MIN_GAP_NETWORKS
                     ) -> tuple[dict[str, float], dict[str, Any]]:
    """``"*|mode"`` -> the median gap per kernel-launching operation (ms) over the networks of that
    correction mode (GPUs pooled: the H100 and H200 agree within 0.05 us inference), for modes
    with at least ``min_networks`` of them; and a report of every mode's count, median and
    quartiles (what was left out says why)."""
    s = gap_samples(nets, in_net)
    gaps: dict[str, float] = {}
    report: dict[str, Any] = {}
    for key, d in s.groupby("key", sort=True):
        q1, med, q3 = (float(v) for v in np.quantile(d["gap_ms"], [0.25, 0.5, 0.75]))
        used = len(d) >= min_networks
        report[str(key)] = {"n": int(len(d)), "gpus": sorted(set(d["gpu"].astype(str))), "median_ms": med,
                            "q1_ms": q1, "q3_ms": q3,
                            **({} if used else {"left_out": f"fewer than {min_networks} networks"})}
        if used:
            gaps[str(key)] = med
    return gaps, report
