"""Every file the project writes outside a store (plots, episodes, videos, run directories,
checkpoints, exports, compact/merge/import destinations) is checked here first, one way:

- ``store_around(path)``: the store a path lies inside, walking up its folders (links resolved,
  ``file://`` URLs as paths): a store owns its directory, and ``compact`` in place keeps only what
  is its own, so anything written inside one is lost at the next compaction;
- ``check_target(path, what=...)``: refuses a target inside any store, a target that is a symbolic
  link (it would be written through), a FIFO, a device or a directory, and a folder that does not
  exist, each in one line naming the path and the fix;
- ``publish_file(tmp, target, replace=...)``: puts a finished temporary file (written beside the
  target) in place: ``os.replace`` where the command replaces its own output, or, for a file that
  must be new, ``link`` then ``unlink`` (no-replace: a file that appeared meanwhile stays).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from replaystore.errors import ConfigError, StoreExistsError, UnsafePathError
from replaystore.storage.readfile import read_file
from replaystore.storage.where import is_url, local_path

#: The attribute of a store's root ``zarr.json`` (format/schema.py's ATTR_KEY).
STORE_ATTR = "replaystore"


def is_store(folder: Path) -> bool:
    """Whether ``folder`` is a replay store's root (its ``zarr.json`` a group with replaystore's attributes)."""
    try:
        doc = json.loads(read_file(folder / "zarr.json", what="a store's zarr.json"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("attributes"), dict) and STORE_ATTR in doc["attributes"]


def store_around(path: Any) -> Path | None:
    """The store whose directory holds ``path`` (``path`` itself included), or None; for a URL, None
    (object stores are checked by their backend)."""
    if is_url(path):
        return None
    here = Path(os.path.realpath(local_path(path)))
    for folder in (here, *here.parents):
        if is_store(folder):
            return folder
    return None


def check_not_in_store(path: Any, *, what: str) -> None:
    """Refuse ``path`` when it lies inside a store (``UnsafePathError``)."""
    inside = store_around(path)
    if inside is not None:
        raise UnsafePathError(errno.EINVAL, f"{path} is inside the replay store {inside}: {what} would be deleted by "
                                            "its next compaction; put it outside the store")


def check_target(path: Any, *, what: str) -> Path:
    """``path`` as a file this command may write: its folder exists, it is not inside a store, and
    nothing but a regular file is there now (a link, FIFO, device or directory is refused)."""
    out = local_path(path)
    if not out.parent.is_dir():
        raise ConfigError(f"the folder {out.parent} does not exist; make it first, or write {what} elsewhere")
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(errno.ELOOP, f"{out} is a symbolic link; {what} is not written through a link: remove "
                                           "it, or give another file name")
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{out} is a directory; give a file name for {what}")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(errno.EINVAL, f"{out} is not a regular file (a FIFO, device or socket); {what} is not "
                                            "written over it: give another file name")
    check_not_in_store(out, what=what)
    return out


def temporary(target: Path) -> Path:
    """A new temporary file's name beside ``target`` (created exclusively by the caller's writer)."""
    return target.with_name(f".{target.name}.{os.getpid()}.tmp")


def publish_file(tmp: Path, target: Path, *, replace: bool) -> None:
    """Put the finished file ``tmp`` at ``target``, fsynced: over an older file of the command's own
    output (``replace``; a link at ``target`` is replaced, never followed), or only where nothing is
    (``StoreExistsError`` and ``tmp`` removed when something appeared meanwhile)."""
    fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if replace:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise StoreExistsError(f"{target} appeared while the command ran; it was not replaced: run the command "
                               "again with a new name") from None
    finally:
        tmp.unlink(missing_ok=True)
