"""The frame shard a stream is writing, held in RAM compressed: its chunks encoded, one chunk raw.

A stream's writer keeps the shard it is filling in RAM until the shard is written whole (writer.py).
Held raw, that was ``shard_len`` frames a stream (28 MB for the default Atari layout), so a vector
env of 32 envs held 900 MB of write buffers, and every stream encoded its whole shard at once when it
crossed into the next, all streams on the same step. Here a chunk is encoded as soon as the writer
moves past it (``seal``), so a stream holds one raw chunk (``chunk_len`` frames) and the shard's
compressed chunks, and writing a shard only joins bytes already encoded (``encode``: the open
chunk's are encoded then without sealing it, so a flush can come at any step).

A shard already stored (the ring wrapped, or a reopened store continues a flushed partial shard) is
loaded as its compressed chunks, checked against their crc32c but not decoded; a chunk is decoded
when the writer opens it, since the steps after the write position in it are older live steps that
stay readable and are written back unchanged.

The reader (reader.py) serves the newest frames from here while planning, under the store's lock:
rows of the open chunk are copied, and the sealed chunks' payloads join the plan like chunks from
the compressed cache, decoded outside the lock. Payloads are immutable ``bytes``: a plan keeps
what it took whatever the writer does next.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.format.shards import crc32c, decode_chunk, encode_chunk, shard_bytes, shard_payloads
from replaystore.storage.decoders import declared_size
from replaystore.storage.plan import scatter

#: ``live_codes``' mark of a shard no writer is filling
NOT_LIVE = -2

#: ``OpenShard.snapshot``'s: the chunks, the odd ones, where, the open chunk's index and frames.
Snapshot = tuple[list[tuple[bytes, bytes] | None], set[int], tuple[str, int], int, np.ndarray]


class OpenShard:
    """Shard ``n_chunks`` chunks of ``chunk_len`` frames of ``shape``/``dtype``, compressed by ``codec``
    (numcodecs), except the chunk ``open_index`` being written, which is ``open`` (raw)."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, *, chunk_len: int, n_chunks: int, codec: Any) -> None:
        self.chunk_len = chunk_len
        self.n_chunks = n_chunks
        self.codec = codec
        self.open = np.zeros((chunk_len, *shape), dtype=dtype)
        self.spare = np.zeros_like(self.open)  # where the next chunk is decoded, then swapped with ``open``
        self.open_index = -1  # the chunk ``open`` holds, or -1
        self.chunks: list[tuple[bytes, bytes] | None] = [None] * n_chunks  # (payload, crc32c); None: never written
        self._zero: tuple[bytes, bytes] | None = None
        self.where = ("obs", -1)  # the array and global shard, for naming a damaged chunk
        self.odd: set[int] = set()  # loaded chunks whose zstd header does not declare one chunk's size

    # ---------------------------------------------------------------------------------------------
    # Writing

    def reset(self, *, name: str, shard: int) -> None:
        """A shard never stored: every chunk zero."""
        self.chunks = [None] * self.n_chunks
        self.odd = set()
        self.open_index = -1
        self.where = (name, shard)

    def load(self, raw: bytes, *, name: str, shard: int) -> None:
        """The stored shard ``raw`` (its chunks checked, not decoded; ``ChunkChecksumError`` names a
        damaged one)."""
        payloads = shard_payloads(raw, chunk_len=self.chunk_len, n_chunks=self.n_chunks, name=name, shard=shard)
        self.chunks = [None if p is None else (bytes(p), crc32c(p)) for p in payloads]
        self.odd = {c for c, p in enumerate(payloads) if p is not None and declared_size(p) != self.open.nbytes}
        self.open_index = -1
        self.where = (name, shard)

    def put(self, row: int, frame: np.ndarray) -> None:
        """Write ``frame`` at ``row`` of the shard."""
        c = row // self.chunk_len
        if c != self.open_index:
            self.open_chunk(c)
        self.open[row - c * self.chunk_len] = frame

    def open_chunk(self, c: int) -> None:
        """Seal the open chunk and make chunk ``c`` the raw one: decoded (its older steps stay), or
        zeros if never written. A chunk that does not decode raises ``ChunkChecksumError`` before
        anything has changed."""
        self.check(c)  # decoded into ``spare``
        if self.chunks[c] is None:
            self.spare[...] = 0
        self.seal()
        self.open, self.spare = self.spare, self.open
        self.open_index = c

    def check(self, c: int) -> None:
        """Decode chunk ``c`` into ``spare`` if it is stored and not open: ``ChunkChecksumError`` if it
        does not decode (changing nothing else)."""
        chunk = self.chunks[c]
        if c != self.open_index and chunk is not None:
            name, shard = self.where
            decode_chunk(memoryview(chunk[0]), self.codec, self.spare, name=name, shard=shard, chunk=c)

    def seal(self) -> None:
        """Encode the open chunk (the writer has moved past it)."""
        if self.open_index >= 0:
            self.chunks[self.open_index] = encode_chunk(self.open, self.codec)
            self.odd.discard(self.open_index)
            self.open_index = -1

    def encode(self, rows: int) -> bytes:
        """The shard's bytes (zarr v3), its chunks starting at or beyond ``rows`` left empty (the
        edge shard); chunks never written are written as zeros. The open chunk stays open."""
        chunks: list[tuple[bytes, bytes] | None] = []
        for c in range(self.n_chunks):
            if c * self.chunk_len >= rows:
                chunks.append(None)
            elif c == self.open_index:
                chunks.append(encode_chunk(self.open, self.codec))
            else:
                chunks.append(self.chunks[c] or self.zero())
        return shard_bytes(chunks)

    def snapshot(self) -> Snapshot:
        """Everything ``restore`` puts back (the payloads are immutable: a list copy keeps them)."""
        return list(self.chunks), set(self.odd), self.where, self.open_index, self.open.copy()

    def restore(self, snapshot: Snapshot) -> None:
        chunks, odd, self.where, self.open_index, raw = snapshot
        self.chunks, self.odd = list(chunks), set(odd)
        self.open[...] = raw

    # ---------------------------------------------------------------------------------------------
    # Reading

    def payload(self, c: int) -> bytes:
        """The compressed payload of chunk ``c`` (not the open one), zeros if it was never written."""
        return (self.chunks[c] or self.zero())[0]

    def decoded(self) -> np.ndarray:
        """The whole shard decoded (for checks and tests; the read path never decodes it whole)."""
        out = np.empty((self.n_chunks * self.chunk_len, *self.open.shape[1:]), dtype=self.open.dtype)
        for c in range(self.n_chunks):
            rows = out[c * self.chunk_len : (c + 1) * self.chunk_len]
            if c == self.open_index:
                rows[...] = self.open
            elif self.chunks[c] is None:
                rows[...] = 0
            else:
                decode_chunk(self.payload(c), self.codec, rows, name=self.where[0], shard=self.where[1], chunk=c)
        return out

    def zero(self) -> tuple[bytes, bytes]:
        """A chunk of zeros, encoded (once)."""
        if self._zero is None:
            self._zero = encode_chunk(np.zeros_like(self.open), self.codec)
        return self._zero


# -------------------------------------------------------------------------------------------------
# What ``FrameReader.plan`` does with the shards the writers are filling (``live``: global shard
# number -> OpenShard), under the store's lock


def live_codes(live: dict[int, OpenShard], n_shards: int, chunks_per_shard: int) -> np.ndarray:
    """Per shard of the array: ``NOT_LIVE``, or (a shard being filled) the global id of its open
    chunk, or -1 where none is open."""
    code = np.full(n_shards, NOT_LIVE, dtype=np.int64)
    for shard, frames in live.items():
        code[shard] = shard * chunks_per_shard + frames.open_index if frames.open_index >= 0 else -1
    return code


def copy_open_chunks(live: dict[int, OpenShard], slots: np.ndarray, taken: np.ndarray, parts: list[list[np.ndarray]],
                     bounds: list[list[int]], shard_len: int, chunk_len: int) -> None:
    """Copy the frames at ``slots`` (``(k, m)``) where ``taken`` (each in the open chunk of a shard in
    ``live``) into batch ``i``'s ``parts[i]``, from the writers' raw chunks."""
    slot_shard = slots // shard_len
    for shard in np.unique(slot_shard[taken]).tolist():
        frames = live[shard]
        first = shard * shard_len + frames.open_index * chunk_len
        here = taken & (slot_shard == shard)
        for i in np.flatnonzero(here.any(axis=1)).tolist():
            hit = np.flatnonzero(here[i])
            scatter(parts[i], bounds[i], hit, frames.open[slots[i, hit] - first])


def writers_payloads(live: dict[int, OpenShard], code: np.ndarray, id_array: np.ndarray, found: list[bytes | None],
                     chunks_per_shard: int, odd: set[int] | None) -> int:
    """Put in ``found`` the payloads of the chunks (``id_array``) that lie in a shard a writer is
    filling (``code``: ``live_codes``'), from the writer (the cache and the files hold an older
    version, or none); returns how many. Those that cannot be decoded joined go into ``odd`` (the
    reader's, where it joins)."""
    shard_of = id_array // chunks_per_shard
    mine = np.flatnonzero(code[shard_of] != NOT_LIVE)
    for j, shard in zip(mine.tolist(), shard_of[mine].tolist()):
        frames = live[shard]
        local = int(id_array[j]) - shard * chunks_per_shard
        found[j] = frames.payload(local)
        if odd is not None and local in frames.odd:
            odd.add(int(id_array[j]))
    return int(mine.size)
