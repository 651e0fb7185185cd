"""The sequence architectures of gpurec.sets, built as plain nn.Modules over token ids.

CPU side: no GPU imports.  Each model takes one int64 tensor of token ids, (batch, seq_len),
with ids in [0, ``model.vocab_size``), and is written the ways such models are commonly
written, so that the operations transformers and recurrent models run (Embedding, matmul,
bmm, softmax, masked_fill, scaled_dot_product_attention, pow, max, cumsum, LSTM, GRU) all
appear in the collected data:

* ``bert_*``: encoders with a classifier head, post-norm or pre-norm; either PyTorch's
  nn.TransformerEncoder or hand-written blocks with explicit attention (matmul, masked_fill
  over a padding mask, softmax) or F.scaled_dot_product_attention; learned positions by
  ``torch.arange`` or RoBERTa's padding-aware cumsum;
* ``gpt_*``: decoders with causal attention (F.scaled_dot_product_attention(is_causal=True)
  or a triangular mask with bmm) and an LM head (tied or not), GELU written out with pow;
* ``lstm_*`` / ``gru_*``: language models (log_softmax over the vocabulary) and classifiers
  (bidirectional, max or mean pooling over time).

Sizes are chosen so one training step of the largest set of each family fits an 80 GB H100
with room to spare (``gpurec.sets.SEQ_SHAPES``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpurec.sets import SEQ_DATASET_ARCHS, SEQ_SWEEP_ARCHS, SEQ_TEST_ARCHS

PAD_ID = 0  # padding token: masked out of attention, position 0 in RoBERTa-style positions
MAX_POSITIONS = 1024


class UnknownSequenceArch(ValueError):
    """Not one of gpurec.sets' sequence architectures."""


@dataclass(frozen=True)
class EncoderSpec:
    d: int
    heads: int
    layers: int
    norm_first: bool
    attention: str  # "torch" (nn.TransformerEncoder), "manual" (matmul + masked_fill + softmax), "sdpa"
    positions: str = "arange"  # "arange" or "cumsum" (RoBERTa's padding-aware positions)
    vocab: int = 30522
    classes: int = 2
    dropout: float = 0.1


@dataclass(frozen=True)
class DecoderSpec:
    d: int
    heads: int
    layers: int
    attention: str  # "sdpa" (is_causal=True) or "bmm" (triangular mask, masked_fill, softmax)
    gelu: str = "torch"  # "torch" (nn.GELU) or "tanh" (written out with pow, as GPT-2's)
    tied: bool = True  # LM head shares the token embedding
    vocab: int = 50257
    dropout: float = 0.1


@dataclass(frozen=True)
class RecurrentSpec:
    cell: str  # "LSTM" or "GRU"
    hidden: int
    layers: int
    bidirectional: bool
    head: str  # "lm" (log_softmax over the vocabulary) or "max" / "mean" pooled classifier
    embed: int = 0  # 0: the hidden size
    vocab: int = 10000
    classes: int = 4
    dropout: float = 0.1


@dataclass(frozen=True)
class RecurrentSweepSpec:
    """Recurrent layers side by side, each its own operation: (input size, hidden size, layers,
    bidirectional) per branch, every branch over token ids embedded at its input size."""

    cell: str  # "LSTM" or "GRU"
    branches: tuple[tuple[int, int, int, bool], ...]
    vocab: int = 10000
    dropout: float = 0.1


@dataclass(frozen=True)
class HeadSweepSpec:
    """Language-model heads side by side, each its own operation: (width K, vocabulary N) per
    branch, every branch over the tokens embedded at its width."""

    branches: tuple[tuple[int, int], ...]
    vocab: int = 1000  # of the token ids (the embedding tables), not of the heads


def _head_branches() -> tuple[tuple[int, int], ...]:
    """Widths beside the training decoders' (512, 1024, 1536) but none of the held-out models'
    (768, 384), by vocabularies users train: padded to a multiple of 8 or more (32,000; 32,768;
    50,304, GPT-2's padded to 64; 128,256) and not (30,522, BERT's; 50,257, GPT-2's).  Why: the
    training rows hold large half-precision heads at 10,000 words (aligned) and 50,257 (not), so
    an aligned 50,304-word head fell between them (DEVELOPERS.md, session 46)."""
    return tuple((k, n) for k in (512, 1024, 2048) for n in (30522, 32000, 32768, 50257, 50304, 128256))


def _sweep_branches() -> tuple[tuple[int, int, int, bool], ...]:
    """Hidden sizes around and beyond the training models' (256-1024) but none of the held-out
    models' (768, 384), one to three layers; the widest take a 512-wide input; a few bidirectional."""
    uni = tuple((h if h <= 896 else 512, h, n, False) for h in (192, 448, 576, 896, 1280) for n in (1, 2, 3))
    return uni + tuple((256, h, n, True) for h in (192, 448, 576) for n in (1, 2))


SPECS: dict[str, EncoderSpec | DecoderSpec | RecurrentSpec | RecurrentSweepSpec | HeadSweepSpec] = {
    # training architectures
    "bert_d256_post": EncoderSpec(256, 4, 4, norm_first=False, attention="torch"),
    "bert_d512_pre": EncoderSpec(512, 8, 6, norm_first=True, attention="manual"),
    "bert_d768_post": EncoderSpec(768, 12, 6, norm_first=False, attention="sdpa", positions="cumsum"),
    "bert_d1024_pre": EncoderSpec(1024, 16, 6, norm_first=True, attention="torch"),
    "gpt_d512": DecoderSpec(512, 8, 6, attention="sdpa", gelu="tanh", dropout=0.0),
    "gpt_d1024": DecoderSpec(1024, 16, 4, attention="bmm"),
    "gpt_d1536": DecoderSpec(1536, 16, 4, attention="sdpa", tied=False),
    "lstm_lm_2x512": RecurrentSpec("LSTM", 512, 2, False, "lm"),
    "gru_lm_1x1024": RecurrentSpec("GRU", 1024, 1, False, "lm", embed=512),
    "lstm_lm_1x1024": RecurrentSpec("LSTM", 1024, 1, False, "lm", embed=512),
    "gru_lm_2x256": RecurrentSpec("GRU", 256, 2, False, "lm"),
    "lstm_cls_bi_1x256": RecurrentSpec("LSTM", 256, 1, True, "max", embed=128),
    "gru_cls_bi_3x512": RecurrentSpec("GRU", 512, 3, True, "mean", embed=256),
    "lstm_lm_4x384": RecurrentSpec("LSTM", 384, 4, False, "lm"),
    "gru_lm_3x640": RecurrentSpec("GRU", 640, 3, False, "lm", embed=320),
    # held-out test architectures
    "bert_d384_pre": EncoderSpec(384, 6, 6, norm_first=True, attention="torch"),
    "gpt_d768": DecoderSpec(768, 12, 6, attention="sdpa", gelu="tanh"),
    "lstm_lm_3x768": RecurrentSpec("LSTM", 768, 3, False, "lm"),
    "gru_cls_bi_2x384": RecurrentSpec("GRU", 384, 2, True, "max", embed=256),
    # recurrent operation sweeps (measured per operation only)
    "lstm_sweep": RecurrentSweepSpec("LSTM", _sweep_branches()),
    "gru_sweep": RecurrentSweepSpec("GRU", _sweep_branches()),
    # language-model head sweep (measured per operation only)
    "gpt_heads": HeadSweepSpec(_head_branches()),
}


def sequence_arch_names() -> tuple[str, ...]:
    return SEQ_DATASET_ARCHS + SEQ_TEST_ARCHS + SEQ_SWEEP_ARCHS


def has_recurrent_layers(arch: str) -> bool:
    """Whether ``arch`` is a sequence architecture built of whole cuDNN LSTM/GRU layers."""
    return isinstance(SPECS.get(arch), (RecurrentSpec, RecurrentSweepSpec))


def build(arch: str) -> nn.Module:
    """A fresh model of ``arch`` (on the current default device; ``with torch.device('meta')``
    builds it without memory).  It has ``vocab_size``: token ids must lie in [0, vocab_size)."""
    if arch not in sequence_arch_names():
        raise UnknownSequenceArch(f"{arch!r} is not a sequence architecture; known: "
                                  f"{', '.join(sequence_arch_names())}")
    spec = SPECS[arch]
    if isinstance(spec, EncoderSpec):
        return Encoder(spec)
    if isinstance(spec, DecoderSpec):
        return Decoder(spec)
    if isinstance(spec, RecurrentSweepSpec):
        return RecurrentSweep(spec)
    if isinstance(spec, HeadSweepSpec):
        return HeadSweep(spec)
    return Recurrent(spec)


def random_token_ids(arch_or_model: str | nn.Module, shape: tuple[int, ...], device: Any = "cpu",
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Random int64 token ids in [0, vocab) for ``arch_or_model`` (an arch name or a built model)."""
    vocab = (SPECS[arch_or_model].vocab if isinstance(arch_or_model, str)
             else int(arch_or_model.vocab_size))  # type: ignore[union-attr]
    return torch.randint(0, vocab, tuple(shape), dtype=torch.int64, device=device, generator=generator)


# -- encoders -------------------------------------------------------------------------------------
def gelu(x: torch.Tensor) -> torch.Tensor:
    """F.gelu behind a function PyTorch's TransformerEncoderLayer does not recognise (no fast path)."""
    return F.gelu(x)


class ManualSelfAttention(nn.Module):
    """Multi-head self-attention written out: explicit scores (matmul), a padding mask
    (masked_fill), softmax and dropout; or F.scaled_dot_product_attention with the mask."""

    def __init__(self, d: int, heads: int, dropout: float, use_sdpa: bool) -> None:
        super().__init__()
        self.heads, self.head_dim, self.use_sdpa, self.p = heads, d // heads, use_sdpa, dropout
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad, dropout_p=self.p if self.training else 0.0)
        else:
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            scores = scores.masked_fill(pad, float("-inf"))
            y = torch.matmul(self.drop(torch.softmax(scores, dim=-1)), v)
        return self.out(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class EncoderBlock(nn.Module):
    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        self.norm_first = spec.norm_first
        self.attn = ManualSelfAttention(spec.d, spec.heads, spec.dropout, use_sdpa=spec.attention == "sdpa")
        self.ff = nn.Sequential(nn.Linear(spec.d, 4 * spec.d), nn.GELU(), nn.Dropout(spec.dropout),
                                nn.Linear(4 * spec.d, spec.d))
        self.norm1, self.norm2 = nn.LayerNorm(spec.d), nn.LayerNorm(spec.d)
        self.drop1, self.drop2 = nn.Dropout(spec.dropout), nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        if self.norm_first:
            x = x + self.drop1(self.attn(self.norm1(x), pad))
            return x + self.drop2(self.ff(self.norm2(x)))
        x = self.norm1(x + self.drop1(self.attn(x, pad)))
        return self.norm2(x + self.drop2(self.ff(x)))


class Encoder(nn.Module):
    """BERT-like: token + learned position embeddings, blocks, [CLS] pooling, classifier."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        self.spec, self.vocab_size = spec, spec.vocab
        self.tok = nn.Embedding(spec.vocab, spec.d)
        self.pos = nn.Embedding(MAX_POSITIONS + 2, spec.d)
        self.emb_norm = nn.LayerNorm(spec.d)
        self.emb_drop = nn.Dropout(spec.dropout)
        if spec.attention == "torch":
            # GELU through a plain function, not "gelu" or nn.GELU: PyTorch's fused inference fast
            # path (which extraction's slow-path decomposition does not describe) is then never
            # taken, so the measured network runs the operations extracted from it.
            layer = nn.TransformerEncoderLayer(spec.d, spec.heads, 4 * spec.d, spec.dropout, activation=gelu,
                                               batch_first=True, norm_first=spec.norm_first)
            self.encoder: nn.Module = nn.TransformerEncoder(layer, spec.layers, enable_nested_tensor=False)
        else:
            self.encoder = nn.ModuleList(EncoderBlock(spec) for _ in range(spec.layers))
        self.final_norm = nn.LayerNorm(spec.d) if spec.norm_first else nn.Identity()
        self.pool = nn.Linear(spec.d, spec.d)
        self.pool_act = nn.Tanh()
        self.classifier = nn.Linear(spec.d, spec.classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.spec.positions == "cumsum":
            keep = ids.ne(PAD_ID).int()
            positions = (torch.cumsum(keep, dim=1) * keep).long() + 1
        else:
            positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.emb_drop(self.emb_norm(self.tok(ids) + self.pos(positions)))
        if self.spec.attention == "torch":
            x = self.encoder(x)
        else:
            pad = (ids == PAD_ID)[:, None, None, :]  # True where a key is padding
            for block in self.encoder:
                x = block(x, pad)
        x = self.final_norm(x)
        return self.classifier(self.pool_act(self.pool(x[:, 0])))


# -- decoders -------------------------------------------------------------------------------------
class TanhGELU(nn.Module):
    """GPT-2's GELU, written out (pow, tanh, mul, add)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):
    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.heads, self.head_dim, self.p = spec.heads, spec.d // spec.heads, spec.dropout
        self.use_sdpa = spec.attention == "sdpa"
        self.qkv = nn.Linear(spec.d, 3 * spec.d)
        self.out = nn.Linear(spec.d, spec.d)
        self.attn_drop = nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape[0], x.shape[1], x.shape[2]
        q, k, v = self.qkv(x).split(d, dim=2)
        if self.use_sdpa:
            q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(b, s, d)
        else:
            # (batch * heads, seq, head_dim) and bmm, as older implementations do
            q, k, v = (t.view(b, s, self.heads, self.head_dim).transpose(1, 2).reshape(b * self.heads, s,
                                                                                        self.head_dim)
                       for t in (q, k, v))
            scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(self.head_dim)
            future = torch.ones_like(scores[0], dtype=torch.bool).triu(1)  # True above the diagonal
            scores = scores.masked_fill(future, float("-inf"))
            y = torch.bmm(self.attn_drop(F.softmax(scores, dim=-1)), v)
            y = y.view(b, self.heads, s, self.head_dim).transpose(1, 2).reshape(b, s, d)
        return self.out(y)


class DecoderBlock(nn.Module):
    """Pre-norm GPT block."""

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(spec.d), nn.LayerNorm(spec.d)
        self.attn = CausalSelfAttention(spec)
        act: nn.Module = TanhGELU() if spec.gelu == "tanh" else nn.GELU()
        self.mlp = nn.Sequential(nn.Linear(spec.d, 4 * spec.d), act, nn.Linear(4 * spec.d, spec.d),
                                 nn.Dropout(spec.dropout))
        self.resid_drop = nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.resid_drop(self.attn(self.ln1(x)))
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    """GPT-like: token + position embeddings, causal blocks, final norm, LM head (logits)."""

    def __init__(self, spec: DecoderSpec) -> None:
        super().__init__()
        self.spec, self.vocab_size = spec, spec.vocab
        self.tok = nn.Embedding(spec.vocab, spec.d)
        self.pos = nn.Embedding(MAX_POSITIONS, spec.d)
        self.drop = nn.Dropout(spec.dropout)
        self.blocks = nn.ModuleList(DecoderBlock(spec) for _ in range(spec.layers))
        self.ln_f = nn.LayerNorm(spec.d)
        self.head = None if spec.tied else nn.Linear(spec.d, spec.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.tok(ids) + self.pos(positions))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if self.head is None:
            return F.linear(x, self.tok.weight)
        return self.head(x)


# -- recurrent ------------------------------------------------------------------------------------
class Recurrent(nn.Module):
    """An LSTM or GRU over embedded tokens: a language model or a pooled classifier."""

    def __init__(self, spec: RecurrentSpec) -> None:
        super().__init__()
        self.spec, self.vocab_size = spec, spec.vocab
        embed = spec.embed or spec.hidden
        self.tok = nn.Embedding(spec.vocab, embed)
        self.drop = nn.Dropout(spec.dropout)
        cls = nn.LSTM if spec.cell == "LSTM" else nn.GRU
        self.rnn = cls(embed, spec.hidden, spec.layers, batch_first=True, bidirectional=spec.bidirectional,
                       dropout=spec.dropout if spec.layers > 1 else 0.0)
        out = spec.hidden * (2 if spec.bidirectional else 1)
        self.head = nn.Linear(out, spec.vocab if spec.head == "lm" else spec.classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(self.drop(self.tok(ids)))
        if self.spec.head == "lm":
            return F.log_softmax(self.head(self.drop(y)), dim=-1)
        pooled = y.max(dim=1).values if self.spec.head == "max" else y.mean(dim=1)
        return self.head(pooled)


class RecurrentSweep(nn.Module):
    """An operation sweep (gpurec.sets.SEQ_SWEEP_ARCHS): one recurrent layer stack per branch of
    the spec, each over the tokens embedded at its input size; the output concatenates every
    branch's last step, so training reaches each stack's backward.  Not a network anyone runs:
    only its operations are measured."""

    def __init__(self, spec: RecurrentSweepSpec) -> None:
        super().__init__()
        self.spec, self.vocab_size = spec, spec.vocab
        cls = nn.LSTM if spec.cell == "LSTM" else nn.GRU
        inputs = sorted({b[0] for b in spec.branches})
        self.tok = nn.ModuleDict({str(d): nn.Embedding(spec.vocab, d) for d in inputs})
        self.rnns = nn.ModuleList(cls(d, h, n, batch_first=True, bidirectional=bi,
                                      dropout=spec.dropout if n > 1 else 0.0) for d, h, n, bi in spec.branches)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        embedded = {d: emb(ids) for d, emb in self.tok.items()}
        last = [rnn(embedded[str(b[0])])[0][:, -1] for rnn, b in zip(self.rnns, self.spec.branches, strict=True)]
        return torch.cat(last, dim=1)


class HeadSweep(nn.Module):
    """An operation sweep (gpurec.sets.SEQ_SWEEP_ARCHS): one language-model head (``nn.Linear(K,
    N)``) per branch of the spec, each over the tokens embedded at its width; the output is each
    head's mean logit, so training reaches each head's backward (its input's gradient included, as
    in a model whose head follows trained layers).  Not a network anyone runs: only its operations
    are measured."""

    def __init__(self, spec: HeadSweepSpec) -> None:
        super().__init__()
        self.spec, self.vocab_size = spec, spec.vocab
        widths = sorted({k for k, _ in spec.branches})
        self.tok = nn.ModuleDict({str(k): nn.Embedding(spec.vocab, k) for k in widths})
        self.heads = nn.ModuleList(nn.Linear(k, n) for k, n in spec.branches)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        embedded = {k: emb(ids) for k, emb in self.tok.items()}
        return torch.stack([head(embedded[str(k)]).mean(dim=-1)
                            for head, (k, _) in zip(self.heads, self.spec.branches, strict=True)], dim=-1)
