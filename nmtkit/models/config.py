"""The sizes of RNNencdec and RNNsearch (their configs: the paper's m, n, n', l, the shortlists) and the named presets:
the paper's (RNNencdec-30/50, RNNsearch-30/50: m = 620, n = n' = 1000, l = 500, Appendix A's equations), the CPU's
(``-small``: smaller, and the decoder state reading the current word) and the tests' (``-tiny``).  Plain values
only, so that a config goes into a checkpoint loaded with ``weights_only=True``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nmtkit.models.encoder import GRU_UNITS
from nmtkit.models.registry import register_preset

# What the decoder's state s_i reads besides s_{i-1} and c_i.  The paper's versions differ (its v6 and v7 notes):
# - "previous": y_{i-1}, Appendix A of v7 as it reads.  Step i predicts y_i from s_{i-1}, which has read y_{i-2},
#   so y_{i-1} reaches the prediction only through V_o E y_{i-1} in the deep output, and the alignment model
#   chooses where to look at step i without knowing the word just produced.
# - "current": y_i, as v6 wrote it and the GroundHog code the authors trained with computes it (its readout reads
#   the state before the step's update, which has read the word just produced).  The equations are otherwise the
#   same; only the word each state reads moves by one, so s_{i-1} has read y_{i-1} when e_ij = a(s_{i-1}, h_j) and
#   t̃_i read it.  Its effect: tests/bench/results/bench_learning.txt, pass 4.
STATE_WORDS = ("previous", "current")


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
    # the word the decoder state reads: "previous", s_i = f(s_{i-1}, y_{i-1}, c_i) (Appendix A, v7), or "current",
    # s_i = f(s_{i-1}, y_i, c_i) (v6's equations and the authors' GroundHog code): then s_{i-1}, which the alignment
    # model and the deep output read at step i, has read y_{i-1}.  See STATE_WORDS.
    state_word: str = "previous"

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
        if self.state_word not in STATE_WORDS:
            raise ValueError(f"state_word must be one of {', '.join(STATE_WORDS)}, got {self.state_word!r}")

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
# The small presets' decoder state reads the current word (STATE_WORDS above; its effect on what they learn per
# update: tests/bench/results/bench_learning.txt, pass 4, and bench_quality.txt, run 6).  The paper's keep Appendix A.
# They train with the "fast" recipe (Adam; nmtkit/train/recipes.py), the paper's sizes with the paper's.
register_preset("rnnsearch-small", "rnnsearch", recipe="fast", **SMALL_SIZES, attn_dim=256, state_word="current")
register_preset("rnnencdec-small", "rnnencdec", recipe="fast", **SMALL_SIZES, state_word="current")
register_preset("rnnsearch-tiny", "rnnsearch", **TINY_SIZES, attn_dim=40)
register_preset("rnnencdec-tiny", "rnnencdec", **TINY_SIZES)
