"""The collection plan (work order) for the dataset and test-set model-input sets.

The plan is computed here with the local torch; on the GPU machine the worker re-extracts
each set with its own torch and fails a row loudly if a signature differs, which is how
signature agreement between torch versions is checked in the field.  Run through
``gpurec tools plan``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PLAN = Path("datasets") / "plans" / "main.json"
SEQ_PLAN = Path("datasets") / "plans" / "seq.json"


def write_main_plan(out: Path | str = DEFAULT_PLAN, precision: str = "fp32") -> dict[str, int]:
    """Write the plan: network rows of every dataset and test set, then operation rows of the
    dataset sets, at ``precision``.  Returns how many items of each kind it holds."""
    from gpurec.collect.plan import (
        DATASET_ARCHS,
        DATASET_BATCH_SIZES,
        MODES,
        TEST_ARCHS,
        TEST_BATCH_SIZES,
        build_plan,
        model_input_sets,
    )

    sets = model_input_sets(DATASET_ARCHS, DATASET_BATCH_SIZES)
    items = build_plan(sets, MODES, networks=True, operations=False, precision=precision)
    items += build_plan(model_input_sets(TEST_ARCHS, TEST_BATCH_SIZES), MODES, networks=True, operations=False,
                        precision=precision)
    items += build_plan(sets, MODES, networks=False, operations=True, precision=precision)
    return _write(out, items)


@dataclass(frozen=True)
class PlanPart:
    """One precision's share of a plan: which sets, in which modes, networks and/or operations.
    With ``seq_shapes`` (gpurec.sets.SEQ_SHAPES-like: family -> (batches, lengths)) the
    architectures are sequence models and ``batch_sizes`` is ignored."""

    precision: str
    archs: Sequence[str]
    batch_sizes: Sequence[int]
    networks: bool = True
    operations: bool = True
    modes: Sequence[str] = ("inference", "training")
    seq_shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None
    op_kinds: Sequence[str] | None = None  # operations of these kinds only (None: every kind)

    def input_sets(self) -> list[Any]:
        from gpurec.collect.plan import model_input_sets, sequence_input_sets

        if self.seq_shapes is not None:
            return sequence_input_sets(self.archs, self.seq_shapes)
        return model_input_sets(self.archs, self.batch_sizes)


def _issue21_parts() -> list[PlanPart]:
    """The precision round's collection: bf16-mixed on every dataset set (operations) and every dataset
    and test set (networks), both modes; TF32 matrix products of a few sets; and bf16
    (cast) and fp16-mixed operations and networks on a few sets that span convolutions,
    depthwise blocks and transformers."""
    from gpurec.sets import DATASET_ARCHS, DATASET_BATCH_SIZES, TEST_ARCHS, TEST_BATCH_SIZES

    few = ("resnet50", "mobilenet_v2", "efficientnet_b0", "convnext_tiny", "vit_b_16", "swin_t")
    return [
        PlanPart("bf16-mixed", DATASET_ARCHS, DATASET_BATCH_SIZES),
        PlanPart("bf16-mixed", TEST_ARCHS, TEST_BATCH_SIZES, operations=False),
        PlanPart("tf32", few, (8, 32), networks=False),
        PlanPart("bf16", few, (8, 32)),
        PlanPart("fp16-mixed", few, (8, 32)),
    ]


def _precision_networks_parts() -> list[PlanPart]:
    """bf16-mixed whole networks only, the unseen test architectures first (the accuracy target
    is judged on them), then the dataset architectures: what the first precision round's budget
    did not reach (the runner skips the networks already measured)."""
    from gpurec.sets import DATASET_ARCHS, DATASET_BATCH_SIZES, TEST_ARCHS, TEST_BATCH_SIZES

    return [PlanPart("bf16-mixed", TEST_ARCHS, TEST_BATCH_SIZES, operations=False),
            PlanPart("bf16-mixed", DATASET_ARCHS, DATASET_BATCH_SIZES, operations=False)]


def _bf16_mixed_operations_parts() -> list[PlanPart]:
    """bf16-mixed operations of every dataset set only: the precision plan shares its lease
    round-robin with bf16, fp16-mixed and TF32 operations, and the unseen bf16-mixed networks are
    judged on models that learn from bf16-mixed operation rows (the same items as the precision
    plan's; the runner skips those already measured)."""
    from gpurec.sets import DATASET_ARCHS, DATASET_BATCH_SIZES

    return [PlanPart("bf16-mixed", DATASET_ARCHS, DATASET_BATCH_SIZES, networks=False)]


def _seq_bf16_mixed_parts() -> list[PlanPart]:
    """The sequence models at bf16-mixed, the precision Hopper users run transformers and LSTMs
    at: networks of the held-out sequence architectures (judged on them), then of the training
    ones, and operations of the training sets only (the held-out architectures stay unseen)."""
    from gpurec.sets import SEQ_DATASET_ARCHS, SEQ_SHAPES, SEQ_TEST_ARCHS, SEQ_TEST_SHAPES

    return [PlanPart("bf16-mixed", SEQ_TEST_ARCHS, (), operations=False, seq_shapes=SEQ_TEST_SHAPES),
            PlanPart("bf16-mixed", SEQ_DATASET_ARCHS, (), seq_shapes=SEQ_SHAPES)]


def _seq_kinds_fp16_mixed_parts() -> list[PlanPart]:
    """The operation kinds sequence models add (gpurec.sets.SEQUENCE_KINDS) at fp16-mixed,
    the other precision Hopper users train at, on the sequence training sets; and the held-out
    sequence architectures' fp16-mixed networks to judge them on.  The kinds alone, not every
    operation of the sets: their rows are what the models lacked (bmm over-predicted 1.5x, softmax
    and Embedding under-predicted 2x before they were measured)."""
    from gpurec.sets import SEQ_DATASET_ARCHS, SEQ_SHAPES, SEQ_TEST_ARCHS, SEQ_TEST_SHAPES, SEQUENCE_KINDS

    return [PlanPart("fp16-mixed", SEQ_TEST_ARCHS, (), operations=False, seq_shapes=SEQ_TEST_SHAPES),
            PlanPart("fp16-mixed", SEQ_DATASET_ARCHS, (), networks=False, seq_shapes=SEQ_SHAPES,
                     op_kinds=SEQUENCE_KINDS)]


def _lm_heads_parts() -> list[PlanPart]:
    """The language-model head sweep (gpurec.sets.HEAD_SWEEP_ARCHS): its heads alone, at bf16-mixed
    (what Hopper users train and serve at, where a head's alignment decides its kernel) and fp32,
    both modes; no network rows (a sweep is not a network anyone runs)."""
    from gpurec.sets import HEAD_SWEEP_ARCHS, HEAD_SWEEP_SHAPES

    return [PlanPart(p, HEAD_SWEEP_ARCHS, (), networks=False, seq_shapes=HEAD_SWEEP_SHAPES, op_kinds=("Linear",))
            for p in ("bf16-mixed", "fp32")]


PRESETS: dict[str, Callable[[], list[PlanPart]]] = {"precision": _issue21_parts,
                                                    "precision-networks": _precision_networks_parts,
                                                    "bf16-mixed-operations": _bf16_mixed_operations_parts,
                                                    "seq-bf16-mixed": _seq_bf16_mixed_parts,
                                                    "seq-kinds-fp16-mixed": _seq_kinds_fp16_mixed_parts,
                                                    "lm-heads": _lm_heads_parts}


def build_parts_plan(parts: Sequence[PlanPart], extract: Any = None,
                     progress: Callable[[str], None] | None = None) -> list[Any]:
    """One plan of several precisions: every part's networks first (in part order), then the
    operations of the parts round-robin, so a run stopped anywhere holds some of each (the
    writer then puts held-out networks first and training networks last: held_out_first)."""
    from gpurec.collect.plan import _round_robin, build_plan

    networks: list[Any] = []
    operations: list[list[Any]] = []
    for part in parts:
        sets = part.input_sets()
        if part.networks:
            networks += build_plan(sets, part.modes, networks=True, operations=False, precision=part.precision)
        if part.operations:
            if progress:
                progress(f"plan: {part.precision} operations of {len(sets)} sets ...")
            ops = build_plan(sets, part.modes, networks=False, operations=True, extract=extract,
                             precision=part.precision)
            operations.append(ops if part.op_kinds is None else [w for w in ops if w.kind in part.op_kinds])
    seen: set[str] = set()
    items = []
    for w in networks + _round_robin(operations):
        if w.id not in seen:  # parts may overlap: each item once
            seen.add(w.id)
            items.append(w)
    return items


def write_preset_plan(preset: str, out: Path | str, progress: Callable[[str], None] | None = None
                      ) -> dict[str, int]:
    """Write the plan of a named preset (PRESETS); returns how many items of each kind and
    precision it holds."""
    if preset not in PRESETS:
        raise ValueError(f"unknown plan preset {preset!r}: choose one of {', '.join(PRESETS)}")
    from gpurec.sets import SEQ_TEST_ARCHS, TEST_ARCHS

    return _write(out, held_out_first(build_parts_plan(PRESETS[preset](), progress=progress),
                                      (*TEST_ARCHS, *SEQ_TEST_ARCHS)))


def write_seq_plan(out: Path | str = SEQ_PLAN) -> dict[str, int]:
    """Write the sequence plan: network rows of every sequence training and test set, then
    operation rows of the training sets (the test architectures stay unseen).  Returns how
    many items of each kind it holds."""
    from gpurec.collect.plan import (
        MODES,
        SEQ_DATASET_ARCHS,
        SEQ_SHAPES,
        SEQ_TEST_ARCHS,
        SEQ_TEST_SHAPES,
        build_plan,
        sequence_input_sets,
    )

    sets = sequence_input_sets(SEQ_DATASET_ARCHS, SEQ_SHAPES)
    items = build_plan(sets, MODES, networks=True, operations=False)
    items += build_plan(sequence_input_sets(SEQ_TEST_ARCHS, SEQ_TEST_SHAPES), MODES, networks=True, operations=False)
    items += build_plan(sets, MODES, networks=False, operations=True)
    return _write(out, held_out_first(items, SEQ_TEST_ARCHS))


RNN_SWEEP_PLAN = Path("datasets") / "plans" / "rnn_sweep.json"


def write_rnn_sweep_plan(out: Path | str = RNN_SWEEP_PLAN) -> dict[str, int]:
    """Write the recurrent sweep plan: operation rows of the LSTM and GRU sweeps
    (gpurec.sets.RNN_SWEEP_ARCHS) at the recurrent training sets' shapes, both modes; no network
    rows (a sweep is not a network anyone runs).  Returns how many items of each kind it holds."""
    from gpurec.collect.plan import MODES, SEQ_SHAPES, build_plan, sequence_input_sets
    from gpurec.sets import RNN_SWEEP_ARCHS

    sets = sequence_input_sets(RNN_SWEEP_ARCHS, SEQ_SHAPES)  # both sweeps are of the "rnn" family
    return _write(out, build_plan(sets, MODES, networks=False, operations=True))


def held_out_first(items: Sequence[Any], held_out: Sequence[str]) -> list[Any]:
    """The order a lease with little GPU time gets most from: networks of the held-out
    architectures (what accuracy on unseen networks is judged on), then every operation (what
    the models learn from), then the training architectures' networks (calibration)."""
    held = set(held_out)

    def arch(w: Any) -> str:
        return str(w.set_key).split(":")[0]

    first = [w for w in items if w.item == "network" and arch(w) in held]
    last = [w for w in items if w.item == "network" and arch(w) not in held]
    return first + [w for w in items if w.item != "network"] + last


def _write(out: Path | str, items: Sequence[Any]) -> dict[str, int]:
    import torch

    return _write_items(out, [w.as_dict() for w in items], torch.__version__)


def _write_items(out: Path | str, items: Sequence[dict[str, Any]], torch_version: str) -> dict[str, int]:
    """Write a plan of ``items`` (as dicts) made with ``torch_version``, atomically; returns how
    many items it holds, by item type and, for other than fp32, by precision."""
    from gpurec.dataset.store import atomic_write_json

    atomic_write_json(Path(out), {"torch": torch_version, "items": list(items)}, compact=True)
    kinds: dict[str, int] = {"items": len(items)}
    for i in items:
        kinds[i["item"]] = kinds.get(i["item"], 0) + 1
        if i.get("precision", "fp32") != "fp32":
            key = f"{i['item']}:{i['precision']}"
            kinds[key] = kinds.get(key, 0) + 1
    return kinds


def arch_subset_items(plan: dict[str, Any], archs: Sequence[str]) -> list[dict[str, Any]]:
    """The items of ``plan`` whose set is of one of ``archs``, copied verbatim in the plan's order.

    Why: a lease too short for a whole plan measures first the architectures that carry a known
    error (the few-group convolution sweeps behind regnet_x_800mf b8), and the rows share ids with
    the full plan's items, so the full plan skips them when it resumes."""
    def arches(item: dict[str, Any]) -> set[str]:  # an operation shared by several sets is in each
        return {str(k).split(":")[0] for k in item.get("model_sets") or [item.get("set_key", item["key"])]}

    wanted = set(archs)
    present = set().union(*(arches(i) for i in plan["items"]))
    missing = sorted(wanted - present)
    if missing:
        raise ValueError(f"architectures not in the plan: {', '.join(missing)}; its architectures are "
                         f"{', '.join(sorted(present))}")
    return [i for i in plan["items"] if arches(i) & wanted]


def write_arch_subset_plan(out: Path | str, source: Path | str, archs: Sequence[str]) -> dict[str, int]:
    """Write the items of the committed plan ``source`` of ``archs`` (arch_subset_items) to ``out``,
    with the source plan's torch."""
    plan = json.loads(Path(source).read_text())
    return _write_items(out, arch_subset_items(plan, archs), plan["torch"])


RECARD_PLAN = Path("datasets") / "plans" / "recard_fp32.json"
RECARD_BATCHES = ("b32", "b128")


def recard_items(cnn_plan: dict[str, Any], seq_plan: dict[str, Any],
                 batches: Sequence[str] = RECARD_BATCHES) -> list[dict[str, Any]]:
    """The network items of both plans at ``batches``, copied verbatim, CNN and sequence items
    interleaved.  Why: measured again on one more card, the same networks of both families tell
    card from family in the H200/H100 energy-ratio error (datasets/h200/cards/README.md), and a
    call cut short still holds both families."""
    import itertools

    def networks(plan: dict[str, Any]) -> list[dict[str, Any]]:
        return [i for i in plan["items"] if i["item"] == "network" and i["key"].split(":")[1] in batches]

    pairs = itertools.zip_longest(networks(cnn_plan), networks(seq_plan))
    return [i for pair in pairs for i in pair if i is not None]


def write_recard_plan(out: Path | str = RECARD_PLAN, cnn: Path | str = DEFAULT_PLAN,
                      seq: Path | str = SEQ_PLAN) -> dict[str, int]:
    """Write the re-card plan from the committed main and sequence plans (their items as they
    are, so the rows share ids with the rows they repeat); the torch of the main plan."""
    cnn_plan, seq_plan = (json.loads(Path(p).read_text()) for p in (cnn, seq))
    return _write_items(out, recard_items(cnn_plan, seq_plan), cnn_plan["torch"])


PEAKS_PLAN = Path("datasets") / "plans" / "peaks.json"


def write_peaks_plan(out: Path | str = PEAKS_PLAN) -> dict[str, int]:
    """Write the peak-memory plan: one item per network of the main plan (every dataset and
    test set, both modes)."""
    from gpurec.collect.plan import (
        DATASET_ARCHS,
        DATASET_BATCH_SIZES,
        MODES,
        TEST_ARCHS,
        TEST_BATCH_SIZES,
        model_input_sets,
        peak_items,
    )

    sets = model_input_sets(DATASET_ARCHS, DATASET_BATCH_SIZES) + model_input_sets(TEST_ARCHS, TEST_BATCH_SIZES)
    return _write(out, peak_items(sets, MODES))

NETWORK_PEAKS_PLAN = Path("datasets") / "plans" / "peaks_networks.json"
NETWORK_PLANS = tuple(Path("datasets") / "plans" / f"{name}.json" for name in ("seq", "targeted", "precision", "main"))


def network_peak_items(plans: Sequence[Path | str]) -> list[Any]:
    """One peak item per network item (set, mode, precision) of ``plans``, in their order with
    the held-out architectures first.  Network rows measured their peak after earlier rows in
    the same process had left memory allocated; a peak item starts from a collected heap and
    records what was still allocated (``memory_allocated_before_bytes``)."""
    from gpurec.collect.plan import WorkItem
    from gpurec.sets import SEQ_TEST_ARCHS, TEST_ARCHS

    seen: set[str] = set()
    items: list[Any] = []
    for plan in plans:
        path = Path(plan)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such plan (write it with `gpurec tools plan`)")
        for d in json.loads(path.read_text())["items"]:
            if d["item"] != "network":
                continue
            w = WorkItem("peak", d["key"], d["mode"], "peak", d["key"], [d["key"]],
                         precision=d.get("precision", "fp32"))
            if w.id not in seen:
                seen.add(w.id)
                items.append(w)
    held = set(TEST_ARCHS) | set(SEQ_TEST_ARCHS)
    return [w for w in items if w.key.split(":")[0] in held] + [w for w in items if w.key.split(":")[0] not in held]


def write_network_peaks_plan(out: Path | str = NETWORK_PEAKS_PLAN,
                             plans: Sequence[Path | str] = NETWORK_PLANS) -> dict[str, int]:
    """Write the peak plan of every network of ``plans`` (sequence, targeted, precision and
    main sets); ids already measured are skipped on the GPU, so only new peaks are taken."""
    return _write(out, network_peak_items(plans))


TARGETED_PLAN = Path("datasets") / "plans" / "targeted.json"


def write_targeted_plan(out: Path | str = TARGETED_PLAN, main: Path | str | None = DEFAULT_PLAN) -> dict[str, int]:
    """Write the targeted plan: the hand-written architectures of gpurec.sets (SYNTH_ARCHS, as
    networks and per operation) and the operation sweeps (SWEEP_ARCHS, per operation only),
    which cover the operation kinds that carry the whole-network error (gpurec.synthsets).
    Items already in the ``main`` plan are left out (the runner would skip them anyway).
    Returns how many items of each kind it holds."""
    import json

    import torch

    from gpurec.collect.plan import MODES, build_plan, model_input_sets
    from gpurec.dataset.store import atomic_write_json
    from gpurec.sets import (
        SWEEP_ARCHS,
        SWEEP_BATCH_SIZES,
        SWEEP_BATCH_SIZES_BY_ARCH,
        SYNTH_ARCHS,
        SYNTH_BATCH_SIZES,
        SYNTH_BATCH_SIZES_BY_ARCH,
    )

    synth = model_input_sets(SYNTH_ARCHS, SYNTH_BATCH_SIZES, batch_sizes_by_arch=SYNTH_BATCH_SIZES_BY_ARCH)
    sweeps = model_input_sets(SWEEP_ARCHS, SWEEP_BATCH_SIZES, batch_sizes_by_arch=SWEEP_BATCH_SIZES_BY_ARCH)
    items = build_plan(synth, MODES, networks=True, operations=False)
    items += build_plan(synth + sweeps, MODES, networks=False, operations=True)
    known: set[str] = set()
    if main is not None and Path(main).is_file():
        known = {f"{w['item']}:{w['key']}:{w['mode']}" for w in json.loads(Path(main).read_text())["items"]}
    items = [w for w in items if w.id not in known]
    atomic_write_json(Path(out), {"torch": torch.__version__, "items": [w.as_dict() for w in items]}, compact=True)
    kinds: dict[str, int] = {"items": len(items), "in_main_plan_left_out": len(known) and
                             sum(1 for w in build_plan(synth, MODES, networks=False, operations=True)
                                 if w.id in known)}
    for w in items:
        kinds[w.item] = kinds.get(w.item, 0) + 1
    return kinds


COUNTER_TWINS_PLAN = Path("datasets") / "plans" / "counters_bf16_mixed.json"


def write_counter_twins_plan(out: Path | str = COUNTER_TWINS_PLAN, counters: Path | str | None = None,
                             precision: str = "bf16-mixed", source: Path | str = DEFAULT_PLAN,
                             twins_from: Path | str | None = None) -> dict[str, int]:
    """Operations at ``precision`` that are the same layers (same set, mode and node) as the fp32
    operations already profiled with Nsight Compute (``counters``: a ``counters.jsonl``; default the
    H200's), with the autocast casts made for them: profiled the same way, they tell how DRAM traffic
    changes with precision against the fp32 twin.  Items come from ``twins_from`` (default
    ``datasets/plans/bf16_mixed_operations.json``), so their ids are ones collection knows."""
    from gpurec.collect.plan import WorkItem
    from gpurec.dataset.store import read_jsonl
    from gpurec.ops import extract_operations
    from gpurec.sets import parse_set_key

    counters = Path(counters) if counters is not None else Path("datasets") / "h200" / "counters" / "counters.jsonl"
    twins_from = Path(twins_from) if twins_from is not None else Path("datasets") / "plans" / "bf16_mixed_operations.json"
    profiled = {r["id"] for r in read_jsonl(counters)}
    fp32 = [WorkItem(**d) for d in json.loads(Path(source).read_text())["items"]]
    fp32 = [w for w in fp32 if w.id in profiled]
    if not fp32:
        raise ValueError(f"no item of {source} was profiled in {counters}: profile fp32 operations first "
                         "(`gpurec counters --plan ...`)")
    candidates = [WorkItem(**d) for d in json.loads(twins_from.read_text())["items"]]
    by_key = {(w.key, w.mode): w for w in candidates if w.precision == precision}
    extracted: dict[tuple[str, str, str], list[Any]] = {}  # one extraction per set, mode and precision

    def ops_of(set_key: str, mode: str, prec: str) -> list[Any]:
        if (set_key, mode, prec) not in extracted:
            s = parse_set_key(set_key)
            extracted[set_key, mode, prec] = extract_operations(s.arch, s.input_shape, mode=mode, keep_sources=False,
                                                                precision=prec)
        return extracted[set_key, mode, prec]

    items: dict[str, Any] = {}  # by id, in the order found
    missing = unmatched = 0
    for w in fp32:
        node = next((o.node for o in ops_of(w.set_key, w.mode, "fp32") if o.signature == w.key), None)
        if node is None:  # the local torch extracts another signature: counted, not dropped silently
            unmatched += 1
            continue
        twins = [o for o in ops_of(w.set_key, w.mode, precision)
                 if o.node == node or str(o.node).startswith(f"{node}.cast")]
        for o in twins:
            item = by_key.get((o.signature, w.mode))
            if item is None:
                missing += 1
            else:
                items.setdefault(item.id, item)
    counts = _write(out, list(items.values()))
    counts["fp32_profiled"] = len(fp32)
    counts["twins_not_in_plan"] = missing
    counts["fp32_not_extracted"] = unmatched
    return counts
