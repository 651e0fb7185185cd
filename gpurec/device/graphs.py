"""Running a step without the host: capture it once as a CUDA graph, replay it, time it on
the GPU.  A replayed graph issues every kernel with no Python, ATen, autograd or per-kernel
launch work, so its time is the GPU's own work (the issue's measurements: graph replay
repeated within 1.6 % across H100 leases while eager time moved up to 2x).

``CudaBackend`` is the real path; tests pass a backend with the same three methods.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol


class CaptureFailed(RuntimeError):
    """The step cannot be captured as a CUDA graph (host synchronisation, CPU tensors, ...)."""


class Replay(Protocol):
    def replay(self) -> None: ...


class Mark(Protocol):
    def synchronize(self) -> None: ...


class StepBackend(Protocol):
    """What the measurement needs from the device: capture, GPU-side timing, synchronise,
    and a mark in the stream to wait for (pacing)."""

    def capture(self, fn: Callable[[], None], reps: int) -> Replay: ...

    def time_gpu_ms(self, fn: Callable[[], None], calls: int) -> float: ...

    def sync(self) -> None: ...

    def mark(self) -> Mark: ...

    def peak_memory_bytes(self, fn: Callable[[], None]) -> int | None: ...

    def allocated_bytes(self) -> int | None: ...


class _CudaReplay:
    def __init__(self, graph: Any, keep: list[Any]):
        self.graph = graph
        self._keep = keep  # tensors the graph reads or writes must outlive it

    def replay(self) -> None:
        self.graph.replay()


class CudaBackend:
    """CUDA graphs and CUDA events on the current device."""

    def __init__(self, warmup_calls: int = 3):
        self.warmup_calls = warmup_calls

    def capture(self, fn: Callable[[], None], reps: int) -> Replay:
        """Capture ``reps`` back-to-back calls of ``fn`` as one graph (warmed up on a side
        stream first, as CUDA graph capture requires)."""
        import torch

        try:
            torch.cuda.empty_cache()  # the graph allocates from its own pool: free the eager cache
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.warmup_calls):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(reps):
                    fn()
            torch.cuda.synchronize()
            graph.replay()  # a first replay surfaces replay-time errors here, not in a window
            torch.cuda.synchronize()
        except Exception as exc:
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
            raise CaptureFailed(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}") from exc
        return _CudaReplay(graph, [])

    def time_gpu_ms(self, fn: Callable[[], None], calls: int) -> float:
        """Milliseconds between CUDA events around ``calls`` calls of ``fn``."""
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize()

    def mark(self) -> Mark:
        import torch

        ev = torch.cuda.Event()
        ev.record()
        return ev

    def peak_memory_bytes(self, fn: Callable[[], None]) -> int | None:
        """The allocator's peak over one call of ``fn`` (weights, inputs and everything the
        call allocates), as ``torch.cuda.max_memory_allocated`` reports it."""
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())

    def allocated_bytes(self) -> int | None:
        """What the allocator holds now (``torch.cuda.memory_allocated``): before a row is
        set up, whatever earlier rows left behind, which the row's peak then includes."""
        import torch

        return int(torch.cuda.memory_allocated())


class Paced:
    """Calls ``fn`` with at most ``depth`` calls queued on the GPU.

    Without pacing the host enqueues seconds of work ahead of the GPU: a window then closes
    seconds after its closing tick and timed blocks wait behind the backlog.  Waiting on the
    oldest call keeps the GPU fed (``depth`` >= 2) while the host stays close to it."""

    def __init__(self, fn: Callable[[], None], backend: StepBackend, depth: int = 2):
        from collections import deque

        self.fn = fn
        self.backend = backend
        self.depth = max(1, depth)
        self._marks: Any = deque()

    def __call__(self) -> None:
        self.fn()
        self._marks.append(self.backend.mark())
        while len(self._marks) > self.depth:
            self._marks.popleft().synchronize()


class CpuBackend:
    """The CPU stand-in for :class:`CudaBackend`: nothing to capture
    (every row falls back to eager timing, with the reason), wall-clock timing."""

    def capture(self, fn: Callable[[], None], reps: int) -> Any:
        raise CaptureFailed("CUDA graphs need a CUDA device")

    def time_gpu_ms(self, fn: Callable[[], None], calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) * 1e3

    def sync(self) -> None:
        pass

    def mark(self) -> Any:
        return _NoMark()

    def peak_memory_bytes(self, fn: Callable[[], None]) -> int | None:
        """No device allocator to read on the CPU: the row says so with ``None``."""
        fn()
        return None

    def allocated_bytes(self) -> int | None:
        """No device allocator on the CPU."""
        return None


class _NoMark:
    def synchronize(self) -> None:
        pass
