"""What to measure, in which order, and which worker measures it.

Work items are distinct (operation signature, mode) pairs over a list of model-input sets,
plus one whole-network item per (set, mode).  The order is round-robin over
(architecture, batch size, mode) groups, and within a group over operation kinds, so a run
stopped at any point holds a balanced sample; sharding takes every n-th item of that order.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

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

    @property
    def id(self) -> str:
        return f"{self.item}:{self.key}:{self.mode}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _round_robin(groups: Sequence[Sequence[Any]]) -> list[Any]:
    out: list[Any] = []
    for row in itertools.zip_longest(*groups):
        out.extend(x for x in row if x is not None)
    return out


def build_plan(sets: Sequence[AnyInputSet], modes: Sequence[str] = MODES, networks: bool = True,
               operations: bool = True, extract: Any = None) -> list[WorkItem]:
    """Deduplicated, balanced work list over image and/or sequence sets (a sequence set's shape is
    (batch, seq_len) of token ids).  ``extract(arch, shape, mode)`` defaults to gpurec.ops."""
    if extract is None:
        from gpurec.ops import extract_operations

        def extract(arch: str, shape: tuple[int, ...], mode: str) -> Any:
            return extract_operations(arch, shape, mode=mode, keep_sources=False)

    # Group order interleaves architectures and batch sizes, so round-robin is balanced.
    order = sorted(sets, key=lambda s: (s.resolution, getattr(s, "seq_len", 0), s.batch, s.arch))
    order = _round_robin([[s for s in order if s.batch == b] for b in sorted({s.batch for s in order})])
    items: list[WorkItem] = []
    if networks:
        items.extend(WorkItem("network", s.key, m, "network", s.key, [s.key]) for s in order for m in modes)
    if not operations:
        return items
    owners: dict[tuple[str, str], list[str]] = defaultdict(list)
    groups: list[list[WorkItem]] = []
    first: dict[tuple[str, str], WorkItem] = {}
    for mode in modes:
        for s in order:
            by_kind: OrderedDict[str, list[WorkItem]] = OrderedDict()
            for op in extract(s.arch, s.input_shape, mode):
                k = (op.signature, mode)
                if s.key not in owners[k]:
                    owners[k].append(s.key)
                if k in first:
                    continue
                w = WorkItem("op", op.signature, mode, op.kind, s.key)
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
