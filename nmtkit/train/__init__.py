"""``nmt-train``: the training loop (``trainer``), its settings and recipes (``config``, ``recipes``), the optimizer
(``adadelta``), learning-rate schedules (``schedule``), gradient norms and clipping (``gradients``), weight averaging
(``averaging``), validation (``validation``), exact resume and the run directory (``resume``, ``rundir``), the
training log and its TensorBoard mirror (``trainlog``, ``tblog``) and data parallelism (``distributed``).

Its public names are importable from the package itself (``from nmtkit.train import Trainer``), each looked up in
its module on first use.
"""

from nmtkit.runtime import lazy_names

__all__, __getattr__ = lazy_names(__name__, {
    "Trainer": "trainer", "train": "trainer", "TrainConfig": "config", "TrainState": "config", "train_config": "config"
})
