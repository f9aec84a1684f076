"""A stream's per-step scalars read from its shards into its ring (all of them when a store opens,
the few a writer rewrote when a reader refreshes), and the check of what was read.

The shards are read a few at a time and decoded into one shard-sized buffer per field, so opening a
store holds its columns (columns.py) and not a second copy of them. ``ep_step`` goes into the
ring's index of episode starts (episteps.py), which takes steps in position order: the shards are
visited in the order of the positions they hold, from the oldest live step on (the one shard the
ring's wrap splits is decoded twice).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from replaystore.errors import ChunkChecksumError, CorruptStoreError
from replaystore.format.schema import Layout, scalar_fields
from replaystore.format.shards import decode_shard
from replaystore.storage.backend import Backend
from replaystore.storage.encoders import ChunkCodec
from replaystore.storage.episteps import Loading
from replaystore.storage.ring import Ring

#: Shards fetched from the backend at once (their compressed bytes are held together).
SHARDS_PER_READ = 16


def load_scalars(backend: Backend, k: int, ring: Ring, layout: Layout, *, shards: Iterable[int] | None = None,
                 steps: tuple[int, int] | None = None, check: bool = True, damaged_as_zero: bool = False) -> None:
    """Read stream ``k``'s scalar shards (default: all of them) as of its commit last read into
    ``ring.fields``; shards never written are all zero. ``steps``: the positions ``[first, end)``
    whose ``ep_step`` is read (default: the ring's live steps; every shard holding one of them must be
    among ``shards``). ``check``: the episode structure of those steps must hold (else
    ``CorruptStoreError``). ``damaged_as_zero``: a damaged shard reads as zeros instead of raising
    (``compact --drop-damaged``, after ``verify`` named its slots)."""
    codec = ChunkCodec(layout.codec)  # libzstd where there is one (numcodecs not imported)
    shard_len, cap = layout.shard_len, ring.capacity
    first, end = (ring.lo, ring.added) if steps is None else steps
    runs = position_runs(first, end, cap, shard_len)
    listed = list(range(-(-cap // shard_len))) if shards is None else list(shards)
    order = list(dict.fromkeys([j for j, _, _ in runs] + listed))  # the runs' shards first, in position order
    schema = backend.schema
    assert schema is not None
    specs = scalar_fields(schema.action, schema.extras)  # as stored: the columns may be narrower
    names = [name for name in ring.fields if name != "ep_step"]
    buffers = {name: np.zeros((shard_len, *specs[name][0]), dtype=specs[name][1]) for name in names}
    ep_buffer = np.zeros(shard_len, dtype=specs["ep_step"][1])
    loading = Loading(ring.ep_step, first, fresh=shards is None or first <= ring.lo)
    pending = iter(runs)
    run = next(pending, None)
    split: np.ndarray | None = None  # the first shard's ep_step, when its run is also the last
    for j, raws in _read(backend, k, order, ["ep_step", *names]):
        start = j * shard_len
        rows = min(shard_len, cap - start)
        for name, raw in zip(["ep_step", *names], raws, strict=True):
            buf = ep_buffer if name == "ep_step" else buffers[name]
            if raw is None:
                buf[:] = 0
            else:
                try:
                    decode_shard(raw, chunk_len=shard_len, n_chunks=1, codec=codec, out=buf, name=name,
                                 shard=backend.shard_of(k, j))
                except ChunkChecksumError:
                    if not damaged_as_zero:
                        raise
                    buf[:] = 0
            if name != "ep_step":
                _put(ring.fields[name], start, buf[:rows], where=f"{backend.where} stream {k} {name} shard {j}")
        while run is not None and run[0] == j:
            loading.feed(ep_buffer[run[1] : run[2]])
            run = next(pending, None)
        if j == order[0] and run is not None:
            split = ep_buffer.copy()
    if run is not None:  # the wrap's other half, in the shard read first
        assert split is not None and run[0] == order[0]
        loading.feed(split[run[1] : run[2]])
    if check and loading.broken:
        raise CorruptStoreError(
            f"{backend.where}: the ep_step array is inconsistent with the committed state (step "
            f"{loading.first_broken} of steps {first}..{end - 1}); the store is damaged: run `replaystore verify`"
        )


def position_runs(first: int, end: int, capacity: int, shard_len: int) -> list[tuple[int, int, int]]:
    """Positions ``[first, end)`` of a ring as ``(shard, lo, hi)`` runs of slots of one shard, in
    position order."""
    out = []
    p = first
    while p < end:
        s = p % capacity
        j = s // shard_len
        hi = min((j + 1) * shard_len, capacity, s + (end - p))
        out.append((j, s - j * shard_len, hi - j * shard_len))
        p += hi - s
    return out


def _read(backend: Backend, k: int, order: list[int], names: list[str]) -> Iterator[tuple[int, list[bytes | None]]]:
    """Each shard of ``order`` with its fields' bytes, fetched ``SHARDS_PER_READ`` shards at a time."""
    for i in range(0, len(order), SHARDS_PER_READ):
        group = order[i : i + SHARDS_PER_READ]
        raws = backend.read_shards([(name, k, j) for j in group for name in names])
        for n, j in enumerate(group):
            yield j, raws[n * len(names) : (n + 1) * len(names)]


def _put(values: Any, start: int, rows: np.ndarray, *, where: str) -> None:
    """``values[start:start + len(rows)] = rows``, refusing integers the narrower column cannot hold."""
    dtype = values.dtype
    if dtype.kind in "iu" and dtype.itemsize < rows.dtype.itemsize and rows.size:
        info = np.iinfo(dtype)
        if rows.min() < info.min or rows.max() > info.max:
            raise CorruptStoreError(f"{where} holds {rows.min()}..{rows.max()}, outside the action space; "
                                    "the store is damaged: run `replaystore verify`")
    values[start : start + len(rows)] = rows
