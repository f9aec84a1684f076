"""One bounded way to read a file the project parses (a store's ``zarr.json``, a stream's commit, a
writer lock's record, a shard read whole by verify and compact, a run directory's ``args.json``
and ``agent.json``): opened without blocking (a FIFO or a device in its place is refused at once,
not waited on), checked to be a regular file no larger than a stated cap before a byte is read,
and read up to that cap only (a file that grows meanwhile is refused too). ``.npy`` members of an
``.npz`` are read the same way: each array's declared shape and dtype are checked against a
memory budget before it is inflated (a small file of compressed zeros can declare gigabytes)."""

from __future__ import annotations

import errno
import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import CorruptStoreError

#: The most bytes a metadata file (zarr.json, a commit, args.json, agent.json, a lock's record) may hold.
METADATA_CAP = 16 * 2**20
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class NotAFileError(CorruptStoreError, OSError):
    """Something other than a regular file (a FIFO, a device, a socket) where a file should be."""


def read_file(path: str | Path, *, cap: int = METADATA_CAP, what: str = "a metadata file") -> bytes:
    """The bytes of the regular file at ``path``, at most ``cap`` of them; ``FileNotFoundError`` and
    ``IsADirectoryError`` as ``open`` raises them, ``NotAFileError`` for a FIFO or device (at once,
    never waiting on it), ``CorruptStoreError`` for a file larger than ``cap``."""
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, f"{path} is a directory, not {what}")
        if not stat.S_ISREG(st.st_mode):
            raise NotAFileError(f"{path} is not a regular file (a FIFO, device or socket in its place); it cannot be "
                                f"{what}: remove it, or put back the file")
        if st.st_size > cap:
            raise CorruptStoreError(f"{path} is {st.st_size:,} bytes, more than {what} can be ({cap:,}); it is "
                                    "damaged or not what it claims to be: put back a copy")
        chunks, left = [], cap + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > cap:
            raise CorruptStoreError(f"{path} grew beyond {cap:,} bytes while it was read; it cannot be {what}")
        return data
    finally:
        os.close(fd)


def read_text(path: str | Path, *, cap: int = METADATA_CAP, what: str = "a metadata file") -> str:
    """``read_file`` as UTF-8 text (``ValueError`` for bytes that are not)."""
    return read_file(path, cap=cap, what=what).decode()


def npz_arrays(path: str | Path, *, budget: int, what: str = "a checkpoint") -> Iterator[tuple[str, np.ndarray]]:
    """Each array of the ``.npz`` at ``path`` (a regular file, no pickles), its declared shape and
    dtype checked before it is inflated: every one together within ``budget`` bytes
    (``CorruptStoreError`` otherwise)."""
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAFileError(f"{path} is not a regular file (a FIFO, device or socket in its place); it cannot be "
                                f"{what}")
    finally:
        os.close(fd)
    with zipfile.ZipFile(path) as archive:
        declared = {}
        for member in archive.namelist():
            with archive.open(member) as f:
                shape, _, dtype = npy_header(f)
            if dtype.hasobject:
                raise CorruptStoreError(f"{path}: {member} holds Python objects; {what} holds numbers only")
            declared[member] = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        total = sum(declared.values())
        if total > budget:
            raise CorruptStoreError(f"{path} declares {total:,} bytes of arrays, more than {what} of this model can "
                                    f"hold ({budget:,}); it is damaged or not {what}: put back a copy")
        for member in archive.namelist():
            with archive.open(member) as f:
                yield member.removesuffix(".npy"), np.lib.format.read_array(f, allow_pickle=False)


def npy_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    """An ``.npy`` stream's declared shape, Fortran order and dtype, read by numpy's header parser (a
    literal of at most 10,000 bytes, never code); ValueError when it is not one."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"an .npy version {version} header")
    return tuple(int(d) for d in shape), bool(fortran), np.dtype(dtype)
