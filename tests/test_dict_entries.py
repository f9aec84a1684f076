"""Dict observations with ``Discrete`` and ``MultiBinary`` entries (format/dictobs.py): stored as int64
and int8 values beside the Box entries, given back bit for bit with the env's space, checked to lie in
their space, described by ``inspect``, moved through Minari; SB3's own ``BitFlippingEnv`` (both of its
Dict spaces) with ``ReplayStoreHerBuffer``."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from goal_env import Rooms

from replaystore import CorruptStoreError, InvalidTransitionError, ReplayStore


def _run(store: ReplayStore, env: gym.Env, moves: int, seed: int = 0) -> list[list[dict]]:
    """``moves`` random moves into ``store``; every episode's observations as the env gave them."""
    episodes: list[list[dict]] = []
    obs, _ = env.reset(seed=seed)
    episodes.append([obs])
    rng = np.random.default_rng(seed)
    for _ in range(moves):
        action = int(rng.integers(0, 8))
        nxt, reward, terminated, truncated, _ = env.step(action)
        store.add(obs, action, reward, nxt, terminated, truncated)
        episodes[-1].append(nxt)
        obs = nxt
        if terminated or truncated:
            obs, _ = env.reset()
            episodes.append([obs])
    return episodes


def test_entries_round_trip_with_the_space(tmp_path) -> None:
    env = Rooms(limit=9)
    path = tmp_path / "rooms.zarr"
    with ReplayStore.create(path, 500, env.observation_space, env.action_space, 2) as store:
        episodes = _run(store, env, 60)
    with ReplayStore.open(path) as store:
        assert store.observation_space == env.observation_space  # Discrete(5, start=1), MultiBinary([2, 3])
        for i, recorded in enumerate(e for e in episodes if len(e) > 1):
            got = store.episode(i)
            for key in ("pos", "room", "lights", "doors"):
                want = np.stack([np.asarray(o[key]) for o in recorded[: len(got.obs[key])]])
                assert np.array_equal(got.obs[key], want), key
            assert got.obs["room"].dtype == np.int64 and got.obs["lights"].dtype == np.int8
        batch = store.sample(16, rng=np.random.default_rng(0))
        assert batch.obs["room"].shape == (16, 2) and batch.obs["lights"].shape == (16, 2, 2, 3)
        assert ((batch.obs["room"] >= 1) & (batch.obs["room"] <= 5)).all()
        assert env.observation_space["lights"].contains(batch.next_obs["lights"][0, -1])


@pytest.mark.parametrize(("key", "value", "message"), [
    ("room", 0, r"obs\['room'\] holds 0, outside the 1\.\.5 of its space"),
    ("room", 6, r"obs\['room'\] holds 6, outside the 1\.\.5"),
    ("lights", np.array([[0, 2, 0], [1, 1, 1]], np.int8), r"obs\['lights'\] holds 2, outside the 0\.\.1"),
    ("lights", np.zeros(6, np.int8), r"obs\['lights'\] has shape \((1, )?6,?\)"),
    ("room", 2.0, r"obs\['room'\] has dtype float64, but .* stores int64"),
    ("doors", np.array([2, 0]), r"obs\['doors'\] holds 0, outside the 1\.\.2 of its space"),
    ("doors", np.array([3, 1]), r"obs\['doors'\] holds 3, outside the 0\.\.2"),
])
def test_values_outside_their_space_are_refused(tmp_path, key, value, message) -> None:
    env = Rooms()
    store = ReplayStore.create(tmp_path / "r.zarr", 100, env.observation_space, env.action_space)
    _run(store, env, 5)
    store.flush()
    before = len(store), sorted(p.name for p in (tmp_path / "r.zarr").rglob("*"))
    obs, _ = env.reset(seed=1)
    bad = {**obs, key: value}
    with pytest.raises(InvalidTransitionError, match=message):
        store.add(bad, 0, 0.0, obs, False, False)
    with pytest.raises(InvalidTransitionError, match=message.replace("obs", "next_obs", 1)):
        store.add_batch({k: np.asarray(v)[None] for k, v in obs.items()}, np.array([0]), np.array([0.0]),
                        {k: np.asarray(v)[None] for k, v in bad.items()}, np.array([False]), np.array([False]))
    assert (len(store), sorted(p.name for p in (tmp_path / "r.zarr").rglob("*"))) == before


def test_inspect_and_damaged_attributes(tmp_path) -> None:
    env = Rooms()
    path = tmp_path / "r.zarr"
    with ReplayStore.create(path, 100, env.observation_space, env.action_space) as store:
        _run(store, env, 20)
    cli = [sys.executable, "-m", "replaystore.cli"]
    text = subprocess.run([*cli, "inspect", str(path)], capture_output=True, text=True, check=True).stdout
    assert ("Dict(doors: MultiDiscrete(2,), lights: MultiBinary(2, 3), pos: float32(2,), room: Discrete(5, start=1))"
            in text)
    summary = json.loads(subprocess.run([*cli, "inspect", "--json", str(path)], capture_output=True, text=True,
                                        check=True).stdout)
    spaces = summary["schema"]["observation_space"]["spaces"]
    assert spaces["room"] == {"type": "Discrete", "n": 5, "start": 1, "shape": [], "dtype": "int64"}
    assert spaces["lights"] == {"type": "MultiBinary", "n": [2, 3], "shape": [2, 3], "dtype": "int8"}
    assert spaces["doors"] == {"type": "MultiDiscrete", "shape": [2], "nvec": [3, 2], "start": [0, 1], "dtype": "int64"}
    meta = path / "zarr.json"
    doc = json.loads(meta.read_text())
    entries = doc["attributes"]["replaystore"]["schema"]["observation_space"]["spaces"]
    assert entries[1] == ["lights", {"type": "MultiBinary", "n": [2, 3]}]
    entry = entries[3]
    assert entry == ["room", {"type": "Discrete", "n": 5, "start": 1}]
    doors = entries[0]
    assert doors == ["doors", {"type": "MultiDiscrete", "shape": [2], "nvec": [3, 2], "start": [0, 1], "dtype": "int64"}]
    doors[1]["nvec"] = [3]
    meta.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError, match=r"spaces\[0\]\.nvec is \[3\], expected 2 ints"):
        ReplayStore.open(path)
    doors[1]["nvec"] = [3, 2]
    entry[1]["type"] = "Graph"
    meta.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError, match=r"spaces\[3\] is .*Graph.*written by a newer replaystore"):
        ReplayStore.open(path)


@pytest.mark.usefixtures("datasets_root")
def test_minari_round_trip(tmp_path) -> None:
    pytest.importorskip("minari")
    import minari
    from minari_data import record

    from replaystore.integrations.minari import minari_from_store, store_from_minari

    data = record("rooms/random-v0", Rooms(limit=10), 120)
    path = tmp_path / "rooms.zarr"
    store_from_minari("rooms/random-v0", path)
    with ReplayStore.open(path) as store:
        assert store.observation_space == data.observation_space
    minari_from_store(path, "replaystore/rooms/back-v0")
    back = minari.load_dataset("replaystore/rooms/back-v0")
    assert back.observation_space == data.observation_space
    for a, b in zip(data.iterate_episodes(), back.iterate_episodes(), strict=True):
        assert all(np.array_equal(a.observations[k], b.observations[k]) for k in a.observations)


@pytest.mark.parametrize("discrete_obs_space", [False, True], ids=["MultiBinary", "Discrete"])
def test_sb3_bit_flipping_env_with_hindsight(tmp_path, discrete_obs_space) -> None:
    """SB3's own HER example env, as it is: its goals are MultiBinary (or Discrete) entries."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.envs import BitFlippingEnv

    from replaystore.integrations.sb3 import ReplayStoreHerBuffer

    env = BitFlippingEnv(n_bits=6, continuous=False, max_steps=6, discrete_obs_space=discrete_obs_space)
    model = DQN("MultiInputPolicy", env, learning_starts=100, buffer_size=5_000, seed=0, device="cpu",
                policy_kwargs={"net_arch": [64, 64]}, replay_buffer_class=ReplayStoreHerBuffer,
                replay_buffer_kwargs={"path": str(tmp_path / "bits.zarr"), "goal_selection_strategy": "future"})
    model.learn(800)
    batch = model.replay_buffer.sample(128)
    obs, nxt = batch.observations, batch.next_observations
    assert (obs["desired_goal"] == nxt["desired_goal"]).all()
    # the env's reward for the relabelled goal: 0 when the next state is the goal, else -1
    reached = (nxt["achieved_goal"] == nxt["desired_goal"]).reshape(128, -1).all(dim=1).numpy()
    assert np.array_equal(batch.rewards.numpy()[:, 0], np.where(reached, 0.0, -1.0))
    assert reached.mean() > 0.05  # relabelling made successes (random play almost never reaches a 6-bit goal)
    store = ReplayStore.open(tmp_path / "bits.zarr")
    assert store.observation_space == env.observation_space


@pytest.mark.usefixtures("datasets_root")
def test_minari_export_of_stacks(tmp_path) -> None:
    """A store of stacks of 2 exported with ``stacks=True``: each key stacked, a Discrete entry as
    gymnasium batches it (a MultiDiscrete), every stack what the agent saw."""
    pytest.importorskip("minari")
    import minari

    from replaystore.integrations.minari import minari_from_store

    env = Rooms(limit=6)
    path = tmp_path / "s.zarr"
    with ReplayStore.create(path, 200, env.observation_space, env.action_space, 2) as store:
        episodes = _run(store, env, 30)
    minari_from_store(path, "replaystore/rooms/stacks-v0", stacks=True)
    data = minari.load_dataset("replaystore/rooms/stacks-v0")
    assert data.observation_space["room"] == gym.spaces.MultiDiscrete([5, 5], start=[1, 1])
    assert data.observation_space["lights"] == gym.vector.utils.batch_space(env.observation_space["lights"], 2)
    for recorded, got in zip((e for e in episodes if len(e) > 1), data.iterate_episodes()):
        rooms = np.array([o["room"] for o in recorded])
        want = np.stack([rooms[np.maximum(np.arange(len(rooms)) - 1, 0)], rooms], axis=1)  # reset padding
        assert np.array_equal(got.observations["room"], want)
        assert data.observation_space.contains({k: v[0] for k, v in got.observations.items()})


def test_gif_of_an_image_entry(tmp_path, capsys) -> None:
    """``episodes --save FILE.gif``: a Dict store's one image entry (here the MultiBinary lights, 0/1
    shown as 0/255 from the space's bounds); a Dict without one is refused, naming what to do."""
    from goal_env import BitFlip
    from PIL import Image

    from replaystore.cli import main

    env = Rooms(limit=5)
    path = tmp_path / "rooms.zarr"
    with ReplayStore.create(path, 100, env.observation_space, env.action_space) as store:
        episodes = _run(store, env, 12)
    assert main(["episodes", str(path), "--save", "0", str(tmp_path / "r.gif")]) == 0
    with Image.open(tmp_path / "r.gif") as gif:
        assert np.array_equal(np.asarray(gif.convert("L")), episodes[0][0]["lights"].astype(np.uint8) * 255)
    bits = BitFlip(4)
    with ReplayStore.create(tmp_path / "bits.zarr", 100, bits.observation_space, bits.action_space) as store:
        obs, _ = bits.reset(seed=0)
        nxt, reward, terminated, truncated, _ = bits.step(0)
        store.add(obs, 0, reward, nxt, True, False)
    capsys.readouterr()
    assert main(["episodes", str(tmp_path / "bits.zarr"), "--save", "0", str(tmp_path / "b.gif")]) == 1
    assert "which entry to show: none is an image, so save the episode as .npz" in capsys.readouterr().err


def test_one_frame_with_a_scalar_entry_unpacks() -> None:
    """A single frame (no leading axis) of a Dict with a Discrete entry: its value is a 0-d array (the
    comparisons of one observation with another unpack single frames)."""
    from replaystore.format.dictobs import dict_from_space

    spec = dict_from_space(Rooms().observation_space)
    obs, _ = Rooms().reset(seed=0)
    one = spec.unpack(spec.pack(obs, name="obs", path="p"))
    assert one["room"].shape == () and int(one["room"]) == obs["room"]
    assert np.array_equal(one["lights"], obs["lights"]) and np.array_equal(one["doors"], obs["doors"])
