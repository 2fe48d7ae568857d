"""A training run's save directory: one run at a time, checkpoints that survive a kill at any instant.

What ``nmt-train --save-dir DIR`` keeps there, and the order it writes it in:

- the directory itself is locked (an exclusive ``flock``) for the whole run, and the kernel drops the lock when the
  process dies, however it dies; ``.nmt-train.pid`` names the holder while it runs.  A second ``nmt-train`` on the
  same directory is refused in one line naming that pid.
- ``checkpointN.pt``: the numbered checkpoints, the newest ``keep_last`` kept (and those an averaging still reads);
  an interruption's, off the ``--valid-every`` grid, goes at the resumed run's next save.
- ``checkpoint_best.pt`` and ``checkpoint_last.pt``: hard links to numbered ones.  A new best is linked *before*
  ``checkpoint_last.pt`` moves on, so the best is never held only by a numbered file that a later rotation deletes;
  and :meth:`RunDir.repair_best` (on resume) relinks it from the numbered file the run's state names should a kill
  have come between the two links of an older nmtkit.
- ``train.jsonl``: the run's log; on resume, the records written after the checkpoint resumed from are dropped
  and so are the interruption's validation records (:func:`truncate_log`), so the log reads like the
  uninterrupted run's.  The log -- there or wherever ``--log-file`` puts it -- is locked as the directory is, for
  as long as the run writes it (:func:`open_log`): two runs of other save directories naming one ``--log-file``
  would truncate and interleave each other's records, so the second is refused in one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import os
import re

from nmtkit.data import checkpoint
from nmtkit.errors import InputError

PID_FILE = ".nmt-train.pid"
NUMBERED = re.compile(r"checkpoint(\d+)\.pt")
# a checkpoint being saved (.checkpointN.pt.XXXX.PID.tmp) or linked (checkpoint_last.pt.PID.tmp)
STALE = re.compile(r"(?:\.checkpoint\d+\.pt\.[A-Za-z0-9_]+|checkpoint_(?:last|best)\.pt)\.(?P<pid>\d+)\.tmp")


class RunDir:
    """The save directory of one run; :meth:`lock` it before writing anything there."""

    def __init__(self, path: str):
        self.path = path
        self._lock_fd: int | None = None

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    # -- one run at a time ---------------------------------------------------------------------------------------

    def lock(self) -> None:
        """Take the directory's exclusive lock, or refuse: another live run holds it (its pid is named)."""
        os.makedirs(self.path, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)  # (the directory itself: no lock file to leave)
        if not _try_lock(fd):
            os.close(fd)
            try:
                with open(self.file(PID_FILE), encoding="ascii") as f:
                    holder = f.read().strip() or "unknown"
            except OSError:
                holder = "unknown"
            raise InputError(f"another nmt-train (pid {holder}) is using this save directory; wait for it to "
                             "finish or choose another --save-dir", self.path) from None
        self._lock_fd = fd
        with open(self.file(PID_FILE), "w", encoding="ascii") as f:  # (who holds it, for the refusal's message)
            f.write(f"{os.getpid()}\n")
        self.remove_stale()

    def remove_stale(self) -> list[str]:
        """Remove the temporaries of checkpoint saves and links that a killed run left (its pid is dead: the lock
        is ours), saying so."""
        from nmtkit.files import remove_stale

        return remove_stale(self.path, pattern=STALE)

    def __del__(self):
        self.unlock()

    def unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.file(PID_FILE))
            os.close(self._lock_fd)  # (closing drops the flock)
            self._lock_fd = None

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def numbered(self) -> list[tuple[int, str]]:
        """(update, path) of the numbered checkpoints, oldest first."""
        found = []
        for p in glob.glob(self.file("checkpoint*.pt")):
            m = NUMBERED.fullmatch(os.path.basename(p))
            if m:
                found.append((int(m.group(1)), p))
        return sorted(found)

    def save(self, payload: dict, update: int, is_best: bool, keep_last: int, needed: set[int] = frozenset(),
             valid_every: int = 1) -> str:
        """Write checkpoint ``update``; link it as best (first) and last; delete numbered ones beyond the newest
        ``keep_last`` except ``needed`` and the one ``checkpoint_best.pt`` may still be the only other name of.
        An earlier checkpoint off the ``valid_every`` grid (an interruption's, or a limit's that a resumed run went
        past) is deleted first and does not count among the kept: the run keeps the checkpoints an uninterrupted
        run keeps."""
        path = self.file(f"checkpoint{update}.pt")
        checkpoint.save(payload, path)
        if is_best:
            checkpoint.link(path, self.file("checkpoint_best.pt"))
        checkpoint.link(path, self.file("checkpoint_last.pt"))
        numbered = self.numbered()
        passed = [(u, p) for u, p in numbered if u % valid_every and u != update]
        kept = [(u, p) for u, p in numbered if (u, p) not in passed]
        for u, old in passed + kept[:-keep_last]:
            if u not in needed:
                os.unlink(old)
        return path

    def repair_best(self, best_update: int) -> bool:
        """Make ``checkpoint_best.pt`` name checkpoint ``best_update`` when that file exists and it does not (a
        kill between the links); returns whether it relinked."""
        numbered = self.file(f"checkpoint{best_update}.pt")
        best = self.file("checkpoint_best.pt")
        if not os.path.isfile(numbered) or (os.path.exists(best) and os.path.samefile(numbered, best)):
            return False
        checkpoint.link(numbered, best)
        return True


def _try_lock(fd: int) -> bool:
    """Take the exclusive ``flock`` of an open file or directory; False when another process holds it.  The kernel
    drops it when the process dies, however it dies."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise
        return False
    return True


def _lock_holder(path: str) -> int | None:
    """The pid of the process holding the ``flock`` of ``path``, from Linux's /proc/locks; None where it cannot be
    told (another system, or the lock already gone).  A line there reads
    ``1: FLOCK  ADVISORY  WRITE 26192 fe:00:2147658 0 EOF`` (pid, then device major:minor in hex and inode); a
    process waiting for the lock has ``->`` after the number, and is skipped."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == key and parts[4].isdigit():
            return int(parts[4])
    return None


def _locked_log(path: str) -> int:
    """A descriptor of the log ``path`` (created if missing) holding its lock, or the refusal: another run's."""
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as e:
            raise InputError(f"cannot write the training log: {e.strerror}", path) from None
        if not _try_lock(fd):
            os.close(fd)
            holder = _lock_holder(path)
            raise InputError(f"another nmt-train{f' (pid {holder})' if holder else ''} is writing this training "
                             "log; give each run its own --log-file (or wait for the other to finish)", path)
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # (replaced by a rename while we locked it: lock the file that has the name now)


def open_log(path: str, resumed_at: int | None, drop_interim: bool = True):
    """Open a run's JSON-lines log for appending, locked while it is open (the refusal of a second writer is one
    line); returns (the file, how many records were dropped).  A resumed run's log loses what :func:`truncate_log`
    drops, under the lock; a new run's is emptied, once the lock is ours."""
    fd = _locked_log(path)
    try:
        dropped = 0
        if resumed_at is None:
            os.ftruncate(fd, 0)
        elif dropped := truncate_log(path, resumed_at, drop_interim):  # (rewritten: lock the new inode, drop the old)
            fd, old = _locked_log(path), fd
            os.close(old)
        return os.fdopen(fd, "a", encoding="utf-8"), dropped
    except BaseException:
        os.close(fd)
        raise


def truncate_log(path: str, update: int, drop_interim: bool = True) -> int:
    """Drop the records of a JSON-lines training log after ``update`` (and a torn last line) and, with
    ``drop_interim`` (the resumed run goes past them), the validations off the schedule (an interruption's);
    returns how many lines were dropped.  The file is rewritten atomically (temporary name, then rename)."""
    from nmtkit.files import atomic_file

    if not os.path.isfile(path):
        return 0
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    keep = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # (a line torn by the kill)
        if not line.endswith("\n"):
            continue
        if isinstance(record, dict) and isinstance(record.get("update"), int) and record["update"] > update:
            continue
        if drop_interim and isinstance(record, dict) and record.get("type") == "valid" and \
                record.get("scheduled") is False:
            continue
        keep.append(line)
    if len(keep) == len(lines):
        return 0
    with atomic_file(path) as f:
        f.writelines(keep)
    return len(lines) - len(keep)
