"""The commits of a store on object storage (format version 3, docs/format.md "Object storage"):
each stream's state object, the generation of every shard object it names, the writer's lease,
and the collection of superseded objects.

Object storage has no rename, so nothing is ever overwritten but the state objects:

- A shard object is written once, under a key that carries its generation
  (``obs/c/12/0/0.g3-17``: the writer's lease epoch 3, its 17th flush), with a create-only put.
- A stream's commit is its state object, ``streams/<k>/zarr.json``, replaced by a compare-and-swap
  on its ETag. It names the shard object of every (array, shard) the stream has written. A crash
  before the swap leaves objects that no commit names (orphans).
- The state object holds the writer's **lease** (holder, token, time to live). It expires ``ttl``
  seconds after the state object's ``last_modified`` (the server's clock stamps it); a writer renews
  it with each commit, and a keeper thread renews it while the writer is idle. Opening a stream for
  writing refuses a live lease, naming its holder, and takes over an expired one with the same
  compare-and-swap, in a new epoch. A writer whose swap is refused has lost its lease
  (``LeaseLostError``): it writes nothing more.
- **Collection.** A commit lists the objects it superseded (``retired``, with the time). At a later
  commit, objects retired more than ``gc_grace`` seconds ago (600 by default) are deleted; a reader
  whose view is older than that gets ``StaleViewError`` and refreshes. A new epoch deletes the
  orphans of earlier epochs (never named by a commit, so no reader can need them).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from typing import Any

from replaystore.errors import CorruptStoreError, LeaseLostError, StoreLockedError, StoreNotFoundError
from replaystore.format.schema import (
    STREAM_ATTR_KEY,
    STREAMS_DIR,
    Layout,
    Schema,
    State,
    array_names,
    item_ndim,
    stream_doc,
    stream_state_from_doc,
    stream_stride,
)
from replaystore.format.shards import shard_key
from replaystore.storage.objects.bucket import Bucket

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL = 60.0
DEFAULT_GC_GRACE = 600.0


@dataclasses.dataclass
class StreamDoc:
    """One stream's state object as read (or last written by this process)."""

    stream: int
    state: State
    objects: dict[str, list[str | None]]  # array -> the generation suffix of each of the stream's shards
    lease: dict[str, Any] | None
    epoch: int
    generation: int
    retired: list[list[Any]]  # [key, unix time it was superseded]
    e_tag: str | None = None
    last_modified: _dt.datetime | None = None

    def to_bytes(self) -> bytes:
        doc = stream_doc(self.stream, self.state)
        doc["attributes"][STREAM_ATTR_KEY].update(
            objects=self.objects, lease=self.lease, epoch=self.epoch, generation=self.generation, retired=self.retired)
        return json.dumps(doc).encode()

    def lease_expires(self) -> float | None:
        """Unix time the lease in this document expires (None: no lease)."""
        if not self.lease or self.last_modified is None:
            return None
        return self.last_modified.timestamp() + float(self.lease.get("ttl", DEFAULT_LEASE_TTL))


class ObjectStreams:
    """Every stream's commit of a store at a URL: reading them, the leases of the streams this
    process writes, their commits, and the keys of their shard objects."""

    def __init__(self, bucket: Bucket, schema: Schema, layout: Layout, *, lease_ttl: float = DEFAULT_LEASE_TTL,
                 gc_grace: float = DEFAULT_GC_GRACE) -> None:
        self.bucket = bucket
        self.schema = schema
        self.layout = layout
        self.lease_ttl = float(lease_ttl)
        self.gc_grace = float(gc_grace)
        self.arrays = array_names(schema)  # every array of the store, each with its shard objects named
        self.ndims = {name: item_ndim(schema, name) for name in self.arrays}
        self.per_stream = stream_stride(schema, layout) // layout.shard_len
        self.n_shards = -(-schema.stream_capacity // layout.shard_len)
        self.latest: dict[int, StreamDoc] = {}  # the last document read of each stream
        self.owned: dict[int, StreamDoc] = {}  # the streams whose lease this process holds: what it last wrote
        self.token = uuid.uuid4().hex
        self.holder = f"process {os.getpid()} on host {socket.gethostname()}"
        self.mutex = threading.RLock()  # the commits and the keeper's renewals (the store's lock, once it is made)
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()

    # ---------------------------------------------------------------------------------------------
    # Keys

    def state_key(self, k: int) -> str:
        return f"{STREAMS_DIR}/{k}/zarr.json"

    def key(self, name: str, k: int, j: int, suffix: str | None) -> str | None:
        """The key of stream ``k``'s shard ``j`` of array ``name`` at generation ``suffix``."""
        if suffix is None:
            return None
        return f"{shard_key(name, k * self.per_stream + j, self.ndims[name])}.{suffix}"

    def obs_keys(self, k: int, doc: StreamDoc | None = None) -> dict[int, str | None]:
        """Global frame shard -> key, for stream ``k`` in ``doc`` (default: the latest read)."""
        doc = doc or self.latest[k]
        return {k * self.per_stream + j: self.key("obs", k, j, s) for j, s in enumerate(doc.objects["obs"])}

    # ---------------------------------------------------------------------------------------------
    # Reading commits

    def read_doc(self, k: int) -> StreamDoc:
        got = self.bucket.get(self.state_key(k))
        where = self.bucket.where(self.state_key(k))
        if got is None:
            raise StoreNotFoundError(f"{where} is missing: stream {k}'s commit is gone; the store is damaged")
        raw, meta = got
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise CorruptStoreError(f"{where} is not valid JSON ({exc}); the store is damaged") from exc
        state = stream_state_from_doc(doc, stream=k, path=where)
        attrs = doc["attributes"][STREAM_ATTR_KEY]
        objects = attrs.get("objects")
        if (not isinstance(objects, dict) or set(objects) != set(self.arrays)
                or any(not isinstance(v, list) or len(v) != self.n_shards for v in objects.values())):
            raise CorruptStoreError(f"{where} does not name its shard objects (format version 3); the store is damaged")
        lease = attrs.get("lease")
        out = StreamDoc(k, state, objects, lease if isinstance(lease, dict) else None, int(attrs.get("epoch", 0)),
                        int(attrs.get("generation", 0)), list(attrs.get("retired") or []), meta.get("e_tag"),
                        meta.get("last_modified"))
        self.latest[k] = out
        return out

    def read_state(self, k: int) -> State:
        """Stream ``k``'s latest commit (kept, with its shard keys, in ``latest[k]``)."""
        return self.read_doc(k).state

    # ---------------------------------------------------------------------------------------------
    # Leases

    def acquire(self, k: int, *, new: StreamDoc | None = None) -> None:
        """Take stream ``k``'s lease (``new``: the document of a stream being created)."""
        with self.mutex:
            if new is not None:
                doc = new
            else:
                doc = self.read_doc(k)
                expires = doc.lease_expires()
                lease = doc.lease or {}
                if expires is not None and lease.get("token") != self.token and time.time() < expires:
                    when = _dt.datetime.fromtimestamp(expires, _dt.UTC).isoformat(timespec="seconds")
                    raise StoreLockedError(
                        f"stream {k} of {self.bucket} is open for writing by {lease.get('holder')} (its lease "
                        f"runs until {when} unless renewed); close that writer first, wait for its lease to expire "
                        "if it died, or open the store with mode='r' to read it")
            mine = dataclasses.replace(doc, lease={"holder": self.holder, "token": self.token, "ttl": self.lease_ttl},
                                       epoch=doc.epoch + 1, generation=0)
            try:
                mine.e_tag = self.bucket.swap(self.state_key(k), mine.to_bytes(), None if new is not None else doc.e_tag)
            except (FileExistsError, _precondition()) as exc:
                raise StoreLockedError(f"stream {k} of {self.bucket} was just opened for writing by another "
                                       "process; open it with mode='r' to read it") from exc
            mine.last_modified = _dt.datetime.now(_dt.UTC)
            self.owned[k] = mine
            self.latest[k] = mine

    def release(self, k: int) -> None:
        """Give stream ``k``'s lease back (the next writer need not wait for it to expire)."""
        with self.mutex:
            doc = self.owned.pop(k, None)
            if doc is None:
                return
            if not self.owned:
                self._stop.set()
            try:
                self.bucket.swap(self.state_key(k), dataclasses.replace(doc, lease=None).to_bytes(), doc.e_tag)
            except Exception as exc:  # noqa: BLE001 - it expires by itself: say so, do not fail a close
                log.warning("could not release the lease of stream %d of %s (%s); it expires in %.0f s", k,
                            self.bucket, exc, self.lease_ttl)

    def holds(self, k: int) -> bool:
        return k in self.owned

    # ---------------------------------------------------------------------------------------------
    # Commits

    def commit(self, k: int, state: State, objects: dict[str, list[str | None]], superseded: list[str]) -> None:
        """Replace stream ``k``'s state object (compare-and-swap): the commit. Then delete the objects
        superseded more than ``gc_grace`` ago."""
        with self.mutex:
            doc = self.owned.get(k)
            if doc is None:
                raise LeaseLostError(f"stream {k} of {self.bucket} is not open for writing by this process (its lease "
                                     "was lost); open the store again to go on")
            now = time.time()
            retired = [*doc.retired, *([key, now] for key in superseded)]
            expired = [key for key, t in retired if now - float(t) > self.gc_grace]
            kept = [[key, t] for key, t in retired if now - float(t) <= self.gc_grace]
            new = dataclasses.replace(doc, state=state, objects={n: list(v) for n, v in objects.items()}, retired=kept)
            self._swap(k, new, doc)
            if expired:
                try:
                    self.bucket.delete(expired)
                except OSError as exc:  # collected at a later commit
                    log.warning("could not delete %d superseded objects of %s (%s)", len(expired), self.bucket, exc)
                    new.retired = [[key, 0.0] for key in expired] + new.retired

    def renew(self, k: int) -> None:
        """Write stream ``k``'s state object again as it is: its lease runs ``ttl`` from now."""
        with self.mutex:
            doc = self.owned.get(k)
            if doc is not None:
                self._swap(k, dataclasses.replace(doc), doc)

    def next_generation(self, k: int) -> str:
        """The suffix of the next flush's objects of stream ``k``."""
        with self.mutex:
            doc = self.owned.get(k)
            if doc is None:
                raise LeaseLostError(f"stream {k} of {self.bucket} is not open for writing by this process (its "
                                     "lease was lost); open the store again to go on")
            doc.generation += 1
            return f"g{doc.epoch}-{doc.generation}"

    def _swap(self, k: int, new: StreamDoc, old: StreamDoc) -> None:
        precondition = _precondition()
        try:
            new.e_tag = self.bucket.swap(self.state_key(k), new.to_bytes(), old.e_tag)
        except precondition:
            # an earlier swap of ours may have gone through while its answer was lost: adopt it if so
            seen = self.read_doc(k)
            if not (seen.lease and seen.lease.get("token") == self.token and seen.epoch == old.epoch):
                self.owned.pop(k, None)
                raise LeaseLostError(
                    f"stream {k} of {self.bucket} was taken over by {(seen.lease or {}).get('holder', 'another writer')} "
                    f"after this writer's lease expired (nothing committed for {self.lease_ttl:.0f} s); its "
                    "uncommitted steps are lost: open the store again to go on") from None
            new.e_tag = self.bucket.swap(self.state_key(k), new.to_bytes(), seen.e_tag)
        new.last_modified = _dt.datetime.now(_dt.UTC)
        self.owned[k] = new

    def collect_orphans(self, k: int) -> int:
        """Delete stream ``k``'s objects of earlier epochs that no commit names (a dead writer's); the
        lease of ``k`` is held. Returns how many."""
        doc = self.owned[k]
        named = {self.key(n, k, j, s) for n, v in doc.objects.items() for j, s in enumerate(v) if s is not None}
        named.update(key for key, _ in doc.retired)
        first, last = k * self.per_stream, (k + 1) * self.per_stream
        orphans = []
        for name in self.arrays:
            for meta in self.bucket.list(f"{name}/c/"):
                path = meta["path"]
                rel = path.split("/c/", 1)[-1]
                head, _, suffix = rel.rpartition(".")
                try:
                    shard = int(head.split("/")[0])
                    epoch = int(suffix[1:].split("-")[0]) if suffix.startswith("g") else -1
                except ValueError:
                    continue
                if first <= shard < last and path not in named and 0 <= epoch < doc.epoch:
                    orphans.append(path)
        if orphans:
            log.info("deleting %d objects of stream %d of %s that no commit names (left by a writer that died)",
                     len(orphans), k, self.bucket)
            self.bucket.delete(orphans)
        return len(orphans)

    # ---------------------------------------------------------------------------------------------
    # The keeper: renews idle leases

    def keep(self) -> None:
        """Start the thread that renews this process's leases every ``ttl / 4`` seconds when no commit
        did (under ``mutex``, as a commit is)."""
        if self._keeper is not None or not self.owned:
            return
        ref = weakref.ref(self)
        stop, period = self._stop, self.lease_ttl / 4

        def loop() -> None:
            while not stop.wait(period):
                me = ref()
                if me is None:
                    return
                with me.mutex:
                    for k in list(me.owned):
                        doc = me.owned.get(k)
                        if doc is not None and doc.last_modified is not None and (
                                _dt.datetime.now(_dt.UTC) - doc.last_modified).total_seconds() > period:
                            try:
                                me.renew(k)
                            except Exception as exc:  # noqa: BLE001 - the next commit says what is wrong
                                log.warning("could not renew the lease of stream %d of %s: %s", k, me.bucket, exc)
                del me

        self._keeper = threading.Thread(target=loop, name="replaystore-lease", daemon=True)
        self._keeper.start()

    def close(self) -> None:
        self._stop.set()


def empty_doc(streams: ObjectStreams, k: int) -> StreamDoc:
    """A new stream's document: nothing written."""
    return StreamDoc(k, State(), {name: [None] * streams.n_shards for name in streams.arrays}, None, 0, 0, [])


def _precondition() -> type[BaseException]:
    from obstore.exceptions import PreconditionError

    return PreconditionError

