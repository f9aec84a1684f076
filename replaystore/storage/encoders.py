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

Where there is no libzstd (libzstd.py), or for blosc, numcodecs encodes. The writer decodes a chunk
only to go on filling it (a stored shard it fills again, as every step once the ring has come
round): through libzstd with a kept context too, ~13 us a chunk against ~33 through numcodecs.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from replaystore.format.schema import CodecSpec
from replaystore.format.shards import numcodecs_codec
from replaystore.storage.decoders import LIBZSTD, declared_size


class _CCtx:
    """A libzstd compression context and an output buffer owned by one thread."""

    def __init__(self, lib: Any, capacity: int) -> None:
        self.lib = lib
        self.ptr = lib.ZSTD_createCCtx()
        self.capacity = capacity
        self.out = ctypes.create_string_buffer(capacity)

    def __del__(self) -> None:
        if self.ptr:
            self.lib.ZSTD_freeCCtx(self.ptr)


class _DCtx:
    """A libzstd decompression context owned by one thread."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.ptr = lib.ZSTD_createDCtx()

    def __del__(self) -> None:
        if self.ptr:
            self.lib.ZSTD_freeDCtx(self.ptr)


class ChunkCodec:
    """``encode(array) -> bytes`` and ``decode(payload, out=...)`` as numcodecs' codec for ``codec``;
    zstd encoding through libzstd where there is one."""

    def __init__(self, codec: CodecSpec) -> None:
        self.spec = codec
        self.level = codec.level
        self._zstd = codec.name == "zstd"
        self._lib = LIBZSTD if self._zstd else None  # (kept: tests patch the module's)
        self._local = threading.local()
        self._numcodecs = None if self._lib is not None else numcodecs_codec(codec)

    @property
    def numcodecs(self) -> Any:
        """numcodecs' codec, made (and numcodecs imported) when first needed: never, where libzstd
        encodes and decodes every zstd chunk."""
        if self._numcodecs is None:
            self._numcodecs = numcodecs_codec(self.spec)
        return self._numcodecs

    def encode(self, data: np.ndarray) -> bytes:
        """``data`` compressed: one zstd frame, or numcodecs' encoding."""
        data = np.ascontiguousarray(data)
        lib = self._lib
        if lib is None:
            return bytes(self.numcodecs.encode(data))
        ctx: _CCtx | None = getattr(self._local, "ctx", None)
        if ctx is None or ctx.capacity < lib.ZSTD_compressBound(data.nbytes):
            ctx = self._local.ctx = _CCtx(lib, lib.ZSTD_compressBound(data.nbytes))
        n = ctx.lib.ZSTD_compressCCtx(ctx.ptr, ctx.out, ctx.capacity, data.ctypes.data, data.nbytes, self.level)
        if ctx.lib.ZSTD_isError(n):
            return bytes(self.numcodecs.encode(data))
        return ctypes.string_at(ctx.out, n)

    def decode(self, payload: Any, out: Any = None) -> Any:
        """``payload`` decoded into ``out``: by libzstd with a kept context where the frame fills
        ``out`` exactly, else by numcodecs (which decodes what libzstd would not, or raises). A zstd
        frame that declares another size than ``out``'s raises ``ValueError``."""
        if self._zstd and isinstance(out, np.ndarray):
            data = payload if isinstance(payload, bytes) else bytes(payload)
            if (size := declared_size(data)) is not None and size != out.nbytes:
                raise ValueError(f"its frame declares {size} bytes, a chunk has {out.nbytes}")
        if self._lib is not None and isinstance(out, np.ndarray) and out.flags.c_contiguous:
            dctx: _DCtx | None = getattr(self._local, "dctx", None)
            if dctx is None:
                dctx = self._local.dctx = _DCtx(self._lib)
            if dctx.lib.ZSTD_decompressDCtx(dctx.ptr, out.ctypes.data, out.nbytes, data, len(data)) == out.nbytes:
                return out
        return self.numcodecs.decode(payload, out=out)
