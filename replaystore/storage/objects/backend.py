"""A store at a URL (``s3://bucket/prefix``) on S3-compatible object storage: format version 3, whose
objects and commits commits.py describes (docs/objects.md).

Object storage has no rename, so a shard is never overwritten: each flush writes the shards it
changed as new objects under a new generation, with create-only puts, and the stream's commit (a
compare-and-swap of its state object) names them and retires the ones they replace. A writer's
claim is a lease in that state object. Creating a store writes the arrays' metadata (made by zarr,
as for a local store), each stream's first state object (holding this process's lease) and last
the root ``zarr.json`` with a create-only put, so two processes creating one store cannot both
succeed, and a half-made store is not a store.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from replaystore.errors import ConfigError, CorruptStoreError, FormatVersionError, StoreExistsError, StoreNotFoundError
from replaystore.format.schema import (
    ATTR_KEY,
    OBJECT_FORMAT_VERSION,
    STREAMS_DIR,
    Layout,
    Schema,
    State,
    array_names,
    from_attrs,
    group_doc,
    slot_count,
    to_attrs,
)
from replaystore.format.shards import store_arrays
from replaystore.format.validate import check_arrays, parse_group_doc
from replaystore.storage.backend import FRAMES, Backend
from replaystore.storage.objects.bucket import Bucket
from replaystore.storage.objects.commits import (
    DEFAULT_GC_GRACE,
    DEFAULT_LEASE_TTL,
    ObjectStreams,
    StreamDoc,
    empty_doc,
)
from replaystore.storage.objects.shards import ObjectShards

log = logging.getLogger(__name__)


class ObjectBackend(Backend):
    """The objects of the store at ``url``. ``storage_options``: obstore's S3 configuration keys
    (``endpoint``, ``access_key_id``, ...), and ``lease_ttl`` and ``gc_grace`` in seconds."""

    views_are_snapshots = True

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.bucket = Bucket(url, storage_options)
        self.where = self.bucket.url
        options = storage_options or {}
        self.lease_ttl = float(options.get("lease_ttl", DEFAULT_LEASE_TTL))
        self.gc_grace = float(options.get("gc_grace", DEFAULT_GC_GRACE))
        self._streams: ObjectStreams | None = None
        self._frames: ObjectShards | None = None
        self._names: dict[int, dict[str, list[str | None]]] = {}  # a written stream's shard objects, as written
        self._superseded: dict[int, list[str]] = {}  # objects those replaced since the stream's last commit
        self._suffix: dict[int, str | None] = {}  # the generation of the flush under way

    # ---------------------------------------------------------------------------------------------
    # The store

    def exists(self) -> bool:
        return self.bucket.exists()

    def create(self, schema: Schema, layout: Layout, *, overwrite: bool) -> None:
        self._clear(overwrite=overwrite)
        self.schema, self.layout, self.format_version = schema, layout, OBJECT_FORMAT_VERSION
        streams = self._make_streams()
        for name, raw in store_arrays(schema, layout).items():
            self.bucket.put(f"{name}/zarr.json", raw)
        self.bucket.put(f"{STREAMS_DIR}/zarr.json", json.dumps(group_doc({})).encode())
        try:
            for k in range(schema.num_streams):
                streams.acquire(k, new=empty_doc(streams, k))
                self._start_writing(k)
            doc = group_doc({ATTR_KEY: to_attrs(schema, layout, OBJECT_FORMAT_VERSION)})
            try:
                self.bucket.put_new("zarr.json", json.dumps(doc, indent=2).encode())
            except FileExistsError as exc:
                raise StoreExistsError(f"another process created a replay store at {self.where} at the same "
                                       "time") from exc
        except BaseException:
            self.close()
            raise

    def read_metadata(self, *, check_arrays: bool = True) -> tuple[Schema, Layout]:
        got = self.bucket.get("zarr.json")
        if got is None:
            raise StoreNotFoundError(f"{self.where} holds no replay store (no zarr.json); check the URL or create one "
                                     f"with ReplayStore.create({self.where!r}, ...)")
        doc = parse_group_doc(got[0], self.where)
        schema, layout, version = from_attrs(doc.get("attributes"), path=self.where)
        if version != OBJECT_FORMAT_VERSION:
            raise FormatVersionError(f"{self.where} holds a store of format version {version}, written for a local "
                                     "disk (its shards were copied as files); open it from a local path, or copy it "
                                     f"to object storage with `replaystore compact SRC {self.where}-copy`")
        self.schema, self.layout, self.format_version = schema, layout, version
        self._make_streams()
        if check_arrays:
            self.check_arrays()
        return schema, layout

    def check_arrays(self) -> None:
        schema, layout = self._known()
        names = array_names(schema)
        metas = dict(zip(names, self.bucket.get_many([f"{name}/zarr.json" for name in names])))
        check_arrays(self.where, schema, layout, metas.get)

    def stored_bytes(self) -> dict[str, int]:
        """Bytes of the objects the commits read name (superseded generations not yet collected are
        not counted)."""
        streams = self.streams
        named: set[str] = set()
        for k in streams.latest:
            doc = streams.latest[k]
            objects = self._names.get(k, doc.objects)
            named.update(key for name, gens in objects.items() for j, g in enumerate(gens)
                         if (key := streams.key(name, k, j, g)) is not None)
        sizes: dict[str, int] = {}
        for meta in self.bucket.list(None):
            name = meta["path"].split("/", 1)[0]
            if meta["path"] in named or meta["path"].endswith("zarr.json"):
                sizes[name] = sizes.get(name, 0) + int(meta["size"])
        return sizes

    def destroy(self) -> None:
        self.close()
        self._clear(overwrite=True)

    def staging(self) -> ObjectBackend:
        """This URL itself, where nothing is stored yet: object storage has no atomic rename, so a
        store there is never replaced in place."""
        if self.exists():
            raise ConfigError(f"{self.where} holds a store, and compact cannot replace a store on object storage in "
                              "place (object storage has no atomic rename); compact it to a new URL or prefix: "
                              f"replaystore compact {self.where} s3://BUCKET/NEW/replay.zarr")
        return self

    def publish(self, staged: Backend, *, replace: bool) -> None:
        assert staged is self  # built here, its root zarr.json created only where none was (put_new): nothing to move

    def close(self) -> None:
        if self._frames is not None:
            self._frames.close()
        if self._streams is not None:
            for k in list(self._streams.owned):
                self.release(k)
            self._streams.close()

    def _clear(self, *, overwrite: bool) -> None:
        """Make sure nothing is stored at this URL, removing an old store with ``overwrite`` (under
        its streams' leases, so a live writer is never clobbered)."""
        if not self.bucket.exists():
            return
        if self.bucket.get("zarr.json") is None:
            raise StoreExistsError(f"{self.where} holds objects that are not a replay store; choose an empty or new "
                                   "prefix")
        if not overwrite:
            raise StoreExistsError(f"a replay store already exists at {self.where}; open it with ReplayStore.open("
                                   f"{self.where!r}, mode='a') or pass overwrite=True to replace it")
        old = ObjectBackend(self.where, self._options())
        old.read_metadata()
        try:
            for k in range(old._known()[0].num_streams):
                old.streams.acquire(k)  # refuses a live writer
            keys = [meta["path"] for meta in self.bucket.list(None)]
            keys.sort(key=lambda key: key == "zarr.json")  # the root goes last: until then it is still a store
            for i in range(0, len(keys), 1000):
                self.bucket.delete(keys[i : i + 1000])
        finally:
            old.streams.owned.clear()  # the objects of those leases are gone
            old.streams.close()

    def _options(self) -> dict[str, Any]:
        return {"lease_ttl": self.lease_ttl, "gc_grace": self.gc_grace}

    # ---------------------------------------------------------------------------------------------
    # Commits

    def read_state(self, k: int) -> State:
        streams = self.streams
        if k in streams.owned:
            return streams.owned[k].state
        return streams.read_doc(k).state

    def read_shards(self, wanted: list[tuple[str, int, int]]) -> list[bytes | None]:
        streams = self.streams
        keys = [streams.key(name, k, j, self._objects_of(k)[name][j]) for name, k, j in wanted]
        fetched = iter(self.bucket.get_many([key for key in keys if key is not None]))
        out: list[bytes | None] = []
        for (_, k, _), key in zip(wanted, keys):
            raw = next(fetched) if key is not None else None
            if key is not None and raw is None:
                raise CorruptStoreError(f"{self.bucket.where(key)}, named by stream {k}'s commit, is missing; the store "
                                        "is damaged (or this view was collected: refresh)")
            out.append(raw)
        return out

    def follow(self, k: int) -> list[int]:
        streams, frames = self.streams, self.frames
        gens = self._objects_of(k)[FRAMES]
        return [shard for j, g in enumerate(gens)
                if frames.set_key(shard := self.shard_of(k, j), streams.key(FRAMES, k, j, g))]

    def _objects_of(self, k: int) -> dict[str, list[str | None]]:
        """Stream ``k``'s shard objects: as this process wrote them, or as its commit last read names them."""
        names = self._names.get(k)
        if names is not None:
            return names
        doc = self.streams.latest.get(k)
        if doc is None:
            doc = self.streams.read_doc(k)
        return doc.objects

    # ---------------------------------------------------------------------------------------------
    # Writing

    def claim(self, k: int) -> State:
        self.streams.acquire(k)
        self._start_writing(k)
        return self.streams.owned[k].state

    def _start_writing(self, k: int) -> None:
        doc: StreamDoc = self.streams.owned[k]
        self._names[k] = {name: list(doc.objects[name]) for name in self.streams.arrays}
        self._superseded[k] = []
        self._suffix[k] = None

    def release(self, k: int) -> None:
        self._names.pop(k, None)
        self.streams.release(k)

    def keep_claims(self) -> None:
        self.streams.keep()

    def collect(self, k: int) -> int:
        return self.streams.collect_orphans(k)

    def write_shard(self, name: str, k: int, j: int, data: bytes) -> None:
        streams = self.streams
        try:
            suffix = self._suffix.get(k) or streams.next_generation(k)
            self._suffix[k] = suffix
            key = streams.key(name, k, j, suffix)
            assert key is not None
            self.bucket.put_new(key, data)
        except BaseException:
            self._suffix[k] = None  # a retry writes under a new generation (this one's key may exist)
            raise
        names = self._names[k]
        old = streams.key(name, k, j, names[name][j])
        if old is not None and old != key:
            self._superseded[k].append(old)
        names[name][j] = suffix
        if name == FRAMES:
            self.frames.set_key(self.shard_of(k, j), key)

    def commit(self, k: int, state: State) -> None:
        self._suffix[k] = None  # the next flush writes a new generation
        self.streams.commit(k, state, self._names[k], self._superseded[k])
        self._superseded[k] = []

    # ---------------------------------------------------------------------------------------------

    @property
    def frames(self) -> ObjectShards:
        if self._frames is None:
            schema, layout = self._known()
            self._frames = ObjectShards(self.bucket, ndim=len(schema.observation.shape),
                                        capacity=slot_count(schema, layout), shard_len=layout.shard_len,
                                        chunk_len=layout.obs_chunk_len)
        return self._frames

    def _make_streams(self) -> ObjectStreams:
        schema, layout = self._known()
        self._streams = ObjectStreams(self.bucket, schema, layout, lease_ttl=self.lease_ttl, gc_grace=self.gc_grace)
        return self._streams

    @property
    def streams(self) -> ObjectStreams:
        """Every stream's commit and lease (commits.py)."""
        if self._streams is None:
            raise RuntimeError(f"{self.where}: read_metadata() or create() comes first")
        return self._streams

