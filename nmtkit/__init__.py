"""nmtkit: RNNsearch and RNNencdec (Bahdanau, Cho & Bengio, ICLR 2015) as command-line tools and a library."""

__version__ = "0.1.0"
