"""Bytes on disk: zarr v3 sharded arrays, encoded and decoded without zarr's per-chunk overhead.

Why not ``arr[a:b] = x``: zarr's own write path and indexing carry a per-chunk overhead (~1 ms a
chunk read) that dominates at 8-frame chunks, an order of magnitude slower than encoding the chunks
directly (docs/benchmarks.md, "Layout"). So this module writes the exact bytes zarr's ``sharding_indexed`` codec would
(inner codecs ``bytes -> zstd|blosc -> crc32c``; an index of ``(offset, nbytes)`` uint64 pairs,
``2**64-1`` for an empty chunk, followed by its own crc32c, at the end of the shard) and parses
them back. The array metadata itself is created by zarr, so any zarr v3 reader opens the arrays;
the tests read every field back with plain ``zarr.open_group``.

Files are written whole, to a temporary name, fsynced, and renamed into place, so a shard on disk
is always either the old or the new one, never a torn mix.
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path
from typing import Any

import google_crc32c
import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

from replaystore.errors import ChunkChecksumError, ConfigError, StoreWriteError
from replaystore.format.schema import CodecSpec

EMPTY = np.uint64(2**64 - 1)
INDEX_ENTRY_BYTES = 16
CRC_BYTES = 4
PARTIAL_SUFFIX = ".partial"


def crc32c(buf: bytes | memoryview) -> bytes:
    """The 4 little-endian crc32c bytes zarr's ``crc32c`` codec appends to ``buf``."""
    return np.uint32(google_crc32c.value(np.frombuffer(buf, dtype=np.uint8))).tobytes()


def zarr_compressors(codec: CodecSpec) -> list[Any]:
    """The zarr codecs matching ``codec``, checksum last (for ``zarr.create_array``)."""
    if codec.name == "zstd":
        return [ZstdCodec(level=codec.level, checksum=False), Crc32cCodec()]
    if codec.name == "blosc":
        return [BloscCodec(cname=codec.cname, clevel=codec.level, shuffle="noshuffle", typesize=1), Crc32cCodec()]
    raise ConfigError(f"codec name is {codec.name!r}, but replaystore supports 'zstd' and 'blosc'; pick one of those")


def numcodecs_codec(codec: CodecSpec) -> Any:
    """The numcodecs codec that produces the same bytes as ``zarr_compressors(codec)[0]``."""
    if codec.name == "zstd":
        return numcodecs.Zstd(level=codec.level)
    if codec.name == "blosc":
        return numcodecs.Blosc(cname=codec.cname, clevel=codec.level, shuffle=numcodecs.Blosc.NOSHUFFLE)
    raise ConfigError(f"codec name is {codec.name!r}, but replaystore supports 'zstd' and 'blosc'; pick one of those")


def validate_codec(codec: CodecSpec) -> None:
    """Raise ``ConfigError`` unless ``codec`` is one replaystore can write."""
    zarr_compressors(codec)
    if codec.name == "zstd" and not -7 <= codec.level <= 22:
        raise ConfigError(f"zstd level is {codec.level}, outside -7..22; use 1..9 (3 is the default)")
    if codec.name == "blosc":
        if codec.cname not in ("lz4", "lz4hc", "zstd", "zlib", "blosclz"):
            raise ConfigError(f"blosc cname is {codec.cname!r}; use lz4, lz4hc, zstd, zlib or blosclz")
        if not 0 <= codec.level <= 9:
            raise ConfigError(f"blosc level is {codec.level}, outside 0..9")


def create_array_metadata(
    root: Path,
    name: str,
    *,
    length: int,
    item_shape: tuple[int, ...],
    dtype: str,
    chunk_len: int,
    shard_len: int,
    codec: CodecSpec,
) -> None:
    """Write ``root/name/zarr.json`` for a sharded array of ``length`` steps (no data)."""
    zarr.create_array(  # stored at root/name itself, so zarr writes no group zarr.json (store.py writes it last)
        str(root / name),
        shape=(length, *item_shape),
        dtype=dtype,
        chunks=(chunk_len, *item_shape),
        shards=(shard_len, *item_shape),
        compressors=zarr_compressors(codec),
        fill_value=False if dtype == "bool" else 0,
        dimension_names=("step", *[f"dim_{i}" for i in range(len(item_shape))]),
        overwrite=True,
    )


def shard_key(name: str, shard: int, item_ndim: int) -> str:
    """Store key of shard ``shard`` of array ``name`` (zarr v3 default key encoding)."""
    return "/".join([name, "c", str(shard), *(["0"] * item_ndim)])


def encode_shard(data: np.ndarray, *, chunk_len: int, rows: int, codec: Any) -> bytes:
    """Encode ``data`` (one shard, ``shard_len`` steps) as zarr v3 shard bytes.

    Chunks that start at or beyond ``rows`` lie outside the array (the edge shard) and are left
    empty; every other chunk is written, whole, even when it equals the fill value.
    """
    n_chunks = data.shape[0] // chunk_len
    index = np.full((n_chunks, 2), EMPTY, dtype="<u8")
    parts: list[bytes] = []
    offset = 0
    for c in range(n_chunks):
        start = c * chunk_len
        if start >= rows:
            break
        payload = codec.encode(np.ascontiguousarray(data[start : start + chunk_len]))
        payload = bytes(payload)
        crc = crc32c(payload)
        parts.append(payload)
        parts.append(crc)
        index[c] = (offset, len(payload) + CRC_BYTES)
        offset += len(payload) + CRC_BYTES
    index_bytes = index.tobytes()
    parts.append(index_bytes)
    parts.append(crc32c(index_bytes))
    return b"".join(parts)


def parse_index(tail: bytes | memoryview, n_chunks: int, *, name: str, shard: int) -> np.ndarray:
    """Check and parse a shard index (the last ``16*n_chunks + 4`` bytes of a shard)."""
    tail = memoryview(tail)
    expected_len = n_chunks * INDEX_ENTRY_BYTES + CRC_BYTES
    if len(tail) != expected_len:
        raise ChunkChecksumError(
            f"shard {shard} of '{name}' is truncated: its index has {len(tail)} bytes, expected {expected_len}; "
            "run `replaystore verify` and `replaystore compact --drop-damaged`",
            array=name, shard=shard, chunk=None,
        )
    body = tail[:-CRC_BYTES]
    if crc32c(body) != bytes(tail[-CRC_BYTES:]):
        raise ChunkChecksumError(
            f"shard {shard} of '{name}' has a damaged index (crc32c mismatch); "
            "run `replaystore verify` and `replaystore compact --drop-damaged`",
            array=name, shard=shard, chunk=None,
        )
    return np.frombuffer(body, dtype="<u8").reshape(n_chunks, 2).copy()


def check_chunk(raw: bytes | memoryview, *, name: str, shard: int, chunk: int, first_step: int, steps: int) -> memoryview:
    """Verify a chunk's trailing crc32c; return the compressed payload without it."""
    raw = memoryview(raw)
    payload = raw[:-CRC_BYTES]
    if len(raw) < CRC_BYTES or crc32c(payload) != bytes(raw[-CRC_BYTES:]):
        raise ChunkChecksumError(
            f"chunk {chunk} of shard {shard} of '{name}' (slots {first_step}..{first_step + steps - 1}) is damaged "
            "(crc32c mismatch); run `replaystore verify` and `replaystore compact --drop-damaged`",
            array=name, shard=shard, chunk=chunk,
        )
    return payload


def decode_chunk(payload: memoryview, codec: Any, out: np.ndarray, *, name: str, shard: int, chunk: int) -> None:
    """Decompress ``payload`` into ``out`` (a reused buffer of exactly one chunk)."""
    try:
        codec.decode(payload, out=out)
    except Exception as exc:  # numcodecs raises RuntimeError/ValueError for bad frames
        raise ChunkChecksumError(
            f"chunk {chunk} of shard {shard} of '{name}' passed its checksum but does not decompress ({exc}); "
            "the store is damaged: run `replaystore verify`",
            array=name, shard=shard, chunk=chunk,
        ) from exc


def decode_shard(raw: bytes, *, chunk_len: int, n_chunks: int, codec: Any, out: np.ndarray, name: str, shard: int) -> None:
    """Decode a whole shard's bytes into ``out`` (``n_chunks*chunk_len`` steps); empty chunks become 0."""
    mv = memoryview(raw)
    tail = n_chunks * INDEX_ENTRY_BYTES + CRC_BYTES
    if len(mv) < tail:
        parse_index(mv[max(0, len(mv) - tail):], n_chunks, name=name, shard=shard)
    index = parse_index(mv[len(mv) - tail :], n_chunks, name=name, shard=shard)
    for c in range(n_chunks):
        off, nbytes = index[c]
        rows = out[c * chunk_len : (c + 1) * chunk_len]
        if off == EMPTY:
            rows[...] = 0
            continue
        if int(off) + int(nbytes) > len(mv) - tail:
            raise ChunkChecksumError(
                f"chunk {c} of shard {shard} of '{name}' points past the end of its shard file; the store is damaged",
                array=name, shard=shard, chunk=c,
            )
        payload = check_chunk(mv[int(off) : int(off) + int(nbytes)], name=name, shard=shard, chunk=c,
                              first_step=shard * n_chunks * chunk_len + c * chunk_len, steps=chunk_len)
        decode_chunk(payload, codec, rows, name=name, shard=shard, chunk=c)


def atomic_write(path: Path, data: bytes, *, sync: bool = True, dirs: set[Path] | None = None) -> None:
    """Write ``data`` to ``path`` via a fsynced temporary file and a rename; ENOSPC gets a clear error.

    The rename is durable once ``path``'s directory is fsynced: with ``dirs``, that directory (and
    the parent of any directory made for it) is added there for the caller to sync once for many
    files (``fsync_dirs``); without, it is synced here."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
    try:
        made = _make_parents(path.parent)
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


def _make_parents(directory: Path) -> list[Path]:
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
