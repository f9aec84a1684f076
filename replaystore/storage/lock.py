"""One writer per store: an ``flock`` on ``<store>/writer.lock``.

``flock`` is released by the kernel when the holding process dies, so a lock left by a crashed or
SIGKILLed writer never blocks the next one; no pid-liveness guessing is needed. The file also records
the holder's pid, host and start time so the refusal can say who holds it. Readers take no lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path

from replaystore.errors import StoreExistsError, StoreLockedError
from replaystore.format.validate import is_store_dir

LOCK_NAME = "writer.lock"


class WriterLock:
    """An exclusive, non-blocking writer lock on a store directory."""

    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``StoreLockedError`` naming the live holder."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._describe_holder()
            os.close(fd)
            raise StoreLockedError(
                f"{self.path.parent} is open for writing by {holder}; close that writer first, "
                "or open this store with mode='r' to read it while it is written"
            ) from None
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _describe_holder(self) -> str:
        try:
            info = json.loads(self.path.read_text() or "{}")
            return f"process {info.get('pid')} on host {info.get('host')}"
        except (OSError, ValueError):
            return "another process"


def claim_directory(root: Path, *, overwrite: bool) -> WriterLock:
    """Make ``root`` an empty directory for a new store and hold its writer lock.

    A path holding other files is refused; an existing store only with ``overwrite`` (its contents
    are removed under its own writer lock, so a live writer is never clobbered).
    """
    lock: WriterLock | None = None
    if root.exists():
        if not root.is_dir():
            raise StoreExistsError(f"{root} exists and is a file; choose another path for the store")
        if [p for p in root.iterdir() if p.name != LOCK_NAME]:
            if not is_store_dir(root):
                raise StoreExistsError(f"{root} holds files that are not a replay store; choose an empty or new path")
            if not overwrite:
                raise StoreExistsError(
                    f"a replay store already exists at {root}; open it with ReplayStore.open({str(root)!r}, mode='a') "
                    "or pass overwrite=True to replace it"
                )
            lock = WriterLock(root)
            lock.acquire()
            for p in root.iterdir():
                if p.name != LOCK_NAME:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    root.mkdir(parents=True, exist_ok=True)
    if lock is None:
        lock = WriterLock(root)
        lock.acquire()
    return lock
