"""Peak-memory estimate against the measured peaks, per group, in seconds after the first run.

Why: extracting every measured network takes minutes; iterating on gpurec.ops.memory needs
seconds.  The extracted operations are cached (pickle, under out/, git-ignored) per (set key,
mode, precision); the terms and the fitted estimate are recomputed from them on every run.

    PYTHONPATH=. nice -n 15 python scripts/memory_eval.py [--refit] [--arch PREFIX] [--rows]

``--refit`` refits the coefficients on the training architectures' trusted peaks (in memory,
nothing written) so a changed analytic part is judged with its own fit, as ``tools fit-memory``
would make it.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

CACHE = Path("out/memory_eval_ops.pkl")


def load_ops(table):
    from gpurec.ops import extract_operations
    from gpurec.sets import parse_set_key

    cache = pickle.loads(CACHE.read_bytes()) if CACHE.exists() else {}
    keys = sorted({(r.set_key, r.mode, r.precision) for r in table.itertuples(index=False)})
    missing = [k for k in keys if k not in cache]
    for n, key in enumerate(missing):
        s = parse_set_key(key[0])
        cache[key] = extract_operations(s.arch, s.input_shape, mode=key[1], keep_sources=False, precision=key[2])
        if n % 50 == 49:
            print(f"extracted {n + 1}/{len(missing)}", file=sys.stderr)
    if missing:
        CACHE.parent.mkdir(exist_ok=True)
        CACHE.write_bytes(pickle.dumps(cache))
    return cache


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--refit", action="store_true")
    p.add_argument("--arch", default="")
    p.add_argument("--rows", action="store_true", help="print every trusted row of the chosen archs")
    p.add_argument("--all", action="store_true", help="include leftover-suspect rows")
    a = p.parse_args()
    from gpurec.model.fitting.memory_fit import fit_memory, peak_table
    from gpurec.model.memory import load_memory_fit
    from gpurec.ops.memory import analytic_memory, memory_terms

    table = peak_table()
    if not a.all:
        table = table[table["leftover_suspect"] == ""].reset_index(drop=True)
    ops = load_ops(table)
    t0 = time.perf_counter()
    terms = [memory_terms(ops[(r.set_key, r.mode, r.precision)], r.mode) for r in table.itertuples(index=False)]
    print(f"memory_terms over {len(terms)} rows: {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    fit = fit_memory(table, terms) if a.refit else load_memory_fit("models")
    assert fit is not None
    if a.refit:
        for m, c in fit.terms.items():
            print(m, {k: round(v, 4) if k != "floor_bytes" else round(v / 1e6, 1) for k, v in c.items()})
    groups: dict[tuple, list] = {}
    for r, t in zip(table.itertuples(index=False), terms, strict=True):
        est = fit.apply(t).total_bytes
        err = (est / r.measured_bytes - 1) * 100
        aerr = (analytic_memory(t).total_bytes / r.measured_bytes - 1) * 100
        groups.setdefault((r.split, r.family, r.mode, r.precision), []).append((err, aerr))
        if a.rows and r.arch.startswith(a.arch) and (a.arch or False):
            w = fit.apply(t)
            print(f"{r.set_key:28s} {r.mode:9s} {r.precision:10s} meas {r.measured_bytes / 1e9:7.3f} est "
                  f"{est / 1e9:7.3f} ({err:+6.1f}%)  params {t.params_bytes / 1e9:.3f} act "
                  f"{t.activations_bytes / 1e9:.3f} rnn {t.rnn_term_bytes / 1e9:.3f} ws {w.workspace_bytes / 1e9:.3f}"
                  f" saved {t.saved_bytes / 1e9:.3f} diff {(r.measured_bytes - est) / 1e9:+.3f}")
    tot: dict[str, list[int]] = {}
    for k in sorted(groups):
        errs = groups[k]
        ok = sum(abs(e) <= 15 for e, _ in errs)
        tot.setdefault(k[0], [0, 0])
        tot[k[0]][0] += ok
        tot[k[0]][1] += len(errs)
        print(f"{k[0]:9s} {k[1]:12s} {k[2]:9s} {k[3]:10s} {len(errs):4d} within {ok:4d} "
              f"mae {sum(abs(e) for e, _ in errs) / len(errs):5.1f}% mean {sum(e for e, _ in errs) / len(errs):+5.1f}%")
    for s, (ok, n) in tot.items():
        print(f"{s}: {ok} of {n} within 15%")


if __name__ == "__main__":
    main()
