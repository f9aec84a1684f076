"""``replaystore compact`` on a store of streams: keeping the streams (same transitions, priorities,
episodes in progress that a writer continues), merging them into fewer or splitting their episodes
over more (every transition kept whole, episodes whole), and the errors."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from replaystore import Layout, ReplayStore, StoreLockedError
from replaystore.cli.compact import compact_store
from replaystore.cli.main import main as cli_main
from replaystore.cli.verify import verify_store
from replaystore.errors import ConfigError
from replaystore.sampling.assemble import prepare
from replaystore.storage.rings import SHIFT

FIELDS = ("obs", "next_obs", "action", "reward", "terminated", "truncated")


def make(path: Path, n: int = 3, capacity: int = 96, frame_stack: int = 3) -> ReplayStore:
    return ReplayStore.create(path, capacity, gym.spaces.Box(0, 255, (2,), np.uint8), gym.spaces.Discrete(4),
                              frame_stack, num_streams=n, layout=Layout(shard_len=8, obs_chunk_len=4))


def fill(store: ReplayStore, steps: int, seed: int = 0) -> None:
    """``steps`` vector-env steps (next-step autoreset) of random-length episodes into every stream;
    every frame of the store is different."""
    rng = np.random.default_rng(seed)
    n = store.num_streams
    made = np.zeros(n, dtype=int)

    def new_frames() -> np.ndarray:
        made[:] += 1
        return np.stack([[made[k] % 256, 16 * k + made[k] // 256] for k in range(n)]).astype(np.uint8)

    obs, reset_row = new_frames(), np.zeros(n, dtype=bool)
    for _ in range(steps):
        nxt = new_frames()
        term = ~reset_row & (rng.random(n) < 0.08)
        trunc = ~reset_row & ~term & (rng.random(n) < 0.04)
        store.add_batch(obs, rng.integers(0, 4, n), rng.normal(size=n), nxt, term, trunc)
        reset_row, obs = term | trunc, nxt
    batch = store.sample(16, rng=np.random.default_rng(seed))
    store.update_priorities(batch.index, np.linspace(0.5, 4.0, 16))


def per_stream(path: Path) -> list[dict[str, np.ndarray]]:
    """Every sampleable transition of each stream, oldest first, with its priority."""
    out = []
    with ReplayStore.open(path) as store:
        for k, ring in enumerate(store.rings.streams):
            positions = np.arange(ring.lo, ring.added, dtype=np.int64)
            positions = positions[ring.valid[positions % ring.capacity]]
            batch = prepare(store.rings, store.reader, (np.int64(k) << SHIFT) | positions).finish(store.reader)
            rows = {name: np.array(getattr(batch, name)) for name in FIELDS}
            rows["priority"] = ring.priority[positions % ring.capacity].copy()
            out.append(rows)
    return out


def keys(rows: dict[str, np.ndarray]) -> list[bytes]:
    """Each transition as bytes (truncated left out: merging closes episodes in progress)."""
    return [b"".join(np.ascontiguousarray(rows[name][i]).tobytes() for name in FIELDS if name != "truncated")
            for i in range(len(rows["action"]))]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "s.zarr"
    store = make(path)
    fill(store, 50)  # 32 steps a stream: wrapped, with episodes in progress
    store.close()
    return path


def test_compact_keeps_streams(source: Path, tmp_path: Path) -> None:
    report = compact_store(source, tmp_path / "k.zarr")
    assert (report.streams_before, report.streams_after) == (3, 3)
    assert report.transitions_before == report.transitions_after > 0
    before, after = per_stream(source), per_stream(tmp_path / "k.zarr")
    for a, b in zip(before, after):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert verify_store(tmp_path / "k.zarr").ok
    # Each stream's episode in progress continues where it was: a writer carries on.
    with ReplayStore.open(source) as old:
        heads = np.stack([_head(old, k) for k in range(3)])
    with ReplayStore.open(tmp_path / "k.zarr", mode="a") as new:
        nxt = heads.copy()
        nxt[:, 1] += 200
        new.add_batch(heads, [1, 1, 1], [0.0] * 3, nxt, [False] * 3, [False] * 3)


def _head(store: ReplayStore, k: int) -> np.ndarray:
    ring = store.rings.streams[k]
    g = np.array([(k << SHIFT) | (ring.added - 1)], dtype=np.int64)
    return np.array(store.reader.gather(g)[0])


@pytest.mark.parametrize("into", [1, 2])
def test_compact_merges_streams_keeping_every_whole_transition(source: Path, tmp_path: Path, into: int) -> None:
    dst = tmp_path / f"m{into}.zarr"
    report = compact_store(source, dst, num_streams=into)
    assert (report.streams_before, report.streams_after) == (3, into)
    assert verify_store(dst).ok
    before = [key for rows in per_stream(source) for key in keys(rows)]
    after = [key for rows in per_stream(dst) for key in keys(rows)]
    assert len(set(after)) == len(after) and set(after) <= set(before)
    # What is missing is exactly the transitions of the oldest episodes that could not follow another.
    assert len(before) - len(after) <= report.steps_unjoined
    assert report.steps_unjoined > 0 or len(after) == len(before)
    with ReplayStore.open(dst) as merged:
        assert merged.num_streams == into and len(merged) == report.transitions_after == len(after)
        for ring in merged.rings.streams:  # every episode of a merged stream is closed
            assert ring.added == 0 or ring.is_last[(ring.added - 1) % ring.capacity]


def test_compact_merge_without_wrapping_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "n.zarr"
    store = make(path, n=4, capacity=256)
    fill(store, 30, seed=3)
    store.close()
    report = compact_store(path, tmp_path / "one.zarr", num_streams=1)
    assert report.steps_unjoined == 0 and report.transitions_after == report.transitions_before
    before = sorted(key for rows in per_stream(path) for key in keys(rows))
    assert before == sorted(key for rows in per_stream(tmp_path / "one.zarr") for key in keys(rows))
    # in place, through the CLI
    assert cli_main(["compact", str(path), "--streams", "2", "--quiet"]) == 0
    assert before == sorted(key for rows in per_stream(path) for key in keys(rows))


def episodes_of(rows: dict[str, np.ndarray]) -> list[bytes]:
    """A stream's episodes whose first step is there (the newest even if it is in progress), each as
    the bytes of its moves. A first step's stack is its frame repeated (reset padding; every frame
    of ``fill`` differs)."""
    out, current = [], None
    for i in range(len(rows["action"])):
        if (rows["obs"][i] == rows["obs"][i][-1]).all():
            current = b""
        if current is None:
            continue
        current += b"".join(np.ascontiguousarray(rows[n][i]).tobytes() for n in FIELDS if n != "truncated")
        if rows["terminated"][i] or rows["truncated"][i]:
            out.append(current)
            current = None
    return out if current is None else [*out, current]


@pytest.mark.parametrize(("n_src", "into", "capacity"), [(1, 4, 256), (3, 5, 480), (2, 3, 96)])
def test_compact_splits_episodes_over_more_streams(tmp_path: Path, n_src: int, into: int, capacity: int) -> None:
    """One env's store (or a few streams) into a vector env's: every episode whose beginning is
    kept goes whole into one new stream, in order, and the new streams take ~equal shares."""
    path = tmp_path / "few.zarr"
    store = make(path, n=n_src, capacity=96 * n_src)
    fill(store, 120 if capacity < 96 * n_src else 40, seed=n_src)
    store.close()
    dst = tmp_path / "many.zarr"
    report = compact_store(path, dst, num_streams=into, capacity=capacity)
    assert (report.streams_before, report.streams_after, report.capacity_after) == (n_src, into, capacity)
    assert verify_store(dst).ok
    before, after = per_stream(path), per_stream(dst)
    old_keys = [key for rows in before for key in keys(rows)]
    new_keys = [key for rows in after for key in keys(rows)]
    assert len(set(new_keys)) == len(new_keys) and set(new_keys) <= set(old_keys)
    assert len(old_keys) - len(new_keys) <= report.steps_unjoined + report.steps_cut
    old_episodes = {e for rows in before for e in episodes_of(rows)}
    new_episodes = [e for rows in after for e in episodes_of(rows)]
    assert set(new_episodes) <= old_episodes  # whole, never cut or joined across a boundary
    with ReplayStore.open(dst) as split:
        assert split.num_streams == into and len(split) == report.transitions_after == len(new_keys)
        sizes = [ring.added - ring.lo for ring in split.rings.streams]
        assert min(sizes) > 0 and max(sizes) - min(sizes) <= 2 * 40  # equal shares, to an episode or so
        for ring in split.rings.streams:  # every episode is closed: no writer continues one
            assert ring.is_last[(ring.added - 1) % ring.capacity]
    # and a vector env of that many envs carries on writing into it
    with ReplayStore.open(dst, mode="a") as more:
        added = [ring.added for ring in more.rings.streams]
        frames = np.full((into, 2), 250, dtype=np.uint8)
        more.add_batch(frames, [0] * into, [1.0] * into, frames + 1, [True] * into, [False] * into)
        assert [ring.added for ring in more.rings.streams] == [n + 2 for n in added]  # a new episode each


def test_compact_split_through_the_cli(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dst = tmp_path / "six.zarr"
    assert cli_main(["compact", str(source), str(dst), "--streams", "6", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "split the episodes of 3 stream(s) into 6" in out and "left out" in out
    with ReplayStore.open(dst) as six:  # stream 0's one long episode is a run of its own
        assert six.num_streams == 6 and all(ring.added > ring.lo for ring in six.rings.streams)
    # a merge that must cut to fit its streams says how much (without --capacity)
    assert cli_main(["compact", str(source), str(tmp_path / "two.zarr"), "--streams", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "merged 3 stream(s) into 2" in out


def test_compact_streams_errors(source: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="an int >= 1"):
        compact_store(source, tmp_path / "x.zarr", num_streams=0)
    with pytest.raises(ConfigError, match=r"capacity 96 \(\S+s.zarr's\) cannot hold 100 streams .* >= 200"):
        compact_store(source, tmp_path / "x.zarr", num_streams=100)
    with pytest.raises(ConfigError, match="capacity 95 does not split evenly into 2 streams; pass a capacity of 94 or 96"):
        compact_store(source, tmp_path / "x.zarr", num_streams=2, capacity=95)
    with ReplayStore.open(source, mode="a", streams=[1]):
        with pytest.raises(StoreLockedError, match="stream 1"):
            compact_store(source, tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()
    assert compact_store(source, tmp_path / "x.zarr").transitions_after > 0  # the locks were all released
