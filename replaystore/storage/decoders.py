"""Chunk decoders for the read path: the array's codec, decoded into reused buffers with the least
per-chunk overhead.

A zstd chunk that zarr (and numcodecs) wrote is a standard zstd frame that records its content size.
Where the system has libzstd (``ctypes.util.find_library("zstd")``, e.g. Debian's libzstd1; libzstd.py),
a batch's chunks are decoded by ``ZSTD_decompressDCtx`` through ctypes straight into the decode area,
with a decompression context reused per thread (contexts are not thread-safe):
no bytes object per chunk and no copy out of it. And since libzstd decodes concatenated frames back
to back, the batch's payloads are joined and decoded by *one* call, which releases the GIL once per
batch instead of once per chunk: that is what lets a second sampling thread help (docs/benchmarks.md,
"Decoding chunks"). Only payloads whose zstd header declares exactly one chunk's size are joined
(``declares_chunk``; zarr, numcodecs and replaystore always write it), and zstd checks every frame's
decoded size against its header, so one bad frame cannot shift the others; if the joined call fails
the chunks are decoded one by one to name the bad one. Without libzstd, numcodecs (zarr's own codec
library, which also encodes every chunk) decodes chunk by chunk; both paths are tested.

Blosc chunks are decoded by numcodecs. Either way the result is written into a caller-owned, reused
buffer of exactly one chunk, and a chunk that does not decode, or whose frame declares any other
size, raises ``ChunkChecksumError`` naming it.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from replaystore.errors import ChunkChecksumError
from replaystore.format.schema import CodecSpec
from replaystore.format.shards import numcodecs_codec
from replaystore.storage.libzstd import load_libzstd

LIBZSTD = load_libzstd()


class _DCtx:
    """A libzstd decompression context owned by one thread."""

    def __init__(self) -> None:
        self.ptr = LIBZSTD.ZSTD_createDCtx()

    def __del__(self) -> None:
        if LIBZSTD is not None and self.ptr:
            LIBZSTD.ZSTD_freeDCtx(self.ptr)


class ChunkDecoder:
    """``decode(payload, out, ...)``: decompress one chunk's payload into ``out`` (exactly one chunk)."""

    def __init__(self, codec: CodecSpec) -> None:
        self.spec = codec
        self._local = threading.local()
        self._zstd = codec.name == "zstd"
        self._libzstd = LIBZSTD is not None and self._zstd
        self._numcodecs = None if self._libzstd else numcodecs_codec(codec)

    def decode(self, payload: Any, out: np.ndarray, *, name: str, shard: int, chunk: int) -> None:
        try:
            if self._zstd and (size := declared_size(payload)) is not None and size != out.nbytes:
                raise ValueError(f"its frame declares {size} bytes, a chunk has {out.nbytes}")
            if self._numcodecs is None:  # (made when first needed: libzstd decodes every sound chunk)
                self._numcodecs = numcodecs_codec(self.spec)
            self._numcodecs.decode(payload, out=out.reshape(-1).view(np.uint8))
        except Exception as exc:  # numcodecs raises RuntimeError or ValueError for bad frames
            raise ChunkChecksumError(
                f"chunk {chunk} of shard {shard} of '{name}' passed its checksum but does not decompress ({exc}); "
                "the store is damaged: run `replaystore verify`",
                array=name, shard=shard, chunk=chunk,
            ) from exc

    def decode_many(self, ids: list[int], payloads: list[bytes | None], area: np.ndarray, start: int, stop: int, *,
                    name: str, chunks_per_shard: int, as_one: bool = False) -> None:
        """Decode ``payloads[start:stop]`` (chunk ``ids[i]``'s bytes, or None for an empty chunk) into
        ``area[start:stop]``.

        ``as_one`` (the caller vouches that every payload is one zstd frame declaring exactly one
        chunk's size, see ``declares_chunk``): the payloads are joined and decoded by a single
        ``ZSTD_decompressDCtx`` call, which decodes concatenated frames back to back. One call, so
        one release of the GIL per batch instead of one per chunk (per-chunk calls hand the GIL back
        and forth ~50 times a batch and do not scale with threads; docs/benchmarks.md). zstd checks each frame's decoded size against its header, so a damaged
        frame cannot shift its neighbours; on any failure the chunks are decoded one by one, which
        names the bad one.
        """
        flat = area.reshape(area.shape[0], -1).view(np.uint8)
        nbytes = flat.shape[1]
        if self._libzstd and flat.flags.c_contiguous:
            dctx = self._dctx()
            base = flat.ctypes.data
            decompress_into = LIBZSTD.ZSTD_decompressDCtx
            if as_one and stop > start:
                blob = b"".join(p for p in payloads[start:stop] if p is not None)  # (as_one: none is None)
                want = (stop - start) * nbytes
                if decompress_into(dctx, base + start * nbytes, want, blob, len(blob)) == want:
                    return
            for i in range(start, stop):
                payload = payloads[i]
                if payload is None:
                    flat[i] = 0
                elif decompress_into(dctx, base + i * nbytes, nbytes, payload, len(payload)) != nbytes:
                    self._decode_one(ids[i], payload, area[i], name, chunks_per_shard)  # raises, naming the chunk
            return
        for i in range(start, stop):
            self._decode_one(ids[i], payloads[i], area[i], name, chunks_per_shard)

    @property
    def joinable(self) -> bool:
        """Whether ``decode_many`` can decode joined payloads in one call (zstd through libzstd)."""
        return self._libzstd

    def declares_chunk(self, payload: bytes, nbytes: int) -> bool:
        """Whether ``payload`` is a zstd frame whose header declares ``nbytes`` of content, so that it
        can be decoded joined with others (``decode_many(..., as_one=True)``). Frames written by
        zarr, numcodecs and replaystore always do; anything else is decoded on its own."""
        if not self.joinable:
            return False
        return LIBZSTD.ZSTD_findFrameCompressedSize(payload, len(payload)) == len(payload) and \
            LIBZSTD.ZSTD_getFrameContentSize(payload, len(payload)) == nbytes

    def _decode_one(self, cid: int, payload: bytes | None, out: np.ndarray, name: str, chunks_per_shard: int) -> None:
        if payload is None:
            out[...] = 0
            return
        shard, chunk = divmod(cid, chunks_per_shard)
        self.decode(payload, out, name=name, shard=shard, chunk=chunk)

    def _dctx(self) -> int:
        ctx = getattr(self._local, "dctx", None)
        if ctx is None:
            ctx = self._local.dctx = _DCtx()
        return ctx.ptr


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def declared_size(payload: bytes | memoryview | None) -> int | None:
    """The content size a zstd frame's header declares, or None (not a zstd frame, or no size):
    what ``ChunkDecoder.declares_chunk`` checks, read from the header in Python (a chunk read from
    disk is checked here without a call into libzstd)."""
    if payload is None or len(payload) < 6 or payload[:4] != _ZSTD_MAGIC:
        return None
    fhd = payload[4]
    single = (fhd >> 5) & 1
    size = ((1 if single else 0), 2, 4, 8)[fhd >> 6]
    if not size:
        return None
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    if len(payload) < at + size:
        return None
    return int.from_bytes(payload[at : at + size], "little") + (256 if size == 2 else 0)
