"""Per-operation features from ncu counters and a calibration (seed ch. 5 and Table 4.1).

Memory-energy lower bound (Eq. 5.3/5.4, offsets left out because they belong to the
calibration kernel, not to the operation):
  DRAM    (dram__sectors_read + dram__sectors_write) x eps_dram
  L2      L2 sector *hits* x eps_l2            (misses are paid at DRAM)
  L1      global-load sector *hits* x eps_l1   (misses are paid at L2)
  shared  shared wavefronts x 4 x eps_shared   (a wavefront moves up to 128 B = 4 sectors;
                                                eps_shared is per 32-byte sector-equivalent)
  energy_mj = sectors x pJ x 1e-9
Utilisation (the profile's Table 4.1 metrics; every ratio is over SMSP elapsed cycles):
  smsp_active_util = smsp__cycles_active / smsp__cycles_elapsed
  smsp_issue_util  = SMSP issue cycles / smsp__cycles_elapsed
  tc_active_util   = tensor-pipe active cycles / smsp__cycles_elapsed (seed Table 4.1:
                     "SMSP cycles with at least 1 active tensor core" over SMSP elapsed)
  tc_issue_util    = tensor instructions (HMMA + Hopper GMMA) / smsp__cycles_elapsed
The SM-level tensor counter (sm__pipe_tensor_cycles_active) is the *sum over the SM's four
sub-partitions*, not an SM-cycle count: on the H200 (ncu 2025.3) it equals
smsp__pipe_tensor_op_hmma_cycles_active.sum for 97% of kernels and reaches 3x
sm__cycles_elapsed on TF32 convolutions, so it is divided by SMSP elapsed cycles too.
Missing counters give NaN for the features that need them, never an exception.
Pure pandas; importable without a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

SHARED_SECTORS_PER_WAVEFRONT = 4
PJ_TO_MJ = 1e-9

DRAM_READ = "dram__sectors_read.sum"
DRAM_WRITE = "dram__sectors_write.sum"
L2_SECTORS = "lts__t_sectors.sum"
L2_HITS = "lts__t_sectors_lookup_hit.sum"
L2_HIT_RATE = "lts__t_sector_hit_rate.pct"
L1_LD_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
L1_LD_HITS = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld_lookup_hit.sum"
L1_HIT_RATE = "l1tex__t_sector_hit_rate.pct"
SHARED_WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
SMSP_ELAPSED = "smsp__cycles_elapsed.sum"
SMSP_ACTIVE = "smsp__cycles_active.sum"
SMSP_ISSUE_ACTIVE = "smsp__issue_active.sum"
SMSP_INST_ISSUED = "smsp__inst_issued.sum"
SM_ELAPSED = "sm__cycles_elapsed.sum"
SM_TENSOR_ACTIVE = "sm__pipe_tensor_cycles_active.sum"
SMSP_HMMA_ACTIVE = "smsp__pipe_tensor_op_hmma_cycles_active.sum"
SMSP_HMMA_INST = "smsp__inst_executed_pipe_tensor_op_hmma.sum"
SMSP_GMMA_INST = "smsp__inst_executed_pipe_tensor_op_gmma.sum"
DURATION = "gpu__time_duration.sum"

# Exact ncu metric names to collect for these features (ncu >= 2023 on Ampere/Hopper).
# Some do not exist on every chip (GMMA is Hopper-only): filter with ncu.split_available().
METRICS: list[str] = [
    DRAM_READ, DRAM_WRITE,
    L2_SECTORS, L2_HITS, L2_HIT_RATE,
    L1_LD_SECTORS, L1_LD_HITS, L1_HIT_RATE,
    SHARED_WAVEFRONTS,
    SMSP_ELAPSED, SMSP_ACTIVE, SMSP_ISSUE_ACTIVE, SMSP_INST_ISSUED,
    SM_ELAPSED, SM_TENSOR_ACTIVE,
    SMSP_HMMA_ACTIVE, SMSP_HMMA_INST, SMSP_GMMA_INST,
    DURATION,
]
FEATURE_COLUMNS = [
    "mem_energy_dram_mj", "mem_energy_l2_mj", "mem_energy_l1_mj", "mem_energy_shared_mj",
    "mem_energy_total_mj", "smsp_active_util", "smsp_issue_util", "tc_active_util", "tc_issue_util",
]


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    import pandas as pd

    if name in df.columns:
        return pd.to_numeric(df[name], errors="coerce").astype("float64")
    return pd.Series(float("nan"), index=df.index, dtype="float64")


def _eps(calibration: dict[str, Any], level: str) -> float:
    v = (calibration.get("levels", {}).get(level) or {}).get("pj_per_sector")
    return float(v) if v is not None else float("nan")


def _ratio(num: pd.Series, den: pd.Series) -> pd.Series:
    return num / den.where(den > 0)


def memory_energy_features(counters: pd.DataFrame, calibration: dict[str, Any]) -> pd.DataFrame:
    """One row per row of ``counters`` (same index) with FEATURE_COLUMNS; see module docstring."""
    import pandas as pd

    c = counters
    out = pd.DataFrame(index=c.index)
    dram = _col(c, DRAM_READ) + _col(c, DRAM_WRITE).fillna(0.0)
    l2_hits = _col(c, L2_HITS).fillna(_col(c, L2_SECTORS) * _col(c, L2_HIT_RATE) / 100.0)
    l1_hits = _col(c, L1_LD_HITS).fillna(_col(c, L1_LD_SECTORS) * _col(c, L1_HIT_RATE) / 100.0)
    shared = _col(c, SHARED_WAVEFRONTS) * SHARED_SECTORS_PER_WAVEFRONT
    out["mem_energy_dram_mj"] = dram * _eps(calibration, "dram") * PJ_TO_MJ
    out["mem_energy_l2_mj"] = l2_hits * _eps(calibration, "l2") * PJ_TO_MJ
    out["mem_energy_l1_mj"] = l1_hits * _eps(calibration, "l1") * PJ_TO_MJ
    out["mem_energy_shared_mj"] = shared * _eps(calibration, "shared") * PJ_TO_MJ
    levels = ["mem_energy_dram_mj", "mem_energy_l2_mj", "mem_energy_l1_mj", "mem_energy_shared_mj"]
    out["mem_energy_total_mj"] = out[levels].sum(axis=1, min_count=1)

    elapsed = _col(c, SMSP_ELAPSED)
    issue = _col(c, SMSP_ISSUE_ACTIVE).fillna(_col(c, SMSP_INST_ISSUED))
    out["smsp_active_util"] = _ratio(_col(c, SMSP_ACTIVE), elapsed)
    out["smsp_issue_util"] = _ratio(issue, elapsed)
    # Tensor pipe: the SM-level all-tensor counter covers Hopper's GMMA; the SMSP HMMA counter
    # is Ampere's.  Both count SMSP cycles (see the module docstring), so both are
    # over SMSP elapsed cycles; take the larger, so neither generation is undercounted.
    tc_sm = _ratio(_col(c, SM_TENSOR_ACTIVE), elapsed)
    tc_smsp = _ratio(_col(c, SMSP_HMMA_ACTIVE), elapsed)
    out["tc_active_util"] = pd.concat([tc_sm, tc_smsp], axis=1).max(axis=1, skipna=True)
    tc_inst = _col(c, SMSP_HMMA_INST).add(_col(c, SMSP_GMMA_INST), fill_value=0.0)
    out["tc_issue_util"] = _ratio(tc_inst, elapsed)
    return out


# -- per-operation table (gpurec tools counters-features) -------------------------------------------

# Per-kernel occupancy attributes that gpurec.collect.counters.segment() summed along with the
# counters before it kept only ".sum" columns (datasets/h200/counters/counters.jsonl has them);
# a sum over kernels means nothing, so they are dropped.
NON_ADDITIVE = ("sm__maximum_warps_avg_per_active_cycle", "sm__maximum_warps_per_active_cycle_pct",
                "smsp__maximum_warps_avg_per_active_cycle")
OPERATION_COLUMNS = ("op_kind", "set_key", "instances", "time_ms", "energy_mj", "dynamic_energy_mj",
                     "power_w", "idle_power_w", "sm_clock_mhz")


def op_feature_table(counters: pd.DataFrame, calibration: dict[str, Any],
                     operations: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per profiled (op_signature, mode): summed counters, FEATURE_COLUMNS and shares.

    ``counters`` are the rows of counters.jsonl (one per operation and mode, counters summed
    over the step's kernels); ``operations`` the measured per-operation table (time_ms,
    dynamic_energy_mj, ... per call), joined on (op_signature, mode).  Added columns:
    ``mem_share_of_dynamic`` = memory-energy lower bound / measured dynamic energy per call,
    ``mem_share_<level>`` = that level's part of the lower bound, ``ncu_time_ms`` (summed kernel
    duration under ncu) and ``ncu_time_ratio`` = ncu_time_ms / measured time_ms.
    """
    import pandas as pd

    c = counters.drop(columns=[k for k in NON_ADDITIVE if k in counters.columns]).reset_index(drop=True)
    feats = memory_energy_features(c, calibration)
    out = pd.concat([c, feats], axis=1)
    out["ncu_time_ms"] = _col(out, DURATION) / 1e6
    cal_gpu = calibration.get("gpu")
    out["calibration_gpu"] = cal_gpu
    if operations is not None and len(operations):
        keep = ["op_signature", "mode", *[k for k in OPERATION_COLUMNS if k in operations.columns]]
        ops = operations[keep].drop_duplicates(["op_signature", "mode"], keep="last")
        # columns the counters rows carry themselves (op_kind; set_key and precision since session 22)
        ops = ops.drop(columns=[k for k in ops.columns if k in out.columns and k not in ("op_signature", "mode")])
        out = out.merge(ops, on=["op_signature", "mode"], how="left", validate="one_to_one")
        dyn = _col(out, "dynamic_energy_mj")
        out["mem_share_of_dynamic"] = _ratio(out["mem_energy_total_mj"], dyn)
        out["ncu_time_ratio"] = _ratio(out["ncu_time_ms"], _col(out, "time_ms"))
    for level in ("dram", "l2", "l1", "shared"):
        out[f"mem_share_{level}"] = _ratio(out[f"mem_energy_{level}_mj"], out["mem_energy_total_mj"])
    return out
