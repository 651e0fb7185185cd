"""The prediction API for what users bring: example inputs (several, non-float), a bad
candidate among many, several threads, and modules that differ only in a function attribute."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import gpurec
from gpurec.model.predictor import CandidateError, Estimate, structure_key
from gpurec.ops.extract import ExtractionError


@pytest.fixture(scope="module")
def p():  # noqa: ANN201
    return gpurec.load_predictor()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Small made-up modules are partly outside the training data: that warning is not under test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpurec.LowCoverageWarning)
        yield


class _Act(nn.Module):
    """A block whose activation is a function kept as an attribute (not a module)."""

    def __init__(self, act) -> None:  # noqa: ANN001
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x))


def test_modules_differing_only_in_a_function_attribute_do_not_share_a_prediction(p) -> None:  # noqa: ANN001
    relu, gelu = _Act(torch.relu), _Act(nn.functional.gelu)
    assert repr(relu) == repr(gelu)
    assert structure_key(relu) != structure_key(gelu)
    assert structure_key(_Act(torch.relu)) == structure_key(relu)  # fresh twins still share
    # lambdas share one name: their code tells them apart
    assert structure_key(_Act(lambda x: x * 2)) != structure_key(_Act(lambda x: x + 2))
    with _quiet():
        a = p.predict(relu, (32, 64), gpu="H100")
        b = p.predict(gelu, (32, 64), gpu="H100")
    assert list(a.per_op["kind"]) == ["Linear", "relu"] and list(b.per_op["kind"]) == ["Linear", "gelu"]


def test_transformer_with_example_inputs_in_predict_many_and_recommend(p) -> None:  # noqa: ANN001
    tr = nn.Transformer(64, 4, 2, 2, 128, batch_first=True)
    src, tgt = torch.randn(8, 20, 64), torch.randn(8, 12, 64)
    with _quiet():
        est = p.predict(tr, example_inputs=(src, tgt), gpu="H100")
        assert isinstance(est, Estimate) and est.input_shape == (8, 20, 64) and est.gpu_time_ms > 0
        longer = p.predict(tr, example_inputs=(src, torch.randn(8, 40, 64)), gpu="H100")
        # the target's length is part of the key: a cached answer for the shorter target would repeat
        # its operations (the models may put two sub-10-us step times either way round)
        assert list(longer.per_op["signature"]) != list(est.per_op["signature"])
        assert longer.gpu_time_ms != est.gpu_time_ms
        many = p.predict_many([(tr, (src, tgt)), tr], example_inputs=(src, tgt), gpu="H100")
        # the same figures (to rounding: a batch of candidates sums in another order)
        assert [m.gpu_time_ms for m in many] == pytest.approx([est.gpu_time_ms] * 2, rel=1e-9)
        ranking = gpurec.recommend(tr, example_inputs=(src, tgt), gpus=["H100", "A100-80GB"], predictor=p)
    assert ranking.input_shape == (8, 20, 64) and len(ranking.rows) == 2
    assert ranking.estimates["NVIDIA H100 80GB HBM3"].gpu_time_ms == pytest.approx(est.gpu_time_ms, rel=1e-9)


class _CalledByKeyword(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.lin = nn.Embedding(100, 64), nn.Linear(64, 64)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.lin(self.emb(decoder_input_ids)) + self.emb(input_ids).mean(1, keepdim=True)


def test_example_inputs_by_keyword_in_predict_many_and_recommend(p) -> None:  # noqa: ANN001
    """A dict of example inputs reaches forward by keyword; the names and shapes are the cache key
    (the same tensors by another name are another call)."""
    m = _CalledByKeyword()
    ids = {"input_ids": torch.zeros(8, 20, dtype=torch.long), "decoder_input_ids": torch.zeros(8, 12, dtype=torch.long)}
    with _quiet():
        est = p.predict(m, example_inputs=ids, gpu="H100")
        assert isinstance(est, Estimate) and est.input_shape == (8, 20) and est.gpu_time_ms > 0
        longer = p.predict(m, example_inputs={**ids, "decoder_input_ids": torch.zeros(8, 40, dtype=torch.long)})
        assert longer.gpu_time_ms != est.gpu_time_ms
        many = p.predict_many([(m, ids), (m, {"decoder_input_ids": ids["input_ids"], "input_ids": ids["input_ids"]})],
                              gpu="H100")
        assert many[0].gpu_time_ms == pytest.approx(est.gpu_time_ms, rel=1e-9)
        assert many[1].gpu_time_ms != pytest.approx(est.gpu_time_ms, rel=1e-9)
        ranking = gpurec.recommend(m, example_inputs=ids, gpus=["H100", "H200"], predictor=p)
    assert ranking.input_shape == (8, 20) and len(ranking.rows) == 2


class _ValueBranch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # control flow on a tensor's value: not traceable
            return x
        return -x


def test_a_bad_candidate_gets_an_error_result_and_the_others_answers(p) -> None:  # noqa: ANN001
    good = nn.Sequential(nn.Linear(32, 32), nn.ReLU())
    with _quiet():
        out = p.predict_many([good, _ValueBranch(), (good, (4, 7)), (good, (8, 32))], gpu="H100",
                             example_inputs=torch.randn(8, 32))
    assert [r.ok for r in out] == [True, False, False, True]
    err, shape_err = out[1], out[2]
    assert isinstance(err, CandidateError) and err.index == 1 and err.model == "_ValueBranch"
    # its own ExtractionError subclass, saying why: the branch reads values a shape-only capture has not
    assert err.error == "ValueDependentControlFlow" and "values" in err.reason and "candidate 1" in str(err)
    assert shape_err.index == 2 and "cannot take input" in shape_err.reason
    # the same answer as alone, to the last bits a batched sum may order differently
    alone = p.predict(good, (8, 32), gpu="H100").gpu_time_ms
    assert out[0].gpu_time_ms == pytest.approx(alone, rel=1e-12) and out[3].gpu_time_ms == pytest.approx(alone, rel=1e-12)
    with pytest.raises(ExtractionError):
        p.predict(_ValueBranch(), (8, 32), gpu="H100")
    with pytest.raises(ValueError, match="GPU|gpu"):
        p.predict_many([good], gpu="no such GPU")  # what applies to all candidates still raises


def test_predict_many_from_four_threads(p) -> None:  # noqa: ANN001
    def candidates(seed: int) -> list:
        """Fresh modules (never seen by the cache), distinct per thread."""
        return [nn.Sequential(nn.Linear(16, 16 + seed * 8 + i), nn.GELU(), nn.Linear(16 + seed * 8 + i, 4))
                for i in range(6)]

    expected = {s: [e.gpu_time_ms for e in p.predict_many([(m, (8, 16)) for m in candidates(s)], gpu="H100")]
                for s in range(4)}
    p.clear_cache()
    got: dict[int, list[list[float]]] = {s: [] for s in range(4)}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work(seed: int) -> None:
        try:
            start.wait()
            for _ in range(3):
                res = p.predict_many([(m, (8, 16)) for m in candidates(seed)], gpu="H100")
                got[seed].append([r.gpu_time_ms if r.ok else r for r in res])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for s in range(4):
        assert got[s] == [expected[s]] * 3, s


def test_kernel_free_operations_get_no_gpu_time_with_models_trained_so() -> None:
    import numpy as np

    from gpurec.model.network import free_kernel_free

    fresh = gpurec.load_predictor()
    fresh.kernel_free_no_gpu_time = False  # as for models fitted with predicted view times
    model = nn.Sequential(nn.Linear(64, 256), nn.Flatten(0), nn.Unflatten(0, (16, 8, 32)), nn.Dropout(0.0),
                          nn.Dropout(0.2))
    with _quiet():
        before = fresh.predict(model, (16, 64), mode="training", gpu="H100")
        fresh.kernel_free_no_gpu_time = True  # as for models whose manifest says "no_gpu_time"
        after = fresh.predict(model, (16, 64), mode="training", gpu="H100")
    ops = after.per_op
    free = ops["kind"].isin(["Flatten", "Unflatten"]) | (ops.index == 3)  # views and dropout with p=0
    assert list(ops.loc[free, "time_ms"]) == [0.0, 0.0, 0.0]
    assert (ops.loc[~free, "time_ms"].to_numpy() == before.per_op.loc[~free, "time_ms"].to_numpy()).all()
    assert (before.per_op.loc[free, "time_ms"] > 0).all() and after.op_sum_time_ms < before.op_sum_time_ms
    # a measurement stands for itself
    t = np.array([1.0, 2.0, 3.0])
    got = free_kernel_free(t, np.array([True, True, False]), np.array([True, False, False]))
    assert got.tolist() == [1.0, 0.0, 3.0] and free_kernel_free(t, None, None) is t


def test_views_that_split_their_input_launch_backward_kernels_in_training() -> None:
    """chunk/split/unbind are views, but in training their backward assembles the pieces'
    gradients (a kernel every step, in-network): kernel-free in inference only.  A plain view
    stays kernel-free in both modes."""
    from torch import nn

    from gpurec.ops import extract_operations

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 16)

        def forward(self, x):  # noqa: ANN001, ANN201
            a, b = self.lin(x).view(4, 16).chunk(2, dim=-1)
            return a * b

    free = {mode: {op.kind: op.kernel_free for op in extract_operations(Gated(), (4, 8), mode=mode)}
            for mode in ("inference", "training")}
    assert free["inference"]["chunk"] and not free["training"]["chunk"]
    assert free["inference"]["view"] and free["training"]["view"]


def test_set_extractor_keeps_the_kernel_free_flags_in_its_disk_cache(tmp_path) -> None:  # noqa: ANN001
    from gpurec.model.features import SetExtractor

    cold = SetExtractor(str(tmp_path))
    first = cold.get("vit_b_32:b2:r224", "training")
    assert first is not None and first.kernel_free is not None and first.kernel_free.any()
    cold.save()
    warm = SetExtractor(str(tmp_path))
    again = warm.get("vit_b_32:b2:r224", "training")
    assert warm.sets.extractions == 0  # read from disk, not extracted
    assert again.kernel_free.tolist() == first.kernel_free.tolist()


def test_a_compiled_module_is_estimated_as_its_eager_module(p) -> None:  # noqa: ANN001
    """torch.compile's wrapper goes through neither torch.fx nor a run on meta tensors: the module
    it wraps is estimated, with a warning that says so."""
    eager = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    compiled = torch.compile(eager)
    with _quiet(), pytest.warns(gpurec.CompiledModuleWarning, match="eager step"):
        est = p.predict(compiled, (32, 64), gpu="H100")
    with _quiet():
        assert est.gpu_time_ms == pytest.approx(p.predict(eager, (32, 64), gpu="H100").gpu_time_ms, rel=1e-9)


def test_a_torchscript_module_is_refused_with_what_to_pass_instead(p) -> None:  # noqa: ANN001
    """A scripted module has no Python forward to trace: the error names TorchScript and the fix,
    not torch.fx's internals."""
    eager = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates TorchScript; users still have scripted modules
        scripted, traced = torch.jit.script(eager), torch.jit.trace(eager, torch.randn(32, 64))
    with _quiet(), pytest.raises(ExtractionError, match="TorchScript module.*pass the nn.Module you scripted"):
        p.predict(scripted, (32, 64), gpu="H100")
    with _quiet(), pytest.raises(ExtractionError, match="TorchScript module"):
        p.predict(traced, (32, 64), gpu="H100")


def test_recommend_searches_the_gpu_bound_batch_at_the_precision_asked(p) -> None:  # noqa: ANN001
    """A host-bound bf16-mixed step sends recommend looking for the batch where it turns GPU-bound;
    that search predicted with the precision passed as example inputs and raised."""
    ranking = gpurec.recommend("gpt_d768", (4, 512), mode="training", precision="bf16-mixed", gpus="H100,H200",
                               predictor=p)
    assert ranking.precision == "bf16-mixed" and len(ranking.rows) == 2
    assert ranking.advice is not None and ranking.advice.searched_up_to > 4
