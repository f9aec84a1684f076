"""Durable writes on a local file system: every file is written whole to a temporary name, fsynced,
and renamed into place, so a file on disk is always the old or the new one, never a torn mix; the
directories renamed into are fsynced before a commit depends on them. A killed writer's temporary
files are removed by the next writer of the same files (``remove_partials``)."""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

from replaystore.errors import StoreWriteError

PARTIAL_SUFFIX = ".partial"


def atomic_write(path: Path, data: bytes, *, sync: bool = True, dirs: set[Path] | None = None) -> None:
    """Write ``data`` to ``path`` via a fsynced temporary file and a rename; ENOSPC gets a clear error.

    The rename is durable once ``path``'s directory is fsynced: with ``dirs``, that directory (and
    the parent of any directory made for it) is added there for the caller to sync once for many
    files (``fsync_dirs``); without, it is synced here."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
    try:
        made = make_parents(path.parent)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if sync:
            todo = {path.parent, *(d.parent for d in made)}
            if dirs is None:
                fsync_dirs(todo)
            else:
                dirs.update(todo)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if exc.errno == errno.ENOSPC:
            raise StoreWriteError(
                errno.ENOSPC,
                f"disk full while writing {path} ({len(data)} bytes); free space and call flush() again — "
                "the store on disk is still at its last commit",
            ) from exc
        raise StoreWriteError(exc.errno or errno.EIO, f"could not write {path}: {exc}; the store on disk is still at its last commit") from exc


def fsync_dir(path: Path) -> None:
    """fsync a directory so renames inside it survive a power cut. Errors are raised as
    ``StoreWriteError``, except where the filesystem cannot sync directories at all (EINVAL,
    ENOTSUP: nothing more can be done there)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise StoreWriteError(exc.errno or errno.EIO, f"could not open {path} to make its files durable: {exc}") from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF):
            raise StoreWriteError(exc.errno or errno.EIO, f"could not make the files in {path} durable (fsync: "
                                  f"{exc.strerror}); the store on disk is still at its last commit") from exc
    finally:
        os.close(fd)


def fsync_dirs(dirs: set[Path]) -> None:
    """``fsync_dir`` each of ``dirs``, deepest first (a new directory before the one holding it)."""
    for d in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
        fsync_dir(d)


def make_parents(directory: Path) -> list[Path]:
    """Make ``directory`` and its missing parents; returns those it made (their parents need a sync)."""
    missing = []
    d = directory
    while not d.exists():
        missing.append(d)
        if d.parent == d:
            break
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            pass
    return missing


def remove_partials(root: Path, owned: set[str] | None = None) -> int:
    """Delete temporary files a killed writer left behind; returns how many. With ``owned`` (keys
    relative to ``root``, such as ``obs/c/3/0/0``), only the temporary files of those keys: other
    streams' writers may be writing theirs right now."""
    count = 0
    for p in root.rglob(f"*{PARTIAL_SUFFIX}"):
        if owned is not None and str(p.relative_to(root).with_name(p.name.rsplit(".", 2)[0])) not in owned:
            continue
        try:
            p.unlink()
            count += 1
        except OSError:
            pass
    return count
