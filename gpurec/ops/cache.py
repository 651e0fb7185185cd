"""The one place model-input sets are extracted: once per (set key, mode), then reused.

Collection looks planned signatures up in it (``find``), and training turns its operations
into feature arrays (``gpurec.model.features.SetExtractor``); both go through this cache.
"""

from __future__ import annotations

from collections import OrderedDict

from gpurec.ops.operation import Operation
from gpurec.ops.precision import DEFAULT_PRECISION
from gpurec.sets import parse_set_key


class SetOperations:
    """Operations of model-input sets by key (``resnet50:b32:r224``, ``gpt_d512:b4:s128``), extracted once each.

    ``keep_sources`` keeps each operation's module so it can be materialised (collection
    needs it; features do not).  ``max_sets`` bounds how many (set, mode) extractions stay in
    memory, least recently used first out; ``None`` keeps them all.
    """

    def __init__(self, keep_sources: bool = True, max_sets: int | None = None) -> None:
        if max_sets is not None and max_sets < 1:
            raise ValueError(f"max_sets must be at least 1 or None, not {max_sets}")
        self.keep_sources = keep_sources
        self.max_sets = max_sets
        # keyed by (set key, mode), plus the precision where it is not fp32
        self._ops: OrderedDict[tuple[str, ...], list[Operation]] = OrderedDict()
        self._by_signature: dict[tuple[str, ...], dict[str, Operation]] = {}
        self.extractions = 0  # how many times a set was actually extracted (not served from the cache)

    def operations(self, set_key: str, mode: str, precision: str = DEFAULT_PRECISION) -> list[Operation]:
        """Every operation of the set in ``mode`` at ``precision``, in execution order
        (extraction errors propagate)."""
        from gpurec.ops.extract import extract_operations

        k = (set_key, mode) if precision == DEFAULT_PRECISION else (set_key, mode, precision)
        hit = self._ops.get(k)
        if hit is not None:
            self._ops.move_to_end(k)
            return hit
        s = parse_set_key(set_key)  # an image set, or a sequence set (int64 token ids by name)
        ops = extract_operations(s.arch, s.input_shape, mode=mode, keep_sources=self.keep_sources, precision=precision)
        self.extractions += 1
        self._ops[k] = ops
        by_sig: dict[str, Operation] = {}
        for op in ops:
            by_sig.setdefault(op.signature, op)
        self._by_signature[k] = by_sig
        if self.max_sets is not None and len(self._ops) > self.max_sets:
            old, _ = self._ops.popitem(last=False)
            self._by_signature.pop(old, None)
        return ops

    def find(self, set_key: str, mode: str, signature: str, precision: str = DEFAULT_PRECISION) -> Operation:
        """The set's first operation with ``signature``; LookupError if the set has none."""
        self.operations(set_key, mode, precision)
        k = (set_key, mode) if precision == DEFAULT_PRECISION else (set_key, mode, precision)
        op = self._by_signature[k].get(signature)
        if op is None:
            where = mode if precision == DEFAULT_PRECISION else f"{mode}, {precision}"
            raise LookupError(f"signature {signature} not found in {set_key} ({where}): extraction differs "
                              "between the planning and measuring torch versions")
        return op

    # Collection code calls it ``get``.
    get = find
