"""Directories renamed in one atomic step: a new store published where nothing is
(``renameat2(RENAME_NOREPLACE)``), and a store swapped for its compacted copy
(``renameat2(RENAME_EXCHANGE)`` on Linux, ``renamex_np(RENAME_SWAP)`` on macOS)."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
from pathlib import Path

from replaystore.errors import StoreExistsError

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
RENAME_SWAP = 2  # macOS's renamex_np flag
AT_FDCWD = -100


def rename_new(a: Path, b: Path) -> None:
    """Rename ``a`` to ``b`` only if nothing is at ``b`` (``renameat2(RENAME_NOREPLACE)``; where the
    file system lacks it, a rename after a check, which a directory made at ``b`` between the two
    still makes fail unless it is empty); ``StoreExistsError`` and ``a`` removed when something is."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None) if sys.platform.startswith("linux") else None
    rc = -1 if fn is None else fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_NOREPLACE)
    err = 0 if rc == 0 else (errno.ENOSYS if fn is None else ctypes.get_errno())
    if err in (errno.ENOSYS, errno.EINVAL):  # (no renameat2, or a file system without the flag)
        err = errno.EEXIST if os.path.lexists(b) else 0
        if not err:
            os.rename(a, b)
    if err:
        shutil.rmtree(a, ignore_errors=True)
        if err == errno.EEXIST:
            raise StoreExistsError(f"{b} appeared while the command ran (another process made it): nothing there was "
                                   "replaced and the new store was discarded; run the command again with a new DST")
        raise OSError(err, f"cannot rename the new store to {b}: {os.strerror(err)}")


def exchange(a: Path, b: Path) -> None:
    """Swap two directories in one atomic step, or raise ``OSError`` (and remove ``a``) where the file
    system cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    if sys.platform == "darwin":  # macOS: renamex_np(RENAME_SWAP) swaps two paths atomically
        fn = getattr(libc, "renamex_np", None)
        rc = -1 if fn is None else fn(os.fsencode(a), os.fsencode(b), RENAME_SWAP)
    else:  # Linux: renameat2(RENAME_EXCHANGE)
        fn = getattr(libc, "renameat2", None)
        rc = -1 if fn is None else fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    if rc != 0:
        err = errno.ENOSYS if fn is None else ctypes.get_errno()
        shutil.rmtree(a, ignore_errors=True)
        raise OSError(err, f"cannot swap {b} for its compacted copy atomically on this filesystem "
                           f"({os.strerror(err)}); compact to a new DST instead: replaystore compact {b} NEW_PATH")
