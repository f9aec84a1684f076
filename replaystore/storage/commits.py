"""A store's commits as they are on disk: each stream's committed state, which streams a handle
may write, and the files its writers own. ``ReplayStore`` (store.py), ``verify`` and ``compact``
read commits through these functions; the commits themselves are written by storage/writer.py.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

from replaystore.errors import ConfigError
from replaystore.format.schema import (
    SCALAR_FIELDS,
    STREAMS_DIR,
    Layout,
    Schema,
    State,
    from_attrs,
    stream_state_from_doc,
    stream_stride,
)
from replaystore.format.shards import shard_key
from replaystore.format.validate import read_group_doc
from replaystore.storage.writer import stream_dir


def root_state(root: Path) -> State:
    return from_attrs(read_group_doc(root).get("attributes"), path=str(root))[2]


def read_stream_state(root: Path, k: int) -> State:
    """Stream ``k``'s committed state, read from ``streams/<k>/zarr.json``."""
    path = stream_dir(root, k)
    return stream_state_from_doc(read_group_doc(path), stream=k, path=str(path / "zarr.json"))


def store_moved(root: Path, schema: Schema, layout: Layout, states: list[State], writing: list[int]) -> bool:
    """Whether a stream this process does not write has a higher live start than in ``states``."""
    cap = schema.stream_capacity
    for k, state in enumerate(states):
        if k in writing:
            continue
        again = read_stream_state(root, k) if schema.num_streams > 1 else root_state(root)
        if again.live_start(cap) != state.live_start(cap):
            return True
    return False


def writing_streams(schema: Schema, mode: str, streams: Any, root: Path) -> list[int]:
    """The streams ``open`` writes, checked: all for mode "a" by default, none for mode "r"."""
    n = schema.num_streams
    if streams is None:
        return list(range(n)) if mode == "a" else []
    if mode != "a":
        raise ConfigError("streams= names the streams to write; pass mode='a' with it")
    picked = [streams] if isinstance(streams, numbers.Integral) else list(streams)
    for k in picked:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k < n:
            raise ConfigError(f"streams holds {k!r}, but {root} has streams 0..{n - 1}; pass stream indexes in that range")
    if not picked or len(set(picked)) != len(picked):
        raise ConfigError(f"streams is {streams!r}; name each stream to write once, at least one")
    return sorted(int(k) for k in picked)


def owned_keys(schema: Schema, layout: Layout, writing: list[int]) -> set[str]:
    """The file keys the writer of ``writing`` streams may leave temporary files of."""
    stride = stream_stride(schema, layout)
    per = stride // layout.shard_len
    ndim = len(schema.observation.shape)
    keys = set()
    for k in writing:
        keys.add(f"{STREAMS_DIR}/{k}/zarr.json")
        for shard in range(k * per, (k + 1) * per):
            keys.add(shard_key("obs", shard, ndim))
            keys.update(shard_key(name, shard, 0) for name in SCALAR_FIELDS)
    return keys
