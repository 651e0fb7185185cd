"""Re-run the hand-made mutations of the measurement, window and timeline code against the tests.

Each mutant replaces one exact piece of source text (which must occur once), runs the given test
files, records whether they failed (killed) or passed (survived), and restores the file, also on
Ctrl-C.  Run from the repository root:

    PYTHONPATH=. python tests/mutants.py                 # every mutant, the default test files
    PYTHONPATH=. python tests/mutants.py iqr median      # only mutants whose name contains a word
    PYTHONPATH=. python tests/mutants.py --tests tests/test_measure.py

Prints one line per mutant and a JSON summary; exits 1 if any mutant survived.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURE = "gpurec/collect/measure.py"
WINDOW = "gpurec/device/window.py"
TIMELINE = "gpurec/model/timeline.py"
RESULTS = "gpurec/results.py"
DEFAULT_TESTS = ("tests/test_measure_mutants.py", "tests/test_measure.py", "tests/test_model_host.py")


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str


MUTANTS = [
    Mutant("host-free dynamic energy without idle subtraction", MEASURE,
           'row["gpu_dynamic_energy_mj"] = (m.power_w - idle_power_w) * gpu_ms',
           'row["gpu_dynamic_energy_mj"] = m.power_w * gpu_ms'),
    Mutant("network dynamic energy without idle subtraction", MEASURE,
           'row["dynamic_energy_mj"] = (row["power_w"] - idle_power_w) * row["time_ms"]',
           'row["dynamic_energy_mj"] = row["power_w"] * row["time_ms"]'),
    Mutant("measure_op grad mode swapped", MEASURE,
           "    ctx = torch.inference_mode() if inference else torch.enable_grad()\n    with ctx:\n"
           "        row = _first_call(step, backend)\n        for _ in range(2):",
           "    ctx = torch.enable_grad() if inference else torch.inference_mode()\n    with ctx:\n"
           "        row = _first_call(step, backend)\n        for _ in range(2):"),
    Mutant("iqr as q[2]-q[1]", MEASURE, "return med, q[2] - q[0]", "return med, q[2] - q[1]"),
    Mutant("median replaced by mean", MEASURE, "med = statistics.median(values)", "med = statistics.mean(values)"),
    Mutant("network host_ms from the block's total time", MEASURE,
           "host = timed_blocks(step, backend, 1, cfg.eager_blocks + 4)[0]",
           "host = timed_blocks(step, backend, 1, cfg.eager_blocks + 4)[1]"),
    Mutant("network host block count 1", MEASURE,
           "host = timed_blocks(step, backend, 1, cfg.eager_blocks + 4)[0]",
           "host = timed_blocks(step, backend, 1, 1)[0]"),
    Mutant("_power_ok always true", MEASURE,
           "def _power_ok(m: Measurement, idle_power_w: float | None, power_limit_w: float | None) -> bool:\n",
           "def _power_ok(m: Measurement, idle_power_w: float | None, power_limit_w: float | None) -> bool:\n"
           "    return True\n"),
    Mutant("window deadline ignores not_before_s", WINDOW,
           "            deadline = max(deadline, not_before_s)", "            pass"),
    Mutant("last_tick().t_s <= after_s changed to <", WINDOW,
           "while s.last_tick().t_s <= after_s:", "while s.last_tick().t_s < after_s:"),
    Mutant("after_s not advanced to the last tick (unthreaded)", WINDOW,
           "after_s = max(after_s, s.last_tick().t_s)", "after_s = after_s"),
    Mutant("timer started before the energy window opens", MEASURE,
           "    start = monitor.begin_window(busy, extra_timeout_s)\n    times = timed()\n",
           "    times = timed()\n    start = monitor.begin_window(busy, extra_timeout_s)\n"),
    Mutant("HOST_BOUND_RATIO 1.2 -> 2.0", RESULTS, "HOST_BOUND_RATIO = 1.2", "HOST_BOUND_RATIO = 2.0"),
    Mutant("bound_of ratio 1.2 -> 2.0", RESULTS,
           'return "host" if time_ms >= HOST_BOUND_RATIO * gpu_time_ms else "gpu"',
           'return "host" if time_ms >= 2.0 * gpu_time_ms else "gpu"'),
]


def run_mutant(m: Mutant, tests: list[str]) -> dict[str, object]:
    path = ROOT / m.path
    original = path.read_text()
    if original.count(m.old) != 1:
        return {"mutant": m.name, "result": f"not applied: the text occurs {original.count(m.old)} times"}
    t0 = time.perf_counter()
    try:
        path.write_text(original.replace(m.old, m.new))
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd=ROOT, capture_output=True, text=True)
    finally:
        path.write_text(original)
    tail = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))][:1]
    result = "killed" if proc.returncode == 1 else "survived" if proc.returncode == 0 else f"error rc={proc.returncode}"
    return {"mutant": m.name, "file": m.path, "result": result, "by": tail[0] if tail else "",
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str]) -> int:
    tests = list(DEFAULT_TESTS)
    if "--tests" in argv:
        i = argv.index("--tests")
        tests, argv = argv[i + 1:], argv[:i]
    chosen = [m for m in MUTANTS if not argv or any(w.lower() in m.name.lower() for w in argv)]
    results = []
    for m in chosen:
        r = run_mutant(m, tests)
        print(f"{r['result']:>9}  {m.name}  {r.get('by', '')}", flush=True)
        results.append(r)
    print(json.dumps(results, indent=1))
    return 1 if any(r["result"] != "killed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
