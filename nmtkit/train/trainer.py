"""Training (the library behind ``nmt-train``): the paper's recipe by default, resumable to the same weights.

Defaults follow Section 4.2 and Appendix B.2: Adadelta (ε = 10⁻⁶, ρ = 0.95), minibatches of 80 sentence pairs,
the gradient rescaled to L2 norm 1 whenever it is larger, and every 20 updates a pool of 1,600 pairs sorted by
length and split into 20 minibatches (:mod:`nmtkit.data.batching`). The cost of a minibatch is the negative
log-likelihood of its target sentences (summed over tokens) averaged over sentences, as GroundHog computes it.

Every ``valid_every`` updates: validation cross-entropy and perplexity, and BLEU of greedy decoding on a subset of
the validation set (tokenised BLEU on Moses tokens, labelled so); a checkpoint is saved, the best one (by the
chosen metric) is kept as ``checkpoint_best.pt``, the last ``keep_last`` numbered ones are kept, and
``checkpoint_last.pt`` always names the newest. Early stopping after ``patience`` validations without improvement.

Options beyond the paper: learning-rate schedules with warm-up (:mod:`nmtkit.train.schedule`), and validating and
saving an exponential moving average of the weights or the mean of the last N validations'
(:mod:`nmtkit.train.averaging`).

Resuming restores weights, optimizer state, RNG states, data position, update count, elapsed time, the metrics
history, the schedule's state and the averaged weights, so a resumed run reaches the same weights as an
uninterrupted one (bit for bit on CPU). Ctrl-C and SIGTERM finish the current update, save a checkpoint at once
(not validated) and stop.

Data parallelism: under ``torchrun`` (``WORLD_SIZE`` > 1) every process takes an interleaved share of each
minibatch, gradients are summed across processes before clipping, so N processes compute the update one process
computes for the same total batch (:mod:`nmtkit.train.distributed`).
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import math
import os
import signal
import time

import numpy as np
import torch

from nmtkit.train import averaging, resume, rundir
from nmtkit.train.distributed import Processes
from nmtkit.train.trainlog import TrainLog
from nmtkit.train.optimizers import update_rule
# (every nmtkit module the run needs is imported when it starts, none at its first validation: a package upgraded
# under a long run must not meet the run's already-loaded modules halfway)
from nmtkit.data.batching import EpochSchedule, collate
from nmtkit.device import resolve_device, warn_if_slow_bf16
from nmtkit.errors import DivergedError, InputError
from nmtkit.data.manifest import PreparedData
from nmtkit.progress import Progress
from nmtkit.threads import ThreadGovernor
from nmtkit.models import build_from_checkpoint, build_model, resolve, set_backend
from nmtkit.train.registry import INITS
from nmtkit.train.guided import GuidedAlignment
from nmtkit.train.schedule import make_schedule
from nmtkit.train.config import TRAINING_DEFAULTS, TrainConfig, TrainState  # (TrainConfig: re-exported)
from nmtkit.train.validation import describe as describe_validation
from nmtkit.train.validation import validation_bleu, validation_loss

log = logging.getLogger("nmtkit.train")
clock = time.perf_counter  # what the run's time is measured with (tests of time budgets put a deterministic one here)

class Trainer:
    """Owns the model, optimizer, data and state of one training run. ``Trainer(cfg).train()``."""

    def __init__(self, cfg: TrainConfig):
        cfg.check()
        resolve_device(cfg.device)  # (before any process group is set up for it)
        self.cfg = cfg
        self.procs = Processes(cfg.device)  # (data parallel: this process's rank and device)
        self.world, self.rank, self.device = self.procs.world, self.procs.rank, self.procs.device
        if cfg.bf16 and self.rank == 0:
            warn_if_slow_bf16(torch.device(cfg.device), log)
        self.governor = None  # --threads 0 on a CPU: the thread count measured and chosen as the run goes
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        elif self.device.type == "cpu" and self.world == 1:
            self.governor = ThreadGovernor(torch.get_num_threads(), events=self._thread_event)
        self.data = PreparedData.open(cfg.data)
        src, tgt = self.data.source_lang, self.data.target_lang
        self.src_vocab, self.tgt_vocab = self.data.vocab(src), self.data.vocab(tgt)
        self.train_src, self.train_tgt = self.data.corpus("train", src), self.data.corpus("train", tgt)
        if len(self.train_src) != len(self.train_tgt):
            raise InputError("train source and target corpora differ in length", cfg.data)
        self.train_views = (self.train_src, self.train_tgt)  # what batches are made of (BPE-dropout: new units)
        if cfg.bpe_dropout is None:  # (the corpus's, recorded in the checkpoints as resolved)
            cfg.bpe_dropout = float((self.data.manifest.get("bpe") or {}).get("dropout", 0.0))
        if cfg.bpe_dropout:
            self.train_views = self._dropout_views()
        self.guide = None  # --guided-alignment: the links the attention is trained towards (nmtkit.train.guided)
        if cfg.guided_alignment:
            try:
                arch = resolve(cfg.arch)[0]
            except ValueError as e:
                raise InputError(str(e)) from None
            if arch != "rnnsearch":  # (refused before minutes of reading links)
                raise InputError(f"--guided-alignment trains the attention; {arch} has none (use an rnnsearch "
                                 "architecture)")
            self.guide = GuidedAlignment(cfg.guided_alignment, self.data, cfg.guided_alignment_order)
            if len(self.guide) != len(self.train_src):
                raise InputError(f"train.kept names {len(self.guide)} training pairs but the corpus has "
                                 f"{len(self.train_src)}: prepare the data again", cfg.data)
        self.valid = None
        if "valid" in self.data.splits:
            self.valid = (self.data.corpus("valid", src), self.data.corpus("valid", tgt))
        elif cfg.lr_scheduler == "plateau":
            raise InputError("--lr-scheduler plateau needs a validation set (prepare it with --valid)", cfg.data)
        self.state = TrainState()
        self.log_window = {"nll": 0.0, "tok": 0, "time": 0.0, "norm": 0.0, "n": 0}
        self._fingerprint = resume.data_fingerprint(self.train_src, self.train_tgt)
        self.stop_signal: int | None = None
        self._rank_rngs: list | None = None  # (data parallel: every process's RNG states at the last checkpoint)
        self.rundir = rundir.RunDir(cfg.save_dir)
        try:
            self._build(self._resume_payload())
        except BaseException:
            self.rundir.unlock()
            self.procs.close()
            raise

    # -- set-up ------------------------------------------------------------------------------------------------

    def _pool_lengths(self):
        """What a pool of the epoch is sorted by: None (the prepared corpus's lengths) without BPE-dropout; with it,
        the lengths of the epoch's own segmentations, so that a minibatch holds sentences of like length as the
        paper's pools intend (sorted by the prepared lengths, dropout's ragged lengths are padded far more:
        tests/bench/results/bench_bpe_dropout.txt)."""
        if not any(hasattr(view, "lengths") for view in self.train_views):
            return None
        src, tgt = self.train_views

        def of_view(view, sizes, ids):
            return view.lengths(ids) if hasattr(view, "lengths") else np.asarray(sizes)[ids]

        return lambda ids: (of_view(src, self.train_src.sizes, ids), of_view(tgt, self.train_tgt.sizes, ids))

    def _dropout_views(self) -> tuple:
        """The training pairs segmented anew in every epoch with BPE-dropout (nmtkit.data.bpedropout)."""
        from nmtkit.data.bpedropout import DropoutCorpus

        src, tgt = self.data.source_lang, self.data.target_lang
        codes = self.data.text_config(src).bpe_codes
        if codes is None:
            raise InputError("--bpe-dropout needs a corpus prepared with BPE (nmt-prepare --bpe-merges or "
                             "--bpe-codes); this one has none", self.cfg.data)
        return tuple(DropoutCorpus(self.data.directory, lang, side, codes, self.cfg.bpe_dropout, vocab, self.cfg.seed,
                                   len(self.train_src))
                     for side, (lang, vocab) in enumerate(((src, self.src_vocab), (tgt, self.tgt_vocab))))

    def _resume_payload(self) -> dict | None:
        if self.rank == 0:  # (held until the run ends: a second nmt-train here is refused)
            self.rundir.lock()
        return resume.find_checkpoint(self.rundir, self.cfg.resume, self.cfg.force,
                                      {"src": self.src_vocab, "tgt": self.tgt_vocab})

    def _build(self, payload: dict | None) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        try:
            if payload is None:
                self.model = build_model(cfg.arch, len(self.src_vocab), len(self.tgt_vocab), **cfg.model_options)
                if cfg.init_from:  # a new run from another's weights (fine-tuning): fresh optimizer and schedule
                    self.model.load_state_dict(resume.initial_weights(cfg.init_from, cfg, {
                        "src": self.src_vocab, "tgt": self.tgt_vocab}))
                    log.info("weights from %s", cfg.init_from)
                elif cfg.init != "paper":  # (the modules' own initialisation is B.1's)
                    INITS.load(cfg.init)(self.model)
            else:
                resume.check_fits(payload, cfg, (len(self.src_vocab), len(self.tgt_vocab)), self._fingerprint,
                                  self.rundir.file("checkpoint_last.pt"))
                self.model = build_from_checkpoint({**payload, "model": averaging.raw_weights(payload)})
        except ValueError as e:
            raise InputError(str(e)) from None
        if payload is not None:
            then = payload["train"].get("guide")
            if then is not None and self.guide is not None and then["sha256"] != self.guide.fingerprint:
                raise InputError("the links differ from those the checkpoint's run was guided by (another file, or "
                                 "this one changed since): resume with that run's links", cfg.guided_alignment)
            if (then is None) != (self.guide is None):
                log.warning("--resume: the checkpoint's run was %s, this one is %s: the updates that follow differ "
                            "from an uninterrupted run's", "guided by links (--guided-alignment)" if then else
                            "not guided", "not guided" if self.guide is None else "guided")
        set_backend(self.model, cfg.backend).to(self.device)
        self.rule = update_rule(cfg)  # (--optimizer: its optimizer, clipping and step)
        self.optimizer = self.rule.build(list(self.model.parameters()))
        self.model.sparse_embedding_grads = self.rule.takes_sparse_embedding_grads(self.device, self.model.backend)
        max_len = cfg.max_len or getattr(self.model.config, "max_len", None) or 10**9
        sizes_ok = (np.asarray(self.train_src.sizes) <= max_len) & (np.asarray(self.train_tgt.sizes) <= max_len)
        self.eligible = np.flatnonzero(sizes_ok)
        if len(self.eligible) == 0:
            raise InputError(f"no training pair has at most {max_len} tokens per side", cfg.data)
        self.max_len = max_len
        self.schedule = make_schedule(cfg.lr_scheduler, cfg.lr, warmup=cfg.warmup_updates, decay=cfg.lr_decay,
                                      patience=cfg.lr_patience, min_lr=cfg.min_lr, total=cfg.horizon,
                                      budget=cfg.time_horizon, decay_fraction=cfg.decay_fraction)
        self.lr = cfg.lr  # the rate of the latest update
        self.averager = averaging.make(self.model, cfg.ema_decay, cfg.average_last)
        if payload is not None:
            self.load_state_dict(payload)

    # -- checkpoints -------------------------------------------------------------------------------------------

    def state_dict(self, weights: dict | None = None) -> dict:
        """The checkpoint of the run as it is, what :meth:`load_state_dict` reads back: the model (its config,
        vocabularies and preprocessing) and the run's own state under ``"train"``.  ``weights``: what ``"model"``
        holds when averaging (default: the averaged weights now), the raw weights going into the train section
        (nmtkit/train/averaging.py)."""
        src, tgt = self.data.source_lang, self.data.target_lang
        raw = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        if weights is None and self.averager is not None:
            weights = self.averager.weights(raw)
        rng = self.procs.rng_state()
        if self._rank_rngs is not None:
            rng["per_rank"] = self._rank_rngs
        return {
            "arch": self.model.arch,
            "config": self.model.config.to_dict(),
            "source_lang": src,
            "target_lang": tgt,
            "vocab": {"src": list(self.src_vocab.tokens), "tgt": list(self.tgt_vocab.tokens)},
            "preprocessing": {"src": self.data.text_config(src).to_dict(), "tgt": self.data.text_config(tgt).to_dict()},
            "model": raw if weights is None else weights,
            "train": {
                "optimizer": self.optimizer.state_dict(),
                "state": dataclasses.asdict(self.state),
                "rng": rng,
                "config": dataclasses.asdict(self.cfg),
                "data": self._fingerprint,
                "log_window": dict(self.log_window),
                "schedule": self.schedule.state_dict(),
                **({} if self.guide is None else {"guide": {"sha256": self.guide.fingerprint,
                                                            "links": self.guide.total_links}}),
                **({} if weights is None else {"raw_model": raw, **self.averager.train_entries(weights)}),
            },
        }

    def load_state_dict(self, payload: dict) -> None:
        """Put the run back where a checkpoint's was, the model already holding its weights (checked by
        :mod:`nmtkit.train.resume` first): optimizer state, counters and metrics history, this process's RNG
        states, the schedule's state and the averaged weights; changed settings are logged."""
        train = payload["train"]
        self.optimizer.load_state_dict(train["optimizer"])
        self.state = TrainState(**train["state"])
        self.log_window.update(train.get("log_window", {}))
        resume.restore_best(self.state, self.rundir, self.rank == 0)
        per_rank = train["rng"].get("per_rank")  # (each process's own: its dropout draws differ)
        mine = per_rank[self.rank] if per_rank and len(per_rank) == self.world else train["rng"]
        torch.set_rng_state(mine["torch"])
        if self.device.type == "cuda" and "cuda" in mine:
            torch.cuda.set_rng_state(mine["cuda"], self.device)
        log.info("resumed from update %d (epoch %d, batch %d)", self.state.update, self.state.epoch + 1,
                 self.state.batch_in_epoch)
        if "schedule" in train:
            changed = self.schedule.load_state_dict(train["schedule"])
            if changed:
                log.warning("--resume: %s (the run's weights follow the new schedule from here)", changed)
        if self.averager is not None and self.rank == 0:  # (only the lead process validates and saves)
            self.averager.resume(payload, self.cfg.save_dir)
        resume.report_changes(train.get("config", {}), dataclasses.asdict(self.cfg), TRAINING_DEFAULTS)

    def save(self, is_best: bool, weights: dict | None = None) -> str:
        # (those a resumed average reads.  Not the best of the scheduled validations where a limit's validation off
        # the grid beat it and is linked as best: --keep-last says what the run keeps; resume.restore_best)
        needed = set() if self.averager is None else self.averager.needed()
        return self.rundir.save(self.state_dict(weights), self.state.update, is_best, self.cfg.keep_last, needed,
                                self.cfg.valid_every)

    # -- one update --------------------------------------------------------------------------------------------

    def _step(self, group: list[np.ndarray]) -> tuple[float, int, float]:
        """Forward, backward, clip and update on a group of minibatches (``--update-freq``: one, or N whose
        gradients add up to the one of their union); returns (summed NLL, target tokens, grad norm)."""
        self.model.train()
        sentences = sum(len(ids) for ids in group)
        self.optimizer.zero_grad(set_to_none=True)
        nll_sum = align_sum = torch.zeros((), dtype=torch.float64)
        ntok = 0
        for ids in group:
            mine = ids[self.rank:: self.world]  # this process's share (all of it in one process)
            if not len(mine):
                continue
            batch = collate(*self.train_views, mine).to(self.device)
            guide = None if self.guide is None else self._guide(batch)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16):
                loss, nll, *align = self.model.training_loss(batch.src, batch.src_lens, batch.tgt_in, batch.tgt_out,
                                                             self.cfg.label_smoothing, guide)  # summed over tokens
            if align:  # + λ Σ −Ã log α over the guided rows (the lead process's share is logged)
                loss = loss + self.cfg.guided_alignment_weight * align[0]
                align_sum = align_sum + align[0].detach().double().cpu()
            (loss / sentences).backward()  # mean over the update's sentences, across processes
            nll_sum, ntok = nll_sum + nll.detach().double().cpu(), ntok + batch.num_tokens
        if self.guide is not None:
            self.log_window["align"] = self.log_window.get("align", 0.0) + float(align_sum)
        nll_sum, ntok = self.procs.all_reduce_grads(self.model.parameters(), nll_sum, ntok)
        # with clipping off (0) an infinite threshold leaves the gradient as is
        max_norm = self.cfg.clip_norm or math.inf
        # (nmtkit/train/schedule.py: every optimizer reads group["lr"])
        self.lr = self.schedule.lr(self.state.update + 1, self.state.elapsed)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        # the norm before rescaling, the clipping, the step and its bookkeeping: the rule's (nmtkit/train/optimizers.py)
        norm = self.rule.step(self.optimizer, list(self.model.parameters()), max_norm,
                              lambda norm: self._check_finite(nll_sum, norm))
        if self.averager is not None:
            self.averager.after_update()
        return float(nll_sum), ntok, float(norm)

    def _guide(self, batch) -> torch.Tensor:
        """The attention targets of a batch (nmtkit.train.guided), on the batch's device; the guided rows counted
        into the log window."""
        before = len(self.guide.unreadable)
        guide, rows = self.guide.targets(batch.ids, self.train_views, (batch.tgt_out.shape[1], batch.src.shape[1]))
        if len(self.guide.unreadable) > before and self.rank == 0:
            log.warning("guided alignment: %d training pair(s) so far left unguided: their tokens do not read back "
                        "into the words their links count (e.g. %s)", len(self.guide.unreadable),
                        self.guide.where(min(self.guide.unreadable)))
        self.log_window["rows"] = self.log_window.get("rows", 0) + rows
        return guide.to(self.device)

    def _thread_event(self, kind: str, line: str) -> None:
        (log.warning if kind == "fell" else log.info)("update %d: %s", self.state.update, line)

    def _check_finite(self, nll_sum, norm) -> None:
        """Stop at the first non-finite loss or gradient, before the update touches the weights (nothing is saved:
        the last checkpoint stays the last good state)."""
        loss, norm = float(nll_sum), float(norm)
        if math.isfinite(loss) and math.isfinite(norm):
            return
        what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {norm}"
        raise DivergedError(f"training diverged at update {self.state.update + 1}: the {what} is not finite; the "
                            f"weights were not updated and no checkpoint was written ({self.cfg.save_dir} holds the "
                            f"run's last good state); try a lower --lr (now {self.lr:g}) or a --clip-norm")

    # -- validation --------------------------------------------------------------------------------------------

    def validate(self) -> dict:
        """Validation NLL per token and perplexity; BLEU of greedy (or beam) decoding on the first
        ``valid_bleu_sentences`` sentences (nmtkit/train/validation.py)."""
        cfg = self.cfg
        vsrc, vtgt = self.valid
        result = {"update": self.state.update,
                  **validation_loss(self.model, vsrc, vtgt, self.device, cfg.valid_batch_size, cfg.bf16)}
        n = len(vsrc) if cfg.valid_bleu_sentences < 0 else min(cfg.valid_bleu_sentences, len(vsrc))
        if n > 0:
            result.update(validation_bleu(self.model, self.data, vsrc, self.tgt_vocab, n, self.device,
                                          cfg.valid_beam, cfg.valid_batch_size, cfg.bf16))
        return result

    # -- the loop ----------------------------------------------------------------------------------------------

    def _on_signal(self, signum, frame) -> None:
        self.stop_signal = signum

    def train(self) -> dict:
        """Run until a stopping condition; returns a summary (``status``: done, early-stopped, interrupted)."""
        cfg, st = self.cfg, self.state
        lead = self.rank == 0
        if lead:
            os.makedirs(cfg.save_dir, exist_ok=True)
            if cfg.force and not cfg.resume:
                for p in glob.glob(os.path.join(cfg.save_dir, "checkpoint*.pt")):
                    os.unlink(p)
        limit = (cfg.max_updates and st.update >= cfg.max_updates) or (cfg.max_time and st.elapsed >= cfg.max_time)
        over = limit or (cfg.patience and st.bad_validations >= cfg.patience) or (cfg.max_epochs and
                                                                                  st.epoch >= cfg.max_epochs)
        if cfg.resume and not over:  # it goes past the interruption, whose validation is not one of the run's
            st.history = [h for h in st.history if h.get("scheduled", True)]
        logf = TrainLog(cfg.log_file or os.path.join(cfg.save_dir, "train.jsonl"), st.update if cfg.resume else None,
                        cfg.tensorboard, drop_interim=not over) if lead else None
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        progress = Progress(lead, cfg)
        window = self.log_window  # (the updates since the last train record: saved, so a resumed log reads the same)
        status, saved_at = "done", (st.update if cfg.resume else -1)  # a resumed state is saved already
        if limit:
            status = "limit"  # a resumed run that already reached its limit: no further update
            progress.write(f"update {st.update}: the run has already reached its --max-updates/--max-time limit")
        elif cfg.patience and st.bad_validations >= cfg.patience:  # (killed after its early stop was saved)
            status = "early-stopped"
            progress.write(f"update {st.update}: the run has already stopped early ({st.bad_validations} validations "
                           f"without improvement, --patience {cfg.patience})")
        log.info("training %s (%s parameters) on %d of %d pairs (at most %d tokens a side), %d process(es); recipe "
                 "%s: %s, lr %g, init %s%s", self.model.arch, f"{sum(p.numel() for p in self.model.parameters()):,}",
                 len(self.eligible), len(self.train_src), self.max_len, self.world, cfg.recipe, cfg.optimizer, cfg.lr,
                 cfg.init, (f", label smoothing {cfg.label_smoothing:g}" if cfg.label_smoothing else "")
                 + (f", BPE-dropout {cfg.bpe_dropout:g}" if cfg.bpe_dropout else ""))
        try:
            while status == "done" and not (cfg.max_epochs and st.epoch >= cfg.max_epochs):
                for view in self.train_views:
                    if hasattr(view, "epoch"):  # (BPE-dropout: this epoch's segmentations)
                        view.epoch = st.epoch
                schedule = EpochSchedule(np.asarray(self.train_src.sizes), np.asarray(self.train_tgt.sizes),
                                         self.eligible, cfg.batch_size, cfg.pool_batches, cfg.seed, st.epoch,
                                         self._pool_lengths())
                while st.batch_in_epoch < len(schedule):
                    t0 = clock()
                    group = schedule[st.batch_in_epoch: st.batch_in_epoch + cfg.update_freq]
                    nll, ntok, norm = self._step(group)
                    dt = clock() - t0
                    if self.governor is not None:
                        self.governor.step(ntok, dt)
                    st.update += 1
                    st.batch_in_epoch += len(group)
                    st.elapsed += dt
                    for k, v in (("nll", nll), ("tok", ntok), ("time", dt), ("norm", norm), ("n", 1)):
                        window[k] += v
                    # (the window's mean, as the JSON record has it: one update's loss swings with its batch)
                    progress.step(st, window["nll"] / max(window["tok"], 1), window["tok"] / max(window["time"], 1e-9))
                    if st.update % cfg.log_every == 0 and lead:
                        logf.train_record(st.update, st.epoch + 1, window, self.lr, st.elapsed)
                    stop = self._should_stop()  # "", "limit" or "interrupted"
                    if st.update % cfg.valid_every == 0 or stop:
                        self._gather_rngs()
                        if lead and stop == "interrupted" and st.update % cfg.valid_every:
                            self._save_interrupted(progress)  # at once: a supervisor's grace period is short
                        elif lead:
                            status = self._validate_and_save(logf, progress)
                        saved_at = st.update
                        status, st.elapsed = self.procs.broadcast_status(status, self.schedule, st.elapsed)
                    if stop and status == "done":
                        status = stop
                    if status != "done":
                        break
                else:
                    st.epoch += 1
                    st.batch_in_epoch = 0
            if saved_at != st.update:
                self._gather_rngs()
            if saved_at != st.update and lead:
                self._validate_and_save(logf, progress)
        finally:
            progress.close()
            for s, h in handlers.items():
                signal.signal(s, h)
            if logf:
                logf.close()
            self.rundir.unlock()
            self.procs.close()
        status = {"done": "done", "limit": "done"}.get(status, status)
        gov = self.governor
        if gov is not None and (gov.trials or gov.changes) and lead:
            log.info("threads: %d trial(s) of another count beside other work, %d change(s); %d at the end",
                     gov.trials, gov.changes, gov.threads)
        return {"status": status, "update": st.update, "epoch": st.epoch, "best": st.best_saved,
                "best_update": st.best_saved_update, "save_dir": cfg.save_dir, "history": st.history}

    def _gather_rngs(self) -> None:
        """Every process's RNG states, for the lead's checkpoint (a collective call: all processes make it)."""
        self._rank_rngs = self.procs.gather_rngs()

    def _should_stop(self) -> str:
        """Whether a signal ("interrupted") or a limit ("limit") ends the run here, else ""; the processes of a
        data-parallel run agree on it (a signal to any of them stops all) and on the time trained (the slowest's),
        which the schedules of a time budget read."""
        cfg, st = self.cfg, self.state
        signalled, st.elapsed = self.procs.agree_to_stop(self.stop_signal is not None, st.elapsed)
        if signalled:
            return "interrupted"
        return "limit" if ((cfg.max_updates and st.update >= cfg.max_updates)
                           or (cfg.max_time and st.elapsed >= cfg.max_time)) else ""

    def _save_interrupted(self, progress) -> None:
        """A signal's checkpoint, written before anything else (as Marian's ``--sigterm save-and-exit``): no
        validation first, which on a large development set takes longer than a supervisor's grace period between
        SIGTERM and SIGKILL (Docker's 10 s, Kubernetes' 30 s).  It is no validation of the run's, so it is not
        in the log or the history, and ``checkpoint_best.pt`` stays as it was; ``--resume`` goes on from it."""
        weights = None
        if self.averager is not None:  # (the checkpoint holds the averaged weights, as every save does)
            weights = self.averager.weights({k: v.detach().cpu() for k, v in self.model.state_dict().items()})
        path = self.save(False, weights)
        progress.write(f"update {self.state.update}: interrupted; saved {path} (not validated)")

    def _validate_and_save(self, logf, progress) -> str:
        cfg, st = self.cfg, self.state
        result, improved, value, raw, weights = {"update": st.update}, True, None, None, None
        # patience, the best metric it counts from, plateau's count and the average's snapshots take only the
        # validations every --valid-every updates, not the checkpoint of an interruption or of a limit: a run
        # interrupted there and resumed meets the same counts as an uninterrupted one
        scheduled = st.update % cfg.valid_every == 0
        if self.averager is not None:  # what is validated and saved: the averaged weights
            raw = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
            weights = self.averager.weights(raw)
        if self.valid is not None:
            t0 = clock()
            with averaging.using_weights(self.model, weights):
                result = self.validate()
            if scheduled:  # (the run's time: what a time budget counts; an interruption's validation is not the run's)
                st.elapsed += clock() - t0
            value = result.get("valid_bleu") if cfg.best_metric == "bleu" else None
            value = -result["valid_loss"] if value is None else value
            if scheduled:
                if st.best is None or value > st.best:
                    st.best, st.best_update, st.bad_validations = value, st.update, 0
                else:
                    st.bad_validations += 1
            improved = st.best_saved is None or value > st.best_saved  # (what checkpoint_best.pt is to hold)
            if improved:
                st.best_saved, st.best_saved_update = value, st.update
        if not scheduled:
            result["scheduled"] = False
        if scheduled and value is not None and self.schedule.on_validation(st.update, value):
            progress.write(f"update {st.update}: learning rate decayed to {self.schedule.lr(st.update + 1):g}")
        result.update(epoch=st.epoch + 1, elapsed=round(st.elapsed, 3), best_update=st.best_saved_update)
        st.history.append(result)
        if scheduled and self.averager is not None:
            self.averager.after_validation(st.update, raw)  # (before saving: the checkpoint names its snapshots)
        path = self.save(improved, weights)
        progress.write(describe_validation(result) + f"; saved {path}")
        logf.record({"type": "valid", **result})
        if cfg.patience and st.bad_validations >= cfg.patience:
            progress.write(f"early stop: no improvement in {cfg.patience} validations (best at update "
                           f"{st.best_update})")
            return "early-stopped"
        return "done"


def train(cfg: TrainConfig) -> dict:
    """Train a model as ``cfg`` says; returns the summary of :meth:`Trainer.train`."""
    return Trainer(cfg).train()
