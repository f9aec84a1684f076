"""The frame array's shard objects as the read path sees them, for a store on object storage: the
counterpart of shardfiles.py, where a shard is an immutable object named by its generation.

Immutability makes the read path simple: a shard's index, once read, is right for as long as the
object exists, and a plan that located a chunk in the object of its view reads that same object
whatever the writer does next (until the object is collected, ``gc_grace`` after it was
superseded: then the read raises ``StaleViewError``, and ``refresh()`` gives a newer view).

``locate`` (under the store's lock) fetches the indexes of shards not seen yet, all at once, with
suffix-range GETs; ``read`` (no lock) fetches the chunks a batch misses with ranged GETs, every
object's ranges in flight at once.
"""

from __future__ import annotations

import asyncio
import errno
from typing import Any

from replaystore.errors import ChunkChecksumError, StaleViewError
from replaystore.format.shards import CRC_BYTES, EMPTY_OFFSET, INDEX_ENTRY, INDEX_ENTRY_BYTES, parse_index
from replaystore.storage.backend import FRAMES, FrameShards, Whole
from replaystore.storage.chunkread import ChunkRead
from replaystore.storage.objects.bucket import Bucket, run

NAME = FRAMES


class ObjectHandle:
    """A shard object with its parsed index."""

    __slots__ = ("key", "index", "size")

    def __init__(self, key: str, index: bytes, size: int) -> None:
        self.key = key
        self.index = index
        self.size = size  # bytes before the index


class ObjectShards(FrameShards):
    """Verified chunk bytes of the ``obs`` array's shard objects, as named by this store's view."""

    warm_on_first_miss = True

    def __init__(self, bucket: Bucket, *, ndim: int, capacity: int, shard_len: int, chunk_len: int) -> None:
        super().__init__(ndim=ndim, capacity=capacity, shard_len=shard_len, chunk_len=chunk_len)
        self.bucket = bucket
        self.keys: dict[int, str | None] = {}  # global shard -> the object of this view (None: never written)
        self._objects: dict[str, ObjectHandle] = {}  # key -> handle (indexes of objects in use)

    def set_key(self, shard: int, key: str | None) -> bool:
        """Point ``shard`` at object ``key`` (a commit read, or this process's writer wrote it);
        returns whether that changed it."""
        old = self.keys.get(shard, "")
        if old == key:
            return False
        self.keys[shard] = key
        if old:
            self._objects.pop(old, None)
        return True

    def locate(self, cids: list[int], generations: list[int]) -> list[ChunkRead | None]:
        per_shard, entry = self.chunks_per_shard, INDEX_ENTRY.unpack_from
        need = {key for s in {cid // per_shard for cid in cids}
                if (key := self.keys.get(s)) is not None and key not in self._objects}
        if need:
            self._fetch_indexes(sorted(need))
        out: list[ChunkRead | None] = []
        for cid in cids:
            shard, chunk = divmod(cid, per_shard)
            key = self.keys.get(shard)
            if key is None:
                out.append(None)
                continue
            handle = self._objects[key]
            off, nbytes = entry(handle.index, INDEX_ENTRY_BYTES * chunk)
            if off == EMPTY_OFFSET:
                out.append(None)
                continue
            if off + nbytes > handle.size or nbytes < CRC_BYTES:
                raise ChunkChecksumError(
                    f"chunk {chunk} of shard {shard} of '{NAME}' ({self.bucket.where(key)}) points outside its object; "
                    "the store is damaged: run `replaystore verify`", array=NAME, shard=shard, chunk=chunk)
            out.append(ChunkRead(cid, handle, off, nbytes, generations[shard]))
        return out

    def read(self, reads: list[ChunkRead]) -> None:
        reads = [r for r in reads if not r.done]
        try:
            by_key: dict[str, list[ChunkRead]] = {}
            for r in reads:
                by_key.setdefault(r.handle.key, []).append(r)
            requests = [(key, [r.offset for r in rs], [r.offset + r.nbytes for r in rs]) for key, rs in by_key.items()]
            try:
                results = self.bucket.get_ranges_many(requests)
            except FileNotFoundError as exc:
                raise StaleViewError(errno.ENOENT, f"{exc.filename or exc}: a shard object of this reader's view was "
                                     "replaced and collected by its writer (the view is older than the collection "
                                     "grace period); call store.refresh() or open the store again") from exc
            check = self.check
            for rs, blobs in zip(by_key.values(), results):
                for r, raw in zip(rs, blobs):
                    r.take(raw, check)
        finally:
            self.release(reads)

    def release(self, reads: list[ChunkRead]) -> None:
        for r in reads:
            r.done = True

    def wholes(self, shards: list[int]) -> list[Whole | None]:
        """``whole`` of each of ``shards``: one GET each, all in flight at once."""
        keys = {shard: key for shard in shards if (key := self.keys.get(shard)) is not None}
        got = dict(zip(keys, self.bucket.get_many(list(keys.values())))) if keys else {}
        out: list[Whole | None] = []
        for shard in shards:
            if shard not in keys:
                out.append(None)
                continue
            if got[shard] is None:
                raise StaleViewError(errno.ENOENT, f"{self.bucket.where(keys[shard])} (shard {shard} of '{NAME}') is "
                                     "gone: this reader's view is older than the collection grace period; call "
                                     "store.refresh()")
            raw = memoryview(got[shard] or b"")
            index = parse_index(raw[max(0, len(raw) - self.tail):], self.chunks_per_shard, name=NAME, shard=shard)
            out.append((raw[: max(0, len(raw) - self.tail)], index.tolist()))
        return out

    def stored_bytes(self) -> int:
        """The bytes of the frame shards this view names (one LIST of the array's objects)."""
        named = {key for key in list(self.keys.values()) if key is not None}  # (a refresh may add keys meanwhile)
        return sum(int(m["size"]) for m in self.bucket.list(f"{NAME}/") if m["path"] in named) if named else 0

    def file_bytes(self, shard: int) -> int:
        key = self.keys.get(shard)
        handle = self._objects.get(key) if key is not None else None
        return handle.size + self.tail if handle is not None else 0

    def keep(self) -> bool:
        return True  # objects are immutable: the view's keys are its snapshot

    def forget(self, shard: int) -> None:
        pass  # the key changes with set_key; an object's index never does

    def close(self) -> None:
        self._objects.clear()

    def _fetch_indexes(self, keys: list[str]) -> None:
        import obstore

        tail = self.tail

        async def one(key: str) -> tuple[bytes, int]:
            result = await obstore.get_async(self.bucket.store, key, options={"range": {"suffix": tail}})
            return bytes(await result.bytes_async()), int(result.meta["size"])

        async def gather() -> list[Any]:
            return await asyncio.gather(*(one(k) for k in keys), return_exceptions=True)

        shard_of = {key: s for s, key in self.keys.items() if key is not None}
        for key, result in zip(keys, run(gather())):
            shard = shard_of.get(key, -1)
            if isinstance(result, FileNotFoundError):
                raise StaleViewError(errno.ENOENT, f"{self.bucket.where(key)} (shard {shard} of '{NAME}') is gone: this "
                                     "reader's view is older than the collection grace period; call store.refresh()")
            if isinstance(result, BaseException):
                raise self.bucket.read_error(key, result) from result
            raw, size = result
            index = parse_index(raw, self.chunks_per_shard, name=NAME, shard=shard).astype("<u8").tobytes()
            self._objects[key] = ObjectHandle(key, index, size - tail)
