"""The compressed-chunk cache (storage/chunkcache.py) against the plain first-in-first-out cache it
implements: an ``OrderedDict`` of payloads, through random inserts, rewrites of shards and clears,
with the lookup a list slot per chunk and a dict."""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from replaystore.storage import chunkcache
from replaystore.storage.chunkcache import ChunkCache

SHARDS, PER_SHARD = 6, 8


class Reference:
    """First in, first out, as the cache's docstring states it."""

    def __init__(self, cache_bytes: int) -> None:
        self.cache_bytes, self.order = cache_bytes, OrderedDict[int, bytes]()

    def insert(self, cid: int, payload: bytes) -> None:
        if len(payload) > self.cache_bytes or cid in self.order:
            return
        self.order[cid] = payload
        while sum(map(len, self.order.values())) > self.cache_bytes:
            self.order.popitem(last=False)

    def invalidate(self, shard: int) -> None:
        for cid in range(shard * PER_SHARD, (shard + 1) * PER_SHARD):
            self.order.pop(cid, None)


@pytest.mark.parametrize("slots", [True, False])
def test_the_cache_is_first_in_first_out_through_rewrites(slots: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not slots:
        monkeypatch.setattr(chunkcache, "LIST_CHUNKS", 0)
    monkeypatch.setattr(chunkcache, "STALE_SLACK", 2)  # compacted often
    rng = np.random.default_rng(0)
    for cache_bytes in (0, 40, 300, 10_000):
        cache = ChunkCache(n_shards=SHARDS, chunks_per_shard=PER_SHARD, cache_bytes=cache_bytes)
        ref = Reference(cache_bytes)
        assert cache.slot_per_chunk == slots
        for _ in range(4000):
            op = rng.random()
            if op < 0.75:
                cid = int(rng.integers(SHARDS * PER_SHARD))
                payload = bytes([cid % 256]) * int(rng.integers(1, 60))
                with cache.lock:
                    cache.insert(cid, payload)
                ref.insert(cid, payload)
            elif op < 0.995:
                shard = int(rng.integers(SHARDS))
                cache.invalidate(shard)
                ref.invalidate(shard)
            else:
                cache.clear()
                ref.order.clear()
            ids = list(range(SHARDS * PER_SHARD))
            assert cache.lookup(ids) == [ref.order.get(cid) for cid in ids]
            assert cache.held == sum(map(len, ref.order.values()))
            assert cache.mean_bytes() == (max(1, cache.held // len(ref.order)) if ref.order else None)
            assert cache.missing_any(0, PER_SHARD) == any(cid not in ref.order for cid in range(PER_SHARD))
            # stale entries of forgotten chunks do not pile up
            assert cache.order_entries <= 2 * len(ref.order) + chunkcache.STALE_SLACK + PER_SHARD + 1


def test_the_order_ring_grows_and_wraps_like_a_deque() -> None:
    from collections import deque

    rng = np.random.default_rng(1)
    fifo, ref = chunkcache.Fifo(), deque[int]()
    for step in range(20_000):
        op = rng.random()
        if op < 0.3 or not ref:
            fifo.append(step)
            ref.append(step)
        elif op < 0.5:
            more = [step * 10 + j for j in range(int(rng.integers(0, 6)))]
            fifo.extend(more)
            ref.extend(more)
        elif op < 0.9:
            assert fifo.popleft() == ref.popleft()
        else:
            k = int(rng.integers(0, 8))
            assert fifo.oldest(k) == list(ref)[:k]
            fifo.drop(k)
            for _ in range(min(k, len(ref))):
                ref.popleft()
        if step % 997 == 0:
            assert list(fifo.ids()) == list(ref) and len(fifo) == len(ref)
    with pytest.raises(IndexError):
        chunkcache.Fifo().popleft()


def test_opening_warming_and_sampling_import_neither_zarr_nor_numcodecs(tmp_path: Path) -> None:
    """zarr (~19 MB of RSS) describes a new store's arrays and numcodecs (~5 MB) encodes where there
    is no libzstd: a process that only reads a zstd store through libzstd needs neither."""
    from conftest import fill, make_store

    from replaystore.storage.decoders import LIBZSTD

    if LIBZSTD is None:
        pytest.skip("no libzstd here: numcodecs decodes")
    with make_store(tmp_path / "r.zarr") as store:
        fill(store, 50)
    code = ("import sys, numpy as np\nfrom replaystore import ReplayStore\n"
            f"store = ReplayStore.open({str(tmp_path / 'r.zarr')!r})\nstore.warm_cache()\n"
            "store.sample(8, rng=np.random.default_rng(0)); store.sample_sequences(2, 3)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'zarr', 'numcodecs', 'fsspec'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
