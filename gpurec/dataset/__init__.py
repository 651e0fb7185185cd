"""Dataset: shipped measurements (Parquet), shard merging and provenance."""

from __future__ import annotations

from typing import Any


def load_dataset(gpu: str | None = None, **kwargs: Any) -> Any:
    from gpurec.dataset.load import load_dataset as _load

    return _load(gpu=gpu, **kwargs)
