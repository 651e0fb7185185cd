"""SM clock sweeps, for users who own their GPU.

Every lock is paired with a reset, on normal exit, on exceptions and on SIGINT/SIGTERM.
gpurec never calls this unless the user passed ``--sm-clocks`` *and* confirmed they own
the GPU; on lent or shared machines clocks are only observed.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from gpurec.device.errors import ClockLockNotPermitted
from gpurec.device.nvml import GPU


@contextlib.contextmanager
def locked_sm_clock(gpu: GPU, clock_mhz: int, *, owned: bool) -> Iterator[int]:
    """Lock ``gpu``'s SM clock at ``clock_mhz`` for the block; always restore afterwards."""
    if not owned:
        raise ClockLockNotPermitted(
            "Refusing to lock clocks: pass --i-own-this-gpu only on a GPU you own. "
            "Shared and lent GPUs are measured at their default clocks."
        )
    previous: dict[int, Any] = {}

    def _restore_and_reraise(signum: int, frame: Any) -> None:
        gpu.reset_sm_clock()
        handler = previous.get(signum)
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        signal.raise_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, _restore_and_reraise)
        except ValueError:  # not the main thread: rely on the finally below
            pass
    try:
        gpu.lock_sm_clock(clock_mhz)
        yield clock_mhz
    finally:
        try:
            gpu.reset_sm_clock()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def parse_clock_list(text: str | None) -> list[int]:
    """``"1095,1410,1980"`` -> [1095, 1410, 1980]; empty means default clocks only."""
    if not text:
        return []
    try:
        clocks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ValueError(f"--sm-clocks takes MHz values such as 1095,1410,1980, not '{text}'") from exc
    if any(c <= 0 for c in clocks):
        raise ValueError("--sm-clocks values must be positive MHz")
    return clocks
