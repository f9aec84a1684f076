"""Chunk decoders for the read path: the array's codec, decoded with the least overhead measured here.

A zstd chunk that zarr (and numcodecs) wrote is a standard zstd frame that records its content size.
``numcodecs.Zstd.decode`` creates a fresh decompression context for every call: measured on real
Breakout chunks of 8 frames, 18 us a chunk, of which ~13 us is context setup. A reused
``zstandard.ZstdDecompressor`` decodes the same bytes in ~5 us and releases the GIL while it works
(2 threads: ~3.6 us a chunk). Contexts are not thread-safe, so each thread keeps its own.

Where the system has libzstd (``ctypes.util.find_library("zstd")``, e.g. Debian's libzstd1), a
batch's chunks are decoded by ``ZSTD_decompressDCtx`` through ctypes straight into the decode area:
no bytes object per chunk and no copy out of it. Measured on the 1M-frame benchmark store this took
uniform sampling from ~1,800 to ~1,900 batches/s on one thread and from ~1,700 to ~2,150 on two.
Without libzstd the ``zstandard`` path above is used; both are tested.

Blosc chunks are decoded by numcodecs (blosc keeps its own contexts). Either way the result is
written into a caller-owned, reused buffer, and a chunk that does not decode (or decodes to the
wrong size) raises ``ChunkChecksumError`` naming it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any

import numpy as np
import zstandard

from replaystore.errors import ChunkChecksumError
from replaystore.schema import CodecSpec
from replaystore.shards import numcodecs_codec


def _load_libzstd() -> Any:
    """The system's libzstd through ctypes, or None: ``ZSTD_decompressDCtx`` writes a chunk straight
    into the decode area (no intermediate bytes object and copy), with the GIL released by ctypes."""
    name = ctypes.util.find_library("zstd")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        lib.ZSTD_createDCtx.restype = ctypes.c_void_p
        lib.ZSTD_freeDCtx.argtypes = [ctypes.c_void_p]
        lib.ZSTD_decompressDCtx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p,
                                            ctypes.c_size_t]
        lib.ZSTD_decompressDCtx.restype = ctypes.c_size_t
    except (OSError, AttributeError):
        return None
    return lib


LIBZSTD = _load_libzstd()


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
        self._numcodecs = None if codec.name == "zstd" else numcodecs_codec(codec)

    def decode(self, payload: Any, out: np.ndarray, *, name: str, shard: int, chunk: int) -> None:
        try:
            if self._numcodecs is not None:
                self._numcodecs.decode(payload, out=out)
                return
            raw = self._context().decompress(payload)
            if len(raw) != out.nbytes:
                raise ValueError(f"decoded to {len(raw)} bytes, expected {out.nbytes}")
            out.reshape(-1).view(np.uint8)[:] = np.frombuffer(raw, dtype=np.uint8)
        except Exception as exc:  # zstd/numcodecs raise ZstdError, RuntimeError or ValueError for bad frames
            raise ChunkChecksumError(
                f"chunk {chunk} of shard {shard} of '{name}' passed its checksum but does not decompress ({exc}); "
                "the store is damaged: run `replaystore verify`",
                array=name, shard=shard, chunk=chunk,
            ) from exc

    def decode_many(self, payloads: list[tuple[int, bytes | None]], area: np.ndarray, start: int, stop: int, *,
                    name: str, chunks_per_shard: int) -> None:
        """Decode ``payloads[start:stop]`` (``(chunk id, bytes or None)``) into ``area[start:stop]``.

        The batch hot path: one context lookup and one flat byte view per call, so the per-chunk
        Python work (which holds the GIL) is a decompress call and a copy that releases it.
        """
        if self._numcodecs is not None:
            for i in range(start, stop):
                self._decode_one(payloads[i], area[i], name, chunks_per_shard)
            return
        flat = area.reshape(area.shape[0], -1).view(np.uint8)
        nbytes = flat.shape[1]
        if LIBZSTD is not None and flat.flags.c_contiguous:
            dctx = self._dctx()
            base = flat.ctypes.data
            decompress_into = LIBZSTD.ZSTD_decompressDCtx
            for i in range(start, stop):
                cid, payload = payloads[i]
                if payload is None:
                    flat[i] = 0
                elif decompress_into(dctx, base + i * nbytes, nbytes, payload, len(payload)) != nbytes:
                    self._decode_one(payloads[i], area[i], name, chunks_per_shard)  # raises, naming the chunk
            return
        decompress = self._context().decompress
        for i in range(start, stop):
            cid, payload = payloads[i]
            try:
                raw = decompress(payload) if payload is not None else None
                if raw is not None and len(raw) != nbytes:
                    raise ValueError(f"decoded to {len(raw)} bytes, expected {nbytes}")
            except Exception:
                self._decode_one(payloads[i], area[i], name, chunks_per_shard)  # raises, naming the chunk
                raise
            if raw is None:
                flat[i] = 0
            else:
                flat[i] = np.frombuffer(raw, dtype=np.uint8)

    def _decode_one(self, item: tuple[int, bytes | None], out: np.ndarray, name: str, chunks_per_shard: int) -> None:
        cid, payload = item
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

    def _context(self) -> zstandard.ZstdDecompressor:
        ctx = getattr(self._local, "ctx", None)
        if ctx is None:
            ctx = self._local.ctx = zstandard.ZstdDecompressor()
        return ctx
