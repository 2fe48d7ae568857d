"""``nmt-select``: its settings and folds (``config``), cross-entropy-difference data selection (``selection``),
its n-gram language models (``lm``, ``lm_count``, ``lm_arpa``) and the scoring workers and scores file
(``scores``).

Its public names are importable from the package itself (``from nmtkit.select import SelectConfig``), each looked up
in its module on first use.
"""

from nmtkit.runtime import lazy_names

__all__, __getattr__ = lazy_names(__name__, {
    "SelectConfig": "config", "select": "selection"
})
