"""The writer's chunk codec: numcodecs' (the codec zarr uses), with zstd chunks encoded by the
system's libzstd through a compression context kept from one chunk to the next.

The writer encodes a frame chunk each time it moves past one (openshard.py), between an env's steps.
numcodecs' ``Zstd.encode`` sets up a compression context for every call, and measured inside such a
loop (real Atari chunks of 8 frames, 56 KB, zstd-3, on the 2-core VM) it took ~52 us a chunk, ~39
in a tight loop; ``ZSTD_compressCCtx`` with one context kept per thread took ~28 us. Each chunk is a
standard zstd frame that declares its content size, as the read path's joined decoding needs
(decoders.py); with Debian's libzstd 1.5.4 the bytes were numcodecs' own for the 500 chunks
compared, and another zstd version may choose other bytes that any zstd reads. ctypes releases the
GIL for the call.

Where there is no libzstd (libzstd.py), or for blosc, numcodecs encodes. Decoding always goes
through numcodecs here (the writer decodes a chunk only to go on filling it).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from replaystore.format.schema import CodecSpec
from replaystore.format.shards import numcodecs_codec
from replaystore.storage.decoders import LIBZSTD


class _CCtx:
    """A libzstd compression context and an output buffer owned by one thread."""

    def __init__(self, capacity: int) -> None:
        self.ptr = LIBZSTD.ZSTD_createCCtx()
        self.capacity = capacity
        self.out = ctypes.create_string_buffer(capacity)

    def __del__(self) -> None:
        if LIBZSTD is not None and self.ptr:
            LIBZSTD.ZSTD_freeCCtx(self.ptr)


class ChunkCodec:
    """``encode(array) -> bytes`` and ``decode(payload, out=...)`` as numcodecs' codec for ``codec``;
    zstd encoding through libzstd where there is one."""

    def __init__(self, codec: CodecSpec) -> None:
        self.numcodecs = numcodecs_codec(codec)
        self.level = codec.level
        self._libzstd = LIBZSTD is not None and codec.name == "zstd"
        self._local = threading.local()

    def encode(self, data: np.ndarray) -> bytes:
        """``data`` compressed: one zstd frame, or numcodecs' encoding."""
        data = np.ascontiguousarray(data)
        if not self._libzstd:
            return bytes(self.numcodecs.encode(data))
        ctx: _CCtx | None = getattr(self._local, "ctx", None)
        if ctx is None or ctx.capacity < LIBZSTD.ZSTD_compressBound(data.nbytes):
            ctx = self._local.ctx = _CCtx(LIBZSTD.ZSTD_compressBound(data.nbytes))
        n = LIBZSTD.ZSTD_compressCCtx(ctx.ptr, ctx.out, ctx.capacity, data.ctypes.data, data.nbytes, self.level)
        if LIBZSTD.ZSTD_isError(n):
            return bytes(self.numcodecs.encode(data))
        return ctypes.string_at(ctx.out, n)

    def decode(self, payload: Any, out: Any = None) -> Any:
        return self.numcodecs.decode(payload, out=out)
