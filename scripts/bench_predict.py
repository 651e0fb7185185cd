"""Measure prediction speed against the targets of gpurec.model, and say where the time goes.

    PYTHONPATH=. python3 scripts/bench_predict.py [--models models/] [--gpu H100]

Targets: one vit_b_16 prediction <= 50 ms after the first call; predict_many >= 50
mobilenet-sized candidates per second. Three kinds of candidate lists are timed, because
they cost very different amounts: repeated candidates (operation cache hits), new input shapes
of torchvision names, and fresh nn.Module instances of new structures (each needs a full
operation extraction by gpurec.ops). A profile splits one fresh candidate into its stages.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _best(fn: Any, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def _ensure_model(path: Path | None) -> Path:
    """The given/default model directory, or a quick model trained on the test fixture."""
    from gpurec.model.persist import default_model_dir

    path = path or default_model_dir()
    if (path / "manifest.json").exists():
        return path
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / "gpurec-bench-model"
    if not (tmp / "manifest.json").exists():
        from gpurec.model import train

        print(f"no model at {path}: training a quick one on tests/fixtures/model into {tmp}")
        train(Path(__file__).resolve().parent.parent / "tests/fixtures/model", tmp, tune_trials=0,
              baselines=False, max_rounds=200, log=lambda s: None)
    return tmp


def split_fresh_extraction(torchvision: Any, shape: tuple[int, ...], n: int = 10) -> None:
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
    ex._trace = timed("torch.fx symbolic trace", ex._trace)
    ex._run_node = timed("meta kernels (leaves not memoised or analytic)", ex._run_node)
    try:
        t0 = time.perf_counter()
        for m in modules:
            ex.extract_operations(m, shape, mode="inference", keep_sources=False)
        total = time.perf_counter() - t0
    finally:
        ex._trace, ex._run_node = originals["_trace"], originals["_run_node"]
    print(f"\nextraction of {n} fresh mobilenet_v2 widths, leaf memo cleared first: {1000 * total / n:.1f} ms "
          "per candidate")
    for label, v in spent.items():
        print(f"  {label:48s} {1000 * v / n:8.1f} ms  {100 * v / total:5.1f}%")
    rest = total - sum(spent.values())
    print(f"  {'recording operations (settings, templates, ...)':48s} {1000 * rest / n:8.1f} ms  {100 * rest / total:5.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=None)
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--candidates", type=int, default=60)
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t0 = time.perf_counter()
    import gpurec
    import gpurec.model

    path = _ensure_model(a.models)
    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    p = gpurec.model.load_predictor(path, check_data=False)
    t_load = time.perf_counter() - t0
    print(f"cores: {os.cpu_count()}, torch threads: {torch.get_num_threads()}, model: {path}")
    print(f"import gpurec + model dir check: {t_import * 1000:.0f} ms, load_predictor: {t_load * 1000:.0f} ms")
    results: list[tuple[str, float, str, bool | None]] = []

    # -- one vit_b_16 prediction -----------------------------------------------------------------
    t0 = time.perf_counter()
    p.predict("vit_b_16", (32, 3, 224, 224), mode="inference", gpu=a.gpu)
    first = time.perf_counter() - t0
    best, med = _best(lambda: p.predict("vit_b_16", (32, 3, 224, 224), mode="inference", gpu=a.gpu), 30)
    results.append(("vit_b_16 first call (extraction + predict)", first * 1000, "ms", None))
    results.append(("vit_b_16 later calls, median", med * 1000, "ms", med * 1000 <= 50))
    est = p.predict("vit_b_16", (32, 3, 224, 224), mode="inference", gpu=a.gpu)
    _, med_df = _best(lambda: p.predict("vit_b_16", (32, 3, 224, 224), gpu=a.gpu).per_op, 10)
    results.append(("vit_b_16 later call + per_op DataFrame", med_df * 1000, "ms", None))

    # -- predict_many ---------------------------------------------------------------------------
    n = a.candidates
    names = ["mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "mnasnet0_5", "mnasnet1_0",
             "shufflenet_v2_x1_0", "efficientnet_b0", "squeezenet1_1"]
    repeated = [(names[i % len(names)], (8, 3, 224, 224)) for i in range(n)]
    p.predict_many(repeated, mode="inference", gpu=a.gpu)  # warm the cache
    best, med = _best(lambda: p.predict_many(repeated, mode="inference", gpu=a.gpu), 5)
    results.append((f"predict_many, {n} cached candidates", n / med, "cand/s", n / med >= 50))

    shapes = [(names[i % len(names)], (1 + i // len(names), 3, 224, 224)) for i in range(n)]
    p.clear_cache()
    t0 = time.perf_counter()
    p.predict_many(shapes, mode="inference", gpu=a.gpu)
    dt = time.perf_counter() - t0
    results.append((f"predict_many, {n} new (name, shape) candidates", n / dt, "cand/s", n / dt >= 50))

    import torchvision

    widths = [0.5 + 0.05 * i for i in range(min(n, 20))]
    modules = [torchvision.models.mobilenet_v2(width_mult=w) for w in widths]
    p.clear_cache()
    t0 = time.perf_counter()
    p.predict_many([(m, (8, 3, 224, 224)) for m in modules], mode="inference", gpu=a.gpu)
    dt = time.perf_counter() - t0
    results.append((f"predict_many, {len(modules)} fresh nn.Module structures", len(modules) / dt, "cand/s",
                    len(modules) / dt >= 50))
    t0 = time.perf_counter()
    p.predict_many([(m, (8, 3, 224, 224)) for m in modules], mode="inference", gpu=a.gpu)
    dt = time.perf_counter() - t0
    results.append((f"predict_many, same {len(modules)} nn.Modules again (hash + cache)", len(modules) / dt,
                    "cand/s", len(modules) / dt >= 50))

    print()
    for label, value, unit, ok in results:
        verdict = "" if ok is None else ("  PASS" if ok else "  FAIL")
        print(f"  {label:58s} {value:10.1f} {unit}{verdict}")

    # -- profile one fresh nn.Module candidate ----------------------------------------------------
    from gpurec.model.features import OpBlock, hardware_row
    from gpurec.model.predictor import structure_key
    from gpurec.ops import extract_operations

    m = torchvision.models.mobilenet_v2(width_mult=1.3)
    shape = (8, 3, 224, 224)
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    structure_key(m)
    stages["structure hash"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ops = extract_operations(m, shape, mode="inference", keep_sources=False)
    stages["gpurec.ops.extract_operations (fresh module)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    block = OpBlock.from_operations(ops, "inference")
    stages["op.features() + signatures -> arrays"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    entry = p._make_entry("x", block, "inference")
    stages["coverage check"] = time.perf_counter() - t0
    hw = hardware_row(a.gpu)
    t0 = time.perf_counter()
    feats = p.builder.build(block, hw[None, :])
    stages["feature matrix (numpy)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    p._boosters["time"]["inference"].predict(feats.X, feats.margin_time)
    p._boosters["power"]["inference"].predict(feats.X, feats.margin_power)
    stages["two booster calls"] = time.perf_counter() - t0
    del entry
    total = sum(stages.values())
    print(f"\nprofile of one fresh mobilenet_v2 nn.Module ({len(ops)} operations), {total * 1000:.0f} ms:")
    for k, v in stages.items():
        print(f"  {k:48s} {v * 1000:8.1f} ms  {100 * v / total:5.1f}%")
    split_fresh_extraction(torchvision, shape)
    try:
        import cProfile
        import pstats

        m2 = torchvision.models.mobilenet_v2(width_mult=1.35)
        prof = cProfile.Profile()
        prof.enable()
        extract_operations(m2, shape, mode="inference", keep_sources=False)
        prof.disable()
        print("\ninside extract_operations (cumulative, top 8):")
        st = pstats.Stats(prof)
        st.sort_stats("cumulative")
        rows = sorted(((v[3], f) for f, v in st.stats.items()), reverse=True)  # type: ignore[attr-defined]
        shown = 0
        for cum, (file, line, fn) in rows:
            if "bench_predict" in file or fn in ("<module>",):
                continue
            print(f"  {cum * 1000:8.1f} ms  {Path(file).name}:{line} {fn}")
            shown += 1
            if shown >= 8:
                break
    except Exception as exc:  # profiling is informative only
        print(f"(profile failed: {exc})")
    print(f"\nvit_b_16 estimate: {est}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
