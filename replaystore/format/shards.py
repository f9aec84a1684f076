"""Bytes on disk: zarr v3 sharded arrays, encoded and decoded without zarr's per-chunk overhead.

Why not ``arr[a:b] = x``: zarr's own write path and indexing carry a per-chunk overhead (~1 ms a
chunk read) that dominates at 8-frame chunks, an order of magnitude slower than encoding the chunks
directly (docs/benchmarks.md, "Layout"). So this module writes the exact bytes zarr's ``sharding_indexed`` codec would
(inner codecs ``bytes -> zstd|blosc -> crc32c``; an index of ``(offset, nbytes)`` uint64 pairs,
``2**64-1`` for an empty chunk, followed by its own crc32c, at the end of the shard) and parses
them back. The array metadata itself is created by zarr, so any zarr v3 reader opens the arrays;
the tests read every field back with plain ``zarr.open_group``.

Pure functions of bytes: where they are stored, and how a write becomes durable, is the storage
backends' business (storage/local, storage/objects).
"""

from __future__ import annotations

import json
import struct
from typing import Any

import google_crc32c
import numpy as np

from replaystore.errors import ChunkChecksumError, ConfigError
from replaystore.format.schema import CodecSpec, Layout, Schema, group_doc, scalar_fields, slot_count

EMPTY = np.uint64(2**64 - 1)
INDEX_ENTRY_BYTES = 16
CRC_BYTES = 4
#: one index entry: a chunk's (offset, nbytes), ``EMPTY_OFFSET`` for a chunk never written
INDEX_ENTRY = struct.Struct("<QQ")
EMPTY_OFFSET = int(EMPTY)


def crc32c(buf: bytes | memoryview) -> bytes:
    """The 4 little-endian crc32c bytes zarr's ``crc32c`` codec appends to ``buf``."""
    return np.uint32(google_crc32c.value(np.frombuffer(buf, dtype=np.uint8))).tobytes()


def zarr_compressors(codec: CodecSpec) -> list[Any]:
    """The zarr codecs matching ``codec``, checksum last (for ``zarr.create_array``)."""
    from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec  # only where arrays are described: zarr costs ~19 MB

    if codec.name == "zstd":
        return [ZstdCodec(level=codec.level, checksum=False), Crc32cCodec()]
    if codec.name == "blosc":
        return [BloscCodec(cname=codec.cname, clevel=codec.level, shuffle="noshuffle", typesize=1),  # type: ignore[arg-type]
                Crc32cCodec()]
    raise ConfigError(f"codec name is {codec.name!r}, but replaystore supports 'zstd' and 'blosc'; pick one of those")


def numcodecs_codec(codec: CodecSpec) -> Any:
    """The numcodecs codec that produces the same bytes as ``zarr_compressors(codec)[0]``."""
    import numcodecs  # where libzstd does not do the work (storage/encoders.py): ~5 MB of RSS

    if codec.name == "zstd":
        return numcodecs.Zstd(level=codec.level)
    if codec.name == "blosc":
        return numcodecs.Blosc(cname=codec.cname, clevel=codec.level, shuffle=numcodecs.Blosc.NOSHUFFLE)
    raise ConfigError(f"codec name is {codec.name!r}, but replaystore supports 'zstd' and 'blosc'; pick one of those")


def validate_codec(codec: CodecSpec) -> None:
    """Raise ``ConfigError`` unless ``codec`` is one replaystore can write (its ranges checked here,
    before zarr or numcodecs see it)."""
    if codec.name == "zstd" and not -7 <= codec.level <= 22:
        raise ConfigError(f"zstd level is {codec.level}, outside -7..22; use 1..9 (3 is the default)")
    if codec.name == "blosc":
        if codec.cname not in ("lz4", "lz4hc", "zstd", "zlib", "blosclz"):
            raise ConfigError(f"blosc cname is {codec.cname!r}; use lz4, lz4hc, zstd, zlib or blosclz")
        if not 0 <= codec.level <= 9:
            raise ConfigError(f"blosc level is {codec.level}, outside 0..9")
    try:
        zarr_compressors(codec)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"codec {codec.name!r} (level {codec.level}) cannot be written: {exc}") from None


def array_metadata(*, length: int, item_shape: tuple[int, ...], dtype: str, chunk_len: int, shard_len: int,
                   codec: CodecSpec) -> bytes:
    """The ``zarr.json`` of a sharded array of ``length`` steps, as zarr writes it (made by zarr in
    memory, so any zarr v3 reader opens the arrays; each backend stores it at ``NAME/zarr.json``)."""
    import zarr  # creating a store only: opening and sampling one never import zarr (~19 MB of RSS)

    made: dict[str, Any] = {}
    zarr.create_array(
        zarr.storage.MemoryStore(store_dict=made),
        shape=(length, *item_shape),
        dtype=dtype,
        chunks=(chunk_len, *item_shape),
        shards=(shard_len, *item_shape),
        compressors=zarr_compressors(codec),
        fill_value=False if dtype == "bool" else 0,
        dimension_names=("step", *[f"dim_{i}" for i in range(len(item_shape))]),
        overwrite=True,
    )
    return bytes(made["zarr.json"].to_bytes())


def store_arrays(schema: Schema, layout: Layout) -> dict[str, bytes]:
    """Each array's ``zarr.json`` for a new store: the frames (``obs``), then every scalar field, all
    over the same slots (every stream's, laid end to end)."""
    length = slot_count(schema, layout)
    box = schema.observation
    out = {"obs": array_metadata(length=length, item_shape=box.shape, dtype=box.dtype, chunk_len=layout.obs_chunk_len,
                                 shard_len=layout.shard_len, codec=layout.codec)}
    if schema.extras:  # the extras' arrays are a subgroup (``extras/<name>``), which zarr needs described too
        out["extras"] = json.dumps(group_doc({})).encode()
    for name, (shape, dtype) in scalar_fields(schema.action, schema.extras).items():
        out[name] = array_metadata(length=length, item_shape=shape, dtype=dtype, chunk_len=layout.shard_len,
                                   shard_len=layout.shard_len, codec=layout.codec)
    return out


def shard_key(name: str, shard: int, item_ndim: int) -> str:
    """Store key of shard ``shard`` of array ``name`` (zarr v3 default key encoding)."""
    return "/".join([name, "c", str(shard), *(["0"] * item_ndim)])


def encode_shard(data: np.ndarray, *, chunk_len: int, rows: int, codec: Any) -> bytes:
    """Encode ``data`` (one shard, ``shard_len`` steps) as zarr v3 shard bytes.

    Chunks that start at or beyond ``rows`` lie outside the array (the edge shard) and are left
    empty; every other chunk is written, whole, even when it equals the fill value.
    """
    n_chunks = data.shape[0] // chunk_len
    return shard_bytes([encode_chunk(data[c * chunk_len : (c + 1) * chunk_len], codec) if c * chunk_len < rows else None
                        for c in range(n_chunks)])


def encode_chunk(rows: np.ndarray, codec: Any) -> tuple[bytes, bytes]:
    """One chunk's compressed payload and the crc32c zarr's ``crc32c`` codec appends to it."""
    payload = bytes(codec.encode(np.ascontiguousarray(rows)))
    return payload, crc32c(payload)


def shard_bytes(chunks: list[tuple[bytes, bytes] | None]) -> bytes:
    """A shard's bytes from its chunks in order, each ``(payload, crc32c)`` or None (left empty):
    the chunks back to back, then the index and its own crc32c."""
    index = np.full((len(chunks), 2), EMPTY, dtype="<u8")
    parts: list[bytes] = []
    offset = 0
    for c, chunk in enumerate(chunks):
        if chunk is None:
            continue
        payload, crc = chunk
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


def check_index_layout(index: np.ndarray, data_len: int, *, name: str, shard: int) -> None:
    """Check a parsed shard index's structure against the shard's data (``data_len`` bytes before the
    index): every chunk written lies inside the data, holds at least its checksum, and the chunks
    follow one another in order without overlapping (as the writer lays them out).
    ``ChunkChecksumError`` naming the first entry that does not."""
    written = [(c, int(off), int(n)) for c, (off, n) in enumerate(index) if off != EMPTY]
    end = 0
    for c, off, n in written:
        why = ("holds fewer bytes than its checksum" if n < CRC_BYTES else
               f"points past its shard's data ({off}+{n} > {data_len} bytes)" if off + n > data_len else
               f"starts at byte {off}, inside the chunk before it (which ends at {end})" if off < end else None)
        if why is not None:
            raise ChunkChecksumError(f"shard {shard} of '{name}' has a damaged index: chunk {c} {why}; run `replaystore "
                                     "compact --drop-damaged`", array=name, shard=shard, chunk=c)
        end = off + n


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


def decode_chunk(payload: bytes | memoryview, codec: Any, out: np.ndarray, *, name: str, shard: int, chunk: int) -> None:
    """Decompress ``payload`` into ``out`` (a reused buffer of exactly one chunk)."""
    try:
        codec.decode(payload, out=out)
    except Exception as exc:  # numcodecs raises RuntimeError/ValueError for bad frames
        raise ChunkChecksumError(
            f"chunk {chunk} of shard {shard} of '{name}' passed its checksum but does not decompress ({exc}); "
            "the store is damaged: run `replaystore verify`",
            array=name, shard=shard, chunk=chunk,
        ) from exc


def shard_payloads(raw: bytes | memoryview, *, chunk_len: int, n_chunks: int, name: str,
                   shard: int) -> list[memoryview | None]:
    """A shard's chunks from its bytes, in order: each one's compressed payload, its crc32c checked,
    or None for an empty chunk. Raises ``ChunkChecksumError`` naming what is damaged."""
    mv = memoryview(raw)
    tail = n_chunks * INDEX_ENTRY_BYTES + CRC_BYTES
    if len(mv) < tail:
        parse_index(mv[max(0, len(mv) - tail):], n_chunks, name=name, shard=shard)
    index = parse_index(mv[len(mv) - tail :], n_chunks, name=name, shard=shard)
    out: list[memoryview | None] = []
    for c in range(n_chunks):
        off, nbytes = int(index[c, 0]), int(index[c, 1])
        if off == EMPTY_OFFSET:
            out.append(None)
            continue
        if off + nbytes > len(mv) - tail:
            raise ChunkChecksumError(
                f"chunk {c} of shard {shard} of '{name}' points past the end of its shard file; the store is damaged",
                array=name, shard=shard, chunk=c,
            )
        out.append(check_chunk(mv[off : off + nbytes], name=name, shard=shard, chunk=c,
                               first_step=shard * n_chunks * chunk_len + c * chunk_len, steps=chunk_len))
    return out


def decode_shard(raw: bytes, *, chunk_len: int, n_chunks: int, codec: Any, out: np.ndarray, name: str, shard: int) -> None:
    """Decode a whole shard's bytes into ``out`` (``n_chunks*chunk_len`` steps); empty chunks become 0."""
    payloads = shard_payloads(raw, chunk_len=chunk_len, n_chunks=n_chunks, name=name, shard=shard)
    for c, payload in enumerate(payloads):
        rows = out[c * chunk_len : (c + 1) * chunk_len]
        if payload is None:
            rows[...] = 0
        else:
            decode_chunk(payload, codec, rows, name=name, shard=shard, chunk=c)
