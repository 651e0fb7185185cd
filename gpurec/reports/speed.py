"""Prediction and extraction speed: measured here, committed as JSON, rendered to docs/speed.md.

``measure`` times, each in a fresh Python process (so import, first-call and cache costs are
what a user sees):

* prediction (``gpurec.model``): one vit_b_16 prediction (target <= 50 ms after the first
  call) and ``predict_many`` on mobilenet-sized candidates (target >= 80 per second).  Three
  kinds of candidate lists are timed, because they cost very different amounts: repeated
  candidates (operation cache hits), new input shapes of torchvision names, and fresh
  nn.Module instances of new structures (each needs a full operation extraction by
  gpurec.ops).  A profile splits one fresh candidate into its stages.
* extraction (``gpurec.ops.extract_operations``): vit_b_16, mobilenet_v3_large and resnet50 at
  batch 32 in both modes, the first call (``cold``: builds the model on the meta device and
  traces it) and the best of later calls (``warm``: interpretation of the cached trace; target
  for vit_b_16 under 1 s).

The JSON (``benchmarks/speed.json``) records the machine, its load and the library versions;
the timings move by tens of per cent with the load of a shared machine, so read them with it.

    gpurec report speed --measure   # measure (about a minute), then render
    gpurec report speed             # render the committed JSON
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpurec.dataset.store import atomic_write_text
from gpurec.reports.machine import describe

JSON_PATH = Path("benchmarks") / "speed.json"
TARGET_VIT_MS = 50.0          # one vit_b_16 prediction after the first call
TARGET_CANDIDATES_S = 80.0    # predict_many, mobilenet-sized candidates per second
TARGET_EXTRACT_S = 1.0        # vit_b_16 batch 32 extraction, warm
EXTRACT_MODELS = ("vit_b_16", "mobilenet_v3_large", "resnet50")
NAMES = ["mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "mnasnet0_5", "mnasnet1_0",
         "shufflenet_v2_x1_0", "efficientnet_b0", "squeezenet1_1"]


def _best(fn: Any, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def _import_ms() -> float:
    """``import gpurec, gpurec.model`` in a new interpreter (this one has imported them already)."""
    import subprocess
    import sys

    code = ("import time; t = time.perf_counter(); import gpurec, gpurec.model; "
            "print(1000 * (time.perf_counter() - t))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(res.stdout.strip().splitlines()[-1])


def _ensure_model(path: Path | None) -> Path:
    """The given or default model directory; timing a model other than the shipped one would
    describe a different predictor, so a missing one is an error."""
    from gpurec.model.persist import default_model_dir

    path = path or default_model_dir()
    if not (path / "manifest.json").exists():
        raise FileNotFoundError(f"no trained model at {path}: train one first (`gpurec train --out {path}`)")
    return path


def split_fresh_extraction(torchvision: Any, shape: tuple[int, ...], n: int = 10) -> dict[str, Any]:
    """Where extraction time goes for candidates of widths not seen before (the leaf memo is
    cleared first, so only shapes shared between these candidates are remembered)."""
    import gpurec.ops.extract as ex

    spent: dict[str, float] = {"torch.fx symbolic trace": 0.0, "meta kernels (leaves not memoised or analytic)": 0.0}
    originals = {"_trace": ex._trace, "_run_node": ex._run_node}

    def timed(label: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - t
        return wrapper

    modules = [torchvision.models.mobilenet_v2(width_mult=0.53 + 0.07 * i) for i in range(n)]
    ex._LEAF_MEMO.clear()  # nothing remembered from the candidates above
    ex._RECORD_MEMO.clear()
    ex._SETTINGS_MEMO.clear()
    ex._trace = timed("torch.fx symbolic trace", ex._trace)
    ex._run_node = timed("meta kernels (leaves not memoised or analytic)", ex._run_node)
    try:
        t0 = time.perf_counter()
        for m in modules:
            ex.extract_operations(m, shape, mode="inference", keep_sources=False, shared_records=True)
        total = time.perf_counter() - t0
    finally:
        ex._trace, ex._run_node = originals["_trace"], originals["_run_node"]
    spent["recording operations (settings, templates, ...)"] = total - sum(spent.values())
    return {"candidates": n, "ms_per_candidate": 1000 * total / n,
            "stages_ms": {k: 1000 * v / n for k, v in spent.items()}}


def measure_prediction(models_dir: str | None, gpu: str = "H100", candidates: int = 60) -> dict[str, Any]:
    """Prediction timings in this process (call it in a fresh one: see ``measure``)."""
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    import gpurec.model

    path = _ensure_model(Path(models_dir) if models_dir else None)
    t0 = time.perf_counter()
    p = gpurec.model.load_predictor(path, check_data=False)
    t_load = time.perf_counter() - t0
    out: dict[str, Any] = {"gpu": gpu, "import_ms": _import_ms(), "load_predictor_ms": t_load * 1000}
    results: list[dict[str, Any]] = []

    def result(label: str, value: float, unit: str, target: float | None = None) -> None:
        met = None if target is None else (value <= target if unit == "ms" else value >= target)
        results.append({"label": label, "value": value, "unit": unit, "target": target, "met": met})

    # -- one vit_b_16 prediction -----------------------------------------------------------------
    shape = (32, 3, 224, 224)
    t0 = time.perf_counter()
    p.predict("vit_b_16", shape, mode="inference", gpu=gpu)
    first = time.perf_counter() - t0
    _, med = _best(lambda: p.predict("vit_b_16", shape, mode="inference", gpu=gpu), 30)
    result("vit_b_16 first call (extraction + predict)", first * 1000, "ms")
    result("vit_b_16 later calls, median", med * 1000, "ms", TARGET_VIT_MS)
    est = p.predict("vit_b_16", shape, mode="inference", gpu=gpu)
    _, med_df = _best(lambda: p.predict("vit_b_16", shape, gpu=gpu).per_op, 10)
    result("vit_b_16 later call + per_op DataFrame", med_df * 1000, "ms")

    # -- predict_many ---------------------------------------------------------------------------
    n = candidates
    repeated = [(NAMES[i % len(NAMES)], (8, 3, 224, 224)) for i in range(n)]
    p.predict_many(repeated, mode="inference", gpu=gpu)  # warm the cache
    _, med = _best(lambda: p.predict_many(repeated, mode="inference", gpu=gpu), 5)
    result(f"predict_many, {n} cached candidates", n / med, "cand/s", TARGET_CANDIDATES_S)

    shapes = [(NAMES[i % len(NAMES)], (1 + i // len(NAMES), 3, 224, 224)) for i in range(n)]
    p.clear_cache()
    t0 = time.perf_counter()
    p.predict_many(shapes, mode="inference", gpu=gpu)
    dt = time.perf_counter() - t0
    result(f"predict_many, {n} new (name, shape) candidates", n / dt, "cand/s", TARGET_CANDIDATES_S)

    import torchvision

    widths = [0.5 + 0.05 * i for i in range(min(n, 20))]
    modules = [torchvision.models.mobilenet_v2(width_mult=w) for w in widths]
    p.clear_cache()
    t0 = time.perf_counter()
    p.predict_many([(m, (8, 3, 224, 224)) for m in modules], mode="inference", gpu=gpu)
    dt = time.perf_counter() - t0
    result(f"predict_many, {len(modules)} fresh nn.Module structures", len(modules) / dt, "cand/s",
           TARGET_CANDIDATES_S)
    t0 = time.perf_counter()
    p.predict_many([(m, (8, 3, 224, 224)) for m in modules], mode="inference", gpu=gpu)
    dt = time.perf_counter() - t0
    result(f"predict_many, same {len(modules)} nn.Modules again (hash + cache)", len(modules) / dt, "cand/s",
           TARGET_CANDIDATES_S)
    # The candidates/s target as stated in docs/speed.md: distinct, never-seen MobileNet-sized modules with random widths,
    # kernels and depths (gpurec.model.bench.random_mobilenet); median of three lists of 50.
    from gpurec.model.bench import random_mobilenet

    rates = []
    for rep in range(3):
        fresh = [random_mobilenet(10_000 + 100 * rep + i) for i in range(50)]
        t0 = time.perf_counter()
        p.predict_many([(m, (8, 3, 224, 224)) for m in fresh], mode="inference", gpu=gpu)
        rates.append(len(fresh) / (time.perf_counter() - t0))
    result("predict_many, 50 random MobileNet-like nn.Modules, never seen (median of 3 lists)",
           statistics.median(rates), "cand/s", TARGET_CANDIDATES_S)
    out["results"] = results

    # -- profile one fresh nn.Module candidate ----------------------------------------------------
    from gpurec.model.features import OpBlock, hardware_row
    from gpurec.model.predictor import structure_key
    from gpurec.ops import extract_operations

    m = torchvision.models.mobilenet_v2(width_mult=1.3)
    shape8 = (8, 3, 224, 224)
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    structure_key(m)
    stages["structure hash"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ops = extract_operations(m, shape8, mode="inference", keep_sources=False, shared_records=True)  # as predict's
    stages["gpurec.ops.extract_operations (fresh module)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    block = OpBlock.from_operations(ops, "inference")
    stages["op.features() + signatures -> arrays"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    p._make_entry("x", block, "inference")
    stages["coverage check"] = time.perf_counter() - t0
    hw = hardware_row(gpu)
    t0 = time.perf_counter()
    feats = p.builder.build(block, hw[None, :])
    stages["feature matrix (numpy)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for target, margin in (("time", feats.margin_time), ("power", feats.margin_power)):
        booster = p._boosters[target]["inference"]
        getattr(booster, "model", booster).predict(feats.X, margin)  # the booster itself, not its row memo
    stages["two booster calls"] = time.perf_counter() - t0
    out["fresh_candidate"] = {"operations": len(ops), "stages_ms": {k: 1000 * v for k, v in stages.items()}}
    out["fresh_extraction_split"] = split_fresh_extraction(torchvision, shape8)
    out["vit_b_16_estimate"] = str(est)
    return out


def measure_extraction(batch: int = 32, repeat: int = 5) -> dict[str, Any]:
    """Extraction timings in this process (call it in a fresh one: the first call is ``cold``)."""
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import torchvision  # noqa: F401  (import cost is not extraction cost)

    from gpurec.ops import extract_operations

    import_s = time.perf_counter() - t0
    rows = []
    for model in EXTRACT_MODELS:
        for mode in ("inference", "training"):
            shape = (batch, 3, 224, 224)
            t0 = time.perf_counter()
            ops = extract_operations(model, shape, mode=mode)
            cold = time.perf_counter() - t0
            warm = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                extract_operations(model, shape, mode=mode)
                warm = min(warm, time.perf_counter() - t0)
            rows.append({"model": model, "mode": mode, "ops": len(ops), "distinct": len({o.signature for o in ops}),
                         "cold_s": cold, "warm_s": warm})
    return {"batch": batch, "repeat": repeat, "import_torch_torchvision_s": import_s, "rows": rows}


def _in_fresh_process(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(fn, *args).result()


def measure(models_dir: Path | str | None = None, gpu: str = "H100", candidates: int = 60,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Both benchmarks, each in a fresh process, with the machine they ran on."""
    from gpurec.reports.machine import machine_info

    say = progress or (lambda msg: None)
    machine = machine_info()
    say("timing extraction (fresh process) ...")
    extraction = _in_fresh_process(measure_extraction)
    say("timing prediction (fresh process) ...")
    prediction = _in_fresh_process(measure_prediction, str(models_dir) if models_dir else None, gpu, candidates)
    try:
        machine["load_avg_1_5_15_min_after"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return {"machine": machine, "models_dir": str(models_dir or "models"), "extraction": extraction,
            "prediction": prediction}


def _verdict(met: bool | None) -> str:
    return "" if met is None else ("met" if met else "**not met**")


def render(data: dict[str, Any]) -> str:
    """docs/speed.md from a ``measure`` result."""
    from gpurec.reports.markdown import table

    m, pr, ex = data["machine"], data["prediction"], data["extraction"]
    after = m.get("load_avg_1_5_15_min_after")
    L = ["# Prediction speed", "",
         "_Generated by `gpurec report speed` from `benchmarks/speed.json`; `gpurec report speed --measure` "
         "re-measures.  Every number below was measured by `gpurec.reports.speed` on the machine named here._", "",
         f"Measured on {describe(m)}" + (f"; load average {after[0]:.2f} when it ended" if after else "")
         + f".  Models: `{data.get('models_dir', 'models')}`; GPU predicted for: {pr.get('gpu')}.  Each "
         "benchmark ran in a fresh Python process.  On a shared machine the timings move by tens of per cent "
         "with its load.", "",
         f"Targets: one vit_b_16 prediction ≤ {TARGET_VIT_MS:g} ms after the first call; `predict_many` ≥ "
         f"{TARGET_CANDIDATES_S:g} mobilenet-sized candidates per second; vit_b_16 extraction at batch "
         f"{ex.get('batch')} under {TARGET_EXTRACT_S:g} s warm.", "",
         "## Prediction", "",
         f"`import gpurec, gpurec.model` in a new interpreter {pr['import_ms']:.0f} ms; `load_predictor` "
         f"{pr['load_predictor_ms']:.0f} ms.", "",
         table(["benchmark", "value", "unit", "target", "verdict"],
               [[r["label"], f"{r['value']:.1f}", r["unit"],
                 "—" if r["target"] is None else (f"≤ {r['target']:g}" if r["unit"] == "ms" else f"≥ {r['target']:g}"),
                 _verdict(r["met"]) or "—"] for r in pr["results"]]), ""]
    fc = pr["fresh_candidate"]
    total = sum(fc["stages_ms"].values())
    L += [f"Where the time of one fresh mobilenet_v2 `nn.Module` candidate ({fc['operations']} operations, "
          f"{total:.0f} ms) goes:", "",
          table(["stage", "ms", "share"], [[k, f"{v:.1f}", f"{100 * v / total:.1f}%"]
                                           for k, v in fc["stages_ms"].items()]), ""]
    sp = pr["fresh_extraction_split"]
    L += [f"Extraction of {sp['candidates']} fresh mobilenet_v2 widths, leaf memo cleared first: "
          f"{sp['ms_per_candidate']:.1f} ms per candidate:", "",
          table(["stage", "ms per candidate", "share"],
                [[k, f"{v:.1f}", f"{100 * v / sp['ms_per_candidate']:.1f}%"] for k, v in sp["stages_ms"].items()]),
          "", f"The vit_b_16 estimate timed above: `{pr['vit_b_16_estimate']}`.", ""]
    L += ["## Extraction", "",
          f"`gpurec.ops.extract_operations` at batch {ex['batch']}, 224×224: cold = first call in a fresh process "
          f"(build on meta + trace + interpret), warm = best of {ex['repeat']} later calls.  Importing torch and "
          f"torchvision took {ex['import_torch_torchvision_s']:.2f} s.", "",
          table(["model", "mode", "ops", "distinct", "cold s", "warm s"],
                [[r["model"], r["mode"], r["ops"], r["distinct"], f"{r['cold_s']:.3f}", f"{r['warm_s']:.3f}"]
                 for r in ex["rows"]]), ""]
    vit = [r["warm_s"] for r in ex["rows"] if r["model"] == "vit_b_16"]
    if vit:
        L += [f"vit_b_16 warm: {max(vit):.3f} s, target {'met' if max(vit) < TARGET_EXTRACT_S else '**not met**'}.", ""]
    missed = [r["label"] for r in pr["results"] if r["met"] is False]
    L += ["## Verdict", "",
          ("Every prediction target is met on this run." if not missed else
           "Prediction targets not met on this run: " + "; ".join(missed) + "."), ""]
    return "\n".join(L)


def generate(root: Path | str = ".", measure_first: bool = False, progress: Callable[[str], None] | None = None,
             gpu: str = "H100", candidates: int = 60) -> str:
    """docs/speed.md under the repository ``root`` from benchmarks/speed.json; with
    ``measure_first`` the benchmarks run first (on this machine) and rewrite that JSON."""
    root = Path(root)
    path = root / JSON_PATH
    if measure_first:
        data = measure(root / "models", gpu, candidates, progress)
        atomic_write_text(path, json.dumps(data, indent=1) + "\n")
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `gpurec report speed --measure` (about a minute)")
    text = render(json.loads(path.read_text()))
    atomic_write_text(root / "docs" / "speed.md", text)
    return text
