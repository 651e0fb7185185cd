"""What to measure, in which order, and which worker measures it.

Work items are distinct (operation signature, mode) pairs over a list of model-input sets,
plus one whole-network item per (set, mode), at one precision (gpurec.ops.precision; an
item's id ends in its precision unless it is fp32, so fp32 ids are as they always were).
The order is round-robin over (architecture, batch size, mode) groups, and within a group
over operation kinds, so a run stopped at any point holds a balanced sample; sharding takes
every n-th item of that order.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpurec.ops.precision import DEFAULT_PRECISION, check_precision, item_id

# The sets and architecture lists live in gpurec.sets (shared with the CPU side); re-exported here.
from gpurec.sets import (  # noqa: F401
    DATASET_ARCHS,
    DATASET_BATCH_SIZES,
    MODES,
    SEQ_DATASET_ARCHS,
    SEQ_SHAPES,
    SEQ_TEST_ARCHS,
    SEQ_TEST_SHAPES,
    TEST_ARCHS,
    TEST_BATCH_SIZES,
    AnyInputSet,
    ModelInputSet,
    SequenceInputSet,
    model_input_sets,
    parse_set_key,
    sequence_input_sets,
)


@dataclass
class WorkItem:
    """One row to measure: an operation (by signature) or a whole network, in a mode."""

    item: str  # "op" or "network"
    key: str  # signature for ops, set key for networks
    mode: str
    kind: str
    set_key: str  # a model-input set that contains it (where to extract it from)
    model_sets: list[str] = field(default_factory=list)
    precision: str = DEFAULT_PRECISION

    @property
    def id(self) -> str:
        return item_id(self.item, self.key, self.mode, self.precision)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.precision == DEFAULT_PRECISION:
            del d["precision"]  # fp32 plans stay as they were written before precision existed
        return d


def _round_robin(groups: Sequence[Sequence[Any]]) -> list[Any]:
    out: list[Any] = []
    for row in itertools.zip_longest(*groups):
        out.extend(x for x in row if x is not None)
    return out


def build_plan(sets: Sequence[AnyInputSet], modes: Sequence[str] = MODES, networks: bool = True,
               operations: bool = True, extract: Any = None, precision: str = DEFAULT_PRECISION) -> list[WorkItem]:
    """Deduplicated, balanced work list over image and/or sequence sets (a sequence set's shape is
    (batch, seq_len) of token ids) at ``precision``.  ``extract(arch, shape, mode)`` (given
    ``precision=`` too when it is not fp32) defaults to gpurec.ops.

    Operation items are the operations whose own precision is ``precision``: under "tf32"
    only the matrix products (the rest are fp32 operations, the main plan's)."""
    check_precision(precision)
    if extract is None:
        from gpurec.ops import extract_operations

        def extract(arch: str, shape: tuple[int, ...], mode: str, precision: str = DEFAULT_PRECISION) -> Any:
            return extract_operations(arch, shape, mode=mode, keep_sources=False, precision=precision)

    def extracted(arch: str, shape: tuple[int, ...], mode: str) -> Any:
        if precision == DEFAULT_PRECISION:
            return extract(arch, shape, mode)
        return [op for op in extract(arch, shape, mode, precision=precision)
                if getattr(op, "precision", DEFAULT_PRECISION) == precision]

    # Group order interleaves architectures and batch sizes, so round-robin is balanced.
    order = sorted(sets, key=lambda s: (s.resolution, getattr(s, "seq_len", 0), s.batch, s.arch))
    order = _round_robin([[s for s in order if s.batch == b] for b in sorted({s.batch for s in order})])
    items: list[WorkItem] = []
    if networks:
        items.extend(WorkItem("network", s.key, m, "network", s.key, [s.key], precision) for s in order for m in modes)
    if not operations:
        return items
    owners: dict[tuple[str, str], list[str]] = defaultdict(list)
    groups: list[list[WorkItem]] = []
    first: dict[tuple[str, str], WorkItem] = {}
    for mode in modes:
        for s in order:
            by_kind: OrderedDict[str, list[WorkItem]] = OrderedDict()
            for op in extracted(s.arch, s.input_shape, mode):
                k = (op.signature, mode)
                if s.key not in owners[k]:
                    owners[k].append(s.key)
                if k in first:
                    continue
                w = WorkItem("op", op.signature, mode, op.kind, s.key, precision=precision)
                first[k] = w
                by_kind.setdefault(op.kind, []).append(w)
            groups.append(_round_robin(list(by_kind.values())))
    # Alternate modes group by group so both modes fill in together.
    half = len(groups) // len(modes) if modes else 0
    interleaved = _round_robin([groups[i * half:(i + 1) * half] for i in range(len(modes))]) if half else groups
    for w in _round_robin(interleaved):
        w.model_sets = owners[(w.key, w.mode)]
        items.append(w)
    return items


def peak_items(sets: Sequence[ModelInputSet], modes: Sequence[str] = MODES) -> list[WorkItem]:
    """One peak-memory item per (set, mode): a cheap pass that records the step's peak device
    memory for networks measured before rows carried it."""
    return [WorkItem("peak", s.key, m, "peak", s.key, [s.key]) for s in sets for m in modes]


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"i/n"``; falls back to torchrun (RANK/WORLD_SIZE) and Slurm array variables."""
    if text:
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError as exc:
            raise ValueError(f"--shard takes i/n with 0 <= i < n, such as 0/4, not '{text}'") from exc
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        i, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    elif "SLURM_ARRAY_TASK_ID" in os.environ and "SLURM_ARRAY_TASK_COUNT" in os.environ:
        first = int(os.environ.get("SLURM_ARRAY_TASK_MIN", "0"))
        i, n = int(os.environ["SLURM_ARRAY_TASK_ID"]) - first, int(os.environ["SLURM_ARRAY_TASK_COUNT"])
    else:
        i, n = 0, 1
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"shard {i}/{n} is out of range: need 0 <= i < n")
    return i, n


def shard_of(item_id: str, count: int) -> int:
    """Stable shard of an item: a hash, not position, because the balanced order is periodic
    (modes, batch sizes) and every n-th item would give each shard one mode only."""
    return int(hashlib.sha1(item_id.encode()).hexdigest()[:8], 16) % count


def shard_items(items: Sequence[WorkItem], index: int, count: int) -> list[WorkItem]:
    """Deterministic split that keeps the plan's order within each shard."""
    return [w for w in items if shard_of(w.id, count) == index]
