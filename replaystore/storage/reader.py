"""Chunk-aware frame reads: positions -> frames, each needed chunk fetched and decoded once.

A read has two phases, so that a store shared by a writer and background samplers stays consistent
while the expensive part runs without any lock:

``plan(positions)`` (called under the store's lock)
    maps the frames to their chunks, serves the newest frames from the shard a writer is filling
    (openshard.py: the rows of its open chunk copied, its other chunks' compressed bytes taken
    from it, never from disk), and collects each distinct on-disk chunk's compressed bytes from
    the compressed-chunk cache. A chunk not in the cache is only
    *located*: its byte range in the shard file open now, which stays open for the plan
    (shardfiles.py). No disk read happens under the lock.
``fetch(plans)`` (no lock)
    reads the located chunks (one ``pread`` each, checked against its crc32c, with the kernel told
    about all of a block's ranges first) and admits them to the cache, unless the writer rewrote
    their shard meanwhile. The bytes come from the file version the plan located, so a plan stays
    valid whatever the writer does next, and several samplers wait on the disk side by side.
``finish(plan)`` (no lock)
    fetches what is still missing, then decodes the chunks into a reused per-thread area (one libzstd call for the whole batch where it
    can, see decoders.py; split across a thread pool when ``decode_threads > 1``) and gathers the
    frames with one ``np.take``. There is no per-transition Python loop: the only loop is over distinct chunks.

Why compressed bytes and not decoded chunks: a decoded-chunk LRU barely helps uniform sampling
(each batch touches ~50 random chunks), while a whole 1M-frame Atari store is ~65 MB compressed, so
caching compressed chunks (bounded by ``cache_bytes``, first in first out) and decoding on demand
keeps every read in RAM. Frames of at most 1 KiB are the exception: there a batch's decoding is
per-chunk overhead and the whole ring is small decoded, so it is kept decoded (mirror.py) and
``plan`` copies their frames from it (a writer's chunk leaves it when the writer starts writing
that chunk: ``opening``).

Where the bytes come from is the backend's ``FrameShards`` (storage/backend.py): open shard files
and their indexes on a file system (local/files.py), ranged GETs on object storage
(objects/shards.py; there, the first miss reads the whole view into the cache when it fits, warm.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate

import numpy as np

from replaystore.format.schema import Layout, Schema
from replaystore.storage.areas import ThreadAreas
from replaystore.storage.backend import FrameShards
from replaystore.storage.chunkcache import ChunkCache
from replaystore.storage.chunkread import ChunkRead
from replaystore.storage.decoders import ChunkDecoder, declared_size
from replaystore.storage.mirror import FrameMirror, mirror_bytes
from replaystore.storage.openshard import NOT_LIVE, OpenShard, copy_open_chunks, live_codes, writers_payloads
from replaystore.storage.plan import Plan, distinct, fill_zero, output_parts, scatter, take_into
from replaystore.storage.warm import warm

#: Below this many chunks a batch is decoded on the calling thread alone (pool overhead ~20 us).
MIN_CHUNKS_PER_TASK = 8
#: ``(shard, frames)`` of each shard a writer is filling (a store may write several streams):
#: its global shard number and its frames (openshard.py).
LiveRegions = Callable[[], "list[tuple[int, OpenShard]]"]


class FrameReader:
    """Reads frames by position from the ``obs`` array's shards, with a compressed-chunk cache."""

    def __init__(self, files: FrameShards, schema: Schema, layout: Layout, *, cache_bytes: int,
                 live_regions: LiveRegions | None = None, decode_threads: int = 1,
                 slots_of: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        """``files``: where the chunks' bytes come from (the backend's). ``slots_of`` maps the
        positions given to ``plan`` to slots of the arrays (the store passes ``Rings.slots``; by
        default positions are slots)."""
        self.files = files
        self.capacity = files.capacity
        self.slots_of = slots_of if slots_of is not None else _identity
        self.shape = schema.observation.shape
        self.dtype = np.dtype(schema.observation.dtype)
        self.chunk_len = layout.obs_chunk_len
        self.shard_len = layout.shard_len
        self.chunks_per_shard = layout.shard_len // layout.obs_chunk_len
        self.decoder = ChunkDecoder(layout.codec)
        self.zero_padding = schema.frame_padding == "zero"  # positions < 0 are frames of zeros
        self.cache_bytes = cache_bytes
        self.live_regions = live_regions
        self.decode_threads = max(1, int(decode_threads))
        #: held until the first miss has read the view whole, where that pays (``_warm_on_first_miss``)
        self.first_miss: threading.Lock | None = threading.Lock() if files.warm_on_first_miss else None
        self.frame_nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.chunk_nbytes = self.chunk_len * self.frame_nbytes
        # small frames: the ring kept decoded (mirror.py), its bytes taken from the compressed cache's
        mirrored = mirror_bytes(capacity=self.capacity, frame_nbytes=self.frame_nbytes, chunk_len=self.chunk_len,
                                cache_bytes=cache_bytes)
        self.cache = ChunkCache(n_shards=-(-self.capacity // self.shard_len), chunks_per_shard=self.chunks_per_shard,
                                cache_bytes=cache_bytes - mirrored)
        self.mirror = FrameMirror(self.cache, capacity=self.capacity, chunk_len=self.chunk_len, shape=self.shape,
                                  dtype=self.dtype) if mirrored else None
        self.odd: set[int] = set()  # chunk ids seen whose payload cannot be decoded joined (see ChunkDecoder)
        self.joinable = self.decoder.joinable
        self.areas = ThreadAreas(self.shape, self.dtype, self.chunk_len)  # each thread's reused memory
        self._pool: ThreadPoolExecutor | None = None
        self.hits = 0
        self.misses = 0

    # ---------------------------------------------------------------------------------------------
    # Public

    @property
    def bytes_held(self) -> int:
        """Compressed bytes in the chunk cache."""
        return self.cache.held

    @property
    def hit_rate(self) -> float:
        """Fraction of chunk lookups served from the cache (RAM-buffer frames are not counted)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def mean_chunk_bytes(self) -> int:
        """The mean compressed size of a frame chunk: from the cache, else from a few shard files'
        sizes, else (nothing written yet) a chunk's raw size."""
        cached = self.cache.mean_bytes()
        if cached is not None:
            return cached
        sizes = [size for shard in range(min(8, len(self.cache.generation))) if (size := self.files.file_bytes(shard))]
        if sizes:
            return max(1, sum(sizes) // (len(sizes) * self.chunks_per_shard))
        return self.chunk_nbytes

    def gather(self, positions: np.ndarray) -> np.ndarray:
        """Frames at ``positions`` (any shape of int64 positions) as ``(*positions.shape, *obs_shape)``.

        Not safe against a concurrent writer on its own: the store calls ``plan`` under its lock.
        """
        frames = self.finish(self.plan(positions))
        assert isinstance(frames, np.ndarray)
        return frames

    def plan(self, positions: np.ndarray, out: np.ndarray | list[np.ndarray] | None = None) -> Plan:
        """Phase 1 (under the store's lock): RAM-buffer frames copied, chunk bytes collected.

        ``out``: where ``finish`` puts the frames (default: one of this thread's recycled output
        blocks). Either one C-contiguous ``(*positions.shape, *obs_shape)`` array, or a list of
        C-contiguous ``(*positions.shape[1:], *obs_shape)`` arrays, one per row of ``positions``: they
        need not be one block of memory (the prefetcher keeps ``obs`` and ``next_obs`` apart)."""
        return self.plan_many(np.asarray(positions, dtype=np.int64)[None], [out])[0]

    def plan_many(self, positions: np.ndarray, outs: list[np.ndarray | list[np.ndarray] | None]) -> list[Plan]:
        """``plan`` for each of ``positions[i]`` with ``outs[i]``, in one set of vectorised steps: the
        chunks of all the batches found with one ``np.unique`` and looked up in one pass (the
        prefetcher plans its blocks this way: less GIL-holding work a batch than separate plans)."""
        positions = np.asarray(positions, dtype=np.int64)
        k, shape = positions.shape[0], positions.shape[1:]
        zeros = positions.reshape(k, -1) < 0 if self.zero_padding else None  # a zero-padded stack's padding
        if zeros is not None and zeros.any():
            positions = np.maximum(positions, 0)  # any valid slot: these rows are filled with zeros below
        else:
            zeros = None
        slots = self.slots_of(positions.reshape(k, -1))
        m = slots.shape[1]
        parts = [[self.areas.output(m)] if out is None else output_parts(out, shape, self.shape, self.dtype)
                 for out in outs]
        bounds = [list(accumulate((part.shape[0] for part in p), initial=0)) for p in parts]
        rows = [np.arange(m)] * k
        # the shards the writers are filling (openshard.py), where they hold rows: those of an open
        # chunk are copied here, the others' chunks come from the writer instead of the cache
        live = dict(self.live_regions()) if self.live_regions is not None else {}
        if live:
            code = live_codes(live, len(self.cache.generation), self.chunks_per_shard)
            slot_code = code[slots // self.shard_len]
            in_live = slot_code != NOT_LIVE
            if not in_live.any():
                live = {}
        mirror = self.mirror
        if mirror is not None:  # every row from the decoded frames first; the rows they lack are decoded below
            # which chunks are there, before copying: another thread's ``finish`` may add a chunk
            # meanwhile (no store lock), and a row copied before its chunk arrived must be decoded
            have = mirror.have(slots)  # (a writer's open chunk is never valid there: ``opening``)
            for i in range(k):
                mirror.gather(slots[i], parts[i], bounds[i])
        if live:
            taken = slots // self.chunk_len == slot_code
            if taken.any():
                copy_open_chunks(live, slots, taken, parts, bounds, self.shard_len, self.chunk_len)
                rows = [np.flatnonzero(~taken[i]) for i in range(k)]
        if zeros is not None:  # after the RAM-buffer frames, which may have been copied over them
            for i in np.flatnonzero(zeros.any(axis=1)).tolist():
                fill_zero(parts[i], bounds[i], np.flatnonzero(zeros[i]))
            kept_rows = [r[~zeros[i, r]] for i, r in enumerate(rows)]
            padded = [r.size - kr.size for r, kr in zip(rows, kept_rows)]
            rows = kept_rows
        else:
            padded = [0] * k
        if mirror is not None:
            if have.any():
                self.hits += distinct(slots[have] // self.chunk_len)  # the chunk lookups it answered
                rows = [r[~have[i, r]] for i, r in enumerate(rows)]
        counts = [r.size for r in rows]
        kept = slots.ravel() if sum(counts) == k * m else np.concatenate([slots[i, r] for i, r in enumerate(rows)])
        chunk_of = kept // self.chunk_len
        if not kept.size:  # every frame came from RAM (the writer's open chunk, the decoded frames) or is padding
            id_array, starts, which = kept, [0] * (k + 1), kept
        elif k == 1:  # the plain sampler's one batch: no keys to combine
            id_array, which = np.unique(chunk_of, return_inverse=True)
            starts = [0, id_array.size]
        else:  # one np.unique for all the batches: chunk c of batch i is the key i * stride + c
            stride = self.capacity // self.chunk_len + 1
            batch_of = np.repeat(np.arange(k, dtype=np.int64), counts)
            keys, inverse = np.unique(batch_of * stride + chunk_of, return_inverse=True)
            id_array = keys % stride
            starts = np.searchsorted(keys // stride, np.arange(k + 1)).tolist()
            which = inverse.reshape(-1) - np.asarray(starts[:-1], dtype=np.int64)[batch_of]
        ids = id_array.tolist()
        offset = kept % self.chunk_len
        # the hot path, one C-level pass: ~48 random chunks of a 125,000-chunk cache took ~12-22 us
        # through a dict (its index, its entry, the payload: a cache miss each) and ~3-8 through a
        # list, with the GIL held (chunkcache.py keeps a list up to LIST_CHUNKS chunks)
        found = self.cache.lookup(ids)
        # ``None in found``: a C-level scan first (~1,600 chunks for a prefetcher block, all cached
        # in the benchmark), the Python pass only when something is missing
        from_writers = writers_payloads(live, code, id_array, found, self.chunks_per_shard,
                                        self.odd if self.joinable else None) if live and ids else 0
        misses = [i for i, payload in enumerate(found) if payload is None] if None in found else []
        self.hits += len(ids) - len(misses) - from_writers
        located: dict[int, ChunkRead | None] = {}  # a chunk two batches miss is read once
        if misses:
            self.misses += len(misses)
            wanted = list(dict.fromkeys(ids[i] for i in misses))
            located = dict(zip(wanted, self.files.locate(wanted, self.cache.generation)))
        joinable = self.joinable and not misses and None not in found and (
            not self.odd or self.odd.isdisjoint(ids))
        cuts = list(accumulate(counts, initial=0))
        id_generation = None
        if mirror is not None and ids:
            id_generation = np.asarray(self.cache.generation, dtype=np.int64)[id_array // self.chunks_per_shard]
        plans = []
        for i in range(k):
            a, b = starts[i], starts[i + 1]
            mine_ids, mine = ids[a:b], found[a:b]
            reads = [(j, r) for j, cid in enumerate(mine_ids)
                     if mine[j] is None and (r := located.get(cid)) is not None] if located else []
            as_one = not reads and (joinable or (self.joinable and None not in mine and self.odd.isdisjoint(mine_ids)))
            plans.append(Plan(parts[i], bounds[i], rows[i], which[cuts[i]:cuts[i + 1]], offset[cuts[i]:cuts[i + 1]],
                              mine_ids, mine, shape, as_one, single=not isinstance(outs[i], list), reads=reads,
                              padded=padded[i], generations=None if id_generation is None or not mine_ids else
                              id_generation[a:b]))
        return plans

    def fetch(self, plans: list[Plan]) -> None:
        """Read the chunks ``plans`` located but did not find in the cache (no lock needed), put them
        in the plans and the cache. Raises ``ChunkChecksumError`` naming a damaged chunk."""
        todo = {id(r): r for plan in plans for _, r in plan.reads}
        if not todo:
            return
        reads = list(todo.values())
        if self.first_miss is not None:
            self._warm_on_first_miss()
        get, generation, per_shard = self.cache.get, self.cache.generation, self.chunks_per_shard
        cached = []
        for r in reads:  # cached since it was planned (the payload read before the generation: one of a newer
            payload = get(r.cid)  # file never passes)
            if payload is not None and generation[r.cid // per_shard] == r.generation:
                r.payload = payload
                cached.append(r)
        if cached:
            self.files.release(cached)
        self.files.read(reads)
        if self.joinable:
            size, odd = self.chunk_nbytes, self.odd
            for r in reads:
                if declared_size(r.payload) != size:
                    odd.add(r.cid)
        self.cache.admit(reads)
        for plan in plans:
            for j, r in plan.reads:
                plan.payloads[j] = r.payload
            plan.reads = []
            plan.as_one = self.joinable and None not in plan.payloads and self.odd.isdisjoint(plan.ids)

    def finish(self, plan: Plan) -> np.ndarray | list[np.ndarray]:
        """Phase 2 (no lock needed): decode the planned chunks and gather the frames. Returns the
        frames shaped ``(*positions.shape, *obs_shape)``, or the list of ``out`` arrays given to ``plan``."""
        if plan.reads:
            self.fetch([plan])
        n = len(plan.payloads)
        if n:
            area = self.areas.decode_area(n + 1)  # one chunk more: its first frame gathers as zero padding
            tasks = min(self.decode_threads, n // MIN_CHUNKS_PER_TASK) if self.decode_threads > 1 else 1
            if tasks > 1:
                bounds = np.linspace(0, n, tasks + 1).astype(int).tolist()  # Python ints: ctypes takes no numpy ints
                pool = self._get_pool()
                futures = [pool.submit(self._decode_range, plan, area, bounds[i], bounds[i + 1])
                           for i in range(1, tasks)]
                self._decode_range(plan, area, 0, bounds[1])
                for f in futures:
                    f.result()
            else:
                self._decode_range(plan, area, 0, n)
            if self.mirror is not None and plan.generations is not None:
                self.mirror.admit(plan.ids, plan.generations, area[:n])
            # np.take into existing memory: a fancy-index temporary (a second fresh 1-2 MB block per
            # batch) tripled the cost of this line through page faults. And mode="clip": with the
            # default mode="raise" numpy gathers into a fresh copy of ``out`` and copies it back
            # (so that a bad index leaves ``out`` untouched), measured 108 us against 35 us for a
            # batch's 256 Atari frames. ``source`` is in range by construction.
            flat_area = area.reshape(-1, *self.shape)
            source = plan.which * self.chunk_len + plan.offset
            if plan.padded and plan.rows.size + plan.padded == plan.bounds[-1]:
                # only zero padding is left out: gather it from a frame of zeros, so every part is still
                # one np.take (the scatter below cost a zero-padded batch ~4x its gather)
                flat_area[n * self.chunk_len] = 0
                every = np.full(plan.bounds[-1], n * self.chunk_len, dtype=np.int64)
                every[plan.rows] = source
                source = every
            if source.size == plan.bounds[-1]:
                take_into(plan.parts, plan.bounds, flat_area, source)
            else:
                scratch = self.areas.scratch(plan.rows.size)
                np.take(flat_area, source, axis=0, out=scratch, mode="clip")
                scatter(plan.parts, plan.bounds, plan.rows, scratch)
        return plan.parts[0].reshape(*plan.shape, *self.shape) if plan.single else [
            part.reshape(*plan.shape[1:], *self.shape) for part in plan.parts]

    def warm(self, shards: range) -> int:
        """Load the compressed chunks of ``shards`` into the cache (one read per shard, every chunk
        checked; warm.py), stopping when the cache is full; returns the bytes added."""
        return warm(self.cache, self.files, shards, chunk_nbytes=self.chunk_nbytes,
                    odd=self.odd if self.joinable else None)

    def _warm_on_first_miss(self) -> None:
        """On object storage, the first read of a chunk the cache misses reads the whole view into
        the cache first, if it fits (``warm``: one GET per shard object, ``GROUP`` in flight): a
        request's latency is most of its cost there, so filling the cache miss by miss would take
        many times as long as reading the store once. Other threads' reads wait for it."""
        lock = self.first_miss
        if lock is None:
            return
        with lock:
            if self.first_miss is None:
                return
            try:
                room = self.cache.cache_bytes - self.cache.held
                if room > 0 and self.files.stored_bytes() <= room:
                    self.warm(range(len(self.cache.generation)))
            finally:
                self.first_miss = None

    def keep(self) -> bool:
        """Keep the frame shards of this view readable from now on (``FrameShards.keep``)."""
        return self.files.keep()

    def opening(self, shard: int, chunk: int) -> None:
        """The writer filling ``shard`` starts writing its ``chunk`` (under the store's lock): with
        decoded frames kept (mirror.py), the chunk leaves them, and the shard's generation moves on
        so that no plan made before now puts its old frames back."""
        if self.mirror is not None:
            with self.cache.lock:
                self.cache.generation[shard] += 1
                self.mirror.valid[shard * self.chunks_per_shard + chunk] = False

    def invalidate(self, shard: int) -> None:
        """Forget everything cached about ``shard`` (the writer just rewrote it)."""
        self.files.forget(shard)
        first = shard * self.chunks_per_shard
        self.cache.invalidate(shard)  # chunks of the old file being read now stay out of the cache
        if self.mirror is not None:
            self.mirror.invalidate(shard)
        if self.odd:
            self.odd.difference_update(range(first, first + self.chunks_per_shard))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.files.close()
        self.cache.clear()
        if self.mirror is not None:
            self.mirror.clear()

    # ---------------------------------------------------------------------------------------------
    # Internals

    def _get_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.decode_threads - 1, thread_name_prefix="replaystore-decode")
        return self._pool

    def _decode_range(self, plan: Plan, area: np.ndarray, start: int, stop: int) -> None:
        self.decoder.decode_many(plan.ids, plan.payloads, area, start, stop, name="obs",
                                 chunks_per_shard=self.chunks_per_shard, as_one=plan.as_one)


def _identity(positions: np.ndarray) -> np.ndarray:
    return positions
