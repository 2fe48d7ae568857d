"""Symmetrising the word alignments of the two translation directions, as statistical aligners do.

One direction's attention links each target word to the source words it attends to; a model of the other
direction (French→English for an English→French one) gives the links seen from the other side.  Neither alone is
a good alignment: each is a function of one side's words, so it misses every one-to-many link of the other side,
and its errors are its own.  Och & Ney (2003) combine the two; Koehn, Och & Marcu (2003) and Moses's ``symal``
named the heuristics used since (links are (source word i, target word j), both directions in that orientation):

- ``intersection``: links both directions have (high precision);
- ``union``: links either has (high recall);
- ``grow-diag``: the intersection, grown by the union's links next to a link it has (the eight neighbours,
  diagonals included), where the new link's source or target word is not yet aligned, until nothing grows;
- ``grow-diag-final``: then each direction's remaining links whose source or target word is still unaligned
  (``final``, the forward direction first);
- ``grow-diag-final-and``: the same, only where both words are still unaligned.

The order of visits is fixed (links in sorted order, neighbours in the order below), so the result is the same on
every run.

``soft`` combines the two models' attention before any link is read off, where the heuristics above combine links
each model has already chosen: target word j links to the source word i that maximises p→(i | j) · p←(j | i), the
forward model's attention of j on i times the reverse model's attention of i on j (each over the words alone,
``</s>`` left out and renormalised). A word pair both models attend to wins over one that only one of them favours,
so one model's diffuse or misplaced attention is outvoted where the other is sure; it keeps one link per target
word, as the forward argmax does (``tests/bench/results/bench_symmetrize.txt`` has what it gained).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

Link = tuple[int, int]
HEURISTICS = ("intersection", "union", "grow-diag", "grow-diag-final", "grow-diag-final-and")
SOFT = "soft"
METHODS = (*HEURISTICS, SOFT)  # what nmt-align --symmetrize takes: the heuristics on links, and soft on attention
NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def symmetrize(forward: Iterable[Link], backward: Iterable[Link], heuristic: str = "grow-diag-final") -> set[Link]:
    """One sentence's links of the two directions (each as (source i, target j)) → the symmetrised links."""
    if heuristic not in HEURISTICS:
        raise ValueError(f"unknown symmetrisation {heuristic!r}; choose from {', '.join(HEURISTICS)}")
    forward, backward = set(forward), set(backward)
    if heuristic == "intersection":
        return forward & backward
    union = forward | backward
    if heuristic == "union":
        return union
    links = forward & backward
    src, tgt = {i for i, _ in links}, {j for _, j in links}  # the aligned words of each side

    def add(link: Link) -> None:
        links.add(link)
        src.add(link[0])
        tgt.add(link[1])

    grown = True
    while grown:  # grow-diag
        grown = False
        for i, j in sorted(links):
            for di, dj in NEIGHBOURS:
                new = (i + di, j + dj)
                if new in union and new not in links and (new[0] not in src or new[1] not in tgt):
                    add(new)
                    grown = True
    if heuristic == "grow-diag":
        return links
    both = heuristic == "grow-diag-final-and"
    for direction in (forward, backward):  # final(-and)
        for link in sorted(direction - links):
            i_free, j_free = link[0] not in src, link[1] not in tgt
            if (i_free and j_free) if both else (i_free or j_free):
                add(link)
    return links


def soft_links(forward: np.ndarray, backward: np.ndarray, n: int, m: int) -> list[Link]:
    """One sentence of n source and m target words: the forward model's attention ``forward`` (m[+1], n[+1]: target
    word j's weights over source words i; a ``</s>`` row and column, if there, are left out) and the reverse
    model's ``backward`` (n[+1], m[+1]: source word i's weights over target words j) -> for each target word j the
    link (i, j) of the largest p→(i | j) · p←(j | i), sorted by target then source."""
    f = np.asarray(forward, dtype=np.float64)[:m, :n]
    b = np.asarray(backward, dtype=np.float64)[:n, :m].T  # (m, n): column i, the reverse model's weights over j
    f = f / np.maximum(f.sum(axis=1, keepdims=True), 1e-30)
    b = b / np.maximum(b.sum(axis=0, keepdims=True), 1e-30)
    return [(int(i), j) for j, i in enumerate((f * b).argmax(axis=1))] if n and m else []


def transpose(links: Iterable[Link]) -> list[Link]:
    """Links of the other direction's model ((its source j, its target i)) in this direction's orientation."""
    return sorted((i, j) for j, i in links)
