"""``nmt-prepare``: raw parallel text → a prepared directory that training reads.

The settings of a run (``config``), the subword step, learned or given BPE codes or SentencePiece model
(``subwords``), and the streaming pipeline that tokenises, filters, counts and binarizes (``pipeline``).

Its public names are importable from the package itself (``from nmtkit.prepare import PrepareConfig, prepare``),
each looked up in its module on first use.
"""

from nmtkit.runtime import lazy_names

__all__, __getattr__ = lazy_names(__name__, {
    "PrepareConfig": "config", "prepare": "pipeline", "CHUNK": "pipeline"
})
