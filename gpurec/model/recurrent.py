"""GPU time of a whole cuDNN recurrent layer (nn.LSTM / nn.GRU) from its sequential structure.

Why: cuDNN runs an LSTM or GRU one timestep after another (the recurrent product of step t
needs the hidden state of step t-1), so at the batch sizes sequence models use its time is
``sequential steps x time per step``, a latency-bound chain; the FLOP roofline the boosters
start from is far below it (a held-out 2-layer bidirectional GRU at batch 8 x 384 tokens was
predicted 7x too fast).  Trees on roofline features cannot extrapolate a time that grows with
``seq_len x layers`` to sequences, depths and widths they never saw; this model can.

    time_ms = steps x exp(c0 + sum_k c_k * term_k)

* ``steps``: the chain length, seq_len x (1 + a (layers - 1)) x (1 + b (directions - 1)).
  ``a`` (layer share) is how much of a step each further unidirectional layer adds: 1 when
  layers run one after another, 0 when they are fully pipelined (layer l runs step t while
  layer l-1 runs step t+1); a bidirectional layer cannot pipeline (its backward direction needs
  the whole sequence of the layer below), so there a = 1.  ``b`` (direction share) is 1 when
  the two directions run one after the other, 0 when they run at once on two streams.
* ``term_k``: how one step's time grows with its work: log batch, log hidden size, (log batch)^2
  (cuDNN switches from persistent to per-step kernels as the batch grows), log batch x log
  hidden (a step is latency-bound at small batches, where the hidden size matters little, and
  compute-bound at large ones, where it costs batch x hidden^2), or log FLOPs and log weight
  bytes of one step's recurrent product (gates x hidden x hidden); and, with the first four, the
  log of the chains in flight, its product with log hidden (a pipelined layer adds more to a step
  the wider the step) and whether the layer is a GRU.

The form (steps and terms) is chosen per mode by leave-one-architecture-out error on the
training architectures' recurrent rows only (gpurec.model.fitting.recurrent_fit), and the coefficients
are refitted on all of them.  Everything is read from the time feature matrix, so the same
code serves training (out-of-fold network sums) and prediction.  The form is fitted on
fp32/TF32 float32 layers of the kinds the fit saw.  A half-precision layer (fp16 or bf16
elements: autocast runs cuDNN's recurrent layers in fp16) is the same chain, each step faster by
a factor fitted per mode on the half-precision rows (``ModeFit.half``, a HalfFactor: a constant or
a few per-step terms, chosen by leave-one-architecture-out error); without it
(too few such rows) the boosters keep predicting it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

GATES: dict[str, float] = {"LSTM": 4.0, "GRU": 3.0, "RNN": 1.0}
SHARES: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)  # the layer and direction shares tried
TERMS: tuple[str, ...] = ("log_batch", "log_batch_sq", "log_hidden", "log_batch_hidden", "log_step_flops",
                          "log_step_weight_bytes", "log_chains", "log_chains_in_flight", "log_chains_in_flight_hidden",
                          "gru")
_COLUMNS = ("batch", "seq_len", "embed_dim", "out_features", "num_heads", "element_bytes", "math_mode",
            "mode_training")


@dataclass(frozen=True)
class ModeFit:
    """One mode's fitted form: chain length (layer and direction shares), per-step terms and their
    coefficients (intercept first)."""

    layer_share: float
    direction_share: float
    terms: tuple[str, ...]
    coef: tuple[float, ...]
    loao_mape: float  # leave-one-architecture-out MAPE of the chosen form on the training rows
    rows: int
    kinds: tuple[str, ...]
    # (batch min, batch max, hidden min, hidden max) of the rows fitted: the per-step terms'
    # inputs.  Sequence length, layers and directions enter through the chain length, which
    # extrapolates by construction.  None in models fitted before it was recorded.
    ranges: tuple[float, float, float, float] | None = None
    # Half-precision layers: log(time) = the fp32 form's + this (None: not fitted, the boosters
    # predict them), with its leave-one-architecture-out error and row count.
    half: HalfFactor | None = None

    def as_dict(self) -> dict[str, Any]:
        d = {"layer_share": self.layer_share, "direction_share": self.direction_share, "terms": list(self.terms),
             "coef": list(self.coef), "loao_mape": self.loao_mape, "rows": self.rows, "kinds": list(self.kinds)}
        d |= {"ranges": list(self.ranges)} if self.ranges is not None else {}
        return d | ({"half": self.half.as_dict()} if self.half is not None else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModeFit:
        r = d.get("ranges")
        return cls(float(d["layer_share"]), float(d["direction_share"]), tuple(d["terms"]),
                   tuple(float(c) for c in d["coef"]), float(d["loao_mape"]), int(d["rows"]), tuple(d["kinds"]),
                   None if r is None else (float(r[0]), float(r[1]), float(r[2]), float(r[3])),
                   HalfFactor.from_dict(d.get("half")))


@dataclass(frozen=True)
class HalfFactor:
    """How a half-precision recurrent layer differs from the fp32 form: log(target) = the fp32
    form's + ``log_factor`` + ``coef`` . ``terms`` (time: fp16 steps are faster; power: they draw
    less).  A few per-step terms at most, because the half-precision rows are few (a handful of
    architectures) and the chain structure they share with fp32 is what extrapolates to other
    lengths and depths.  Why terms at all: the gain is the recurrent product's, so it grows with
    the hidden size and with the batch up to where the step stops being latency-bound (H200 and
    H100 training rows: x0.93 at batch 1, x0.5 at batch 8-32, x0.65 at 128).  The terms are read
    with batch and hidden size clamped to ``ranges`` (the rows fitted): outside them the factor
    stays the nearest fitted one instead of following a quadratic in log batch."""

    log_factor: float
    loao_mape: float  # leave-one-architecture-out MAPE of the factor on the half-precision rows
    rows: int
    terms: tuple[str, ...] = ()  # per-step terms (step_terms' names) beyond the constant
    coef: tuple[float, ...] = ()
    ranges: tuple[float, float, float, float] | None = None  # (batch min, max, hidden min, max) fitted

    def log_shift(self, s: RecurrentShape) -> np.ndarray:
        """The log factor of each row of ``s`` (a half-precision shape)."""
        if not self.terms:
            return np.full(len(s.batch), self.log_factor)
        assert self.ranges is not None, "a HalfFactor with terms records the ranges it was fitted on"
        b_lo, b_hi, h_lo, h_hi = self.ranges
        clamped = replace(s, batch=np.clip(s.batch, b_lo, b_hi), hidden=np.clip(s.hidden, h_lo, h_hi))
        return self.log_factor + step_terms(clamped, self.terms)[:, 1:] @ np.asarray(self.coef)

    def as_dict(self) -> dict[str, Any]:
        d = {"log_factor": self.log_factor, "loao_mape": self.loao_mape, "rows": self.rows}
        return d | ({"terms": list(self.terms), "coef": list(self.coef), "ranges": list(self.ranges or ())}
                    if self.terms else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> HalfFactor | None:
        if not d:
            return None
        terms = tuple(d.get("terms", ()))
        ranges: tuple[float, float, float, float] | None = None
        if terms:
            values = [float(x) for x in d.get("ranges", ())]
            if len(values) != 4:
                raise ValueError(f"a half-precision factor with terms {list(terms)} needs its four fitted ranges "
                                 f"(batch min, max, hidden min, max), not {values}: the model file is damaged; "
                                 "refit it (`gpurec tools fit-recurrent --half-only`)")
            ranges = (values[0], values[1], values[2], values[3])
        return cls(float(d["log_factor"]), float(d["loao_mape"]), int(d["rows"]), terms,
                   tuple(float(c) for c in d.get("coef", ())), ranges)


@dataclass(frozen=True)
class RecurrentShape:
    """Per row of a feature matrix: the recurrent layer's structure (NaN-free where ``mask``)."""

    mask: np.ndarray  # recurrent kind, float32 element, fp32/TF32 arithmetic, shapes known
    half: np.ndarray  # recurrent kind, fp16/bf16 element, shapes known
    gates: np.ndarray
    batch: np.ndarray
    seq_len: np.ndarray
    hidden: np.ndarray
    directions: np.ndarray
    layers: np.ndarray
    element_bytes: np.ndarray
    training: np.ndarray


def recurrent_shape(X: np.ndarray, feature_names: Sequence[str], kinds: Sequence[str] = tuple(GATES)
                    ) -> RecurrentShape:
    """The recurrent structure of each row of ``X`` (gpurec.ops.features puts a whole cuDNN layer
    into the common features: embed_dim = hidden size, out_features = hidden x directions,
    num_heads = layers x directions)."""
    names = list(feature_names)
    n = len(X)
    gates = np.zeros(n)
    for kind in kinds:
        col = f"kind={kind}"
        if col in names:
            gates = np.where(X[:, names.index(col)] > 0.5, GATES[kind], gates)
    if not all(c in names for c in _COLUMNS):
        gates = np.zeros(n)
        cols = {c: np.ones(n) for c in _COLUMNS}
    else:
        cols = {c: X[:, names.index(c)].astype(np.float64) for c in _COLUMNS}
    return _shape(cols, gates)


def _shape(cols: dict[str, np.ndarray], gates: np.ndarray) -> RecurrentShape:
    hidden = cols["embed_dim"]
    with np.errstate(divide="ignore", invalid="ignore"):
        directions = np.where(hidden > 0, np.rint(cols["out_features"] / hidden), 0.0)
        layers = np.where(directions > 0, np.rint(cols["num_heads"] / np.maximum(directions, 1.0)), 0.0)
    known = ((gates > 0) & (cols["batch"] >= 1) & (cols["seq_len"] >= 1) & (hidden >= 1) & (directions >= 1)
             & (layers >= 1))
    mask = known & (cols["element_bytes"] == 4.0) & (cols["math_mode"] <= 1.0)
    half = known & (cols["element_bytes"] == 2.0)
    return RecurrentShape(mask, half, gates, cols["batch"], cols["seq_len"], hidden, directions, layers,
                          cols["element_bytes"], cols["mode_training"] > 0.5)


def as_fp32(s: RecurrentShape) -> RecurrentShape:
    """The same layers with float32 elements: the shape the fp32 form is evaluated on for a
    half-precision layer (its weight bytes as the form's coefficients were fitted)."""
    return replace(s, element_bytes=np.full(len(s.element_bytes), 4.0))


def chain_steps(s: RecurrentShape, layer_share: float, direction_share: float) -> np.ndarray:
    """Sequential steps of the layer (see the module docstring)."""
    a = np.where(s.directions > 1, 1.0, layer_share)
    return s.seq_len * (1.0 + a * (s.layers - 1.0)) * (1.0 + direction_share * (s.directions - 1.0))


def step_terms(s: RecurrentShape, terms: Sequence[str]) -> np.ndarray:
    """Design matrix (intercept first) of the per-step terms."""
    b = np.log(np.maximum(s.batch, 1.0))
    h = np.log(np.maximum(s.hidden, 1.0))
    chains = np.log(np.maximum(np.where(s.directions > 1, s.directions, s.layers), 1.0))
    values = {
        "log_batch": b,
        "log_batch_sq": b * b,
        "log_hidden": h,
        "log_batch_hidden": b * h,
        "log_step_flops": np.log(np.maximum(2.0 * s.batch * s.gates * s.hidden * s.hidden, 1.0)),
        "log_step_weight_bytes": np.log(np.maximum(s.element_bytes * s.gates * s.hidden * s.hidden, 1.0)),
        # layers x directions: the chains cuDNN can keep in flight at once (a layer runs step t while
        # the one below runs t+1; two directions run on two streams), so more of the GPU is busy
        "log_chains": np.log(np.maximum(s.layers * s.directions, 1.0)),
        # the chains that can be in flight at once: a bidirectional layer needs the whole output of
        # the layer below (as chain_steps says), so only its two directions run together; the
        # layers of a unidirectional stack pipeline
        "log_chains_in_flight": chains,
        # how much a further chain adds to a step grows with the hidden size: in the H200's LSTM
        # sweeps at batch 8 a second and third layer add about 20% a layer at hidden 576, 35% at 896 and
        # 60% at 1280 (the pipelined layers contend for the SMs more as each step's product grows)
        "log_chains_in_flight_hidden": chains * h,
        # cuDNN's GRU step is another kernel than its LSTM step (three gates, a reset gate applied
        # inside the recurrent product), not just fewer gates
        "gru": (s.gates == GATES["GRU"]).astype(np.float64),
    }
    unknown = [t for t in terms if t not in values]
    if unknown:
        raise ValueError(f"unknown recurrent terms {unknown}; known: {', '.join(TERMS)}")
    return np.column_stack([np.ones(len(b)), *(values[t] for t in terms)])


def log_time_ms(s: RecurrentShape, fit: ModeFit) -> np.ndarray:
    """log(time_ms) of every row under ``fit`` (meaningful where ``s.mask``)."""
    steps = np.maximum(chain_steps(s, fit.layer_share, fit.direction_share), 1.0)
    return np.log(steps) + step_terms(s, fit.terms) @ np.asarray(fit.coef)



def _kind_columns(kinds_fitted: set[str], feature_names: list[str]) -> tuple[tuple[str, ...], list[int]]:
    """The recurrent kinds the fits saw (in GATES order) and their one-hot feature columns."""
    kinds = tuple(k for k in GATES if k in kinds_fitted)
    return kinds, [feature_names.index(f"kind={k}") for k in kinds if f"kind={k}" in feature_names]


class _RecurrentRows:
    """Finds the recurrent layers among feature rows, for the time, power and host models alike."""

    feature_names: list[str]
    _kinds: tuple[str, ...]
    _kind_cols: list[int]

    def _recurrent_rows(self, X: np.ndarray) -> tuple[np.ndarray, RecurrentShape] | None:
        """Indices of the rows of ``X`` that are recurrent layers and their shapes; None where none is
        (the cheap one-hot test first: most rows are not recurrent)."""
        if not self._kind_cols or not len(X):
            return None
        rows = np.flatnonzero(X[:, self._kind_cols].max(axis=1) > 0.5)
        if not len(rows):
            return None
        return rows, recurrent_shape(X[rows], self.feature_names, self._kinds)

    @staticmethod
    def _modes_of(modes: str | np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The mode of each found row: one mode for all, or the rows' own."""
        return np.full(len(rows), modes, dtype=object) if isinstance(modes, str) else np.asarray(modes)[rows]

class RecurrentTime(_RecurrentRows):
    """Fitted per-mode recurrent time models over a frozen feature-name list."""

    def __init__(self, fits: dict[str, ModeFit], feature_names: Sequence[str]) -> None:
        self.fits = dict(fits)
        self.feature_names = list(feature_names)
        self._kinds, self._kind_cols = _kind_columns({k for f in self.fits.values() for k in f.kinds},
                                                     self.feature_names)

    def as_dict(self) -> dict[str, Any]:
        return {"model": "steps x exp(per-step terms)", "by_mode": {m: f.as_dict() for m, f in self.fits.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, feature_names: Sequence[str]) -> RecurrentTime | None:
        """None when the models were trained without it (their boosters predict recurrent layers)."""
        if not d or not d.get("by_mode"):
            return None
        return cls({m: ModeFit.from_dict(f) for m, f in d["by_mode"].items()}, feature_names)

    def coverage(self, values: np.ndarray, feature_names: Sequence[str], kinds: np.ndarray, mode: str,
                 tolerance: float) -> tuple[np.ndarray, np.ndarray]:
        """(replaced, inside) per operation (rows of ``values`` over ``feature_names``,
        gpurec.model.features.OpBlock): the recurrent layers this model predicts in ``mode`` (it
        replaces the boosters' time there), and those of them whose batch and hidden size lie within
        the fitted rows' ranges x ``tolerance``, the hidden size no lower than the smallest fitted.
        Their FLOPs grow with sequence length x layers, which the chain length extrapolates, so a
        FLOP range says nothing about them.  A replaced layer outside the ranges is an extrapolation
        of the form, whatever rows the boosters saw (e.g. hidden sizes below
        fitting.recurrent_fit.MIN_HIDDEN, another cuDNN regime).  Both empty for models fitted
        before the ranges were recorded."""
        out = np.zeros(len(kinds), dtype=bool)
        replaced = out.copy()
        fit = self.fits.get(mode)
        if fit is None or fit.ranges is None or not len(kinds):
            return replaced, out
        rows = np.flatnonzero(np.isin(np.asarray(kinds, dtype=object), fit.kinds))
        if not len(rows):
            return replaced, out
        names = list(feature_names)
        cols = {c: (values[rows, names.index(c)].astype(np.float64) if c in names else np.zeros(len(rows)))
                for c in _COLUMNS}
        cols["mode_training"] = np.full(len(rows), float(mode == "training"))
        gates = np.array([GATES[str(k)] for k in np.asarray(kinds, dtype=object)[rows]])
        s = _shape(cols, gates)
        b_lo, b_hi, h_lo, h_hi = fit.ranges
        # no tolerance below the smallest hidden size fitted: just below it (hidden 192 against
        # 256) cuDNN was measured running another regime (fitting.recurrent_fit.MIN_HIDDEN)
        inside = ((s.batch >= b_lo / tolerance) & (s.batch <= b_hi * tolerance)
                  & (s.hidden >= h_lo) & (s.hidden <= h_hi * tolerance))
        predicted = s.mask | s.half if fit.half is not None else s.mask
        out[rows] = predicted & inside
        replaced[rows] = predicted
        return replaced, out

    def apply(self, log_t: np.ndarray, X: np.ndarray, modes: str | np.ndarray) -> np.ndarray:
        """``log_t`` (log ms per row of ``X``) with the recurrent rows replaced by this model."""
        found = self._recurrent_rows(X)
        if found is None:
            return log_t
        rows, s = found
        out = np.array(log_t, dtype=np.float64, copy=True)
        mode_of = self._modes_of(modes, rows)
        for mode, fit in self.fits.items():
            sel = s.mask & (mode_of == mode)
            if sel.any():
                out[rows[sel]] = log_time_ms(take_rows(s, sel), fit)
            sel = s.half & (mode_of == mode)
            if fit.half is not None and sel.any():
                hs = take_rows(s, sel)
                out[rows[sel]] = log_time_ms(as_fp32(hs), fit) + fit.half.log_shift(hs)
        return out


def take_rows(s: RecurrentShape, sel: np.ndarray) -> RecurrentShape:
    return RecurrentShape(*(getattr(s, f)[sel] for f in RecurrentShape.__dataclass_fields__))


@dataclass(frozen=True)
class PowerFit:
    """One mode's recurrent power: log(power / TDP) = coef . (1, terms)."""

    terms: tuple[str, ...]
    coef: tuple[float, ...]
    loao_mape: float
    rows: int
    kinds: tuple[str, ...]
    half: HalfFactor | None = None  # half-precision layers: log(power / TDP) = the fp32 form's + it

    def as_dict(self) -> dict[str, Any]:
        d = {"terms": list(self.terms), "coef": list(self.coef), "loao_mape": self.loao_mape, "rows": self.rows,
             "kinds": list(self.kinds)}
        return d | ({"half": self.half.as_dict()} if self.half is not None else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PowerFit:
        return cls(tuple(d["terms"]), tuple(float(c) for c in d["coef"]), float(d["loao_mape"]), int(d["rows"]),
                   tuple(d["kinds"]), HalfFactor.from_dict(d.get("half")))


class RecurrentPower(_RecurrentRows):
    """Board power of a cuDNN recurrent layer as a share of the GPU's TDP, from its batch and
    hidden size.  Why: a latency-bound chain keeps most SMs idle (170-300 W on an H100 below
    batch 32, 300-580 W at 128), which the power booster, fitted mostly on throughput-bound
    operations, over-predicted by 70% for a held-out bidirectional GRU."""

    def __init__(self, fits: dict[str, PowerFit], feature_names: Sequence[str]) -> None:
        self.fits = dict(fits)
        self.feature_names = list(feature_names)
        self._kinds, self._kind_cols = _kind_columns({k for f in self.fits.values() for k in f.kinds},
                                                     self.feature_names)
        self._tdp_col = self.feature_names.index("hw_tdp_w") if "hw_tdp_w" in self.feature_names else -1

    def as_dict(self) -> dict[str, Any]:
        return {"model": "log(power / TDP) linear in per-step terms", "by_mode": {m: f.as_dict()
                                                                                 for m, f in self.fits.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, feature_names: Sequence[str]) -> RecurrentPower | None:
        if not d or not d.get("by_mode"):
            return None
        return cls({m: PowerFit.from_dict(f) for m, f in d["by_mode"].items()}, feature_names)

    def apply(self, log_w: np.ndarray, X: np.ndarray, modes: str | np.ndarray) -> np.ndarray:
        """``log_w`` (log W per row of the power feature matrix ``X``) with recurrent rows replaced."""
        found = self._recurrent_rows(X) if self._tdp_col >= 0 else None
        if found is None:
            return log_w
        rows, s = found
        tdp = X[rows, self._tdp_col].astype(np.float64)
        out = np.array(log_w, dtype=np.float64, copy=True)
        mode_of = self._modes_of(modes, rows)
        for mode, fit in self.fits.items():
            sel = s.mask & (mode_of == mode) & (tdp > 0)
            if sel.any():
                out[rows[sel]] = np.log(tdp[sel]) + step_terms(take_rows(s, sel), fit.terms) @ np.asarray(fit.coef)
            sel = s.half & (mode_of == mode) & (tdp > 0)
            if fit.half is not None and sel.any():
                hs = take_rows(s, sel)
                out[rows[sel]] = (np.log(tdp[sel]) + step_terms(as_fp32(hs), fit.terms) @ np.asarray(fit.coef)
                                  + fit.half.log_shift(hs))
        return out


class RecurrentHost(_RecurrentRows):
    """Host dispatch of a cuDNN recurrent layer on the reference host: ``a_ms + b_ms x steps``
    with steps = seq_len x layers x directions.  Why: cuDNN enqueues a few kernels for every
    step of every layer and direction from the host (15-45 us per step in inference, 45-120 us
    in training on the collection hosts), so eager time grows with the sequence far beyond
    the GPU time, which per-operation host boosters did not extrapolate."""

    def __init__(self, fits: dict[str, dict[str, Any]], feature_names: Sequence[str]) -> None:
        self.fits = {m: dict(f) for m, f in fits.items()}
        self.feature_names = list(feature_names)
        self._kinds, self._kind_cols = _kind_columns({k for f in self.fits.values() for k in f["kinds"]},
                                                     self.feature_names)

    def as_dict(self) -> dict[str, Any]:
        return {"model": "a_ms + b_ms x seq_len x layers x directions", "by_mode": self.fits}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, feature_names: Sequence[str]) -> RecurrentHost | None:
        if not d or not d.get("by_mode"):
            return None
        return cls(d["by_mode"], feature_names)

    def apply(self, ms: np.ndarray, X: np.ndarray, mode: str) -> np.ndarray:
        """``ms`` (reference-host dispatch per row of the host feature matrix ``X``) with recurrent
        rows replaced."""
        fit = self.fits.get(mode)
        found = self._recurrent_rows(X) if fit is not None else None
        if found is None:
            return ms
        rows, s = found
        out = np.array(ms, dtype=np.float64, copy=True)
        steps = chain_steps(s, 1.0, 1.0)
        # a half-precision layer enqueues the same kernels per step as an fp32 one
        sel = s.mask | s.half
        out[rows[sel]] = float(fit["a_ms"]) + float(fit["b_ms"]) * steps[sel]
        return out
