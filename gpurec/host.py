"""Facts about the host machine (the CPU launches every kernel, so it is provenance)."""

from __future__ import annotations

import platform


def host_cpu() -> str:
    """This machine's CPU model name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
