"""A stream's per-step scalars read from its shards into its ring (all of them when a store opens,
the few a writer rewrote when a reader refreshes), and the check of what was read."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from replaystore.errors import ChunkChecksumError, CorruptStoreError
from replaystore.format.schema import Layout
from replaystore.format.shards import decode_shard, numcodecs_codec
from replaystore.storage.backend import Backend
from replaystore.storage.ring import Ring


def load_scalars(backend: Backend, k: int, ring: Ring, layout: Layout, *, shards: Iterable[int] | None = None,
                 check: bool = True, damaged_as_zero: bool = False) -> None:
    """Read stream ``k``'s scalar shards (default: all of them) as of its commit last read into
    ``ring.fields``; shards never written are all zero. ``check``: the episode structure of the live
    steps must hold (else ``CorruptStoreError``). ``damaged_as_zero``: a damaged shard reads as zeros
    instead of raising (``compact --drop-damaged``, after ``verify`` named its slots)."""
    codec = numcodecs_codec(layout.codec)
    n_shards = -(-ring.capacity // layout.shard_len)
    shard_list = list(range(n_shards)) if shards is None else list(shards)
    wanted = [(name, k, j) for name in ring.fields for j in shard_list]
    raws = iter(backend.read_shards(wanted))
    out: dict[str, np.ndarray] = {}
    for name, _, j in wanted:
        values = ring.fields[name]
        buf = out.setdefault(name, np.zeros((layout.shard_len, *values.shape[1:]), dtype=values.dtype))
        start = j * layout.shard_len
        rows = min(layout.shard_len, ring.capacity - start)
        raw = next(raws)
        if raw is None:
            values[start : start + rows] = 0
            continue
        try:
            decode_shard(raw, chunk_len=layout.shard_len, n_chunks=1, codec=codec, out=buf, name=name,
                         shard=backend.shard_of(k, j))
        except ChunkChecksumError:
            if not damaged_as_zero:
                raise
            buf[:] = 0
        values[start : start + rows] = buf[:rows]
    if check:
        check_episodes(ring, backend.where)


def check_episodes(ring: Ring, where: str) -> None:
    """The live steps' ``ep_step`` must count up within episodes (0 starts one)."""
    lo, added = ring.lo, ring.added
    positions = np.arange(lo, added, dtype=np.int64)
    ep = ring.ep_step[positions % ring.capacity].astype(np.int64)
    if positions.size and (ep.min() < 0 or np.any(ep[1:] > ep[:-1] + 1)):
        raise CorruptStoreError(
            f"{where}: the ep_step array is inconsistent with the committed state (steps {lo}..{added - 1}); "
            "the store is damaged: run `replaystore verify`"
        )
