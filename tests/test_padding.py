"""Zero-padded frame stacks (``frame_padding="zero"``, SB3's VecFrameStack) through every feed path.

Each frame's bytes name its step, so a sampled stack is checked against the stack recorded while
writing (zeros before the episode's first frame), whichever path decoded it: ``sample`` from the
writer's RAM and from disk, ``blocks`` on threads and in decode processes, ``as_dataset``,
``jax_blocks``, ``sample_sequences``, and a compacted copy.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import frame

from replaystore import Layout, ReplayStore
from replaystore.cli.main import main as cli_main
from replaystore.errors import ConfigError, CorruptStoreError

K = 4
SHAPE = (6, 5)
SPACE = gym.spaces.Box(0, 255, SHAPE, np.uint8)


def _fill(path: Path, padding: str = "zero", streams: int = 2, steps: int = 300) -> tuple[ReplayStore, dict]:
    """A store of ``streams`` streams with episodes of 1..9 moves; returns it and the stacks seen."""
    store = ReplayStore.create(path, 256 * streams, SPACE, gym.spaces.Discrete(3), K, num_streams=streams,
                               frame_padding=padding, layout=Layout(shard_len=32, obs_chunk_len=4))
    rng = np.random.default_rng(1)
    seen: dict[bytes, np.ndarray] = {}
    counter = [0]

    def fresh() -> np.ndarray:
        counter[0] += 1
        return frame(counter[0], SHAPE)

    frames = [fresh() for _ in range(streams)]
    stacks = [_start(f, padding) for f in frames]
    left = rng.integers(1, 10, size=streams)
    for _ in range(steps):
        nxt = [fresh() for _ in range(streams)]
        done = left == 1
        heads = rng.random(streams) < 0.5
        store.add_batch(np.stack(frames), rng.integers(0, 3, size=streams), np.ones(streams), np.stack(nxt),
                        done & heads, done & ~heads, autoreset_mode="disabled")
        for i in range(streams):
            seen[frames[i].tobytes()] = np.stack(stacks[i])
            stacks[i].append(nxt[i])
            seen[nxt[i].tobytes()] = np.stack(stacks[i])
            if done[i]:
                frames[i] = fresh()
                stacks[i] = _start(frames[i], padding)
                left[i] = rng.integers(1, 10)
            else:
                frames[i] = nxt[i]
                left[i] -= 1
    return store, seen


def _start(first: np.ndarray, padding: str) -> deque:
    pad = np.zeros_like(first) if padding == "zero" else first
    return deque([pad] * (K - 1) + [first], maxlen=K)


def _check(stacks: np.ndarray, seen: dict) -> int:
    """Every stack in ``stacks`` (``(..., K, *SHAPE)``) is one recorded; returns how many padded ones."""
    flat = np.asarray(stacks).reshape(-1, K, *SHAPE)
    padded = 0
    for s in flat:
        want = seen[s[-1].tobytes()]
        assert np.array_equal(s, want)
        padded += int(not s[0].any())
    return padded


def test_zero_padding_in_sample_from_ram_and_disk(tmp_path):
    store, seen = _fill(tmp_path / "z.zarr")
    padded = 0
    for seed in range(5):
        b = store.sample(64, rng=np.random.default_rng(seed))
        padded += _check(b.obs, seen) + _check(b.next_obs, seen)
    assert padded > 20  # episodes are short: many stacks reach before their start
    store.close()
    with ReplayStore.open(tmp_path / "z.zarr") as reader:
        assert reader.schema.frame_padding == "zero"
        b = reader.sample(128, rng=np.random.default_rng(9), n_step=3)
        assert _check(b.obs, seen) + _check(b.next_obs, seen) > 10
        seq = reader.sample_sequences(16, 6, rng=np.random.default_rng(2))
        _check(seq.obs, seen)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "decode-processes"])
def test_zero_padding_in_blocks(tmp_path, processes):
    store, seen = _fill(tmp_path / "z.zarr")
    store.flush()
    with ReplayStore.open(tmp_path / "z.zarr") as reader, reader.blocks(32, batches_per_block=4, seed=0,
                                                                         processes=processes) as it:
        for _ in range(3):
            with next(it) as block:
                assert _check(block["obs"], seen) + _check(block["next_obs"], seen) > 0


def test_zero_padding_in_tf_dataset_and_jax_blocks(tmp_path):
    store, seen = _fill(tmp_path / "z.zarr")
    store.flush()
    with ReplayStore.open(tmp_path / "z.zarr") as reader:
        ds = reader.as_dataset(32, seed=1, device=None)
        for batch in ds.take(3):
            _check(batch["obs"].numpy(), seen)
            _check(batch["next_obs"].numpy(), seen)
        it = reader.jax_blocks(16, batches_per_block=2, seed=3)
        try:
            block = next(iter(it))
            _check(np.asarray(block["obs"]), seen)
        finally:
            it.close()


def test_reset_padding_unchanged_and_compact_keeps_padding(tmp_path):
    store, seen = _fill(tmp_path / "r.zarr", padding="reset")
    _check(store.sample(64, rng=np.random.default_rng(0)).obs, seen)
    store.close()
    doc = json.loads((tmp_path / "r.zarr" / "zarr.json").read_text())
    assert "frame_padding" not in doc["attributes"]["replaystore"]["schema"]  # reset stores are as before

    zstore, zseen = _fill(tmp_path / "z.zarr")
    zstore.close()
    assert cli_main(["compact", str(tmp_path / "z.zarr"), str(tmp_path / "c.zarr")]) == 0
    with ReplayStore.open(tmp_path / "c.zarr") as copy:
        assert copy.schema.frame_padding == "zero"
        _check(copy.sample(128, rng=np.random.default_rng(4)).obs, zseen)


def test_inspect_shows_padding(tmp_path, capsys):
    _fill(tmp_path / "z.zarr", steps=20)[0].close()
    assert cli_main(["inspect", str(tmp_path / "z.zarr")]) == 0
    assert "frame_stack 4 (zero padding)" in capsys.readouterr().out


def test_bad_padding_refused(tmp_path):
    with pytest.raises(ConfigError, match="frame_padding is 'ones'"):
        ReplayStore.create(tmp_path / "b.zarr", 64, SPACE, gym.spaces.Discrete(3), K, frame_padding="ones")
    assert not (tmp_path / "b.zarr").exists()
    _fill(tmp_path / "z.zarr", steps=5)[0].close()
    doc_path = tmp_path / "z.zarr" / "zarr.json"
    doc = json.loads(doc_path.read_text())
    doc["attributes"]["replaystore"]["schema"]["frame_padding"] = "mirror"
    doc_path.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError, match="frame_padding is 'mirror'"):
        ReplayStore.open(tmp_path / "z.zarr")
