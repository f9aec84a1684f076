"""``replaystore merge SRC SRC [...] DST`` (``merge_stores``): one new store of the live steps of
several stores of one kind. Each source stream becomes a stream of the new store with the same
transitions and priorities (its episode in progress closed as truncated), or ``--streams M`` merges
or splits them as ``compact`` does; the sources are only read, under their writer locks. Stores of
another kind, a store named twice, a DST that exists or lies inside a source are refused in one line,
with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import snapshot
from test_streams_compact import FIELDS, fill, keys, make, per_stream

from replaystore import Layout, ReplayStore
from replaystore.cli.compact import merge_stores
from replaystore.cli.main import main as cli_main
from replaystore.cli.verify import verify_store


@pytest.fixture
def sources(tmp_path: Path) -> list[Path]:
    """A store of 3 streams whose rings wrapped (episodes in progress, the oldest ones cut), and one of
    a single stream that did not wrap."""
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    store = make(a)
    fill(store, 50, seed=1)
    store.close()
    store = make(b, n=1, capacity=64)
    fill(store, 40, seed=2)
    store.close()
    return [a, b]


def test_every_source_stream_becomes_a_stream_with_its_transitions(sources: list[Path], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    before = {p: snapshot(p) for p in sources}
    dst = tmp_path / "merged.zarr"
    assert cli_main(["merge", *map(str, sources), str(dst), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"merged {sources[0]}, {sources[1]} -> {dst}: ")
    assert all(snapshot(p) == before[p] for p in sources)  # only read
    assert verify_store(dst).ok
    streams = per_stream(sources[0]) + per_stream(sources[1])
    merged = per_stream(dst)
    assert len(merged) == 4
    for k, (old, new) in enumerate(zip(streams, merged)):
        assert keys(old) == keys(new), k  # the same transitions, in order (truncated aside)
        np.testing.assert_array_equal(old["priority"], new["priority"])
    with ReplayStore.open(dst) as store, ReplayStore.open(sources[0]) as a, ReplayStore.open(sources[1]) as b:
        # the capacity keeps every live step: 4 streams of the fullest source stream's (b's 41)
        ring = b.rings.streams[0]
        assert store.num_streams == 4 and store.capacity == 4 * 41 == 4 * (ring.added - ring.lo)
        assert len(store) == len(a) + len(b)
        for ring in store.rings.streams:  # no writer goes on in a merged store: every episode is closed
            assert ring.is_last[(ring.added - 1) % ring.capacity]
        batch = store.sample(64, rng=np.random.default_rng(0), n_step=3, gamma=0.9)
        assert batch.obs.shape == (64, 3, 2)


def test_streams_merged_into_one_and_split_over_more(sources: list[Path], tmp_path: Path) -> None:
    every = [key for path in sources for rows in per_stream(path) for key in keys(rows)]
    one = merge_stores(sources, tmp_path / "one.zarr", num_streams=1)
    assert (one.streams_before, one.streams_after) == (4, 1) and verify_store(tmp_path / "one.zarr").ok
    after = [key for rows in per_stream(tmp_path / "one.zarr") for key in keys(rows)]
    assert len(set(after)) == len(after) and set(after) <= set(every)
    assert len(every) - len(after) <= one.steps_unjoined  # only oldest episodes that lost their first steps
    six = merge_stores(sources, tmp_path / "six.zarr", num_streams=6, capacity=300)
    assert (six.streams_after, six.capacity_after) == (6, 300) and verify_store(tmp_path / "six.zarr").ok
    with ReplayStore.open(tmp_path / "six.zarr") as store:
        assert store.num_streams == 6 and all(ring.added > 0 for ring in store.rings.streams)


def test_a_run_directory_and_extras(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A source named by its replaystore-train run directory is read from its store (said on
    stderr); each move's extras come along."""
    space, actions = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2)
    paths = [tmp_path / "run" / "replay.zarr", tmp_path / "other.zarr"]
    paths[0].parent.mkdir()
    (paths[0].parent / "args.json").write_text(json.dumps({"env_id": "CartPole-v1"}))
    for s, path in enumerate(paths):
        with ReplayStore.create(path, 40, space, actions, 1, extras={"is_success": "bool"}) as store:
            for i in range(12):
                obs, nxt = np.full(3, 0.1 * i + s, np.float32), np.full(3, 0.1 * (i + 1) + s, np.float32)
                store.add(obs, i % 2, 1.0, nxt, i % 4 == 3, False, extras={"is_success": i % 4 == 3})
    dst = tmp_path / "m.zarr"
    assert cli_main(["merge", str(tmp_path / "run"), str(paths[1]), str(dst), "--quiet"]) == 0
    assert f"{tmp_path / 'run'} is a replaystore-train run directory: its store is {paths[0]}" in capsys.readouterr().err
    with ReplayStore.open(dst) as store:
        assert store.num_streams == 2 and len(store) == 24
        ep = store.episode(1, stream=1)
        assert ep.extras["is_success"].tolist() == [False, False, False, True]
        np.testing.assert_allclose(ep.obs[0], [1.4, 1.4, 1.4])


def test_bad_merges_are_refused_and_write_nothing(sources: list[Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.zarr"
    with ReplayStore.create(other, 32, gym.spaces.Box(0, 255, (3,), np.uint8), gym.spaces.Discrete(4), 3,
                            layout=Layout(shard_len=8, obs_chunk_len=4)):
        pass
    stacked = tmp_path / "stacked.zarr"
    with ReplayStore.create(stacked, 32, gym.spaces.Box(0, 255, (2,), np.uint8), gym.spaces.Discrete(4), 4,
                            layout=Layout(shard_len=8, obs_chunk_len=4)):
        pass
    (tmp_path / "exists.zarr").mkdir()
    a, b = map(str, sources)
    cases = [
        ([a, str(other), "{dst}"], f"{other} holds observations Box(0, 255, (3,), uint8), but {a} holds "
                                   "Box(0, 255, (2,), uint8); merge stores of one kind"),
        ([a, str(stacked), "{dst}"], f"{stacked} holds frame_stack 4, but {a} holds 3"),
        ([a, a, "{dst}"], f"{a} is the same store as {a}; name each store once"),
        ([a, "{dst}"], "merge takes two or more stores and a new DST, and got 2 path(s)"),
        ([a, b, str(tmp_path / "exists.zarr")], "already exists; choose a new DST"),
        ([a, b, str(sources[0] / "inner.zarr")], "is inside"),
        ([a, b, "{dst}", "--streams", "3", "--capacity", "100"], "capacity 100 does not split evenly into 3 streams"),
        ([a, b, "{dst}", "--streams", "0"], "num_streams is 0; the stores hold 4 streams together"),
        ([a, str(tmp_path / "missing.zarr"), "{dst}"], "missing.zarr"),
    ]
    before = {p: snapshot(p) for p in sources}
    for argv, message in cases:
        dst = tmp_path / "dst.zarr"
        assert cli_main(["merge", *(x.format(dst=dst) for x in argv), "--quiet"]) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (argv, err)
        assert not dst.exists() and not (sources[0] / "inner.zarr").exists()
    assert all(snapshot(p) == before[p] for p in sources)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zarr", "b.zarr", "exists.zarr", "other.zarr",
                                                          "stacked.zarr"]
    assert FIELDS  # (the transitions compared above are these fields)


def test_stores_on_object_storage(sources: list[Path], s3_url: str, tmp_path: Path) -> None:
    """A local store and one on the S3 server merged into a new prefix there, and back to disk."""
    from replaystore.cli.compact import compact_store

    remote = s3_url.replace("replay.zarr", "b.zarr")
    compact_store(sources[1], remote)
    merged = s3_url.replace("replay.zarr", "merged.zarr")
    report = merge_stores([sources[0], remote], merged)
    assert report.streams_after == 4 and verify_store(merged).ok
    assert cli_main(["merge", merged, str(sources[1]), str(tmp_path / "back.zarr"), "--quiet"]) == 0
    expected = per_stream(sources[0]) + per_stream(sources[1])
    assert [keys(rows) for rows in per_stream(tmp_path / "back.zarr")] == [keys(r) for r in expected + expected[3:]]


def test_a_full_disk_leaves_no_store_and_the_sources_as_they_were(tmp_path: Path, tiny_disk: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    paths = [tmp_path / "x.zarr", tmp_path / "y.zarr"]
    for path in paths:  # 2 x 3,000 incompressible frames of 256 bytes: 1.5 MB, more than the 1 MiB disk
        with ReplayStore.create(path, 4_000, gym.spaces.Box(0, 255, (256,), np.uint8), gym.spaces.Discrete(2), 1) as store:
            obs = rng.integers(0, 256, 256, dtype=np.uint8)
            for i in range(3_000):
                nxt = rng.integers(0, 256, 256, dtype=np.uint8)
                store.add(obs, i % 2, 0.0, nxt, i % 100 == 99, False)
                obs = nxt if i % 100 != 99 else rng.integers(0, 256, 256, dtype=np.uint8)
    before = {p: snapshot(p) for p in paths}
    dst = tiny_disk / "m.zarr"
    assert cli_main(["merge", *map(str, paths), str(dst), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "disk full while writing the merged store of" in err and err.count("\n") == 1, err
    assert "nothing of it is kept" in err and list(tiny_disk.iterdir()) == []
    assert all(snapshot(p) == before[p] for p in before)


def test_a_store_being_written_is_refused_and_every_lock_given_back(sources: list[Path], tmp_path: Path) -> None:
    """A writer on the second store: the merge is refused naming it (after the first store's
    locks were taken), and once the writer is gone the same merge runs: nothing stayed locked."""
    from replaystore import StoreLockedError

    with ReplayStore.open(sources[1], mode="a"):
        with pytest.raises(StoreLockedError, match="b.zarr is open for writing by process"):
            merge_stores(sources, tmp_path / "m.zarr")
        with ReplayStore.open(sources[0], mode="a"):  # the first store's locks were given back
            pass
    assert not (tmp_path / "m.zarr").exists()
    assert merge_stores(sources, tmp_path / "m.zarr").streams_after == 4
