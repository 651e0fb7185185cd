"""A regressor's predictions remembered per feature row, so a row it has seen costs a lookup.

Why: a warm prediction (the same network again, or another GPU of a ranking) and a NAS loop
(new candidates built from the same blocks) send the same feature rows through the boosters
again and again; three booster calls were most of a warm vit_b_16 estimate.  A booster's
prediction for a row depends on that row and its margin only, so a remembered value is the
value the booster gives (tests/test_extract_speed.py compares the two paths).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Remembered rows per regressor, forgotten all at once beyond: a key is the row's bytes (about
# 1 kB at 130 features), so about 25 MB per regressor at most; a NAS list of 50 MobileNets has
# about 900 distinct rows.
MAX_ROWS = 20_000


class RowMemo:
    """``model.predict(X, margin)`` with each (row of X, margin) predicted once; the rows not
    seen before go through ``model`` in one call."""

    def __init__(self, model: Any, max_rows: int = MAX_ROWS) -> None:
        self.model = model
        self.max_rows = max_rows
        self._memo: dict[bytes, float] = {}

    def predict(self, X: np.ndarray, margin: Any) -> np.ndarray:
        n = len(X)
        if n == 0:
            return self.model.predict(X, margin)
        margin = np.broadcast_to(np.asarray(margin, dtype=np.float64), (n,))
        # One row of bytes per prediction: its features, then its margin (the exact values the
        # model is given; -0.0 or another NaN payload only makes a miss, never a wrong value).
        keyed = np.ascontiguousarray(np.column_stack([np.asarray(X, dtype=np.float64), margin]))
        raw, width = keyed.tobytes(), keyed.shape[1] * keyed.itemsize
        keys = [raw[i * width:(i + 1) * width] for i in range(n)]
        memo = self._memo
        values = [memo.get(k) for k in keys]
        # A new row repeated within the call (a network's repeated blocks) goes through the
        # model once: the first index of each distinct missing key.
        first: dict[bytes, int] = {}
        for i, v in enumerate(values):
            if v is None:
                first.setdefault(keys[i], i)
        if first:
            rows = list(first.values())
            fresh = self.model.predict(X[rows], margin[rows]).tolist()
            if len(memo) + len(rows) > self.max_rows:
                memo.clear()
            for i, v in zip(rows, fresh, strict=True):
                memo[keys[i]] = v
            values = [memo[k] if v is None else v for k, v in zip(keys, values, strict=True)]
        return np.asarray(values, dtype=np.float64)

    def clear(self) -> None:
        self._memo.clear()

    def __len__(self) -> int:
        return len(self._memo)
