"""Minari datasets in and out of a store (integrations/minari/), against datasets that Minari itself
recorded from real envs (``minari.DataCollector``) or wrote (``create_dataset_from_buffers``), and
read back with ``minari.load_dataset``. What an export writes and refuses is in test_minari_export.py."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

minari = pytest.importorskip("minari")

from info_env import Reporting  # noqa: E402
from minari_data import VECTOR, episode, left_beside, record, where, written  # noqa: E402

from replaystore import ReplayStore  # noqa: E402
from replaystore.cli import main  # noqa: E402
from replaystore.errors import (  # noqa: E402
    ConfigError,
    CorruptStoreError,
    InvalidTransitionError,
    StoreExistsError,
    StoreNotFoundError,
)
from replaystore.integrations.minari import minari_from_store, store_from_minari  # noqa: E402

pytestmark = pytest.mark.usefixtures("datasets_root")  # Minari's datasets root: each test's own

# -------------------------------------------------------------------------------------------------
# In and out


def test_a_recorded_dataset_is_stored_sampled_and_exported_exactly(tmp_path: Path) -> None:
    data = record("cartpole/random-v0", gym.make("CartPole-v1"), 1500)
    path = tmp_path / "cartpole.zarr"
    report = store_from_minari("cartpole/random-v0", path)
    assert (report.episodes, report.moves, report.closed, report.frame_stack) == (len(data), 1500, 0, 1)
    episodes = list(data.iterate_episodes())
    with ReplayStore.open(path) as store:
        assert len(store) == 1500 and store.capacity == 1500 + len(data)
        assert store.action_space == data.action_space
        for i, ep in enumerate(episodes):  # every episode, whole
            got = store.episode(i)
            assert np.array_equal(got.obs, ep.observations) and np.array_equal(got.action, ep.actions)
            assert np.array_equal(got.reward, ep.rewards.astype(np.float32))
            assert np.array_equal(got.terminated, ep.terminations) and np.array_equal(got.truncated, ep.truncations)
        at = where(store, data)
        gamma = 0.9
        for n_step in (1, 3):  # sampled transitions are the dataset's, n-step returns computed from it
            batch = store.sample(256, n_step=n_step, gamma=gamma, rng=np.random.default_rng(n_step))
            for j, g in enumerate(batch.index):
                e, t = at[int(g)]
                ep = episodes[e]
                m = min(n_step, len(ep) - t)
                assert np.array_equal(batch.obs[j, -1], ep.observations[t])
                assert np.array_equal(batch.next_obs[j, -1], ep.observations[t + m])
                assert batch.action[j] == ep.actions[t]
                want = sum(gamma**i * np.float32(ep.rewards[t + i]) for i in range(m))
                assert batch.reward[j] == pytest.approx(want, rel=1e-5)
                ends = bool(ep.terminations[t + m - 1])
                assert batch.discount[j] == pytest.approx(0.0 if ends else gamma**m)
    out = minari_from_store(path, "replaystore/cartpole/back-v0", env="CartPole-v1", author="tests")
    assert (out.episodes, out.moves, out.partial, out.in_progress) == (len(data), 1500, 0, 0)
    back = minari.load_dataset("replaystore/cartpole/back-v0")
    assert back.total_steps == 1500 and back.spec.env_spec.id == "CartPole-v1"
    assert back.recover_environment().spec.id == "CartPole-v1"
    assert back.storage.metadata["author"] == {"tests"}
    for a, b in zip(episodes, back.iterate_episodes(), strict=True):
        assert np.array_equal(a.observations, b.observations) and np.array_equal(a.actions, b.actions)
        assert np.array_equal(a.rewards.astype(np.float32), b.rewards)
        assert np.array_equal(a.terminations, b.terminations) and np.array_equal(a.truncations, b.truncations)
    assert "replaystore/cartpole/back-v0" in minari.list_local_datasets()


def test_frame_stacks_are_stored_once_a_frame_and_sampled_as_recorded(tmp_path: Path) -> None:
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0, full_action_space=False)
    env = gym.wrappers.FrameStackObservation(gym.wrappers.AtariPreprocessing(env, noop_max=0), 4)
    data = record("pong/random-v0", env, 400)
    episodes = list(data.iterate_episodes())
    path = tmp_path / "pong.zarr"
    report = store_from_minari(data, path)
    assert report.frame_stack == 4 and "4 frames of (84, 84)" in report.stacking
    with ReplayStore.open(path) as store:
        assert store.observation_space.shape == (84, 84) and store.frame_stack == 4
        assert store.schema.frame_padding == "reset"
        at = where(store, data)
        batch = store.sample(64, rng=np.random.default_rng(0))
        assert batch.obs.shape == (64, 4, 84, 84)
        for j, g in enumerate(batch.index):  # each sampled stack is the observation Minari recorded
            e, t = at[int(g)]
            assert np.array_equal(batch.obs[j], episodes[e].observations[t])
            assert np.array_equal(batch.next_obs[j], episodes[e].observations[t + 1])
        assert store.backend.stored_bytes()["obs"] < 401 * 84 * 84  # each frame once, compressed
    minari_from_store(path, "back/pong-stacks-v0", stacks=True)
    minari_from_store(path, "back/pong-frames-v0")
    stacks, frames = minari.load_dataset("back/pong-stacks-v0"), minari.load_dataset("back/pong-frames-v0")
    assert stacks.observation_space.shape == (4, 84, 84) and frames.observation_space.shape == (84, 84)
    assert not stacks.storage.metadata["jpeg_encoding"]
    for a, b, c in zip(episodes, stacks.iterate_episodes(), frames.iterate_episodes(), strict=True):
        assert np.array_equal(a.observations, b.observations)  # the recorded stacks, rebuilt
        assert np.array_equal(a.observations[:, -1], c.observations)


def test_box_actions_and_zero_padded_stacks_round_trip(tmp_path: Path) -> None:
    frames = np.random.default_rng(0).integers(1, 255, (12, 2, 5), dtype=np.uint8)
    eps = []
    for start, moves in ((0, 4), (5, 6)):  # SB3 VecFrameStack style: zeros before the first frame, last axis
        seq = np.concatenate([np.zeros((2, 2, 5), np.uint8), frames[start:start + moves + 1]])
        obs = np.stack([np.concatenate(list(seq[t:t + 3]), axis=-1) for t in range(moves + 1)])
        ep = episode(moves, end="truncated")
        ep["obs"] = obs
        ep["action"] = np.linspace(-2, 2, moves * 2, dtype=np.float32).reshape(moves, 2)
        eps.append(ep)
    obs_space = gym.spaces.Box(0, 255, (2, 15), np.uint8)
    action_space = gym.spaces.Box(-2, 2, (2,), np.float32)
    written("box/stacked-v0", eps, obs_space, action_space)
    path = tmp_path / "box.zarr"
    report = store_from_minari("box/stacked-v0", path)
    assert report.frame_stack == 3 and "zero-padded" in report.stacking
    with ReplayStore.open(path) as store:
        assert store.observation_space.shape == (2, 5) and store.schema.frame_padding == "zero"
        assert store.action_space == action_space
        for i, ep in enumerate(eps):
            got = store.episode(i)
            assert np.array_equal(got.obs, ep["obs"][..., -5:]) and np.array_equal(got.action, ep["action"])
            assert got.ended == "truncated"
    minari_from_store(path, "box/back-v0", stacks=True)
    for ep, back in zip(eps, minari.load_dataset("box/back-v0").iterate_episodes(), strict=True):
        # the stacks on a new first axis, zero-padded as the store pads them
        assert np.array_equal(np.concatenate(list(back.observations.transpose(1, 0, 2, 3)), axis=-1), ep["obs"])
        assert np.array_equal(back.actions, ep["action"])


def test_an_episode_cut_short_is_closed_as_truncated(tmp_path: Path) -> None:
    eps = [episode(5), episode(4, start=20.0, end="none"), episode(3, start=30.0)]
    written("cut/short-v0", eps, VECTOR, gym.spaces.Discrete(3))
    report = store_from_minari("cut/short-v0", tmp_path / "cut.zarr")
    assert (report.episodes, report.moves, report.closed, report.empty) == (3, 12, 1, 0)
    with ReplayStore.open(tmp_path / "cut.zarr") as store:
        assert [store.episode(i).ended for i in range(3)] == ["terminated", "truncated", "terminated"]
        assert np.array_equal(store.episode(1).obs, eps[1]["obs"])
        assert not store.episode(1).truncated[:-1].any()  # closed after its last move only (the flag on the step)


def test_a_smaller_capacity_keeps_the_newest_episodes(tmp_path: Path) -> None:
    eps = [episode(9, start=100.0 * i) for i in range(6)]
    written("many/eps-v0", eps, VECTOR, gym.spaces.Discrete(3))
    store_from_minari("many/eps-v0", tmp_path / "small.zarr", capacity=32)
    with ReplayStore.open(tmp_path / "small.zarr") as store:
        assert store.capacity == 32
        assert np.array_equal(store.episode(-1).obs, eps[-1]["obs"])
        assert np.array_equal(store.episode(-2).obs, eps[-2]["obs"])


def test_metadata_that_undercounts_the_moves_is_refused_and_a_smaller_capacity_is_said(
        tmp_path: Path, datasets_root: Path, capsys: pytest.CaptureFixture) -> None:
    """An under-counted ``total_steps`` made the default capacity too small: the import said "28
    episodes, 1,484 moves" and kept 128 steps. Now the episodes are counted as they are read: one
    line, no store; a capacity given smaller is said in the summary."""
    import json

    eps = [episode(9, start=100.0 * i) for i in range(6)]
    written("under/count-v0", eps, VECTOR, gym.spaces.Discrete(3))
    meta = datasets_root / "under" / "count-v0" / "data" / "metadata.json"
    doc = json.loads(meta.read_text())
    doc["total_steps"] = 10
    meta.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError, match="metadata says 10 moves, but its episodes hold more"):
        store_from_minari("under/count-v0", tmp_path / "u.zarr")
    assert not (tmp_path / "u.zarr").exists() and left_beside(tmp_path / "u.zarr") == []
    report = store_from_minari("under/count-v0", tmp_path / "u.zarr", capacity=60)
    assert (report.moves, report.kept_steps) == (54, 60)
    assert main(["import-minari", "under/count-v0", str(tmp_path / "c.zarr"), "--capacity", "32", "--quiet"]) == 0
    assert "--capacity 32 keeps the newest 32 steps of 60" in capsys.readouterr().out


def test_an_episode_that_declares_huge_arrays_is_refused_before_it_is_read(tmp_path: Path,
                                                                          datasets_root: Path) -> None:
    """A small HDF5 file whose episode declares 1.2 GB of observations (h5py would allocate them on
    read): refused from the declared shape, with no store made."""
    import h5py

    written("huge/decl-v0", [episode(5), episode(4, start=20.0)], VECTOR, gym.spaces.Discrete(3))
    main_file = datasets_root / "huge" / "decl-v0" / "data" / "main_data.hdf5"
    with h5py.File(main_file, "a") as f:
        group = f[sorted(f)[1]]
        del group["observations"]
        group.create_dataset("observations", shape=(10**8, *VECTOR.shape), dtype="float32", chunks=True)
    assert main_file.stat().st_size < 2**20
    with pytest.raises(CorruptStoreError, match=r"observations declares shape \(100000000,"):
        store_from_minari("huge/decl-v0", tmp_path / "h.zarr")
    assert not (tmp_path / "h.zarr").exists() and left_beside(tmp_path / "h.zarr") == []


def test_a_store_on_object_storage(s3_url: str) -> None:
    data = record("cartpole/s3-v0", gym.make("CartPole-v1"), 300)
    report = store_from_minari(data, s3_url)
    assert report.path == s3_url and report.moves == 300
    with ReplayStore.open(s3_url) as store:
        assert np.array_equal(store.episode(0).obs, next(iter(data.iterate_episodes())).observations)
    out = minari_from_store(s3_url, "s3/back-v0")
    assert out.moves == 300 and minari.load_dataset("s3/back-v0").total_steps == 300


# -------------------------------------------------------------------------------------------------
# Bad input: a clear error, and nothing left behind


@pytest.mark.parametrize("case", ["nan-obs", "action-outside", "reward-beyond-float32", "ends-early", "short-obs",
                                  "stacks-break"])
def test_a_bad_episode_is_named_and_no_store_is_left(tmp_path: Path, case: str) -> None:
    eps = [episode(5), episode(6, start=10.0), episode(4, start=20.0)]
    bad = eps[1]
    obs_space = VECTOR
    if case == "nan-obs":
        bad["obs"][3, 1] = np.nan
    elif case == "action-outside":
        bad["action"][2] = 7
    elif case == "reward-beyond-float32":
        bad["reward"][4] = 1e300
    elif case == "ends-early":
        bad["truncated"][2] = True
    elif case == "short-obs":
        bad["obs"] = bad["obs"][:-1]
    else:  # the first episode holds frame stacks, the second does not
        obs_space = gym.spaces.Box(0, 255, (2, 3), np.uint8)
        for k, ep in enumerate(eps):
            frames = (np.arange(len(ep["obs"]) + 1) + 40 * k).astype(np.uint8)[:, None] + np.arange(3, dtype=np.uint8)
            ep["obs"] = np.stack([frames[np.maximum(t - 1, 0):t + 1] if t else frames[[0, 0]]
                                  for t in range(len(ep["obs"]))])
        bad["obs"][3, 0] = 99  # its older frame is not the previous observation's newer one
    written("bad/data-v0", eps, obs_space, gym.spaces.Discrete(3))
    path = tmp_path / "bad.zarr"
    with pytest.raises(InvalidTransitionError, match="episode 1") as err:
        store_from_minari("bad/data-v0", path)
    assert "\n" not in str(err.value)
    assert not path.exists() and left_beside(path) == []


def test_what_a_store_cannot_hold_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    space = gym.spaces.Dict({"pos": VECTOR, "n": gym.spaces.Dict({"m": gym.spaces.Text(3)})})
    written("dict/obs-v0", [{**episode(3), "obs": {"pos": episode(3)["obs"], "n": {"m": ["abc"] * 4}}}],
            space, gym.spaces.Discrete(3))
    with pytest.raises(ConfigError, match=r"dict/obs-v0 cannot be stored: observation_space\['n/m'\] is Text"):
        store_from_minari("dict/obs-v0", tmp_path / "d.zarr")
    with pytest.raises(StoreNotFoundError, match="minari download nobody/nothing-v0"):
        store_from_minari("nobody/nothing-v0", tmp_path / "d.zarr")
    written("fine/data-v0", [episode(3)], VECTOR, gym.spaces.Discrete(3))
    existing = tmp_path / "there.zarr"
    existing.mkdir()
    (existing / "mine.txt").write_text("keep")
    with pytest.raises(StoreExistsError, match="already exists"):
        store_from_minari("fine/data-v0", existing)
    assert [p.name for p in existing.iterdir()] == ["mine.txt"]
    assert not (tmp_path / "d.zarr").exists()


def test_a_damaged_dataset_file_is_an_error_and_leaves_no_store(tmp_path: Path, datasets_root: Path) -> None:
    written("torn/file-v0", [episode(30, start=100.0 * i) for i in range(20)], VECTOR, gym.spaces.Discrete(3))
    data = datasets_root / "torn" / "file-v0" / "data"
    h5 = data / "main_data.hdf5"
    with open(h5, "r+b") as f:
        f.truncate(h5.stat().st_size // 2)  # a download or copy cut short
    with pytest.raises(CorruptStoreError, match="could not read the Minari dataset torn/file-v0"):
        store_from_minari("torn/file-v0", tmp_path / "t.zarr")
    (data / "metadata.json").write_text("{not json")
    with pytest.raises(ConfigError, match="could not read the Minari dataset at"):
        store_from_minari("torn/file-v0", tmp_path / "t.zarr")
    assert not (tmp_path / "t.zarr").exists() and left_beside(tmp_path / "t.zarr") == []


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    record("cartpole/cli-v0", gym.make("CartPole-v1"), 200)
    dst = tmp_path / "cli.zarr"
    assert main(["import-minari", "cartpole/cli-v0", str(dst), "--quiet"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"stored the Minari dataset cartpole/cli-v0 in {dst}:") and ", 200 moves" in line
    assert main(["export-minari", str(dst), "cli/back-v0", "--env", "CartPole-v1", "--quiet"]) == 0
    assert "wrote the Minari dataset cli/back-v0" in capsys.readouterr().out
    assert minari.load_dataset("cli/back-v0").total_steps == 200
    assert main(["import-minari", "cartpole/cli-v0", str(dst), "--quiet"]) == 1
    assert main(["import-minari", "cartpole/cli-v0", str(tmp_path / "n.zarr"), "--frame-stack", "four"]) == 1
    assert main(["export-minari", str(dst), "cli/back-v0", "--quiet"]) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(e.startswith("error: ") for e in errors)
    assert "already exists" in errors[0] and "--frame-stack is 'four'" in errors[1]


def test_a_dict_dataset_is_stored_and_exported_exactly(tmp_path: Path) -> None:
    """Goal-conditioned datasets (Minari's mazes observe dicts): recorded by Minari from a Dict env,
    stored with each step's dict packed into one frame, read and sampled back as dicts, exported again."""
    from goal_env import Reach

    data = record("reach/random-v0", Reach(limit=25), 400)
    path = tmp_path / "reach.zarr"
    report = store_from_minari("reach/random-v0", path)
    assert (report.episodes, report.moves, report.frame_stack) == (len(data), 400, 1)
    episodes = list(data.iterate_episodes())
    with ReplayStore.open(path) as store:
        assert store.observation_space == data.observation_space
        for i, ep in enumerate(episodes):
            got = store.episode(i)
            for key, values in ep.observations.items():
                assert got.obs[key].dtype == values.dtype and np.array_equal(got.obs[key], values), key
        at = where(store, data)
        batch = store.sample(64, rng=np.random.default_rng(0))
        for j, g in enumerate(batch.index):
            e, t = at[int(g)]
            for key, values in episodes[e].observations.items():
                assert np.array_equal(batch.obs[key][j, -1], values[t]) and np.array_equal(batch.next_obs[key][j, -1],
                                                                                           values[t + 1])
    with pytest.raises(ConfigError, match="Dict observations, which are stored whole"):
        store_from_minari("reach/random-v0", tmp_path / "other.zarr", frame_stack=4)
    space = gym.spaces.Dict({"pos": VECTOR, "goal": VECTOR})
    eps = [{**episode(n), "obs": {"pos": episode(n)["obs"], "goal": episode(n)["obs"][:1].repeat(n + 1, 0)}} for n in (3, 4)]
    eps[1]["obs"]["goal"] = eps[1]["obs"]["goal"][:-1]  # one goal short
    written("dict/short-v0", eps, space, gym.spaces.Discrete(3))
    with pytest.raises(InvalidTransitionError, match=r"episode 1 \(4 moves\): observations\['goal'\] has shape \(4, 3\)"):
        store_from_minari("dict/short-v0", tmp_path / "short.zarr")
    assert not (tmp_path / "short.zarr").exists() and left_beside(tmp_path / "short.zarr") == []
    out = minari_from_store(path, "replaystore/reach/back-v0")
    assert (out.episodes, out.moves, out.observation_shape) == (len(data), 400, ())
    back = minari.load_dataset("replaystore/reach/back-v0")
    assert back.observation_space == data.observation_space
    for a, b in zip(episodes, back.iterate_episodes(), strict=True):
        assert all(np.array_equal(a.observations[k], b.observations[k]) for k in a.observations)


# -------------------------------------------------------------------------------------------------
# Infos


def reported(t: int) -> dict:
    """Infos of numbers (kept), a nested dict and a string (left out)."""
    return {"t": np.int64(t), "even": t % 2 == 0, "pole": np.full(2, t / 4, np.float32), "nested": {"a": np.int64(t)},
            "word": "x" * (t % 3 + 1)}


def reporting() -> gym.Env:
    return Reporting(gym.make("CartPole-v1"), reported, at_reset=True)


def test_infos_are_kept_as_extras_and_exported_back(tmp_path: Path) -> None:
    data = record("cartpole/infos-v0", reporting(), 300, record_infos=True)
    episodes = list(data.iterate_episodes())
    path = tmp_path / "infos.zarr"
    report = store_from_minari("cartpole/infos-v0", path)
    assert report.infos == ("even", "pole", "t")
    assert any(left.startswith("nested (a nested dict") for left in report.infos_left)
    assert any(left.startswith("word (dtype") for left in report.infos_left)
    with ReplayStore.open(path) as store:
        for i, ep in enumerate(episodes):  # move t keeps the info its step returned, infos[t + 1]
            got = store.episode(i).extras
            np.testing.assert_array_equal(got["t"], ep.infos["t"][1:])
            np.testing.assert_array_equal(got["pole"], ep.infos["pole"][1:])
            np.testing.assert_array_equal(got["even"], ep.infos["even"][1:])
        batch = store.sample(64, rng=np.random.default_rng(0))
        at = where(store, data)
        for j, g in enumerate(batch.index):
            e, t = at[int(g)]
            assert batch.extras["t"][j] == episodes[e].infos["t"][t + 1] == t + 1
    minari_from_store(path, "replaystore/cartpole/infos-back-v0")
    back = list(minari.load_dataset("replaystore/cartpole/infos-back-v0").iterate_episodes())
    for a, b in zip(episodes, back, strict=True):
        assert sorted(b.infos) == ["even", "pole", "t"]
        np.testing.assert_array_equal(b.infos["t"][1:], a.infos["t"][1:])
        np.testing.assert_array_equal(b.infos["pole"], np.concatenate([[[0, 0]], a.infos["pole"][1:]]))
        assert b.infos["t"][0] == 0  # the reset's info is not kept
    assert store_from_minari("cartpole/infos-v0", tmp_path / "none.zarr", infos=False).infos == ()
    assert store_from_minari("cartpole/infos-v0", tmp_path / "t.zarr", infos=["t"]).infos == ("t",)
    with pytest.raises(ConfigError, match="'word' cannot be kept: dtype"):
        store_from_minari("cartpole/infos-v0", tmp_path / "w.zarr", infos=["t", "word"])
    with pytest.raises(ConfigError, match=r"infos names \['lives'\]"):
        store_from_minari("cartpole/infos-v0", tmp_path / "l.zarr", infos=["lives"])
    assert not (tmp_path / "w.zarr").exists() and not (tmp_path / "l.zarr").exists()


def test_the_command_line_keeps_the_infos_it_is_told(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    record("cartpole/cli-infos-v0", reporting(), 60, seed=1, record_infos=True)
    assert main(["import-minari", "cartpole/cli-infos-v0", str(tmp_path / "a.zarr"), "--quiet"]) == 0
    said = capsys.readouterr().out
    assert "infos kept as extras: even, pole, t; left out: nested (a nested dict), word (dtype" in said
    assert main(["import-minari", "cartpole/cli-infos-v0", str(tmp_path / "b.zarr"), "--infos", "t", "--quiet"]) == 0
    assert "infos kept as extras: t\n" in capsys.readouterr().out
    assert main(["import-minari", "cartpole/cli-infos-v0", str(tmp_path / "c.zarr"), "--no-infos", "--quiet"]) == 0
    assert "infos kept as extras: none\n" in capsys.readouterr().out
    assert ReplayStore.open(tmp_path / "c.zarr").schema.extras == ()
