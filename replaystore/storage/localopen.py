"""``ReplayStore.create`` and ``ReplayStore.open`` for a store on a local (or shared) file system:
format versions 1 and 2, whose layout and commits are described in docs/format.md (objectopen.py
is the counterpart for URLs).

Creating writes the arrays' metadata, each stream's first commit (under its writer lock) and last
the root ``zarr.json``, whole and atomically, so a half-made directory is never a store. Opening
takes the writer locks of the streams to be written, then reads the commits under them, again
while a writer in another process tears what was read (``store_moved``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from replaystore.errors import CorruptStoreError, FormatVersionError, StoreLockedError
from replaystore.format.schema import (
    ATTR_KEY,
    OBJECT_FORMAT_VERSION,
    SCALAR_FIELDS,
    STREAMS_DIR,
    Layout,
    Schema,
    State,
    from_attrs,
    slot_count,
    stream_doc,
    to_attrs,
)
from replaystore.format.shards import create_array_metadata, remove_partials
from replaystore.format.validate import check_arrays, read_group_doc
from replaystore.sampling.memory import check_config
from replaystore.storage.commits import owned_keys, read_stream_state, store_moved, writing_streams
from replaystore.storage.lock import WriterLock, claim_directory
from replaystore.storage.refresh import settle_streams
from replaystore.storage.writer import stream_dir, write_group_json

log = logging.getLogger("replaystore.store")


def create(cls: Any, root: Path, schema: Schema, layout: Layout, *, overwrite: bool, cache_bytes: int,
           memory_budget: int | None, decode_threads: int) -> Any:
    """A new store at ``root`` (checked by ``ReplayStore.create``), open for appending every stream."""
    box, n, capacity = schema.observation, schema.num_streams, schema.capacity
    lock = claim_directory(root, overwrite=overwrite)
    locks = [lock]
    try:
        length = slot_count(schema, layout)
        create_array_metadata(root, "obs", length=length, item_shape=box.shape, dtype=box.dtype,
                              chunk_len=layout.obs_chunk_len, shard_len=layout.shard_len, codec=layout.codec)
        for name, dtype in SCALAR_FIELDS.items():
            create_array_metadata(root, name, length=length, item_shape=(), dtype=dtype,
                                  chunk_len=layout.shard_len, shard_len=layout.shard_len, codec=layout.codec)
        state = State()
        if n > 1:
            write_group_json(root / STREAMS_DIR, {"zarr_format": 3, "node_type": "group",
                                                  "consolidated_metadata": None, "attributes": {}})
            for k in range(n):
                write_group_json(stream_dir(root, k), stream_doc(k, state))
                locks.append(WriterLock(stream_dir(root, k), f"stream {k} of {root}"))
                locks[-1].acquire()
        # The group's zarr.json goes last, whole and atomically: until it exists the directory is
        # not a store, so a reader never sees one half made.
        doc = {"attributes": {ATTR_KEY: to_attrs(schema, layout, state)}, "zarr_format": 3,
               "consolidated_metadata": None, "node_type": "group"}
        write_group_json(root, doc)
    except BaseException:
        for held in locks:
            held.release()
        raise
    if n > 1:
        lock.release()  # a store of streams is written under its streams' locks
        locks = locks[1:]
    log.info("created replay store %s (capacity %d, %d streams, layout %s)", root, capacity, n, layout)
    return cls(root, schema, layout, [state] * n, doc, writing=list(range(n)), cache_bytes=cache_bytes,
               locks=locks, decode_threads=decode_threads, memory_budget=memory_budget)


def open_(cls: Any, root: Path, mode: str, *, streams: Any, cache_bytes: int, memory_budget: int | None,
          decode_threads: int) -> Any:
    """The store at ``root``, open to read, or to append the streams ``streams`` (mode "a")."""
    doc = read_group_doc(root)
    schema, layout, state = from_attrs(doc.get("attributes"), path=str(root))
    if doc["attributes"][ATTR_KEY]["format_version"] == OBJECT_FORMAT_VERSION:
        raise FormatVersionError(f"{root} holds a store written for object storage (format version "
                                 f"{OBJECT_FORMAT_VERSION}); open it at its s3:// URL")
    check_arrays(root, schema, layout)
    writing = writing_streams(schema, mode, streams, root)
    check_config(schema, layout, root, writable=len(writing), cache_bytes=cache_bytes,
                 memory_budget=memory_budget, decode_threads=decode_threads)
    n = schema.num_streams
    locks: list[WriterLock] = []
    try:
        for k in writing:
            locks.append(WriterLock(root) if n == 1 else WriterLock(stream_dir(root, k), f"stream {k} of {root}"))
            locks[-1].acquire()
        for _ in range(100):
            # (re-)read under the locks: the last writer may just have committed
            doc = read_group_doc(root)
            schema, layout, state = from_attrs(doc.get("attributes"), path=str(root))
            states = [state] if n == 1 else [read_stream_state(root, k) for k in range(n)]
            if writing:
                removed = remove_partials(root, None if n == 1 else owned_keys(schema, layout, writing))
                if removed:
                    log.info("removed %d temporary files left by an interrupted writer in %s", removed, root)
            try:
                store = cls(root, schema, layout, states, doc, writing=writing, cache_bytes=cache_bytes,
                            locks=locks, decode_threads=decode_threads, memory_budget=memory_budget)
            except CorruptStoreError:
                if not store_moved(root, schema, layout, states, writing):
                    raise  # nothing moved: the store really is damaged
                continue  # torn by a writer overwriting what we read: load again at the new state
            if settle_streams(store, states):
                return store
            store._finalizer.detach()
            store.reader.close()
        raise StoreLockedError(f"{root} is being rewritten faster than it can be read; open it again")
    except BaseException:
        for held in locks:
            held.release()
        raise
