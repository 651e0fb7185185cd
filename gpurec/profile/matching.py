"""Offline kernel matching between the framework trace and the ncu report.

Timestamps are useless here (ncu serialises and replays kernels), so, as in the method,
kernels are matched on attributes both tools record: the kernel name (normalised), the
grid and block dimensions, registers per thread and the share of iteration time. The
pairing is an order-preserving global alignment (Needleman-Wunsch without gap penalty,
i.e. a maximum-weight common subsequence): both tools see the kernels in launch order,
so a dropped or extra kernel on one side only costs that kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

# Score weights; a pair is admissible only with some name agreement and score >= MIN_SCORE.
W_NAME = 0.5
W_GRID = 0.2
W_BLOCK = 0.2
W_REGS = 0.05
W_DUR = 0.05
MIN_SCORE = 0.5


def _strip_brackets(text: str, open_ch: str, close_ch: str) -> str:
    out = []
    depth = 0
    for ch in text:
        if ch == open_ch:
            depth += 1
        elif ch == close_ch and depth > 0:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _itanium_qualified_name(mangled: str) -> str | None:
    """The qualified function name of an Itanium-mangled symbol, template arguments left out.

    The trace sometimes keeps a kernel's mangled name (cuDNN's CUTLASS kernels) where ncu
    demangles it: ``_ZN17cutlass__5x_cudnn6KernelINS_...`` -> ``cutlass__5x_cudnn::Kernel``.
    Only the leading nested (``_ZN...``) or plain (``_Z<len>name``) name is read.
    """
    m = re.match(r"_Z(N?)", mangled)
    if not m:
        return None
    i, parts = m.end(), []
    while i < len(mangled) and mangled[i].isdigit():
        j = i
        while j < len(mangled) and mangled[j].isdigit():
            j += 1
        n = int(mangled[i:j])
        parts.append(mangled[j:j + n])
        i = j + n
        if not m.group(1):
            break  # a plain name has one component
    return "::".join(parts) if parts else None


def normalize_kernel_name(name: str) -> str:
    """Demangled kernel name -> qualified function name without return type, templates, args.

    ``void at::native::vectorized_elementwise_kernel<4, F, A>(int, F, A)`` ->
    ``at::native::vectorized_elementwise_kernel``; plain names (cuDNN, cuBLAS) pass through;
    mangled names (``_Z...``) are reduced to their qualified name first.
    """
    s = (name or "").strip()
    if s.startswith("_Z"):
        s = _itanium_qualified_name(s) or s
    s = s.replace("(anonymous namespace)", "anon")
    s = _strip_brackets(s, "<", ">")
    s = _strip_brackets(s, "(", ")")
    s = s.strip()
    for prefix in ("void ", "static ", "__global__ "):
        if s.startswith(prefix):
            s = s[len(prefix):]
    return re.sub(r"\s+", "", s)


def kernel_family(norm_name: str) -> str:
    """Coarser key: digits dropped, so tile-size variants of one library kernel agree."""
    return re.sub(r"\d+", "#", norm_name)


@dataclass
class MatchResult:
    """Pairs (trace_idx, ncu_idx, score) and the kernels left over on each side."""

    pairs: list[tuple[int, int, float]]
    unmatched_trace: list[int] = field(default_factory=list)
    unmatched_ncu: list[int] = field(default_factory=list)

    @property
    def n_matched(self) -> int:
        return len(self.pairs)


def _ids(values: list[object]) -> np.ndarray:
    table: dict[object, int] = {}
    return np.array([table.setdefault(v, len(table)) for v in values], dtype=np.int64)


def _dims_key(value: object) -> object:
    if isinstance(value, (tuple, list)) and len(value) == 3:
        return tuple(int(v) for v in value)
    return None


def _dims_equal(a: list[object], b: list[object], a_prod: np.ndarray, b_prod: np.ndarray) -> np.ndarray:
    """Equal 3-D dims where both known; else equal products (ncu launch__*_size)."""
    keys_a = [_dims_key(v) for v in a]
    keys_b = [_dims_key(v) for v in b]
    ids = _ids(keys_a + keys_b)
    ia, ib = ids[: len(a)], ids[len(a):]
    eq = ia[:, None] == ib[None, :]
    known_a = np.array([k is not None for k in keys_a])
    known_b = np.array([k is not None for k in keys_b])
    both = known_a[:, None] & known_b[None, :]
    prod_eq = (a_prod[:, None] == b_prod[None, :]) & np.isfinite(a_prod)[:, None] & np.isfinite(b_prod)[None, :]
    return np.where(both, eq, prod_eq)


def _prod(values: list[object], fallback: pd.Series | None) -> np.ndarray:
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        k = _dims_key(v)
        if k is not None:
            out[i] = float(k[0] * k[1] * k[2])
        elif fallback is not None:
            out[i] = float(fallback.iloc[i])
    return out


def similarity_matrix(trace_k: pd.DataFrame, ncu_k: pd.DataFrame) -> np.ndarray:
    """Score in [0, 1] for every (trace kernel, ncu kernel) pair; -inf where inadmissible."""
    n, m = len(trace_k), len(ncu_k)
    if n == 0 or m == 0:
        return np.zeros((n, m))
    tn = [normalize_kernel_name(x) for x in trace_k["name"]]
    nn_ = [normalize_kernel_name(x) for x in ncu_k["name"]]
    ids = _ids(tn + nn_)
    name_eq = ids[:n, None] == ids[None, n:]
    short = _ids([x.rsplit("::", 1)[-1] for x in tn + nn_])  # tools may differ in namespaces
    short_eq = short[:n, None] == short[None, n:]
    fam = _ids([kernel_family(x) for x in tn + nn_])
    fam_eq = fam[:n, None] == fam[None, n:]
    name_s = np.where(name_eq, 1.0, np.where(short_eq, 0.8, np.where(fam_eq, 0.5, 0.0)))

    tg, ng = list(trace_k["grid"]), list(ncu_k["grid"])
    tb, nb = list(trace_k["block"]), list(ncu_k["block"])
    grid_eq = _dims_equal(tg, ng, _prod(tg, None), _prod(ng, ncu_k.get("launch__grid_size")))
    block_eq = _dims_equal(tb, nb, _prod(tb, None), _prod(nb, ncu_k.get("launch__block_size")))

    tr = pd.to_numeric(trace_k.get("registers", pd.Series([np.nan] * n)), errors="coerce").to_numpy(float)
    nr = pd.to_numeric(ncu_k.get("launch__registers_per_thread", pd.Series([np.nan] * m)),
                       errors="coerce").to_numpy(float)
    regs_known = np.isfinite(tr)[:, None] & np.isfinite(nr)[None, :]
    regs_s = np.where(regs_known, (tr[:, None] == nr[None, :]).astype(float), 0.5)

    td = trace_k["dur_us"].to_numpy(float)
    nd = pd.to_numeric(ncu_k.get("gpu__time_duration.sum", pd.Series([np.nan] * m)),
                       errors="coerce").to_numpy(float)
    dur_s = np.full((n, m), 0.5)
    if np.nansum(td) > 0 and np.nansum(nd) > 0:
        ta = np.clip(td / np.nansum(td), 1e-9, None)
        na = np.clip(nd / np.nansum(nd), 1e-9, None)
        ratio = np.abs(np.log(ta[:, None] / na[None, :]))
        dur_s = np.where(np.isfinite(ratio), np.clip(1.0 - ratio / np.log(10.0), 0.0, 1.0), 0.5)

    score = W_NAME * name_s + W_GRID * grid_eq + W_BLOCK * block_eq + W_REGS * regs_s + W_DUR * dur_s
    admissible = (name_s > 0) & (score >= MIN_SCORE)
    return np.where(admissible, score, -np.inf)


def align(score: np.ndarray) -> list[tuple[int, int, float]]:
    """Order-preserving alignment maximising the summed score of matched pairs."""
    n, m = score.shape
    if n == 0 or m == 0:
        return []
    dp = np.zeros((n + 1, m + 1))
    for i in range(1, n + 1):
        prev = dp[i - 1]
        cand = np.maximum(prev[:-1] + score[i - 1], prev[1:])  # match or skip trace kernel
        dp[i, 1:] = np.maximum.accumulate(cand)  # or skip ncu kernel (running max from left)
        dp[i, 1:] = np.maximum(dp[i, 1:], 0.0)
    pairs: list[tuple[int, int, float]] = []
    i, j = n, m
    while i > 0 and j > 0:
        s = score[i - 1, j - 1]
        if np.isfinite(s) and dp[i, j] == dp[i - 1, j - 1] + s:
            pairs.append((i - 1, j - 1, float(s)))
            i, j = i - 1, j - 1
        elif dp[i, j] == dp[i - 1, j]:
            i -= 1
        else:
            j -= 1
    pairs.reverse()
    return pairs


def match_kernels(trace_k: pd.DataFrame, ncu_k: pd.DataFrame) -> MatchResult:
    """Match trace kernels (launch order) to ncu kernels (ncu ID order)."""
    pairs = align(similarity_matrix(trace_k, ncu_k))
    mt = {p[0] for p in pairs}
    mn = {p[1] for p in pairs}
    return MatchResult(
        pairs=pairs,
        unmatched_trace=[i for i in range(len(trace_k)) if i not in mt],
        unmatched_ncu=[j for j in range(len(ncu_k)) if j not in mn],
    )
