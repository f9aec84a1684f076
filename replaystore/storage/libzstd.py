"""The system's libzstd through ctypes (standard library only: feed/decodeworker.py, a process that
imports nothing of replaystore, loads this file by its path).

``ZSTD_decompressDCtx`` writes a chunk straight into a decode area (no intermediate bytes object and
copy) with the GIL released by ctypes, and decodes concatenated frames back to back: storage/decoders.py
decodes a batch's chunks with one call. ``ZSTD_compressCCtx`` encodes the writer's chunks with a
context kept from one chunk to the next (storage/encoders.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any


def load_libzstd() -> Any:
    """libzstd with the signatures replaystore calls declared, or None where there is none."""
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
        lib.ZSTD_getFrameContentSize.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
        lib.ZSTD_findFrameCompressedSize.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.ZSTD_findFrameCompressedSize.restype = ctypes.c_size_t
        lib.ZSTD_createCCtx.restype = ctypes.c_void_p
        lib.ZSTD_freeCCtx.argtypes = [ctypes.c_void_p]
        lib.ZSTD_compressCCtx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                          ctypes.c_size_t, ctypes.c_int]
        lib.ZSTD_compressCCtx.restype = ctypes.c_size_t
        lib.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
        lib.ZSTD_compressBound.restype = ctypes.c_size_t
        lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
        lib.ZSTD_isError.restype = ctypes.c_uint
    except (OSError, AttributeError):
        return None
    return lib
