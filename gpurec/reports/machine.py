"""Where a benchmark ran: committed timings are only meaningful next to the machine, its
load and the library versions that produced them."""

from __future__ import annotations

import datetime as dt
import os
import platform
from typing import Any


def machine_info() -> dict[str, Any]:
    """CPU, cores, load average, library versions and the UTC time, for a benchmark's JSON."""
    import torch
    import torchvision

    from gpurec.host import host_cpu

    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"host_cpu": host_cpu(), "machine": platform.machine(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_avg_1_5_15_min": load,
            "python": platform.python_version(), "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")}


def describe(m: dict[str, Any]) -> str:
    """One sentence naming the machine a benchmark JSON was measured on."""
    load = m.get("load_avg_1_5_15_min")
    load_s = f", load average {load[0]:.2f} (1 min) when it started" if load else ""
    return (f"{m.get('host_cpu', '?')} ({m.get('machine', '?')}, {m.get('cores', '?')} cores, "
            f"torch threads {m.get('torch_threads', '?')}{load_s}), Python {m.get('python', '?')}, "
            f"torch {m.get('torch', '?')}, torchvision {m.get('torchvision', '?')}, on {m.get('date_utc', '?')} UTC")
