"""Extras (format/extras.py): per-move fields declared at ``create``, kept beside the action and
reward, given back by the store's readers (batches of each sampler, windows, episodes), kept by
``compact``, checked by ``verify``, shown by ``inspect`` and ``episodes``; bad input refused with
the store unchanged. The feeds, object storage, HER and the trainer: test_extras_feeds.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_same_ram, flip_byte_in_chunk, frame, ram_state, small_spaces, snapshot
from extras_data import EXTRAS, check_moves, create, extras_of, fill

from replaystore import (
    ConfigError,
    CorruptStoreError,
    FormatVersionError,
    InvalidTransitionError,
    Layout,
    ReplayStore,
)


def test_every_reader_gives_each_moves_extras(tmp_path) -> None:
    store = create(tmp_path / "x.zarr", capacity=48)
    fill(store, 100)  # the ring (48 steps) has wrapped twice
    rng = np.random.default_rng(0)
    for kwargs in ({}, {"n_step": 3}, {"prioritized": True}):
        batch = store.sample(32, rng=rng, **kwargs)
        check_moves(batch.extras, batch.action)
        assert set(batch.extras) == set(EXTRAS) and batch.extras["box"].dtype == np.uint8
    window = store.sample_sequences(8, 3, rng=rng)
    check_moves(window.extras, window.action)
    np.testing.assert_array_equal(np.diff(window.extras["move"], axis=1), 1)
    for episode in store.iter_episodes():
        check_moves(episode.extras, episode.action)
        assert episode.extras["move"].shape == (len(episode),)
    store.close()
    with ReplayStore.open(tmp_path / "x.zarr") as again:  # read back from the shards
        batch = again.sample(32, rng=rng)
        check_moves(batch.extras, batch.action)
        assert again.schema.extras == store.schema.extras


def test_an_episodes_last_step_and_the_newest_hold_zeros(tmp_path) -> None:
    store = create(tmp_path / "x.zarr")
    fill(store, 9, start=1)  # moves 1..6 end an episode; 7..9 are in progress
    ring = store.ring
    assert ring.is_last[6] and ring.fields["extras/move"][6] == 0
    np.testing.assert_array_equal(ring.fields["extras/move"][:6], np.arange(1, 7))
    assert ring.fields["extras/move"][ring.added - 1] == 0  # the newest step: no move from it yet
    episode = store.episode(-1)
    np.testing.assert_array_equal(episode.extras["move"], [7, 8, 9])


def test_zarr_reads_the_extras_as_a_subgroup(tmp_path) -> None:
    import zarr

    path = tmp_path / "x.zarr"
    with create(path) as store:
        fill(store, 6, episode_len=100)
    group = zarr.open_group(path, mode="r")
    np.testing.assert_array_equal(group["extras"]["move"][:6], np.arange(6))
    assert group["extras/vec"].shape == (64, 2, 3)
    attrs = json.loads((path / "zarr.json").read_text())["attributes"]["replaystore"]["schema"]
    assert attrs["requires"] == ["extras"] and attrs["extras"][0] == ["move", {"shape": [], "dtype": "int64"}]


def test_vector_env_rows_keep_their_extras(tmp_path) -> None:
    """``add_batch`` with next-step autoreset: a sub-env's reset row is skipped, and so are its extras."""
    obs_space, act_space = small_spaces()
    store = ReplayStore.create(tmp_path / "v.zarr", 128, obs_space, act_space, 2, num_streams=2,
                               layout=Layout(shard_len=16, obs_chunk_len=4), extras={"t": "int32", "env": "uint8"})
    obs = np.stack([frame(0), frame(1000)])
    for t in range(30):
        nxt = np.stack([frame(t + 1), frame(1000 + t + 1)])
        ended = [t % 6 == 5, False]
        # a vector env's info: the declared keys beside others, rows as the vector env gives them
        info = {"t": np.array([t, 100 + t]), "env": np.array([0, 1]), "_t": np.array([True, True]), "x": "y"}
        store.add_batch(obs, [t % 5, 1], [0.0, 1.0], nxt, ended, [False, False], extras=info)
        obs = nxt
    batch = store.sample(40, rng=np.random.default_rng(1))
    stream = store.rings.stream_of_slots(batch.index)
    np.testing.assert_array_equal(batch.extras["env"], stream)
    t = batch.extras["t"] - 100 * stream
    np.testing.assert_array_equal(batch.action[stream == 0], t[stream == 0] % 5)
    assert not np.isin(t[stream == 0], [6, 12, 18, 24]).any()  # the reset rows carried no move


@pytest.mark.parametrize(("extras", "message"), [
    (None, "keeps extras 'move'"),
    ({"move": 1}, "extras has no ['act'"),
    ({**extras_of(3), "vec": np.zeros(6)}, "extras['vec'] has shape (6,)"),
    ({**extras_of(3), "act": 1.5}, "keeps it as int16: pass ints"),
    ({**extras_of(3), "act": 40_000}, "outside int16"),
    ({**extras_of(3), "ok": 2}, "extras['ok'] holds 2"),
    ({**extras_of(3), "ok": 0.5}, "extras['ok'] holds 0.5"),
    ({**extras_of(3), "logp": 1e39}, "beyond float32"),
    ({**extras_of(3), "move": "seven"}, "pass numbers"),
    ({**extras_of(3), "box": [[1, 2]]}, "has shape (1, 2)"),
])
def test_bad_extras_leave_the_store_as_it_was(tmp_path, extras, message) -> None:
    store = create(tmp_path / "x.zarr")
    fill(store, 12)
    store.flush()
    before, disk = ram_state(store), snapshot(tmp_path / "x.zarr")
    with pytest.raises(InvalidTransitionError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        store.add(frame(5), 1, 0.0, frame(100_013), False, False, extras=extras)
    with pytest.raises(InvalidTransitionError):
        store.add_batch(frame(5)[None], [1], [0.0], frame(100_013)[None], [False], [False],
                        extras=None if extras is None else {k: np.asarray(v)[None] for k, v in extras.items()}
                        if message != "extras['vec'] has shape (6,)" else {**extras, "move": [1]})
    assert_same_ram(before, ram_state(store))
    store.flush()
    assert snapshot(tmp_path / "x.zarr") == disk


def test_values_are_kept_in_the_dtype_declared(tmp_path) -> None:
    """What an env's info holds is cast where nothing is lost: gymnasium-robotics' float
    ``is_success`` (0.0 or 1.0) into a bool, Python ints and floats, numpy scalars of other widths."""
    store = create(tmp_path / "x.zarr")
    given = {"move": np.int8(3), "act": 3, "ok": np.float32(1.0), "logp": -1.5, "vec": np.ones((2, 3), np.uint8),
             "box": [3, 1]}
    store.add(frame(0), 3, 0.0, frame(100_001), False, False, extras=given)
    kept = {name: values[0] for name, values in store.ring.extras.items()}
    assert kept["extras/ok"] is np.True_ and kept["extras/logp"] == np.float32(-1.5) and kept["extras/move"] == 3
    assert kept["extras/vec"].dtype == np.float64 and kept["extras/box"].tolist() == [3, 1]


def test_extras_given_to_a_store_without_them_are_refused(tmp_path) -> None:
    obs_space, act_space = small_spaces()
    with ReplayStore.create(tmp_path / "p.zarr", 64, obs_space, act_space) as store:
        with pytest.raises(InvalidTransitionError, match="declares none"):
            store.add(frame(0), 1, 0.0, frame(1), False, False, extras={"a": 1})
        assert len(store) == 0
        store.add(frame(0), 1, 0.0, frame(1), False, False)
        assert store.sample(1).extras == {}


@pytest.mark.parametrize(("extras", "message"), [
    ({"1bad": "int8"}, "extras name '1bad'"),
    ({"a/b": "int8"}, "extras name 'a/b'"),
    ({"zarr.json": "int8"}, "extras name 'zarr.json'"),
    ({"__meta": "int8"}, "extras name '__meta'"),
    ({"s": "U5"}, "strings and objects are not stored"),
    ({"o": object}, "strings and objects"),
    ({"c": "complex64"}, "use one of bool"),
    ({"z": "nonsense"}, "numpy does not know"),
    ({"v": ((0,), "float32")}, "shape"),
    ({"v": ((2, -1), "float32")}, "shape"),
    ({"big": ((1024, 2), "float32")}, "at most 4096"),
    (["move"], "pass a dict"),
])
def test_bad_declarations_are_refused_before_anything_is_written(tmp_path, extras, message) -> None:
    obs_space, act_space = small_spaces()
    with pytest.raises(ConfigError, match=message):
        ReplayStore.create(tmp_path / "n.zarr", 64, obs_space, act_space, extras=extras)
    assert not (tmp_path / "n.zarr").exists() or not any((tmp_path / "n.zarr").iterdir())


def _edit_schema(path: Path, change) -> None:
    doc = json.loads((path / "zarr.json").read_text())
    change(doc["attributes"]["replaystore"]["schema"])
    (path / "zarr.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(("change", "error", "message"), [
    (lambda s: s.update(requires=["extras", "time-travel"]), FormatVersionError, "upgrade replaystore"),
    (lambda s: s.pop("requires"), CorruptStoreError, "requires"),
    (lambda s: s.update(requires="extras"), CorruptStoreError, "requires"),
    (lambda s: s["extras"].append(["move", {"shape": [], "dtype": "int8"}]), CorruptStoreError, "repeat"),
    (lambda s: s["extras"][0][1].update(dtype="object"), CorruptStoreError, "dtype"),
    (lambda s: s["extras"][0][1].update(shape=[10**9]), CorruptStoreError, "damaged"),
    (lambda s: s.update(extras={"a": 1}), CorruptStoreError, "damaged"),
    (lambda s: s["extras"][1][1].update(dtype="int32"), CorruptStoreError, "does not match"),
])
def test_damaged_attributes_are_named(tmp_path, change, error, message) -> None:
    path = tmp_path / "x.zarr"
    with create(path) as store:
        fill(store, 10)
    _edit_schema(path, change)
    with pytest.raises(error, match=message):
        ReplayStore.open(path)


def test_verify_finds_a_damaged_extras_chunk_and_compact_keeps_them(tmp_path) -> None:
    path = tmp_path / "x.zarr"
    with create(path, capacity=128, num_streams=2) as store:
        obs = np.stack([frame(0), frame(1)])
        for i in range(40):
            nxt = np.stack([frame(2 * i + 2), frame(2 * i + 3)])
            store.add_batch(obs, [i % 5, (i + 1) % 5], [0.0, 0.0], nxt, [False, False], [False, False],
                            extras={name: np.stack([extras_of(i)[name], extras_of(i + 1)[name]]) for name in EXTRAS})
            obs = nxt
    cli = [sys.executable, "-m", "replaystore.cli"]
    done = subprocess.run([*cli, "compact", str(path), str(tmp_path / "one.zarr"), "--streams", "1"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with ReplayStore.open(tmp_path / "one.zarr") as merged:
        assert merged.schema.extras == ReplayStore.open(path).schema.extras
        batch = merged.sample(64, rng=np.random.default_rng(0), n_step=2)
        check_moves(batch.extras, batch.action)
        assert len(merged) == 80
    summary = json.loads(subprocess.run([*cli, "inspect", "--json", str(path)], capture_output=True, text=True).stdout)
    assert summary["schema"]["extras"]["vec"] == {"shape": [2, 3], "dtype": "float64"}
    assert summary["extras"]["move"]["moves"] == 80 and summary["extras"]["move"]["max"] == 40
    assert {f"extras/{name}" for name in EXTRAS} <= set(summary["bytes_by_array"])  # (each extra's own bytes)
    text = subprocess.run([*cli, "inspect", str(path)], capture_output=True, text=True).stdout
    assert "extras            move int64: mean" in text and "vec float64(2, 3)" in text

    flip_byte_in_chunk(path, 1, 0, 1, array="extras/logp")
    done = subprocess.run([*cli, "verify", str(path)], capture_output=True, text=True)
    assert done.returncode != 0 and "extras/logp" in done.stdout + done.stderr


def test_the_episode_listing_shows_each_scalar_extra_at_the_last_move(tmp_path) -> None:
    path = tmp_path / "x.zarr"
    with create(path) as store:
        fill(store, 24)  # three episodes of 7 moves, then 3 moves in progress
    cli = [sys.executable, "-m", "replaystore.cli", "episodes", str(path)]
    rows = json.loads(subprocess.run([*cli, "--json"], capture_output=True, text=True).stdout)["episodes"]
    assert [row["extras_at_last_move"]["move"] for row in rows] == [6, 13, 20, 23]
    assert set(rows[0]["extras_at_last_move"]) == {"move", "act", "ok", "logp"}  # (vec and box are not scalars)
    text = subprocess.run(cli, capture_output=True, text=True).stdout.splitlines()
    assert text[1].split()[-5:] == ["move", "act", "ok", "logp", "ended"]
    assert text[2].split()[4:] == ["6", "1", "True", "-3", "terminated"]


def test_episode_npz_holds_the_extras(tmp_path) -> None:
    path = tmp_path / "x.zarr"
    with create(path) as store:
        fill(store, 20)
    out = tmp_path / "ep.npz"
    done = subprocess.run([sys.executable, "-m", "replaystore.cli", "episodes", str(path), "--save", "1", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    saved = np.load(out)
    np.testing.assert_array_equal(saved["extras.move"], np.arange(7, 14))
    assert saved["extras.vec"].shape == (7, 2, 3)
