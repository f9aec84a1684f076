"""The RAM a store needs, estimated up front from its configuration, and the budget check.

Everything a store keeps in RAM is sized by a knob the user controls:

==================  ============================================  =====================================
part                size                                          knob
==================  ============================================  =====================================
per-step scalars    capacity x 20 bytes (7 fields + bitmap)       ``capacity``
priority tree       32 bytes x 2**ceil(log2(capacity))            ``capacity`` (built on first use)
write buffer        2 x shard_len x frame bytes (writers only)    ``layout.shard_len``
chunk cache         at most ``cache_bytes`` of compressed chunks  ``cache_bytes``
cache lookup        8 bytes per chunk of the ring                 ``capacity``, ``layout.obs_chunk_len``
decode areas        128 chunks per decoding thread                ``decode_threads``, ``obs_chunk_len``
shard indexes       128 open shards x 16 bytes per chunk          ``layout.shard_len``
==================  ============================================  =====================================

Frames are never held in RAM beyond these: that is the point of the store. ``check_budget`` refuses a
configuration whose estimate exceeds ``memory_budget`` (or, with no budget, the machine's physical
RAM), naming the part that is largest and the knob that shrinks it.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import ConfigError
from replaystore.format.schema import SCALAR_FIELDS, Layout, Schema

DECODE_AREA_CHUNKS = 128
OPEN_SHARDS = 128
MB = 2**20

_KNOBS = {
    "scalars": "capacity",
    "priority_tree": "capacity",
    "write_buffer": "layout.shard_len",
    "chunk_cache": "cache_bytes",
    "cache_lookup": "capacity (or layout.obs_chunk_len)",
    "decode_areas": "decode_threads (or layout.obs_chunk_len)",
    "shard_indexes": "layout.shard_len",
}


def estimate(schema: Schema, layout: Layout, *, writable: bool, cache_bytes: int, decode_threads: int) -> dict[str, int]:
    """Bytes of RAM each part of a store with this configuration can use."""
    cap = schema.capacity
    frame = schema.observation.frame_bytes
    per_step = sum(np.dtype(d).itemsize for d in SCALAR_FIELDS.values()) + 1  # + the sampleable bitmap
    tree_leaves = 1 << max(0, int(cap - 1).bit_length())
    chunks_per_shard = layout.shard_len // layout.obs_chunk_len
    return {
        "scalars": cap * per_step,
        "priority_tree": 2 * 2 * tree_leaves * 8,
        "write_buffer": 2 * layout.shard_len * frame if writable else 0,
        "chunk_cache": int(cache_bytes),
        "cache_lookup": 8 * -(-cap // layout.shard_len) * chunks_per_shard,
        "decode_areas": max(1, decode_threads) * DECODE_AREA_CHUNKS * layout.obs_chunk_len * frame,
        "shard_indexes": OPEN_SHARDS * chunks_per_shard * 16,
    }


def physical_ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_budget(parts: dict[str, int], budget: int | None, *, path: str) -> None:
    """Raise ``ConfigError`` when ``parts`` cannot fit in ``budget`` bytes (or in physical RAM)."""
    total = sum(parts.values())
    limit, what = (budget, f"memory_budget is {budget / MB:.0f} MB") if budget is not None else (
        physical_ram(), f"this computer has {(physical_ram() or 0) / MB:.0f} MB of RAM")
    if limit is None or total <= limit:
        return
    largest = max(parts, key=lambda k: parts[k])
    listing = ", ".join(f"{k.replace('_', ' ')} {v / MB:.1f} MB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v)
    raise ConfigError(
        f"the replay store at {path} would need about {total / MB:.0f} MB of RAM ({listing}) but {what}; "
        f"the largest part is the {largest.replace('_', ' ')}: lower {_KNOBS[largest]}"
        + (", or raise memory_budget" if budget is not None else "")
    )


def check_config(schema: Schema, layout: Layout, root: Path, *, writable: bool, cache_bytes: Any,
                  memory_budget: Any, decode_threads: Any) -> None:
    """Validate the RAM knobs of ``create``/``open``, then refuse a configuration over ``memory_budget``."""
    for name, value, low in (("cache_bytes", cache_bytes, 0), ("decode_threads", decode_threads, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ConfigError(f"{name} is {value!r}; it must be an int >= {low}")
    if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(memory_budget, numbers.Integral)
                                      or memory_budget <= 0):
        raise ConfigError(f"memory_budget is {memory_budget!r}; it must be a positive number of bytes, or None")
    parts = estimate(schema, layout, writable=writable, cache_bytes=int(cache_bytes), decode_threads=int(decode_threads))
    check_budget(parts, None if memory_budget is None else int(memory_budget), path=str(root))
