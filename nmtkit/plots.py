"""Figures for ``nmt-score`` and ``nmt-align``: BLEU by sentence length (the paper's Figure 2) and attention
matrices (Figure 3).

matplotlib is imported inside the functions, with the non-interactive Agg backend, so that importing this module
costs nothing and no display is ever needed. The format follows the file's extension (``.png``, ``.svg``, ``.pdf``);
every file is written atomically (:func:`nmtkit.files.atomic_file`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from nmtkit.errors import InputError
from nmtkit.files import atomic_dir, check_output_dir

FORMATS = ("png", "svg", "pdf")
# The most words (with </s>) a side of an attention plot may have.  The figure grows with the sentence, 0.26 inch a
# word so that 9-point labels fit, and what matplotlib holds to draw it grows with its area (a 420-word line took
# 2.3 GB, issue #57).  Figure 3's sentences have fewer than 40.
MAX_PLOT_WORDS = 100


def plot_format(path: str | os.PathLike, allowed: Sequence[str] = FORMATS) -> str:
    """The image format named by ``path``'s extension; anything else is an InputError."""
    ext = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    if ext not in allowed:
        raise InputError(f"cannot tell the image format from the name: use one of "
                         f"{', '.join('.' + a for a in allowed)}", path)
    return ext


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str, fmt: str, dpi: int) -> None:
    from nmtkit.files import atomic_file

    plt = _pyplot()
    try:
        with atomic_file(path, "wb") as f:
            fig.savefig(f, format=fmt, dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)


def plot_by_length(labels: Sequence[str], counts: Sequence[int], scores: dict[str, Sequence[float | None]],
                   path: str | os.PathLike, ylabel: str = "BLEU", xlabel: str = "source sentence length (words)",
                   title: str | None = None, note: str | None = None) -> None:
    """A line chart with one line per system: ``scores[name][k]`` is the score in length bucket ``labels[k]``
    (``None``, for an empty bucket, leaves a gap); ``counts[k]`` sentences are written under each bucket label.
    ``note`` (e.g. the metric's signature) goes in small print under the axes."""
    path = os.fspath(path)
    fmt = plot_format(path)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    xs = list(range(len(labels)))
    markers = "osD^vP*Xh<>"
    for k, (name, values) in enumerate(scores.items()):
        ys = [float("nan") if v is None else v for v in values]
        ax.plot(xs, ys, marker=markers[k % len(markers)], linewidth=1.8, markersize=5, label=name)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{lab}\nn={n}" for lab, n in zip(labels, counts)], fontsize=9)
    ax.set_xlabel(xlabel, fontsize=11)
    ax.set_ylabel(ylabel, fontsize=11)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9, loc="best")
    if title:
        ax.set_title(title, fontsize=12)
    if note:
        fig.text(0.01, -0.02, note, fontsize=7, ha="left", va="top", color="0.3")
    fig.tight_layout()
    _save(fig, path, fmt, dpi=150)


def plot_attention(source: Sequence[str], target: Sequence[str], alpha, path: str | os.PathLike,
                   title: str | None = None, fmt: str | None = None) -> None:
    """One attention matrix as the paper's Figure 3: α_ij in grayscale (0 black, 1 white), source words along the
    top (x axis, labels turned 90°), target words down the left (y axis), one cell per word pair.

    ``alpha`` is (len(target), len(source)); the figure grows with the sentence so labels stay readable.
    """
    import numpy as np

    path = os.fspath(path)
    fmt = fmt or plot_format(path, ("png", "pdf", "svg"))
    a = np.asarray(alpha, dtype=np.float64)
    if a.shape != (len(target), len(source)):
        raise ValueError(f"alpha has shape {a.shape}, expected ({len(target)}, {len(source)})")
    plt = _pyplot()
    cell = 0.26  # inches per word: 9-point labels fit
    longest = max([len(w) for w in list(source) + list(target)] + [1])
    margin = min(0.075 * longest + 0.4, 2.5)
    fig, ax = plt.subplots(figsize=(max(2.5, cell * len(source)) + margin, max(2.0, cell * len(target)) + margin))
    ax.imshow(a, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="equal")
    ax.xaxis.tick_top()
    ax.set_xticks(range(len(source)))
    ax.set_xticklabels(source, rotation=90, fontsize=9)
    ax.set_yticks(range(len(target)))
    ax.set_yticklabels(target, fontsize=9)
    ax.tick_params(length=0)
    if title:
        ax.set_xlabel(title, fontsize=9)
    _save(fig, path, fmt, dpi=110)


def check_plot_dir(directory: str, force: bool = False) -> None:
    """Refuse, before any work, a plot directory that :func:`write_attention_plots` would not replace."""
    check_output_dir(directory, force, marker="index.tsv", kind="a plot directory of nmt-align")


def _words(labels: list[str]) -> int:
    return len(labels) - (1 if labels and labels[-1] == "</s>" else 0)


def write_attention_plots(directory: str, items, fmt: str = "png", force: bool = False
                          ) -> tuple[list[str], list[int]]:
    """One :func:`plot_attention` image per item into ``directory``, built atomically with an ``index.tsv``
    (line, file, source, target) that marks the directory as ours: an earlier plot directory is replaced only
    with ``force``, a directory of other files never. ``items``: (line number, title, source words, target
    words, alpha). Returns the file names, and the line numbers not plotted: those with more than
    :data:`MAX_PLOT_WORDS` words on a side (a closing ``</s>`` is not a word)."""

    if fmt not in ("png", "pdf", "svg"):
        raise InputError(f"unknown plot format '{fmt}' (png, pdf or svg)")
    check_plot_dir(directory, force)
    items = list(items)
    width = max([len(str(it[0])) for it in items] + [4])
    names, skipped = [], []
    with atomic_dir(directory, force=force, marker="index.tsv", kind="a plot directory of nmt-align") as tmp:
        index = ["line\tfile\tsource\ttarget\n"]
        for line, title, source, target, alpha in items:
            if max(_words(source), _words(target)) > MAX_PLOT_WORDS:
                skipped.append(line)
                continue
            name = f"{line:0{width}d}.{fmt}"
            plot_attention(source, target, alpha, os.path.join(tmp, name), title=title, fmt=fmt)
            index.append(f"{line}\t{name}\t{' '.join(source)}\t{' '.join(target)}\n")
            names.append(name)
        with open(os.path.join(tmp, "index.tsv"), "w", encoding="utf-8", newline="\n") as f:
            f.writelines(index)
    return names, skipped
