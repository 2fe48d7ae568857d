"""The sizes of RNNencdec and RNNsearch (their configs: the paper's m, n, n', l, the shortlists) and the named presets:
the paper's (RNNencdec-30/50, RNNsearch-30/50: m = 620, n = n' = 1000, l = 500), the CPU's (``-small``) and the
tests' (``-tiny``).  Plain values only, so that a config goes into a checkpoint loaded with ``weights_only=True``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nmtkit.models.encoder import GRU_UNITS
from nmtkit.models.registry import register_preset


@dataclass
class RNNencdecConfig:
    """Sizes of the RNN Encoder-Decoder.  Defaults are the paper's (m=620, n=1000, l=500, 30k shortlists)."""

    src_vocab_size: int = 30000
    tgt_vocab_size: int = 30000
    emb_dim: int = 620  # m
    hidden_dim: int = 1000  # n
    maxout_dim: int = 500  # l
    max_len: int = 50  # training sentence length (informational: 30 or 50 in the paper)
    dropout: float = 0.0  # the paper used none
    encoder_gru: str = "paper"  # "paper" (reset before U) or "torch" (torch.nn.GRU: a different unit)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"{f.name} must be a positive integer, got {v!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        self.dropout = float(self.dropout)
        if self.encoder_gru not in GRU_UNITS:
            raise ValueError(f"encoder_gru must be one of {', '.join(GRU_UNITS)}, got {self.encoder_gru!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain ints/floats/strs only (safe for checkpoints loaded with weights_only=True)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(valid))
        if unknown:
            raise ValueError(f"unknown {cls.__name__} option(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
        return cls(**d)


@dataclass
class RNNsearchConfig(RNNencdecConfig):
    """Sizes of RNNsearch: the RNNencdec's plus the alignment model's hidden layer n'."""

    attn_dim: int = 1000  # n'


PAPER_SIZES = dict(emb_dim=620, hidden_dim=1000, maxout_dim=500)
# the peer benchmark's sizes (CPU).  maxout l = 256, not the paper's ratio l = n/2: with l = 128 only 128 units
# feed the 16,000-word softmax; l = 256 learns more per update (tests/bench/results/bench_quality.txt and
# bench_learning.txt, pass 3)
SMALL_SIZES = dict(emb_dim=256, hidden_dim=256, maxout_dim=256)
TINY_SIZES = dict(emb_dim=32, hidden_dim=48, maxout_dim=24)  # tests
for _len in (30, 50):
    register_preset(f"rnnsearch-{_len}", "rnnsearch", **PAPER_SIZES, attn_dim=1000, max_len=_len)
    register_preset(f"rnnencdec-{_len}", "rnnencdec", **PAPER_SIZES, max_len=_len)
register_preset("rnnsearch-small", "rnnsearch", **SMALL_SIZES, attn_dim=256)
register_preset("rnnencdec-small", "rnnencdec", **SMALL_SIZES)
register_preset("rnnsearch-tiny", "rnnsearch", **TINY_SIZES, attn_dim=40)
register_preset("rnnencdec-tiny", "rnnencdec", **TINY_SIZES)
