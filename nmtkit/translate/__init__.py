"""``nmt-translate``: the streaming translator (``translator``), batch decoding (``decoding``) in this process or in
worker processes (``pool``), beam search (``search``), sampling (``sampling``), and the per-line outputs: word
alignments (``wordalign``) and the other formats (``outputs``).

Its public names are importable from the package itself (``from nmtkit.translate import Translator``), each looked
up in its module on first use.
"""

from nmtkit.runtime import lazy_names

__all__, __getattr__ = lazy_names(__name__, {
    "Translator": "translator", "DecodeConfig": "config", "Translation": "outputs", "load_unk_dict": "unkreplace"
})
