"""The formats the tools exchange on disk: text preprocessing (``text``), vocabularies (``vocab``), the binarized
corpus (``corpus``), the prepared directory's manifest (``manifest``), training batches (``batching``), BPE-dropout
(``bpedropout``) and the checkpoint format (``checkpoint``).  The bottom of the library with ``nmtkit.runtime``:
it imports no model and no tool (docs/design.rst).

Its public names are importable from the package itself (``from nmtkit.data import PreparedData``), each looked up
in its module on first use.
"""

from nmtkit.runtime import lazy_names

__all__, __getattr__ = lazy_names(__name__, {
    "PreparedData": "manifest"
})
