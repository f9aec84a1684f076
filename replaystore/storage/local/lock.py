"""One writer per store: an ``flock`` on ``<store>/writer.lock``.

``flock`` is released by the kernel when the holding process dies, so a lock left by a crashed or
SIGKILLed writer never blocks the next one; no pid-liveness guessing is needed. The file also records
the holder's pid, host and start time so the refusal can say who holds it. Readers take no lock.

The lock file is opened without following a symbolic link and must be a regular file
(``UnsafePathError`` otherwise): it is truncated and written, and must never be a file elsewhere.
Every way the lock can fail is named: another writer (``StoreLockedError``, naming it), a filesystem
without locks such as NFS without lockd, a directory that cannot be written, a platform without
``fcntl`` (``LockUnavailableError``), no descriptors left (``TooManyOpenFilesError``). The lock's
descriptor is closed on every path that does not end holding it.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import time
from pathlib import Path

from replaystore.errors import LockUnavailableError, StoreLockedError, TooManyOpenFilesError, UnsafePathError
from replaystore.storage.readfile import read_text

try:
    import fcntl
except ImportError:  # not POSIX: reading works, writing is refused when a lock is asked for
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = "writer.lock"
#: flock errors that mean "this filesystem does not do locks", not "someone holds it"
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS}


class WriterLock:
    """An exclusive, non-blocking writer lock on a store directory."""

    def __init__(self, root: Path, name: str | None = None) -> None:
        """``name``: what the errors call the locked thing (default: the directory)."""
        self.path = root / LOCK_NAME
        self.name = name or str(root)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``StoreLockedError`` naming the live holder (see the module
        docstring for the other errors)."""
        store = self.path.parent
        if fcntl is None:
            raise LockUnavailableError(errno.ENOSYS, f"cannot open {store} for writing: this platform has no fcntl "
                                       "(POSIX file locks), which the writer lock needs; open it with mode='r' to "
                                       "read it, or write it on Linux or macOS")
        try:  # never through a symbolic link: the lock is truncated and written (O_NOFOLLOW)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP or (exc.errno == errno.EISDIR and self.path.is_symlink()):
                raise UnsafePathError(exc.errno, f"{self.path} is a symbolic link (to {os.readlink(self.path)}); the "
                                      "store writes its lock only inside its own directory, never through a link: "
                                      f"remove the link (rm {self.path}) and open the store again") from None
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise TooManyOpenFilesError(exc.errno, f"cannot create the writer lock {self.path}: this process has "
                                            "too many open files; close replay stores you no longer use, or raise "
                                            "the limit (`ulimit -n`)") from exc
            raise LockUnavailableError(exc.errno, f"cannot create the writer lock {self.path} ({exc.strerror}); "
                                       "the store's directory must be writable to open it for writing: open it "
                                       "with mode='r' to read it") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a device: never truncated or written
            os.close(fd)
            raise UnsafePathError(errno.EINVAL, f"{self.path} is not a regular file; the store's writer lock must be "
                                  f"one: remove it (rm {self.path}) and open the store again")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._describe_holder()
            os.close(fd)
            raise StoreLockedError(
                f"{self.name} is open for writing by {holder}; close that writer first, "
                "or open this store with mode='r' to read it while it is written"
            ) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno in _NO_LOCKS:
                raise LockUnavailableError(exc.errno, f"cannot lock {self.path} ({exc.strerror}): the filesystem "
                                           f"holding {store} does not support file locks (NFS without lockd, "
                                           "some FUSE mounts); put the store on a local disk to write it, or "
                                           "open it with mode='r' to read it") from exc
            raise LockUnavailableError(exc.errno, f"cannot lock {self.path} ({exc.strerror}); open the store "
                                       "with mode='r' to read it") from exc
        try:  # who holds it, for the refusal a second writer gets: worth having, not worth failing for
            info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, info, 0)
        except OSError:
            pass
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass  # closing the descriptor below releases the lock anyway
        finally:
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _describe_holder(self) -> str:
        try:
            info = json.loads(read_text(self.path, cap=64 * 1024, what="a writer lock's record") or "{}")
            return f"process {info.get('pid')} on host {info.get('host')}"
        except (OSError, ValueError):
            return "another process"
