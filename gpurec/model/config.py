"""The knobs of a training run and the targets it learns (all saved in the manifest)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpurec.model.features import FeatureConfig

# An unmeasured GPU's band: the measured band widened this many times in log space, used when
# no leave-one-GPU-out validation could measure the cross-GPU error.
UNMEASURED_BAND_WIDENING = 3.0

# The time target's kind groups: per mode, one booster on the rows of each group's kinds and one
# (gpurec.model.regressors.REST_GROUP) on every other row, so rows of one kind stop moving the
# leaves another kind's predictions sit in (session 25's dense convolutions moved batch norm,
# session 26's DenseNet rows moved dense convolutions).  Rows are routed by their ``kind=...``
# one-hot columns; the saved models carry the definition they were fitted with (manifest
# ``kind_groups``), so this constant only shapes new training runs.  Off:
# ``TrainConfig(time_kind_groups=False)``.
TIME_KIND_GROUPS: dict[str, tuple[str, ...]] = {"conv_bn": ("Conv2d", "BatchNorm2d")}

TARGETS: dict[str, dict[str, str]] = {
    "time": {"column": "gpu_time_ms (host-free; eager time_ms before issue 12's data)", "transform": "log",
             "unit": "ms", "name": "log_gpu_time_ms"},
    "power": {"column": "gpu_power_w (host-free; eager power_w before issue 12's data)", "transform": "log",
              "unit": "W", "name": "log_gpu_power_w"},
    "host": {"column": "host_ms / dispatch scale of the run's host profile against the reference host",
             "transform": "log", "unit": "ms", "name": "log_host_ms_on_reference_host"},
}


@dataclass
class TrainConfig:
    """Knobs of a training run (all saved in the manifest)."""

    tune_trials: int = 20
    seed: int = 0
    n_folds: int = 5
    tune_folds: int = 3
    max_rounds: int = 600
    early_stopping_rounds: int = 30
    default_rounds: int = 400  # used when tune_trials == 0
    min_rows_per_mode: int = 30  # also per kind group: a smaller group is served by its mode's booster
    time_kind_groups: bool = True  # time boosters per mode and TIME_KIND_GROUPS group (False: one per mode)
    forest_trees: int = 150
    baselines: bool = True  # RandomForest and roofline-linear beside XGBoost
    small_op_ms: float = 0.02
    correction_ridge: float = 0.1
    min_networks_gpu: int = 8
    per_gpu_correction: str = "network_only"  # 'all' | 'network_only' | 'none' (validation.correction_gpus)
    band_quantiles: tuple[float, float] = (0.05, 0.95)
    nthread: int | None = None  # None: auto_nthread() (idle cores) at the start of a run
    cache_dir: str | None = None
    use_measured: bool = True  # measured operations replace predictions on their GPU (saved with the model)
    time_target: str = "auto"  # 'auto' | 'host_free' | 'eager' (gpurec.model.fitting.data)
    gpu_time_source: str = "in_network"  # 'in_network' | 'isolated' (gpurec.model.fitting.data)
    host_min_rows: int = 40  # fewer host_ms rows: the host model stays the profile prior
    logo_min_train_share: float = 0.25  # leave-one-GPU-out needs other GPUs' rows >= this share of the held-out
    host_rounds: int = 300
    reuse_tuning: str | None = None  # a report.json whose tuned parameters are reused (no tuning)
    feature: FeatureConfig = field(default_factory=FeatureConfig)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["feature"] = self.feature.as_dict()
        d["band_quantiles"] = list(self.band_quantiles)
        return d
