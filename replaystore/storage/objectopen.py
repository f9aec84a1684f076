"""``ReplayStore.create`` and ``ReplayStore.open`` for a store at a URL (``s3://bucket/prefix``):
format version 3, whose layout and commits are described in objectstreams.py and docs/format.md.

Creating writes the arrays' metadata (made by zarr, as for a local store), each stream's first
state object (holding this process's lease) and last the root ``zarr.json`` with a create-only put,
so two processes creating one store cannot both succeed, and a half-made store is not a store.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replaystore.errors import CorruptStoreError, FormatVersionError, StoreExistsError, StoreNotFoundError
from replaystore.format.schema import (
    ATTR_KEY,
    OBJECT_FORMAT_VERSION,
    SCALAR_FIELDS,
    STREAMS_DIR,
    Layout,
    Schema,
    from_attrs,
    slot_count,
    to_attrs,
)
from replaystore.format.shards import create_array_metadata
from replaystore.format.validate import check_arrays
from replaystore.storage.commits import writing_streams
from replaystore.storage.objects import Bucket
from replaystore.storage.objectstreams import (
    DEFAULT_GC_GRACE,
    DEFAULT_LEASE_TTL,
    ObjectLease,
    ObjectStreams,
    empty_doc,
)

if TYPE_CHECKING:
    from replaystore.store import ReplayStore

log = logging.getLogger(__name__)

_GROUP = {"zarr_format": 3, "node_type": "group", "consolidated_metadata": None, "attributes": {}}


def _streams(bucket: Bucket, schema: Schema, layout: Layout, options: dict[str, Any] | None) -> ObjectStreams:
    options = options or {}
    return ObjectStreams(bucket, schema, layout, lease_ttl=float(options.get("lease_ttl", DEFAULT_LEASE_TTL)),
                         gc_grace=float(options.get("gc_grace", DEFAULT_GC_GRACE)))


def read_root(bucket: Bucket) -> tuple[dict[str, Any], Schema, Layout]:
    """The root ``zarr.json`` of the store at ``bucket``, checked to be format version 3."""
    got = bucket.get("zarr.json")
    if got is None:
        raise StoreNotFoundError(f"{bucket} holds no replay store (no zarr.json); check the URL or create one with "
                                 f"ReplayStore.create({bucket.url!r}, ...)")
    try:
        doc = json.loads(got[0])
    except ValueError as exc:
        raise CorruptStoreError(f"{bucket}/zarr.json is not valid JSON ({exc}); the store's metadata is damaged") from exc
    if not isinstance(doc, dict) or doc.get("zarr_format") != 3 or doc.get("node_type") != "group":
        raise CorruptStoreError(f"{bucket}/zarr.json is not a zarr v3 group; this is not a replay store")
    schema, layout, _ = from_attrs(doc.get("attributes"), path=bucket.url)
    version = doc["attributes"][ATTR_KEY]["format_version"]
    if version != OBJECT_FORMAT_VERSION:
        raise FormatVersionError(f"{bucket} holds a store of format version {version}, written for a local disk (its "
                                 "shards were copied as files); open it from a local path, or copy it to object "
                                 "storage with `replaystore compact SRC s3://...`")
    return doc, schema, layout


def create(cls: type[ReplayStore], url: str, schema: Schema, layout: Layout, *, overwrite: bool, cache_bytes: int,
           memory_budget: int | None, decode_threads: int, storage_options: dict[str, Any] | None) -> ReplayStore:
    bucket = Bucket(url, storage_options)
    _clear(bucket, overwrite=overwrite, options=storage_options)
    streams = _streams(bucket, schema, layout, storage_options)
    n = schema.num_streams
    with tempfile.TemporaryDirectory(prefix="replaystore-meta-") as tmp:
        root = Path(tmp)
        length = slot_count(schema, layout)
        box = schema.observation
        create_array_metadata(root, "obs", length=length, item_shape=box.shape, dtype=box.dtype,
                              chunk_len=layout.obs_chunk_len, shard_len=layout.shard_len, codec=layout.codec)
        for name, dtype in SCALAR_FIELDS.items():
            create_array_metadata(root, name, length=length, item_shape=(), dtype=dtype, chunk_len=layout.shard_len,
                                  shard_len=layout.shard_len, codec=layout.codec)
        for name in ("obs", *SCALAR_FIELDS):
            bucket.put(f"{name}/zarr.json", (root / name / "zarr.json").read_bytes())
    bucket.put(f"{STREAMS_DIR}/zarr.json", json.dumps(_GROUP).encode())
    leases = []
    try:
        for k in range(n):
            streams.acquire(k, new=empty_doc(streams, k))
            leases.append(ObjectLease(streams, k))
        doc = {"attributes": {ATTR_KEY: to_attrs(schema, layout, None, objects=True)}, "zarr_format": 3,
               "consolidated_metadata": None, "node_type": "group"}
        try:
            bucket.put_new("zarr.json", json.dumps(doc, indent=2).encode())
        except FileExistsError as exc:
            raise StoreExistsError(f"another process created a replay store at {url} at the same time") from exc
    except BaseException:
        for lease in leases:
            lease.release()
        raise
    log.info("created replay store %s (capacity %d, %d streams, layout %s)", url, schema.capacity, n, layout)
    states = [streams.owned[k].state for k in range(n)]
    for k in range(n):
        streams.latest[k] = streams.owned[k]
    return cls(url, schema, layout, states, doc, writing=list(range(n)), cache_bytes=cache_bytes,  # type: ignore[arg-type]
               locks=leases, decode_threads=decode_threads, memory_budget=memory_budget, objects=streams)


def open_(cls: type[ReplayStore], url: str, mode: str, *, streams: Any, cache_bytes: int, memory_budget: int | None,
          decode_threads: int, storage_options: dict[str, Any] | None) -> ReplayStore:
    from replaystore.sampling.memory import check_config

    bucket = Bucket(url, storage_options)
    doc, schema, layout = read_root(bucket)
    metas = bucket.get_many([f"{name}/zarr.json" for name in ("obs", *SCALAR_FIELDS)])
    check_arrays(Path(url), schema, layout, read=dict(zip(("obs", *SCALAR_FIELDS), metas)).get)
    writing = writing_streams(schema, mode, streams, url)  # type: ignore[arg-type]
    check_config(schema, layout, url, writable=len(writing), cache_bytes=cache_bytes,  # type: ignore[arg-type]
                 memory_budget=memory_budget, decode_threads=decode_threads)
    objects = _streams(bucket, schema, layout, storage_options)
    leases: list[ObjectLease] = []
    try:
        for k in writing:
            leases.append(ObjectLease(objects, k))
            leases[-1].acquire()
            objects.latest[k] = objects.owned[k]
        states = [objects.owned[k].state if k in writing else objects.read_state(k) for k in range(schema.num_streams)]
        return cls(url, schema, layout, states, doc, writing=writing, cache_bytes=cache_bytes,  # type: ignore[arg-type]
                   locks=leases, decode_threads=decode_threads, memory_budget=memory_budget, objects=objects)
    except BaseException:
        for lease in leases:
            if lease.held:
                lease.release()
        raise


def _clear(bucket: Bucket, *, overwrite: bool, options: dict[str, Any] | None) -> None:
    """Make sure nothing is stored at ``bucket``'s URL, removing an old store with ``overwrite`` (under
    its streams' leases, so a live writer is never clobbered)."""
    if not bucket.exists():
        return
    if bucket.get("zarr.json") is None:
        raise StoreExistsError(f"{bucket} holds objects that are not a replay store; choose an empty or new prefix")
    if not overwrite:
        raise StoreExistsError(f"a replay store already exists at {bucket}; open it with "
                               f"ReplayStore.open({bucket.url!r}, mode='a') or pass overwrite=True to replace it")
    _, schema, layout = read_root(bucket)
    old = _streams(bucket, schema, layout, options)
    for k in range(schema.num_streams):
        old.acquire(k)  # refuses a live writer
    keys = [meta["path"] for meta in bucket.list(None)]
    keys.sort(key=lambda key: key == "zarr.json")  # the root goes last: until then it is still a store
    for i in range(0, len(keys), 1000):
        bucket.delete(keys[i : i + 1000])
    old.owned.clear()
    old.close()
