"""Process-owned scratch folders, so a crashed process's temporary files are removed at the next start.

Every temporary file loraplex writes lives in ``<root>/<owner>/``, a folder owned by one process:
``<owner>`` is ``<boot id>-<pid>-<random>``, and the process holds an exclusive ``flock`` on
``<root>/<owner>.lock`` for its whole life. ``sweep(root)`` (run whenever a process opens its scratch
folder under ``root``, i.e. at every start) removes the folder of every owner whose lock it can take,
and never one whose lock is held.

Why a lock and not a pid check: replicas may share ``root`` across hosts (NFS, where Linux maps ``flock``
onto the server's byte-range locks), and another host's pid means nothing here; pids are also reused. The
kernel (or the NFS server, once the dead client's lease expires) drops a lock when its holder dies,
SIGKILL included, so "the lock can be taken" proves the owner is gone. The boot id and pid only make
the names readable; the random part keeps them unique where they are not (containers on one host share
the boot id and each has its own pid 1). Lock files are only ever opened by their owner and by sweeps,
and a sweep never opens its own process's locks (closing any descriptor of a file drops the process's
POSIX locks on it, which is what ``flock`` becomes on NFS).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
import uuid
from pathlib import Path

LOCK_SUFFIX = ".lock"
_BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
_registry: dict[Path, ProcessScratch] = {}
_registry_lock = threading.Lock()


def boot_id() -> str:
    """This host's boot id (changes at every boot); a random id fixed for this process where there is none."""
    global _fallback_boot_id
    try:
        value = _BOOT_ID_FILE.read_text().strip()
    except OSError:
        value = ""
    if value:
        return value
    if _fallback_boot_id is None:
        _fallback_boot_id = "noboot" + uuid.uuid4().hex[:12]
    return _fallback_boot_id


_fallback_boot_id: str | None = None


class ProcessScratch:
    """This process's folder under ``root`` (use ``process_scratch(root)``: one per root and process)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.owner = f"{boot_id()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path = root / self.owner
        self._fd: int | None = None
        root.mkdir(parents=True, exist_ok=True)
        self._fd = _take_lock(root / f"{self.owner}{LOCK_SUFFIX}")
        self.path.mkdir()
        sweep(root, skip=self.owner)

    def mkdtemp(self, prefix: str) -> Path:
        """A new private folder inside this process's scratch folder (the caller removes it)."""
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.path))

    def close(self) -> None:
        """Remove the folder and release the lock (at exit; a crash leaves both to the next sweep)."""
        if self._fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.root / f"{self.owner}{LOCK_SUFFIX}")
        os.close(self._fd)
        self._fd = None


def process_scratch(root: Path) -> ProcessScratch:
    """This process's scratch folder under ``root``, created (and ``root`` swept) on first use."""
    key = Path(os.path.abspath(root))
    with _registry_lock:
        scratch = _registry.get(key)
        if scratch is None or scratch._fd is None:
            scratch = _registry[key] = ProcessScratch(key)
        return scratch


def sweep(root: Path, skip: str | None = None) -> list[str]:
    """Remove the scratch folders under ``root`` whose owner process is gone; return their owner names.

    ``skip`` is the calling process's own owner name (its lock must not be opened, see the module doc).
    """
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return removed
    locks = {e.name[: -len(LOCK_SUFFIX)] for e in entries if e.name.endswith(LOCK_SUFFIX) and e.is_file()}
    mine = {s.owner for s in _registry.values()} | ({skip} if skip else set())
    for owner in sorted(locks - mine):
        if _remove_if_dead(root, owner):
            removed.append(owner)
    for entry in entries:
        # a folder in the owner-name format whose lock file is gone: an interrupted sweep's leftover
        if entry.is_dir(follow_symlinks=False) and _is_owner_name(entry.name) and entry.name not in locks | mine:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


def _is_owner_name(name: str) -> bool:
    parts = name.rsplit("-", 2)
    return len(parts) == 3 and parts[1].isdigit() and len(parts[2]) == 8


def _remove_if_dead(root: Path, owner: str) -> bool:
    lock_path = root / f"{owner}{LOCK_SUFFIX}"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # alive
        # Dead: remove the folder first, then the lock file, still holding the lock.
        shutil.rmtree(root / owner, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)
        return True
    finally:
        os.close(fd)


def _take_lock(lock_path: Path) -> int:
    """Create and lock ``lock_path``; retry if a sweep unlinked it between our open and our lock."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(f"scratch lock {lock_path} is held by another process") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def _close_all() -> None:
    with _registry_lock:
        for scratch in _registry.values():
            scratch.close()
        _registry.clear()


def _forget_in_child() -> None:
    """A forked child does not own its parent's folders: drop its copies of the locks (the parent's stay)."""
    global _registry_lock
    _registry_lock = threading.Lock()
    for scratch in _registry.values():
        if scratch._fd is not None:
            os.close(scratch._fd)
            scratch._fd = None
    _registry.clear()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forget_in_child)
