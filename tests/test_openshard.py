"""The shard a writer goes on filling, held compressed (storage/openshard.py): damage in it found when
the writer reaches it, with nothing changed. (Reads from it are checked against the ground truth in
test_sampling.py; the bytes it writes, in test_decoders.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import OBS_SHAPE, add_one, assert_same_ram, fill, make_store, ram_state, snapshot

from replaystore import ReplayStore


def break_chunks_after(path: Path, head: int, capacity: int, shard_len: int, chunk_len: int) -> tuple[int, int]:
    """Truncate, by a byte, the payload of every chunk after step ``head``'s in its ``obs`` shard, crc32c
    recomputed (so each passes its checksum and does not decode); returns the shard and its first
    chunk broken."""
    from replaystore.format.shards import crc32c, shard_bytes, shard_key, shard_payloads

    slot = head % capacity
    shard, first = slot // shard_len, (slot % shard_len) // chunk_len + 1
    f = path / shard_key("obs", shard, len(OBS_SHAPE))
    payloads = shard_payloads(f.read_bytes(), chunk_len=chunk_len, n_chunks=shard_len // chunk_len, name="obs",
                              shard=shard)
    chunks = [None if p is None else (bytes(p)[:-1] if c >= first else bytes(p)) for c, p in enumerate(payloads)]
    f.write_bytes(shard_bytes([None if p is None else (p, crc32c(p)) for p in chunks]))
    return shard, first


@pytest.mark.parametrize("episode_len, moves", [(7, 60), (4, 70)], ids=["within-episodes", "new-episodes-too"])
def test_a_stored_chunk_that_does_not_decode_fails_the_add_that_reaches_it(store_path: Path, episode_len: int,
                                                                           moves: int) -> None:
    """A reopened store loads the shard it goes on filling compressed (openshard.py) and decodes a
    chunk when the writer reaches it. A chunk there that passes its checksum but does not decode
    fails the add that reaches it with ``ChunkChecksumError`` naming it, before anything changed
    (inside a shard no undo is prepared): RAM, the commit and the files stay as they were, the same
    add fails alike again, and the steps before it stay readable."""
    from replaystore.errors import ChunkChecksumError

    store = make_store(store_path, capacity=64, shard_len=16, chunk_len=4)
    fill(store, moves, episode_len=episode_len)  # wrapped: the writer fills a shard again, over older steps
    store.flush()
    head = store.ring.added - 1
    store.close()
    shard, broken = break_chunks_after(store_path, head, 64, 16, 4)
    assert broken < 4
    store = ReplayStore.open(store_path, mode="a")
    for i in range(moves, moves + 16):
        before, files, committed = ram_state(store), snapshot(store_path), store.committed
        try:
            add_one(store, i, episode_len)
        except ChunkChecksumError as exc:
            assert f"chunk {broken} of shard {shard} of 'obs' passed its checksum but does not decompress" in str(exc)
            assert_same_ram(ram_state(store), before)
            with pytest.raises(ChunkChecksumError):
                add_one(store, i, episode_len)
            assert_same_ram(ram_state(store), before)
            assert snapshot(store_path) == files and store.committed == committed
            break
    else:
        pytest.fail("no add reached the broken chunk")
    assert store.episode(-1).obs.shape[0] > 1  # the episode in progress, up to the head
    store.close()
