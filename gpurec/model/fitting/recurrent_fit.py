"""Fitting gpurec.model.recurrent's per-mode recurrent time model (training side).

The candidates are a few physical forms (chain length x per-step terms); each mode keeps the
one with the lowest leave-one-architecture-out error on the training architectures' recurrent
rows, refitted on all of them.  Least squares in log space: the error that matters is relative.
Every architecture weighs the same, in the fits and in the error that picks the form
(arch_weights), however many rows it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from gpurec.model.recurrent import (
    GATES,
    SHARES,
    HalfFactor,
    ModeFit,
    PowerFit,
    RecurrentHost,
    RecurrentPower,
    RecurrentShape,
    RecurrentTime,
    as_fp32,
    chain_steps,
    log_time_ms,
    recurrent_shape,
    step_terms,
    take_rows,
)

# Per-step term sets tried, simplest first (a tie keeps the simpler one).
TERM_SETS: tuple[tuple[str, ...], ...] = (
    ("log_batch", "log_hidden"),
    ("log_step_flops", "log_step_weight_bytes"),
    ("log_batch", "log_batch_sq", "log_hidden"),
    ("log_batch", "log_hidden", "log_batch_hidden"),
    ("log_batch", "log_batch_sq", "log_hidden", "log_batch_hidden"),
    ("log_batch", "log_batch_sq", "log_hidden", "log_batch_hidden", "log_chains_in_flight",
     "log_chains_in_flight_hidden", "gru"),
)
MIN_ROWS = 12
MIN_GROUPS = 3
# Smallest hidden size the forms are fitted on.  Below it cuDNN runs another regime, by all signs
# one persistent kernel per layer and direction instead of one launch per step: the H200's
# hidden-192 sweep stacks spend 0.2-0.6 ms of host time on 128 steps (2-11 ms at hidden 448 and
# above), take the same GPU time per step for one to three layers and one or two directions (no
# layer pipelining, no concurrent directions) and, at batch 128, two to four times the per-step
# time of hidden 256-576 (DEVELOPERS.md, "Experiments, shipped or not").  One form cannot hold both
# regimes (leave-one-architecture-out 12.4 -> 23.8% with those rows in; the host model's per-step
# term fell to 0), and no training architecture has a hidden size below 256, so rows below it are
# counted, not fitted; a layer below it is outside the fitted range (RecurrentTime.coverage).
MIN_HIDDEN = 256
_RIDGE = 1e-6


def arch_weights(groups: np.ndarray) -> np.ndarray:
    """Per row, 1 / its architecture's row count: every architecture weighs the same in a fit.
    Why: an operation sweep holds two thirds of the recurrent rows, and weighted by row it chose
    the form for the few real architectures (session 20: the held-out bidirectional GRU's training
    time 4.3 -> 10.0% off)."""
    _, inverse, counts = np.unique(np.asarray(groups), return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def _wsolve(D: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Ridge least squares with row weights ``w`` (any scale)."""
    w = w / w.mean()
    Dw = D * w[:, None]
    return np.linalg.solve(D.T @ Dw + _RIDGE * np.eye(D.shape[1]), Dw.T @ y)


def _solve(s: RecurrentShape, log_t: np.ndarray, shares: tuple[float, float], terms: tuple[str, ...],
           w: np.ndarray) -> np.ndarray:
    D = step_terms(s, terms)
    y = log_t - np.log(np.maximum(chain_steps(s, *shares), 1.0))
    return _wsolve(D, y, w)


def _loao_mape(s: RecurrentShape, log_t: np.ndarray, groups: np.ndarray, shares: tuple[float, float],
               terms: tuple[str, ...], kinds: tuple[str, ...]) -> float:
    """Leave-one-architecture-out MAPE, the mean of the architectures' own (each weighs the same)."""
    errs = []
    w = arch_weights(groups)
    for g in np.unique(groups):
        test = groups == g
        coef = _solve(take_rows(s, ~test), log_t[~test], shares, terms, w[~test])
        fit = ModeFit(*shares, terms, tuple(coef), 0.0, 0, kinds)
        errs.append(float(np.mean(np.abs(np.exp(log_time_ms(take_rows(s, test), fit) - log_t[test]) - 1.0))))
    return float(np.mean(errs))


def _mode_rows(s_all: RecurrentShape, modes: np.ndarray, usable: np.ndarray, groups: Sequence[Any],
               report: dict[str, Any]) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """Per mode, (mode, the recurrent rows with a usable target and a hidden size of at least
    MIN_HIDDEN, their architectures), for the modes with at least MIN_ROWS such rows from
    MIN_GROUPS architectures; every mode's counts (those below MIN_HIDDEN too) go into
    ``report["rows"]``."""
    modes = np.asarray(modes).astype(str)
    groups_arr = np.asarray([str(g) for g in groups])
    wide_enough = s_all.hidden >= MIN_HIDDEN
    for mode in sorted(set(modes.tolist())):
        sel = s_all.mask & (modes == mode) & usable
        narrow = int((sel & ~wide_enough).sum())
        sel &= wide_enough
        n, n_groups = int(sel.sum()), len(set(groups_arr[sel].tolist()))
        report["rows"][mode] = {"rows": n, "architectures": n_groups} | (
            {f"rows_below_hidden_{MIN_HIDDEN}": narrow} if narrow else {})
        if n >= MIN_ROWS and n_groups >= MIN_GROUPS:
            yield mode, sel, groups_arr[sel]


def _fitted_ranges(s: RecurrentShape) -> tuple[float, float, float, float]:
    """(batch min, batch max, hidden min, hidden max) of the rows a form was fitted on."""
    return float(s.batch.min()), float(s.batch.max()), float(s.hidden.min()), float(s.hidden.max())


def _log_tdp_share(X: np.ndarray, log_w: np.ndarray, names: list[str]) -> np.ndarray:
    """log(power / TDP) per row: the recurrent power forms' target."""
    return np.asarray(log_w, dtype=np.float64) - np.log(np.maximum(X[:, names.index("hw_tdp_w")], 1e-9))


# Half-precision factor term sets tried, simplest first (a tie keeps the simpler): the gain of
# fp16 steps over fp32 ones is the recurrent product's, so it can grow with the hidden size and
# with the batch up to where the step stops being latency-bound (HalfFactor).
HALF_TERM_SETS: tuple[tuple[str, ...], ...] = (
    (),
    ("log_hidden",),
    ("log_batch",),
    ("log_batch", "log_hidden"),
    ("log_batch", "log_batch_sq", "log_hidden"),
)


def half_factor(log_target: np.ndarray, fp32_form: Callable[[RecurrentShape], np.ndarray], s_all: RecurrentShape,
                modes: np.ndarray, mode: str, groups: Sequence[Any],
                report: dict[str, float] | None = None) -> HalfFactor | None:
    """The half-precision factor of one mode: the log target minus ``fp32_form`` (the fitted fp32
    form's log target of an fp32 shape) over that mode's half-precision recurrent rows of hidden
    size at least MIN_HIDDEN, fitted architecture-weighted as a constant or on one of
    HALF_TERM_SETS, whichever has the lowest leave-one-architecture-out error (each set's error
    goes into ``report``).  None below MIN_ROWS rows or MIN_GROUPS architectures."""
    groups_arr = np.asarray([str(g) for g in groups])
    y = np.asarray(log_target, dtype=np.float64)
    sel = s_all.half & (np.asarray(modes).astype(str) == mode) & np.isfinite(y) & (s_all.hidden >= MIN_HIDDEN)
    g = groups_arr[sel]
    hs = take_rows(s_all, sel)
    r = y[sel] - fp32_form(as_fp32(hs)) if sel.any() else y[sel]
    if len(r) < MIN_ROWS or len(set(g.tolist())) < MIN_GROUPS:
        return None
    w = arch_weights(g)
    best: tuple[float, tuple[str, ...]] | None = None
    for terms in HALF_TERM_SETS:
        D = step_terms(hs, terms)
        mape = float(np.mean([np.mean(np.abs(np.exp(r[g == a] - D[g == a] @ _wsolve(D[g != a], r[g != a], w[g != a]))
                                             - 1.0)) for a in np.unique(g)]))
        if report is not None:
            report["+".join(terms) or "constant"] = mape
        if best is None or mape < best[0] - 1e-3:
            best = (mape, terms)
    assert best is not None
    mape, terms = best
    coef = _wsolve(step_terms(hs, terms), r, w)
    return HalfFactor(float(coef[0]), mape, int(len(r)), terms, tuple(float(c) for c in coef[1:]),
                      _fitted_ranges(hs) if terms else None)


def refit_half(time_model: RecurrentTime | None, power_model: RecurrentPower | None, X_time: np.ndarray,
               X_power: np.ndarray, log_t: np.ndarray, log_w: np.ndarray, modes: np.ndarray, groups: Sequence[Any],
               feature_names: Sequence[str]) -> tuple[RecurrentTime | None, RecurrentPower | None, dict[str, Any]]:
    """The given fitted models with only their half-precision factors fitted again (on the rows
    given, against the models' own fp32 forms, which stay as they are).  Why: new half-precision
    rows or factor forms need not move the fp32 forms a full refit would also move."""
    names = list(feature_names)
    report: dict[str, Any] = {"time": {}, "power": {}}
    if time_model is not None:
        s_all = recurrent_shape(X_time, names)
        time_model = RecurrentTime({m: replace(f, half=half_factor(
            log_t, lambda hs, f=f: log_time_ms(hs, f), s_all, modes, m, groups,
            report["time"].setdefault(m, {}))) for m, f in time_model.fits.items()}, names)
    if power_model is not None and "hw_tdp_w" in names:
        s_all = recurrent_shape(X_power, names)
        y_all = _log_tdp_share(X_power, log_w, names)
        power_model = RecurrentPower({m: replace(f, half=half_factor(
            y_all, lambda hs, f=f: step_terms(hs, f.terms) @ np.asarray(f.coef), s_all, modes, m, groups,
            report["power"].setdefault(m, {}))) for m, f in power_model.fits.items()}, names)
    return time_model, power_model, report


def _kinds_in(X: np.ndarray, names: list[str], sel: np.ndarray) -> tuple[str, ...]:
    """The recurrent kinds (in GATES order) among the selected rows, by their one-hot columns."""
    return tuple(k for k in GATES if f"kind={k}" in names and (X[sel, names.index(f"kind={k}")] > 0.5).any())


def fit_recurrent(X: np.ndarray, log_t: np.ndarray, modes: np.ndarray, groups: Sequence[Any],
                  feature_names: Sequence[str]) -> tuple[RecurrentTime | None, dict[str, Any]]:
    """The recurrent time model from rows of the time feature matrix ``X`` with targets ``log_t``
    (log ms; host-free elapsed time, not the in-network kernel sum: cuDNN runs layers and
    directions on concurrent streams).  ``groups`` are the rows' architectures.  Returns the
    model (None when no mode has at least MIN_ROWS recurrent rows from MIN_GROUPS architectures)
    and a report of every candidate's error."""
    s_all = recurrent_shape(X, feature_names)
    names = list(feature_names)
    report: dict[str, Any] = {"candidates": {}, "chosen": {}, "rows": {}}
    fits: dict[str, ModeFit] = {}
    for mode, sel, g in _mode_rows(s_all, modes, np.isfinite(log_t), groups, report):
        n = int(sel.sum())
        s, y = take_rows(s_all, sel), np.asarray(log_t, dtype=np.float64)[sel]
        kinds = _kinds_in(X, names, sel)
        scores: dict[str, float] = {}
        best: tuple[float, tuple[float, float], tuple[str, ...]] | None = None
        for shares in ((a, b) for a in SHARES for b in SHARES):
            for terms in TERM_SETS:
                mape = _loao_mape(s, y, g, shares, terms, kinds)
                scores[f"layers {shares[0]:g}, directions {shares[1]:g}|{'+'.join(terms)}"] = mape
                if best is None or mape < best[0] - 1e-3:
                    best = (mape, shares, terms)
        assert best is not None
        mape, shares, terms = best
        coef = tuple(float(c) for c in _solve(s, y, shares, terms, arch_weights(g)))
        fit = ModeFit(*shares, terms, coef, mape, n, kinds,
                      _fitted_ranges(s))
        fits[mode] = replace(fit, half=half_factor(log_t, lambda hs, fit=fit: log_time_ms(hs, fit), s_all, modes,
                                                   mode, groups, report.setdefault("half_candidates", {})
                                                   .setdefault(mode, {})))
        report["candidates"][mode] = scores
        report["chosen"][mode] = fits[mode].as_dict()
    return (RecurrentTime(fits, feature_names) if fits else None), report


# Power term sets tried, simplest first; each mode keeps the lowest leave-one-architecture-out
# error (a tie keeps the simpler).  (log batch)^2 because the power of a chain does not grow
# with the batch as a power law: cuDNN's persistent kernels at small batches keep a few SMs busy
# at any batch, per-step kernels at large ones fill the GPU.  log_chains (layers x directions)
# because cuDNN keeps the chains of several layers and both directions in flight at once: a
# held-out 3-layer LSTM ran at 1.5-1.7x the power of a 1-layer one of similar width and batch.
# log_step_flops instead of log_hidden: an LSTM step does 4 gates' work, a GRU's 3.
# log_chains_in_flight instead of log_chains: a bidirectional layer waits for the whole layer
# below, so only its two directions run together however deep the stack (session 14: leave-one-
# architecture-out 11.7 -> 9.4% inference, 9.5 -> 7.6% training, on the training architectures).
POWER_TERM_SETS: tuple[tuple[str, ...], ...] = (
    ("log_batch", "log_hidden"),
    ("log_batch", "log_batch_sq", "log_hidden"),
    ("log_batch", "log_batch_sq", "log_step_flops"),
    ("log_batch", "log_batch_sq", "log_hidden", "log_chains"),
    ("log_batch", "log_batch_sq", "log_step_flops", "log_chains"),
    ("log_batch", "log_batch_sq", "log_hidden", "log_chains_in_flight"),
    ("log_batch", "log_batch_sq", "log_step_flops", "log_chains_in_flight"),
)


def fit_recurrent_power(X: np.ndarray, log_w: np.ndarray, modes: np.ndarray, groups: Sequence[Any],
                        feature_names: Sequence[str]) -> tuple[RecurrentPower | None, dict[str, Any]]:
    """gpurec.model.recurrent.RecurrentPower from rows of the power feature matrix ``X`` (it
    carries ``hw_tdp_w``) and their log power; same row and architecture minimums as the time."""
    names = list(feature_names)
    report: dict[str, Any] = {"candidates": {}, "chosen": {}, "rows": {}}
    if "hw_tdp_w" not in names:
        return None, report
    s_all = recurrent_shape(X, names)
    y_all = _log_tdp_share(X, log_w, names)
    fits: dict[str, PowerFit] = {}
    for mode, sel, g in _mode_rows(s_all, modes, np.isfinite(y_all), groups, report):
        n = int(sel.sum())
        s, y = take_rows(s_all, sel), y_all[sel]
        kinds = _kinds_in(X, names, sel)

        w = arch_weights(g)

        def solve(rows: np.ndarray, terms: tuple[str, ...], s: RecurrentShape = s, y: np.ndarray = y,
                  w: np.ndarray = w) -> np.ndarray:
            return _wsolve(step_terms(take_rows(s, rows), terms), y[rows], w[rows])

        scores: dict[str, float] = {}
        best: tuple[float, tuple[str, ...]] | None = None
        for terms in POWER_TERM_SETS:
            errs = [np.mean(np.abs(np.exp(step_terms(take_rows(s, g == a), terms) @ solve(g != a, terms) - y[g == a])
                                   - 1.0)) for a in np.unique(g)]
            mape = float(np.mean(errs))  # each architecture weighs the same
            scores["+".join(terms)] = mape
            if best is None or mape < best[0] - 1e-3:
                best = (mape, terms)
        assert best is not None
        mape, terms = best
        coef = tuple(float(c) for c in solve(np.ones(n, dtype=bool), terms))
        half = half_factor(y_all, lambda hs, terms=terms, coef=coef: step_terms(hs, terms) @ np.asarray(coef), s_all,
                           modes, mode, groups, report.setdefault("half_candidates", {}).setdefault(mode, {}))
        fits[mode] = PowerFit(terms, coef, mape, n, kinds, half)
        report["candidates"][mode] = scores
        report["chosen"][mode] = fits[mode].as_dict()
    return (RecurrentPower(fits, names) if fits else None), report


def fit_recurrent_host(X: np.ndarray, log_ms: np.ndarray, modes: np.ndarray, groups: Sequence[Any],
                       feature_names: Sequence[str]) -> tuple[RecurrentHost | None, dict[str, Any]]:
    """gpurec.model.recurrent.RecurrentHost from rows of the host feature matrix ``X`` and their
    log dispatch on the reference host; least squares in relative error, both terms >= 0."""
    names = list(feature_names)
    s_all = recurrent_shape(X, names)
    y_all = np.exp(np.asarray(log_ms, dtype=np.float64))
    report: dict[str, Any] = {"chosen": {}, "rows": {}}
    fits: dict[str, dict[str, Any]] = {}
    for mode, sel, g in _mode_rows(s_all, modes, np.isfinite(y_all) & (y_all > 0), groups, report):
        n = int(sel.sum())
        steps, y = chain_steps(take_rows(s_all, sel), 1.0, 1.0), y_all[sel]

        def solve(rows: np.ndarray, steps: np.ndarray = steps, y: np.ndarray = y) -> tuple[float, float]:
            D = np.column_stack([np.ones(int(rows.sum())), steps[rows]]) / y[rows, None]
            a, b = np.linalg.lstsq(D, np.ones(int(rows.sum())), rcond=None)[0]
            if a < 0:  # a negative constant is not physical: the per-step term alone
                a, b = 0.0, float(np.sum(steps[rows] / y[rows]) / np.sum((steps[rows] / y[rows]) ** 2))
            return float(a), max(float(b), 0.0)

        errs = []
        for a_group in np.unique(g):
            a, b = solve(g != a_group)
            errs.append(np.abs((a + b * steps[g == a_group]) / y[g == a_group] - 1.0))
        a, b = solve(np.ones(n, dtype=bool))
        kinds = list(_kinds_in(X, names, sel))
        fits[mode] = {"a_ms": a, "b_ms": b, "loao_mape": float(np.mean(np.concatenate(errs))), "rows": n,
                      "kinds": kinds}
        report["chosen"][mode] = fits[mode]
    return (RecurrentHost(fits, names) if fits else None), report
