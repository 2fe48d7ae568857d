"""Checkpoints: the only module that calls ``torch.save`` / ``torch.load``; owns the format and its version.

A checkpoint is one self-contained file holding only tensors and plain containers, loaded with
``torch.load(..., weights_only=True)`` so that a checkpoint from a stranger cannot run code::

    {
      "format": "nmtkit-checkpoint", "format_version": 2, "nmtkit_version": "0.1.0",
      "arch": "rnnsearch", "config": {...model config...},
      "source_lang": "en", "target_lang": "fr",
      "vocab": {"src": "tokens in id order, one per line", "tgt": "..."},
      "preprocessing": {"src": {...TextConfig, BPE codes included...}, "tgt": {...}},
      "model": {state dict},
      "train": {...optional: optimizer state, RNG states, data position, update count, metrics history...},
    }

``"model"`` holds the weights to translate with: with ``--ema-decay`` or ``--average-last`` the averaged ones, and
then ``"train"`` also holds the raw training weights as ``"raw_model"`` (nmtkit/train/averaging.py); else the raw ones.

Version 2 stores each vocabulary as one string (version 1, still read, as a list of strings): torch's
weights-only unpickler is slow over tens of thousands of small strings, and that is start-up time of every
``nmt-translate``.  :func:`load` gives the vocabularies as lists of tokens either way.

Writes are atomic: a temporary file in the same directory is written, fsynced and renamed over the target.

:func:`load` takes a checkpoint only whole: every field a tool reads of its type, vocabularies of the config's sizes
with the specials once each, each token text (no C0 control character, no lone surrogate), weights dense, real,
finite and bounded, in magnitude and in each tensor's root mean square (:func:`check_weights`).  What needs the model
is checked where one is built: the weights' names and shapes against the config's model on the meta device
(:func:`check_shapes`, from :func:`nmtkit.models.build_from_checkpoint`), and the ``"train"`` section where a run
resumes from it (:func:`nmtkit.train.resume.check_training_state`).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import warnings

from nmtkit import __version__
from nmtkit.errors import InputError

FORMAT_NAME = "nmtkit-checkpoint"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
_SPACE = re.compile(r"\s")  # (the characters str.isspace() calls whitespace)
# What no vocabulary entry holds: C0 control characters (NUL among them; the tokenizer deletes them from every line,
# so no corpus puts one in a token) and lone surrogates (UTF-8 text cannot hold them).  DEL and the C1 controls do
# reach tokens -- real corpora hold them (news-test-2014's French reference has U+0096) -- and so are read.
_NOT_TEXT = re.compile("[\x00-\x1f\ud800-\udfff]")


def save(payload: dict, path: str | os.PathLike) -> None:
    """Write ``payload`` (format fields are added) atomically to ``path``."""
    import torch

    path = os.fspath(path)
    payload = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "nmtkit_version": __version__, **payload}
    if isinstance(payload.get("vocab"), dict):  # (tokens hold no whitespace: one per line)
        payload["vocab"] = {side: tokens if isinstance(tokens, str) else "\n".join(tokens)
                            for side, tokens in payload["vocab"].items()}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    from nmtkit.files import tmp_suffix

    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=tmp_suffix())
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        from nmtkit.files import WRITE_ERRORS

        # torch's zip writer reports a failed write as a RuntimeError ("... file write failed", or "unexpected
        # pos" after the OSError it raised while writing a tensor, which then is its context)
        chain, cause = [], e
        while cause is not None and len(chain) < 8:
            chain.append(cause)
            cause = cause.__cause__ or cause.__context__
        os_error = next((c for c in chain if isinstance(c, OSError) and c.errno in WRITE_ERRORS), None)
        if os_error is not None or (isinstance(e, RuntimeError) and "write failed" in str(e)):
            reason = os.strerror(os_error.errno).lower() if os_error else "the write failed (disk full?)"
            raise InputError(f"cannot write the checkpoint: {reason}; nothing was written (the earlier checkpoints "
                             "are intact)", path) from None
        raise


def link(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Make ``dst`` name the same checkpoint as ``src`` (a hard link, replaced atomically; a copy if links fail)."""
    import shutil

    src, dst = os.fspath(src), os.fspath(dst)
    if os.path.exists(dst) and os.path.samefile(src, dst):
        return  # already linked; renaming a second link of the same file over it would do nothing, leaving tmp
    tmp = f"{dst}.{os.getpid()}.tmp"
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def load(path: str | os.PathLike, map_location="cpu") -> dict:
    """Load and check a checkpoint; a missing, corrupt, truncated or foreign file is a one-line InputError."""
    import torch

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InputError("no such checkpoint file", path)
    # torch warns about what it reads before it fails (e.g. "Detected pickle protocol 158" for random bytes
    # that start like a pickle): hold its warnings back, so that a bad file gives our one line and nothing
    # else, and pass them on only when the file did load.
    with warnings.catch_warnings(record=True) as held:
        warnings.simplefilter("always")
        try:
            payload = torch.load(path, map_location=map_location, weights_only=True)
        except Exception as e:  # torch raises many types for bad files: zip errors, unpickling errors, EOF ...
            raise InputError(f"not a readable checkpoint (corrupt, truncated or not made by nmtkit): "
                             f"{_reason(e)}", path) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_NAME:
        raise InputError("not an nmtkit checkpoint", path)
    version = payload.get("format_version")
    if version not in READABLE_VERSIONS:
        raise InputError(f"checkpoint format version {version!r} is not understood; this nmtkit "
                         f"({__version__}) reads version(s) {', '.join(map(str, READABLE_VERSIONS))}", path)
    for key in ("arch", "config", "vocab", "preprocessing", "model"):
        if key not in payload:
            raise InputError(f"checkpoint lacks '{key}'", path)
    _check_structure(payload, path)
    for w in held:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return payload


def peek(path: str | os.PathLike, key: str):
    """One top-level entry of a checkpoint, read cheaply (the weights memory-mapped, not read) and unchecked; None
    where the file does not open as a checkpoint or lacks it (:func:`load` says what is wrong with such a file)."""
    import torch

    if not os.path.isfile(path):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # (not a zip checkpoint, or not a checkpoint at all)
            return None
    return payload.get(key) if isinstance(payload, dict) else None


def differences(a: dict, b: dict) -> list[str]:
    """What differs between two loaded checkpoints (empty: the same run state): each weight whose tensor is not bit
    for bit the same, then "optimizer state" and the run state (update, epoch, best... but not the time taken or
    the validation history) where a training checkpoint's differ.  Used to check that a resumed or re-run training
    reached exactly what another did."""
    diffs = sorted(a["model"].keys() ^ b["model"].keys())
    diffs += [k for k in a["model"] if k in b["model"] and not _same(a["model"][k], b["model"][k])]
    if "train" in a or "train" in b:
        ta, tb = a.get("train", {}), b.get("train", {})
        if not _same(ta.get("optimizer"), tb.get("optimizer")):
            diffs.append("optimizer state")
        state_a, state_b = ({k: v for k, v in t.get("state", {}).items() if k not in ("elapsed", "history")}
                            for t in (ta, tb))
        if state_a != state_b:
            diffs.append(f"run state {state_a} != {state_b}")
    return diffs


def _same(x, y) -> bool:
    """Deep equality; tensors bit for bit (dtype and shape included)."""
    import torch

    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return isinstance(y, (list, tuple)) and len(x) == len(y) and all(_same(p, q) for p, q in zip(x, y))
    return x == y


def _check_structure(payload: dict, path: str) -> None:
    """Every field a tool reads, of the type it expects: a malformed body is one line naming the field."""
    import torch

    from nmtkit.data.text import TextConfig, bpe_codes_problem, spm_processor
    from nmtkit.data.vocab import Vocabulary

    def bad(field: str, problem: str):
        return InputError(f"malformed checkpoint: {field} {problem}", path)

    if not isinstance(payload["arch"], str):
        raise bad("'arch'", "is not a string")
    if not isinstance(payload["config"], dict) or not all(isinstance(k, str) for k in payload["config"]):
        raise bad("'config'", "is not a dict of settings")
    vocab = payload["vocab"]
    if not isinstance(vocab, dict):
        raise bad("'vocab'", "is not a dict")
    for side in ("src", "tgt"):
        tokens = vocab.get(side)
        if isinstance(tokens, str) and payload["format_version"] >= 2:  # (the tokens, one per line)
            tokens = vocab[side] = tokens.split("\n")
        elif not isinstance(tokens, list):
            raise bad(f"'vocab.{side}'", "is missing or not a list of tokens")
        for i, tok in enumerate(tokens):
            if not isinstance(tok, str) or not tok or _SPACE.search(tok):
                raise bad(f"'vocab.{side}'[{i}]", f"is not a token without spaces ({tok!r})")
            if (odd := _NOT_TEXT.search(tok)) is not None:
                what = "a lone surrogate" if "\ud800" <= odd.group() <= "\udfff" else "a control character"
                raise bad(f"'vocab.{side}'[{i}]", f"is not text: it holds {what}, U+{ord(odd.group()):04X} ({tok!r})")
        try:  # (the specials first, once each, and no token twice)
            Vocabulary(tokens)
        except ValueError as e:
            raise bad(f"'vocab.{side}'", str(e)) from None
    pre = payload["preprocessing"]
    if not isinstance(pre, dict):
        raise bad("'preprocessing'", "is not a dict")
    for side in ("src", "tgt"):
        if not isinstance(pre.get(side), dict):
            raise bad(f"'preprocessing.{side}'", "is missing or not a dict")
        try:
            config = TextConfig.from_dict(pre[side])
        except (TypeError, ValueError) as e:
            raise bad(f"'preprocessing.{side}'", f"is not understood: {e}") from None
        if config.bpe_codes is not None and not isinstance(config.bpe_codes, str):
            raise bad(f"'preprocessing.{side}.bpe_codes'", "is not the text of a codes file")
        if config.bpe_codes is not None and (problem := bpe_codes_problem(config.bpe_codes)) is not None:
            raise bad(f"'preprocessing.{side}.bpe_codes'", f"are not subword-nmt codes: {problem}")
        if config.spm_model is not None:
            if not isinstance(config.spm_model, str):
                raise bad(f"'preprocessing.{side}.spm_model'", "is not base64 text")
            if config.bpe_codes is not None:
                raise bad(f"'preprocessing.{side}'", "has both BPE codes and a SentencePiece model")
            try:
                spm_processor(config.spm_model)
            except ValueError as e:
                raise bad(f"'preprocessing.{side}.spm_model'", str(e)) from None
    sizes = {side: payload["config"].get(f"{side}_vocab_size") for side in ("src", "tgt")}
    for side, size in sizes.items():  # (every architecture's shortlists: the embeddings' and the output's rows)
        if size is None:
            raise bad(f"'config.{side}_vocab_size'", "is missing")
        if not isinstance(size, int) or isinstance(size, bool):
            raise bad(f"'config.{side}_vocab_size'", f"is not a whole number ({size!r})")
        if size != len(vocab[side]):
            raise bad(f"'vocab.{side}'", f"has {len(vocab[side]):,} entries; 'config.{side}_vocab_size' is {size:,}")
    model = payload["model"]
    if not isinstance(model, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in model.items()):
        raise bad("'model'", "is not a dict of named tensors")
    check_weights(model, "model", path)
    defaults = payload.get("decoding_defaults")
    if defaults is not None and not (isinstance(defaults, dict) and all(
            isinstance(k, str) and (v is None or isinstance(v, (bool, int, float, str))) for k, v in defaults.items())):
        # (nmt-translate --save-defaults; what each value means is checked where it is applied, by
        # nmtkit.translate.defaults.read, which nmt-translate and nmt-serve call before they decode)
        raise bad("'decoding_defaults'", "is not a dict of settings by name, each a number, a string or null")


# The largest weight magnitude a checkpoint may hold.  Trained weights are O(1): Appendix B.1 draws them at 0.01
# and orthogonal, and a trained GRU's and its embeddings' stay within a few units.  1e4 is far above any of them,
# and far below where float32 products overflow: a layer's sum of at most ~1e5 terms, each a weight times an
# activation in [-1, 1] or an embedding (both at most 1e4), stays below 1e13, where weights of 3e38 overflow to
# infinity at the first product, the softmax to NaN, and every translation and alignment to word 0.
WEIGHT_BOUND = 1e4
# The largest root mean square of one tensor's weights.  WEIGHT_BOUND alone lets through a model whose weights were all
# multiplied by 9999: a young model's largest weight is about 0.5, so 5,000 after it, and its translations and
# alignments are garbage without a word.  Every weight matrix starts at an RMS of at least about 0.01 (Appendix B.1:
# N(0, 0.01²), orthogonal matrices 1/sqrt(n)) and training keeps them of order 1 at most, so 10 leaves room
# (tests/test_checkpoint_faults.py loads a young model with its weights multiplied by 10) while a model multiplied by
# a few thousand exceeds it.
WEIGHT_RMS_BOUND = 10.0


def check_weights(weights: dict, field: str, path: str) -> None:
    """The named tensors ``weights`` (``field`` of the checkpoint: ``model``, ``train.raw_model`` ...) as a model
    can take them: dense, real floating point, finite, at most :data:`WEIGHT_BOUND` in magnitude and of a root
    mean square of at most :data:`WEIGHT_RMS_BOUND`; else one InputError naming the file and the tensor.  Every tool
    that reads a checkpoint runs it, through :func:`load` (nmt-train's ``--resume`` also on the train section's
    weights)."""
    import torch

    for name, tensor in weights.items():
        key = f"'{field}.{name}'"
        odd = [what for what, flag in (("sparse", tensor.layout != torch.strided), ("nested", tensor.is_nested),
                                       ("meta", tensor.is_meta), ("quantized", tensor.is_quantized)) if flag]
        if odd:
            raise InputError(f"malformed checkpoint: {key} is not a dense tensor of weights ({odd[0]}, "
                             f"{str(tensor.layout).replace('torch.', '')})", path)
        if tensor.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            raise InputError(f"malformed checkpoint: {key} is {str(tensor.dtype).replace('torch.', '')}, not real "
                             "floating-point weights", path)
        if not tensor.numel():
            continue
        low, high = (float(x) for x in torch.aminmax(tensor))  # (NaN if any is NaN)
        if not (math.isfinite(low) and math.isfinite(high)):
            count = int((~torch.isfinite(tensor)).sum())
            raise InputError(f"the weights are not finite ({count:,} NaN or infinite value(s) in {key}): the "
                             "training run that made this checkpoint diverged", path)
        if max(-low, high) > WEIGHT_BOUND:
            raise InputError(f"malformed checkpoint: {key} holds a weight of {max(-low, high):.3g}, beyond any "
                             f"trained model's (at most {WEIGHT_BOUND:g} is read)", path)
        wide = tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.float()  # (half: no overflow)
        rms = float(torch.linalg.vector_norm(wide)) / math.sqrt(tensor.numel())
        if rms > WEIGHT_RMS_BOUND:
            raise InputError(f"malformed checkpoint: {key} has weights of root mean square {rms:.3g}, beyond any "
                             f"trained model's (below 1; at most {WEIGHT_RMS_BOUND:g} is read): scaled weights?", path)


def check_shapes(weights: dict, expected: dict, field: str, path: str | None) -> None:
    """``weights`` (named tensors, ``field`` of the checkpoint) with the names and shapes of ``expected`` (a
    model's state dict, e.g. built on the meta device); else one InputError naming the file and the tensor."""
    def shape(t) -> str:
        return f"[{', '.join(map(str, t.shape))}]"

    for name, want in expected.items():
        if name not in weights:
            raise InputError(f"malformed checkpoint: '{field}' lacks '{name}', a weight of shape {shape(want)} "
                             "of its config's model", path)
        if weights[name].shape != want.shape:
            raise InputError(f"malformed checkpoint: '{field}.{name}' has shape {shape(weights[name])}; its "
                             f"config's model has {shape(want)}", path)
    extra = next((name for name in weights if name not in expected), None)
    if extra is not None:
        raise InputError(f"malformed checkpoint: '{field}.{extra}' is not a weight of its config's model", path)


def _reason(e: Exception) -> str:
    """The gist of torch's (long, multi-line) load error: one sentence, no terminal escapes, no advice to load
    the file unsafely (torch's weights-only errors suggest ``weights_only=False``: never for a bad file)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    detail = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    text = detail.group(1) if detail else (text.splitlines()[0] if text else "")
    text = text.split(". ")[0].strip().rstrip(".")
    return text[:200] if text else type(e).__name__
