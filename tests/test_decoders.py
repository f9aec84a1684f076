"""The batch decoder: one libzstd call for a batch's joined chunks, and what it must not trust.

A batch's chunks are decoded by a single ``ZSTD_decompressDCtx`` call on their joined payloads only
when each payload is one zstd frame declaring exactly one chunk's size. Anything else (a frame that
does not record its size, declares another size, or is not a frame) is decoded on its own, and a
frame that declares the right size but does not decode makes the joined call fail, after which the
chunks are decoded one by one to name the bad one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zstandard
from conftest import fill, make_store, rewrite_obs_shard

from replaystore import ReplayStore
from replaystore.cli.verify import verify_store
from replaystore.errors import ChunkChecksumError
from replaystore.storage import decoders

pytestmark = pytest.mark.skipif(decoders.LIBZSTD is None, reason="no libzstd shared library on this machine")

CHUNK_LEN = 4


@pytest.fixture
def filled(store_path: Path) -> Path:
    store = make_store(store_path, capacity=64, shard_len=16, chunk_len=CHUNK_LEN)
    fill(store, 100, episode_len=9)
    store.close()
    return store_path


def live_positions(store: ReplayStore) -> np.ndarray:
    return np.arange(store.ring.lo, store.ring.added, dtype=np.int64)


def rewrite_shard_1(path: Path, encode) -> None:
    rewrite_obs_shard(path, 1, CHUNK_LEN, encode)


def test_a_batch_of_chunks_is_decoded_by_one_call_and_matches_chunk_by_chunk(filled: Path) -> None:
    store = ReplayStore.open(filled)
    positions = live_positions(store)
    plan = store.reader.plan(positions)
    store.reader.fetch([plan])  # the chunks were not cached: planning only located them
    assert plan.as_one and len(plan.ids) > 1
    joined = store.reader.finish(plan).copy()
    plan = store.reader.plan(positions)
    one_by_one = plan.__class__(**{**plan.__dict__, "as_one": False})
    np.testing.assert_array_equal(store.reader.finish(one_by_one), joined)


def test_frames_without_a_recorded_size_are_decoded_on_their_own(filled: Path) -> None:
    store = ReplayStore.open(filled)
    positions = live_positions(store)
    expected = store.reader.gather(positions).copy()
    store.close()
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=False)
    rewrite_shard_1(filled, lambda chunk: compressor.compress(chunk.tobytes()))

    store = ReplayStore.open(filled)
    plan = store.reader.plan(positions)
    store.reader.fetch([plan])
    assert not plan.as_one  # shard 1's chunks do not declare their size
    np.testing.assert_array_equal(store.reader.finish(plan), expected)
    assert verify_store(filled).ok


def test_a_frame_that_declares_another_size_is_named(filled: Path) -> None:
    rewrite_shard_1(filled, lambda chunk: zstandard.ZstdCompressor().compress(chunk.tobytes()[: chunk.nbytes // 2]))
    store = ReplayStore.open(filled)
    with pytest.raises(ChunkChecksumError, match="of shard 1 of 'obs' passed its checksum but does not decompress"):
        store.reader.gather(live_positions(store))


def test_a_frame_that_declares_the_right_size_but_does_not_decode_is_named(filled: Path) -> None:
    """A hand-made frame: header says one chunk's size, its one raw block holds 10 bytes."""

    def short_frame(chunk: np.ndarray) -> bytes:
        assert chunk.nbytes < 256
        header = b"\x28\xb5\x2f\xfd" + bytes([0x20, chunk.nbytes])  # single segment, 1-byte content size
        block = (10 << 3 | 1).to_bytes(3, "little") + bytes(10)  # last block, raw, 10 bytes
        return header + block

    frame = short_frame(np.zeros((CHUNK_LEN, 3, 4), np.uint8))
    rewrite_shard_1(filled, short_frame)
    store = ReplayStore.open(filled)
    assert store.reader.decoder.declares_chunk(frame, CHUNK_LEN * 3 * 4)
    plan = store.reader.plan(live_positions(store))
    store.reader.fetch([plan])
    assert plan.as_one  # it passes every check that can be made without decoding
    with pytest.raises(ChunkChecksumError, match="chunk 0 of shard 1 of 'obs' passed its checksum but does not decompress"):
        store.reader.finish(plan)


@pytest.mark.parametrize("libzstd", [True, False], ids=["libzstd", "zstandard"])
def test_decoding_on_several_threads_gives_the_same_batches(store_path: Path, libzstd: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``decode_threads`` > 1 splits a batch's chunks between threads (each part joined on its own)."""
    if not libzstd:
        monkeypatch.setattr(decoders, "LIBZSTD", None)
    store = make_store(store_path, capacity=2048, shard_len=256, chunk_len=CHUNK_LEN)
    fill(store, 2000, episode_len=37)
    store.close()
    batches = []
    for threads in (1, 3):
        with ReplayStore.open(store_path, decode_threads=threads) as s:
            plan = s.reader.plan(live_positions(s)[:400])
            s.reader.fetch([plan])
            assert len(plan.ids) >= 3 * 8 and plan.as_one == libzstd  # enough chunks for 3 tasks
            batches.append([s.sample(128, rng=np.random.default_rng(seed), n_step=3) for seed in range(5)])
    for one, three in zip(*batches, strict=True):
        np.testing.assert_array_equal(one.obs, three.obs)
        np.testing.assert_array_equal(one.next_obs, three.next_obs)
        np.testing.assert_array_equal(one.reward, three.reward)


@pytest.mark.parametrize("libzstd", [True, False], ids=["libzstd", "numcodecs"])
def test_the_writers_codec_writes_what_numcodecs_writes(store_path: Path, libzstd: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer encodes (and decodes) its chunks with libzstd and kept contexts (storage/encoders.py):
    each is one zstd frame declaring its size that numcodecs (zarr's codec) decodes to the chunk,
    numcodecs' frames decode back, a frame that does not fill the chunk is refused, and a store
    written with it (or without libzstd) holds what was added. (The bytes may differ from
    numcodecs' where the two zstd versions compress differently.)"""
    from replaystore.format.schema import CodecSpec
    from replaystore.format.shards import numcodecs_codec
    from replaystore.storage import encoders

    if not libzstd:
        monkeypatch.setattr(encoders, "LIBZSTD", None)
    codec = encoders.ChunkCodec(CodecSpec())
    reference = numcodecs_codec(CodecSpec())
    rng = np.random.default_rng(0)
    for chunk in (np.zeros((8, 84, 84), np.uint8), rng.integers(0, 255, (8, 84, 84), dtype=np.uint8),
                  np.repeat(rng.integers(0, 4, (8, 1, 84), dtype=np.uint8), 84, axis=1), np.arange(12.0).reshape(3, 4)):
        payload = codec.encode(chunk)
        assert decoders.declared_size(payload) == chunk.nbytes
        out = np.empty_like(chunk)
        reference.decode(payload, out=out)
        np.testing.assert_array_equal(out, chunk)
        codec.decode(bytes(reference.encode(chunk)), out=(again := np.empty_like(chunk)))  # and decodes numcodecs'
        np.testing.assert_array_equal(again, chunk)
    with pytest.raises(ValueError, match="declares 56 bytes, a chunk has 64"):  # (a ChunkChecksumError by the caller)
        codec.decode(bytes(reference.encode(np.zeros(7))), out=np.empty(8))
    strided = np.arange(24.0).reshape(4, 6)[:, ::2]  # not contiguous: encoded as its copy
    reference.decode(codec.encode(strided), out=(out := np.empty((4, 3))))
    np.testing.assert_array_equal(out, strided)
    assert encoders.ChunkCodec(CodecSpec(name="blosc", level=5)).encode(np.ones((4, 4), np.uint8)) == \
        bytes(numcodecs_codec(CodecSpec(name="blosc", level=5)).encode(np.ones((4, 4), np.uint8)))
    store = make_store(store_path, capacity=64, shard_len=16, chunk_len=CHUNK_LEN)
    fill(store, 100, episode_len=9)
    expected = store.sample(16, rng=np.random.default_rng(1))
    store.close()
    assert verify_store(store_path).ok
    with ReplayStore.open(store_path) as again:
        got = again.sample(16, rng=np.random.default_rng(1))
        np.testing.assert_array_equal(got.obs, expected.obs)
