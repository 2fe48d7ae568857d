#!/usr/bin/env python3
"""What an ``examples/one-hour.sh`` WORKDIR is made of, and the split of its training corpus.

A WORKDIR resumes what it holds: its prepared data and its model.  Run again on another training corpus, or with
the languages swapped, it would go on training the old data's model and say nothing; so the WORKDIR records the
corpus and the languages it was prepared from (``WORKDIR/corpus.json``: the files, and the SHA-256 of their text,
gzip or not) and a run that names others stops with one line.  The same text under another path or compression is
the same corpus.

    check WORK TRAIN DEV SRC TGT    before anything else: TRAIN and DEV ('' = none) name files; the record, if any,
                                    is of these files' text and these languages (a WORKDIR prepared before records
                                    were kept: the prepared data's languages, and the record is written now)
    record WORK TRAIN DEV SRC TGT   once the data is prepared: write the record
    split TRAIN OUT SRC TGT SEED    hold 1,000 random pairs (at most a tenth) out of TRAIN for validation:
                                    OUT.train.* and OUT.valid.*

Every problem (a prefix with no files, two sides of different lengths, a mismatch) is one line on stderr and exit
status 1, never a traceback (nmtkit must be importable: one-hour.sh puts the checkout on ``PYTHONPATH``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys

from nmtkit.errors import InputError
from nmtkit.files import atomic_file, open_binary, read_parallel, resolve_prefix

RECORD = "corpus.json"


def describe(train: str, dev: str, src: str, tgt: str) -> dict:
    """What a run names: the languages, and each corpus's two files with the SHA-256 of their (decompressed) text."""
    def corpus(prefix: str) -> dict | None:
        if not prefix:
            return None
        files = [os.path.abspath(p) for p in resolve_prefix(prefix, src, tgt)]
        return {"files": files, "sha256": [_digest(p) for p in files]}

    return {"src": src, "tgt": tgt, "train": corpus(train), "dev": corpus(dev)}


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open_binary(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check(work: str, train: str, dev: str, src: str, tgt: str) -> None:
    """Refuse a run whose corpus or languages are not those ``work`` was prepared from."""
    path = os.path.join(work, RECORD)
    manifest = os.path.join(work, "data", "manifest.json")
    if not os.path.exists(path):
        for prefix in (train, dev):  # (a prefix with no files: one line now, not a traceback of the split later)
            if prefix:
                resolve_prefix(prefix, src, tgt)
        if os.path.exists(manifest):  # (prepared before records were kept: its languages, then record it)
            with open(manifest, encoding="utf-8") as f:
                m = json.load(f)
            _same_languages(work, path, (m.get("source_lang"), m.get("target_lang")), (src, tgt))
            record(work, train, dev, src, tgt)
            print(f"one-hour.sh: {path}: recorded {train} as the training corpus of {work}, prepared before "
                  "WORKDIRs recorded theirs (its corpus could not be checked)", file=sys.stderr)
        return
    try:
        with open(path, encoding="utf-8") as f:
            was = json.load(f)
        langs = (was["src"], was["tgt"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"unreadable ({e}): delete it and {work}'s data and model to start over", path) from None
    _same_languages(work, path, langs, (src, tgt))
    now = describe(train, dev, src, tgt)
    for name, what in (("train", "the training corpus"), ("dev", "--dev")):
        old, new = was.get(name), now[name]
        if (old or {}).get("sha256") == (new or {}).get("sha256"):
            continue
        had, given = (", ".join(c["files"]) if c else "none (pairs held out of the training corpus)"
                      for c in (old, new))
        this = "whose text has changed since" if had == given else f"not {given}"
        raise InputError(f"{work} was prepared from {what} {had}, {this}: resuming would go on training on the old "
                         "data; give the corpus it was made from, or another WORKDIR (or delete this one to start "
                         "over)", path)


def _same_languages(work: str, path: str, was: tuple, now: tuple) -> None:
    if tuple(was) != tuple(now):
        raise InputError(f"{work} was prepared for --src {was[0]} --tgt {was[1]}, not --src {now[0]} --tgt {now[1]}: "
                         "give its languages, or another WORKDIR (or delete this one to start over)", path)


def record(work: str, train: str, dev: str, src: str, tgt: str) -> None:
    with atomic_file(os.path.join(work, RECORD)) as f:
        json.dump(describe(train, dev, src, tgt), f, indent=2)
        f.write("\n")


def split(prefix: str, out: str, src: str, tgt: str, seed: str) -> None:
    a, b = resolve_prefix(prefix, src, tgt)
    pairs = [(x.text, y.text) for x, y in read_parallel(a, b)]
    held = set(random.Random(int(seed)).sample(range(len(pairs)), min(1000, len(pairs) // 10)))
    for name, keep in (("train", lambda i: i not in held), ("valid", lambda i: i in held)):
        for lang, side in ((src, 0), (tgt, 1)):
            with atomic_file(f"{out}.{name}.{lang}") as f:
                f.writelines(p[side] + "\n" for i, p in enumerate(pairs) if keep(i))
    print(f"one-hour.sh: {len(held):,} of {len(pairs):,} pairs held out for validation", file=sys.stderr)


STEPS = {"check": (check, 5), "record": (record, 5), "split": (split, 5)}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in STEPS or len(argv) - 1 != STEPS[argv[0]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        STEPS[argv[0]][0](*argv[1:])
    except InputError as e:
        print(f"one-hour.sh: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # (an unreadable or unwritable file)
        print(f"one-hour.sh: {e.filename or ''}: {e.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
