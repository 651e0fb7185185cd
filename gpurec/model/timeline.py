"""The step as two queues: the host issues operations, the GPU runs them.

Eager PyTorch issues operation *i* once the host has finished dispatching it (Python, ATen,
autograd, the launch), and the GPU starts it at the later of that issue time and the end of
the GPU's previous work. So with per-operation host dispatch times ``d`` and GPU times ``g``:

    issue_i = d_1 + ... + d_i                       (host queue)
    end_i   = max(issue_i, end_{i-1}) + g_i         (GPU queue)

which unrolls to ``end_n = G_n + max_k(issue_k - G_{k-1})`` with ``G`` the running sum of
``g``: one cumulative maximum, so thousands of networks simulate in a few vectorised passes.

* ``gpu_time_ms`` = G_n: the GPU's work alone, the step replayed as one CUDA graph;
* ``time_ms`` = end_n: the eager step on that host (it ends when the GPU finishes);
* ``host_time_ms`` = issue_n: the host's issue time;
* ``bound`` = ``"host"`` when the host makes the step at least ``HOST_BOUND_RATIO`` x longer
  than the GPU alone, else ``"gpu"``.

A training step's operations are simulated in extraction order, each with its forward and
backward as one unit (the extracted operation); the backward pass really runs in reverse
order, which moves work between the queues but not their sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpurec.results import HOST_BOUND_RATIO, bound_of  # noqa: F401 - the one bound rule, re-exported


@dataclass(frozen=True)
class Timeline:
    """Simulated steps, one entry per network (arrays of equal length)."""

    gpu_time_ms: np.ndarray
    time_ms: np.ndarray
    host_time_ms: np.ndarray
    gpu_wait_ms: np.ndarray  # time the GPU sits waiting for the host: time_ms - gpu_time_ms

    @property
    def bound(self) -> np.ndarray:
        return np.where(self.time_ms >= HOST_BOUND_RATIO * self.gpu_time_ms, "host", "gpu")


def simulate(gpu_ms: np.ndarray, host_ms: np.ndarray, offsets: np.ndarray) -> Timeline:
    """Two-queue simulation of each network ``offsets[j]:offsets[j + 1]`` (operations in issue order)."""
    g = np.asarray(gpu_ms, dtype=np.float64)
    d = np.asarray(host_ms, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    if n <= 0:
        z = np.zeros(0)
        return Timeline(z, z, z, z)
    gpu_t, eager_t, host_t = np.empty(n), np.empty(n), np.empty(n)
    for j in range(n):
        a, b = offsets[j], offsets[j + 1]
        if b <= a:
            gpu_t[j] = eager_t[j] = host_t[j] = 0.0
            continue
        G = np.cumsum(g[a:b])
        issue = np.cumsum(d[a:b])
        G_prev = G - g[a:b]
        lead = np.maximum.accumulate(issue - G_prev)  # the host's lead over the GPU's queue, worst so far
        gpu_t[j] = G[-1]
        eager_t[j] = G[-1] + max(0.0, float(lead[-1]))
        host_t[j] = issue[-1]
    return Timeline(gpu_t, eager_t, host_t, eager_t - gpu_t)


def simulate_reference(gpu_ms: np.ndarray, host_ms: np.ndarray) -> float:
    """The same recurrence, one operation at a time (the definition; tests compare against it)."""
    issue = end = 0.0
    for g, d in zip(gpu_ms, host_ms, strict=True):
        issue += float(d)
        end = max(issue, end) + float(g)
    return end
