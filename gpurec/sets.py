"""Model-input sets and the architecture lists both halves of gpurec share.

The GPU side plans and measures these sets; the CPU side trains on and reports them.  They
live here, with no imports, so that modelling and recommending never load collection code.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# The modes every operation and network is extracted, measured and predicted in.
MODES: tuple[str, ...] = ("inference", "training")

# The architectures measured per operation (the training set) ...
DATASET_ARCHS: tuple[str, ...] = (
    "alexnet", "vgg11", "vgg16", "resnet18", "resnet34", "resnet50", "resnet101", "resnext50_32x4d",
    "wide_resnet50_2", "densenet121", "squeezenet1_0", "googlenet", "mobilenet_v2", "mobilenet_v3_large",
    "mnasnet1_0", "shufflenet_v2_x1_0", "efficientnet_b0", "efficientnet_b3", "regnet_y_400mf",
    "regnet_y_1_6gf", "convnext_tiny", "vit_b_16", "vit_b_32", "swin_t",
)
DATASET_BATCH_SIZES: tuple[int, ...] = (1, 8, 32, 128)
# ... and the unseen test architectures: only ever measured as whole networks, never trained on.
TEST_ARCHS: tuple[str, ...] = (
    "vgg13_bn", "resnext101_32x8d", "densenet169", "efficientnet_b1", "regnet_x_800mf", "mnasnet0_5",
    "shufflenet_v2_x0_5", "swin_s", "squeezenet1_1",
)
TEST_BATCH_SIZES: tuple[int, ...] = (8, 64)
# Hand-written architectures (built by gpurec.synthsets, never torchvision classifiers) that
# target the operation kinds carrying the time error on unseen networks: measured per
# operation and whole, they join the training data like DATASET_ARCHS.
SYNTH_ARCHS: tuple[str, ...] = ("synthgconv", "synthdense", "synthwin", "synthse", "synthsd", "synthdensecat")
SYNTH_BATCH_SIZES: tuple[int, ...] = (8, 32, 128)
# ... except architectures added after the unseen networks' batches were fixed: theirs avoid
# TEST_BATCH_SIZES like the sweeps' below (synthdensecat: 96 for the bytes of densenet169's widest
# concatenations at a given input count, 4 below the unseen networks' smallest batch).
SYNTH_BATCH_SIZES_BY_ARCH: dict[str, tuple[int, ...]] = {"synthdensecat": (16, 48, 96, 4)}
# Operation sweeps: many shapes of one kind side by side, measured per operation only (as a
# network they are not a meaningful step, and the wide ones would not fit in training).
SWEEP_ARCHS: tuple[str, ...] = ("sweepgconv", "sweepwindow", "sweepfewgroups", "sweepmidgroups", "sweepdepthwise",
                                 "sweeplategroups", "sweepdense", "sweepnarrow")
SWEEP_BATCH_SIZES: tuple[int, ...] = (8, 32)
# ... except where the batch itself is what the sweep is for (cuDNN's algorithm choice for
# few-group convolutions changes with the batch).  Its batches avoid TEST_BATCH_SIZES, so that no
# swept operation is one of an unseen network's.
# Dense convolutions: the training sets hold them at batches 1, 8, 32 and 128; the dense sweeps'
# batches fill the gaps on both sides of the unseen networks' 8 and 64 without being either.
SWEEP_BATCH_SIZES_BY_ARCH: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(("sweepfewgroups", "sweepmidgroups", "sweepdepthwise", "sweeplategroups"), (1, 2, 4, 16, 32)),
    "sweepdense": (48, 96, 16, 4, 2),
    "sweepnarrow": (48, 96, 16),
}


@dataclass(frozen=True)
class ModelInputSet:
    """A torchvision architecture on one input: ``arch:bBATCH:rRESOLUTION`` as a key."""

    arch: str
    batch: int
    resolution: int = 224

    input_dtype = "float32"  # a class constant, not a field: images are float (batch, 3, r, r)

    @property
    def key(self) -> str:
        return f"{self.arch}:b{self.batch}:r{self.resolution}"

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, 3, self.resolution, self.resolution)

    @staticmethod
    def parse(key: str) -> ModelInputSet:
        """The set of a key such as ``resnet50:b32:r224``; ValueError names a malformed key."""
        try:
            arch, b, r = key.split(":")
            if not (b.startswith("b") and r.startswith("r")):
                raise ValueError
            return ModelInputSet(arch, int(b[1:]), int(r[1:]))
        except ValueError:
            raise ValueError(f"a model-input set key looks like 'resnet50:b32:r224', not {key!r}") from None


def model_input_sets(archs: Iterable[str], batch_sizes: Iterable[int],
                     resolutions: Iterable[int] = (224,),
                     batch_sizes_by_arch: dict[str, tuple[int, ...]] | None = None) -> list[ModelInputSet]:
    """Every (architecture, resolution, batch size) combination, in that nesting order; an
    architecture in ``batch_sizes_by_arch`` takes its own batch sizes instead."""
    batch_sizes = list(batch_sizes)
    resolutions = list(resolutions)
    by_arch = batch_sizes_by_arch or {}
    return [ModelInputSet(a, b, r) for a in archs for r in resolutions for b in by_arch.get(a, batch_sizes)]


# -- sequence models (token-id inputs), built by gpurec.seqmodels -------------------------------
# Families by name prefix: "bert" encoders, "gpt" causal decoders, "lstm"/"gru" recurrent models.
# Measured per operation (training set) ...
SEQ_DATASET_ARCHS: tuple[str, ...] = (
    "bert_d256_post", "bert_d512_pre", "bert_d768_post", "bert_d1024_pre",
    "gpt_d512", "gpt_d1024", "gpt_d1536",
    "lstm_lm_2x512", "lstm_lm_1x1024", "gru_lm_1x1024", "gru_lm_2x256", "lstm_cls_bi_1x256", "gru_cls_bi_3x512",
    # deeper unidirectional stacks (session 10): without them no training network had more than two
    # recurrent layers, and the held-out 3-layer LSTM language model was 10.7% off in time
    "lstm_lm_4x384", "gru_lm_3x640",
)
# ... and held out: only ever measured as whole networks, never trained on.
SEQ_TEST_ARCHS: tuple[str, ...] = ("bert_d384_pre", "gpt_d768", "lstm_lm_3x768", "gru_cls_bi_2x384")
# The operation kinds transformers and recurrent networks run that the torchvision sets do not
# (whole cuDNN recurrent layers and the attention building blocks; issue 22).
SEQUENCE_KINDS: tuple[str, ...] = ("LSTM", "GRU", "RNN", "Embedding", "scaled_dot_product_attention", "matmul",
                                   "bmm", "softmax", "log_softmax", "masked_fill", "where", "pow", "max", "cumsum")
# (batch sizes, sequence lengths) per family; the test shapes differ from the training ones on purpose.
SEQ_SHAPES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "bert": ((1, 8, 32), (64, 128, 512)),
    "gpt": ((1, 4, 16), (128, 512, 1024)),
    "rnn": ((1, 8, 32, 128), (32, 128, 512)),
}
SEQ_TEST_SHAPES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "bert": ((4, 16), (128, 384)),
    "gpt": ((2, 8), (256, 768)),
    "rnn": ((8, 64), (96, 384)),
}


# Recurrent operation sweeps: LSTM or GRU layers of many sizes side by side over token ids,
# measured per operation only, at the training sets' shapes (SEQ_SHAPES["rnn"]).  Without them
# the recurrent models saw five hidden sizes; the sweeps' sizes avoid the held-out ones (768, 384).
RNN_SWEEP_ARCHS: tuple[str, ...] = ("lstm_sweep", "gru_sweep")
# Language-model heads of many widths and vocabularies side by side (gpurec.seqmodels.HeadSweep),
# measured per operation only, at these (batch sizes, sequence lengths): 256 to 8,192 tokens, at
# the training decoders' batches (never the held-out ones' batch 8 or 2).
HEAD_SWEEP_ARCHS: tuple[str, ...] = ("gpt_heads",)
SEQ_SWEEP_ARCHS: tuple[str, ...] = RNN_SWEEP_ARCHS + HEAD_SWEEP_ARCHS
HEAD_SWEEP_SHAPES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {"gpt": ((1, 16), (256, 512))}


def seq_family(arch: str) -> str:
    """"bert", "gpt" or "rnn" (LSTM and GRU models) from a sequence architecture's name."""
    head = arch.split("_", 1)[0]
    if head in ("bert", "gpt"):
        return head
    if head in ("lstm", "gru", "rnn"):
        return "rnn"
    raise ValueError(f"{arch!r} is not a sequence architecture (names start with bert_, gpt_, lstm_ or gru_)")


def is_sequence_arch(arch: str) -> bool:
    return arch in SEQ_DATASET_ARCHS or arch in SEQ_TEST_ARCHS or arch in SEQ_SWEEP_ARCHS


@dataclass(frozen=True)
class SequenceInputSet:
    """A sequence architecture on ``batch`` sequences of ``seq_len`` token ids (int64):
    ``arch:bBATCH:sSEQ`` as a key.  Same protocol as ModelInputSet (key, input_shape, parse)."""

    arch: str
    batch: int
    seq_len: int

    input_dtype = "int64"  # class constants, not fields
    resolution = 0  # no image: sorts before every image set in a plan

    @property
    def key(self) -> str:
        return f"{self.arch}:b{self.batch}:s{self.seq_len}"

    @property
    def input_shape(self) -> tuple[int, int]:
        return (self.batch, self.seq_len)

    @staticmethod
    def parse(key: str) -> SequenceInputSet:
        """The set of a key such as ``gpt_d512:b4:s1024``; ValueError names a malformed key."""
        try:
            arch, b, s = key.split(":")
            if not (b.startswith("b") and s.startswith("s")):
                raise ValueError
            return SequenceInputSet(arch, int(b[1:]), int(s[1:]))
        except ValueError:
            raise ValueError(f"a sequence set key looks like 'gpt_d512:b4:s1024', not {key!r}") from None


AnyInputSet = ModelInputSet | SequenceInputSet


def parse_set_key(key: str) -> AnyInputSet:
    """An image set (``arch:bB:rR``) or a sequence set (``arch:bB:sS``) from its key."""
    parts = key.split(":")
    if len(parts) == 3 and parts[2].startswith("s"):
        return SequenceInputSet.parse(key)
    try:
        return ModelInputSet.parse(key)
    except ValueError:
        raise ValueError(f"a model-input set key looks like 'resnet50:b32:r224' or 'gpt_d512:b4:s1024', "
                         f"not {key!r}") from None


def sequence_input_sets(archs: Iterable[str], shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
                        ) -> list[SequenceInputSet]:
    """Every (architecture, sequence length, batch size) of each architecture's family shapes."""
    out = []
    for a in archs:
        batches, lengths = shapes[seq_family(a)]
        out.extend(SequenceInputSet(a, b, s) for s in lengths for b in batches)
    return out
