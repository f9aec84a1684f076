"""Nested observation spaces (format/nesting.py): a Dict of Dicts (Minari's kitchen datasets), a
Tuple (Blackjack), and the two inside each other are kept as the flat Dict of their leaves and given
back in their own structure: by ``sample``, ``episode``, ``blocks``, tf.data and JAX, after a reopen,
``compact`` and a Minari round trip; ``inspect`` shows the structure, ``.npz`` names each leaf by its
path. A value of another structure, a space that cannot be kept and damaged attributes are refused,
naming the place, with the store as it was; SB3 says what to flatten.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import snapshot

from replaystore import ConfigError, CorruptStoreError, HindsightSampler, InvalidTransitionError, Layout, ReplayStore


def box(*shape: int, dtype: Any = np.float32) -> gym.spaces.Box:
    return gym.spaces.Box(-5, 5, shape, dtype)


SPACES = {
    "dict-of-dicts": gym.spaces.Dict({"observation": box(5), "achieved_goal": gym.spaces.Dict(
        {"kettle": box(7), "light switch": box(2, dtype=np.float64)}), "desired_goal": gym.spaces.Dict(
        {"kettle": box(7), "light switch": box(2, dtype=np.float64)})}),
    "tuple": gym.spaces.Tuple((gym.spaces.Discrete(32), gym.spaces.Discrete(11), gym.spaces.Discrete(2))),
    "tuple-in-dict": gym.spaces.Dict({"pos": box(2), "cards": gym.spaces.Tuple((gym.spaces.Discrete(4, start=1),
                                                                                gym.spaces.MultiBinary(3)))}),
    "dict-in-tuple": gym.spaces.Tuple((box(3, 2), gym.spaces.Dict({"a": gym.spaces.MultiDiscrete([2, 5]),
                                                                   "b": gym.spaces.Tuple((box(1),))}))),
}


def leaves(value: Any, path: str = "") -> dict[str, np.ndarray]:
    """A nested value's arrays by their paths (the structure's own walk, for comparing)."""
    if isinstance(value, dict):
        out: dict[str, np.ndarray] = {}
        for key, item in value.items():
            out.update(leaves(item, f"{path}/{key}"))
        return out
    if isinstance(value, tuple):
        out = {}
        for i, item in enumerate(value):
            out.update(leaves(item, f"{path}/{i}"))
        return out
    return {path: np.asarray(value)}


def structure(value: Any) -> Any:
    """The shape of a nested value without its arrays: dict keys in order, tuple lengths."""
    if isinstance(value, dict):
        return ("dict", tuple((key, structure(item)) for key, item in value.items()))
    if isinstance(value, tuple):
        return ("tuple", tuple(structure(item) for item in value))
    return "leaf"


def filled(path: Path, space: gym.Space, moves: int = 60, *, frame_stack: int = 2, capacity: int = 200
           ) -> tuple[ReplayStore, list[Any]]:
    """A store of ``moves`` random observations of ``space`` (an episode ends every 7), and them."""
    store = ReplayStore.create(path, capacity, space, gym.spaces.Discrete(3), frame_stack, layout=Layout(shard_len=16))
    space.seed(0)
    seen = [space.sample()]
    for t in range(moves):
        seen.append(space.sample())
        store.add(seen[t], t % 3, float(t), seen[t + 1], t % 7 == 6, False)
    store.flush()
    return store, seen


@pytest.mark.parametrize("name", SPACES)
def test_kept_and_given_back_in_their_structure(tmp_path: Path, name: str) -> None:
    space = SPACES[name]
    store, seen = filled(tmp_path / "s.zarr", space)
    store.close()
    for path in (tmp_path / "s.zarr", tmp_path / "copy.zarr"):
        if path.name == "copy.zarr":
            subprocess.run([sys.executable, "-m", "replaystore.cli", "compact", str(tmp_path / "s.zarr"), str(path)],
                           check=True, capture_output=True)
        with ReplayStore.open(path) as store:
            assert store.observation_space == space
            episode = store.episode(1)  # moves 7..13: observations 7..14
            assert structure(episode.obs) == structure(seen[0])
            for key, values in leaves(episode.obs).items():
                np.testing.assert_array_equal(values, np.stack([leaves(o)[key] for o in seen[7:15]]), err_msg=key)
            batch = store.sample(20, rng=np.random.default_rng(1))
            assert structure(batch.obs) == structure(seen[0]) == structure(batch.next_obs)
            for j, move in enumerate(batch.action.tolist()):
                t = int(batch.reward[j])  # (the reward is the move's number)
                assert move == t % 3
                for key, values in leaves(batch.obs).items():
                    np.testing.assert_array_equal(values[j, -1], leaves(seen[t])[key])
                for key, values in leaves(batch.next_obs).items():
                    np.testing.assert_array_equal(values[j, -1], leaves(seen[t + 1])[key])


def test_the_feeds_give_the_structure(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    jax = pytest.importorskip("jax")
    space = SPACES["tuple-in-dict"]
    store, seen = filled(tmp_path / "s.zarr", space)
    want = structure(seen[0])
    block = next(iter(store.blocks(4, batches_per_block=2, threads=1)))
    assert structure(block["obs"]) == want and leaves(block["obs"])["/cards/1"].shape == (2, 4, 2, 3)
    dataset = store.as_dataset(4, batches_per_call=2, threads=1)
    spec = dataset.element_spec["obs"]["cards"][0]
    assert (spec.shape, spec.dtype) == ((4, 2), tf.int64)
    for element in [next(iter(dataset)), *dataset.take(1)]:  # (the fast iterator, and tf.data's own)
        obs = tf.nest.map_structure(np.asarray, element["obs"])
        assert structure(obs) == want
        for j, t in enumerate(np.asarray(element["reward"]).astype(int).tolist()):
            for key, values in leaves(obs).items():
                np.testing.assert_array_equal(values[j, -1], leaves(seen[t])[key])
    dataset.prefetcher.close()
    blocks = store.as_dataset(4, batches_per_call=2, threads=1, blocks=True)
    assert structure(tf.nest.map_structure(np.asarray, next(iter(blocks))["obs"])) == want
    blocks.prefetcher.close()
    device = next(iter(store.jax_blocks(4, batches_per_block=2, threads=1)))
    assert structure(jax.tree_util.tree_map(np.asarray, device["obs"])) == want
    store.close()


@pytest.mark.parametrize(("name", "wrong", "message"), [
    ("dict-of-dicts", lambda o: {**o, "achieved_goal": {"kettle": o["achieved_goal"]["kettle"]}},
     r"obs\['achieved_goal'\] has the keys \['kettle'\].*missing \['light switch'\]"),
    ("dict-of-dicts", lambda o: {**o, "achieved_goal": o["achieved_goal"]["kettle"]},
     r"obs\['achieved_goal'\] is a ndarray, but .* stores a Dict there"),
    ("tuple", lambda o: o[:2], r"obs is a tuple of 2, but .* stores a Tuple of 3 there"),
    ("tuple", lambda o: (40, *o[1:]), r"obs\['0'\] holds 40, outside the 0..31 of its space"),
    ("tuple-in-dict", lambda o: {**o, "cards": (o["cards"][0], np.array([0, 2, 1], np.int8))},
     r"obs\['cards/1'\] holds 2, outside the 0..1"),
    ("dict-in-tuple", lambda o: (o[0], {**o[1], "b": o[1]["b"][0]}), r"obs\[1\]\['b'\] is a ndarray, but .* Tuple of 1"),
])
def test_another_structure_is_refused_and_nothing_changes(tmp_path: Path, name: str, wrong: Any, message: str) -> None:
    store, seen = filled(tmp_path / "s.zarr", SPACES[name], moves=20)
    before, size = snapshot(tmp_path / "s.zarr"), len(store)
    with pytest.raises(InvalidTransitionError, match=message):
        store.add(wrong(seen[-1]), 0, 0.0, seen[-1], False, False)
    with pytest.raises(InvalidTransitionError, match=message):  # (a batch: the obs of its first row)
        store.add_batch(wrong_rows(wrong, seen[-1]), np.zeros(1, np.int64), np.zeros(1), stack_rows(seen[-1]),
                        np.zeros(1, bool), np.zeros(1, bool))
    store.flush()
    assert len(store) == size and snapshot(tmp_path / "s.zarr") == before
    store.close()


def stack_rows(value: Any) -> Any:
    """One observation as a batch of one row (each leaf with a leading axis of 1)."""
    if isinstance(value, dict):
        return {key: stack_rows(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(stack_rows(item) for item in value)
    return np.asarray(value)[None]


def wrong_rows(wrong: Any, value: Any) -> Any:
    return stack_rows(wrong(value)) if not isinstance(value, tuple) or len(wrong(value)) == len(value) else wrong(
        stack_rows(value))


@pytest.mark.parametrize(("space", "message"), [
    (gym.spaces.Dict({"a": gym.spaces.Dict({"b": gym.spaces.Dict({"c": gym.spaces.Dict({"d": gym.spaces.Dict({
        "e": gym.spaces.Dict({"f": gym.spaces.Dict({"g": gym.spaces.Dict({"h": box(1)})})})})})})})}),
     "nests deeper than 8 levels"),
    (gym.spaces.Dict({"a": gym.spaces.Dict({}), "b": box(1)}), r"observation_space\['a'\] is an empty Dict"),
    (gym.spaces.Dict({"a/b": box(1), "a": gym.spaces.Dict({"b": box(1)})}), "two entries at the path 'a/b'"),
    (gym.spaces.Dict({"a": gym.spaces.Tuple((box(1), gym.spaces.Text(5)))}), r"observation_space\['a/1'\] is Text"),
])
def test_spaces_that_cannot_be_kept_are_refused(tmp_path: Path, space: gym.Space, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ReplayStore.create(tmp_path / "x.zarr", 64, space, gym.spaces.Discrete(2))
    assert not (tmp_path / "x.zarr").exists()


def deep(levels: int) -> dict:
    node: dict = {"type": "Box", "shape": [1], "dtype": "float32", "low": 0, "high": 1}
    for _ in range(levels):
        node = {"type": "Tuple", "spaces": [node]}
    return node


def wide(nodes: int) -> dict:
    """``nodes`` Tuples of 250 Boxes each (each within the 256 a level may hold, not in all)."""
    box = {"type": "Box", "shape": [1], "dtype": "float32", "low": 0, "high": 1}
    return {"type": "Tuple", "spaces": [{"type": "Tuple", "spaces": [box] * 250} for _ in range(nodes)]}


@pytest.mark.parametrize(("damage", "message"), [
    (lambda o: o.update(deep(200)), r"observation_space.spaces\[0\](.spaces\[0\]){7} nests deeper than 8 levels"),
    (lambda o: o.update(wide(200)), "holds more than 256 entries"),
    (lambda o: o["spaces"][1]["spaces"].append(["a", {"type": "Box", "shape": [1], "dtype": "float32", "low": 0,
                                                       "high": 1}]), "names a key twice"),
    (lambda o: o["spaces"][1].__setitem__("type", "Graph"), r"observation_space.spaces\[1\] is .*Graph"),
    (lambda o: o["spaces"][1].__setitem__("spaces", {}),
     r"observation_space.spaces\[1\].spaces is \{\} \(dict\), expected list"),
    (lambda o: o["spaces"][1]["spaces"].clear(), r"spaces\[1\].spaces holds 0 entries"),
    (lambda o: o["spaces"][1]["spaces"][1][1]["spaces"].append(5), r"spaces\[1\].spaces\[1\].spaces\[1\] is 5"),
], ids=["200-levels", "50k-leaves", "key-twice", "graph", "spaces-a-dict", "no-entries", "entry-a-number"])
def test_damaged_or_hostile_attributes_are_named(tmp_path: Path, damage: Any, message: str) -> None:
    """A damaged nested space in zarr.json is named where it is wrong; one that nests 200 levels deep
    or holds 50,000 leaves is refused after looking at a few hundred of them."""
    store, _ = filled(tmp_path / "s.zarr", SPACES["dict-in-tuple"], moves=10, frame_stack=1)
    store.close()
    meta = tmp_path / "s.zarr" / "zarr.json"
    doc = json.loads(meta.read_text())
    damage(doc["attributes"]["replaystore"]["schema"]["observation_space"])
    meta.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError, match=message):
        ReplayStore.open(tmp_path / "s.zarr")


def test_inspect_shows_the_structure_and_npz_names_each_leaf(tmp_path: Path) -> None:
    store, seen = filled(tmp_path / "s.zarr", SPACES["dict-in-tuple"], moves=20)
    store.close()
    run = [sys.executable, "-m", "replaystore.cli"]
    text = subprocess.run([*run, "inspect", str(tmp_path / "s.zarr")], capture_output=True, text=True, check=True).stdout
    assert "Tuple(float32(3, 2), Dict(a: MultiDiscrete(2,), b: Tuple(float32(1,))))" in text
    info = json.loads(subprocess.run([*run, "inspect", str(tmp_path / "s.zarr"), "--json"], capture_output=True,
                                     text=True, check=True).stdout)
    obs = info["schema"]["observation_space"]
    assert obs["type"] == "Tuple" and list(obs["spaces"]) == ["0", "1/a", "1/b/0"] and obs["structure"].startswith("Tuple(")
    subprocess.run([*run, "episodes", str(tmp_path / "s.zarr"), "--save", "1", str(tmp_path / "e.npz")], check=True,
                   capture_output=True)
    saved = np.load(tmp_path / "e.npz")
    np.testing.assert_array_equal(saved["obs.1/a"], np.stack([o[1]["a"] for o in seen[7:15]]))
    np.testing.assert_array_equal(saved["obs.1/b/0"], np.stack([o[1]["b"][0] for o in seen[7:15]]))


class Kitchen(gym.Env):
    """Minari's kitchen datasets' shape of observation: goals as a Dict of one Box per object."""

    def __init__(self) -> None:
        goals = gym.spaces.Dict({"kettle": box(7, dtype=np.float64), "microwave": box(1, dtype=np.float64)})
        self.observation_space = gym.spaces.Dict({"achieved_goal": goals, "desired_goal": goals,
                                                  "observation": box(4, dtype=np.float64)})
        self.action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action: int) -> tuple[dict, float, bool, bool, dict]:
        self.t += 1
        return self.observation_space.sample(), float(action), self.t % 9 == 0, False, {}


@pytest.mark.parametrize("env", ["kitchen", "blackjack"])
def test_a_minari_dataset_of_nested_observations_round_trips(tmp_path: Path, datasets_root: Path, env: str) -> None:
    minari = pytest.importorskip("minari")
    from minari_data import record

    from replaystore.integrations.minari import minari_from_store, store_from_minari

    data = record(f"{env}/random-v0", Kitchen() if env == "kitchen" else gym.make("Blackjack-v1"), 200)
    store_from_minari(f"{env}/random-v0", tmp_path / "k.zarr")
    with ReplayStore.open(tmp_path / "k.zarr") as store:
        assert store.observation_space == data.observation_space
        batch = store.sample(8)
        assert structure(batch.obs) == structure(next(iter(data.iterate_episodes())).observations)
    minari_from_store(tmp_path / "k.zarr", f"{env}/back-v0")
    back = minari.load_dataset(f"{env}/back-v0")
    assert back.observation_space == data.observation_space
    for a, b in zip(data.iterate_episodes(), back.iterate_episodes(), strict=True):
        assert structure(a.observations) == structure(b.observations)
        for (key, x), (_, y) in zip(leaves(a.observations).items(), leaves(b.observations).items(), strict=True):
            assert x.dtype == y.dtype and np.array_equal(x, y), key


def test_hindsight_relabels_a_nested_goal_leaf_for_leaf(tmp_path: Path) -> None:
    """The kitchen datasets' goals (a Dict of one Box per object): every leaf of ``desired_goal`` is
    replaced by the same leaf of a later ``achieved_goal`` of the episode, and ``compute_reward`` gets
    both goals as dicts of ``(m, ...)`` arrays; goals of different structures are refused."""
    store, seen = filled(tmp_path / "s.zarr", SPACES["dict-of-dicts"], moves=60, frame_stack=2)
    calls: list[tuple[Any, Any]] = []

    def compute_reward(achieved: Any, desired: Any, infos: list) -> np.ndarray:
        calls.append((achieved, desired))
        return -np.abs(achieved["kettle"] - desired["kettle"]).sum(axis=-1)

    batch = store.sample(40, sampler=HindsightSampler(compute_reward), rng=np.random.default_rng(3))
    rows = np.flatnonzero(batch.relabelled)
    assert rows.size == 32 and len(calls) == 1
    achieved, desired = calls[0]
    assert set(achieved) == {"kettle", "light switch"} and achieved["light switch"].shape == (32, 2)
    assert achieved["light switch"].dtype == np.float64
    for j, row in enumerate(rows.tolist()):
        goal = {key: batch.obs["desired_goal"][key][row, -1] for key in ("kettle", "light switch")}
        later = [o for o in seen if all(np.array_equal(o["achieved_goal"][k], v) for k, v in goal.items())]
        assert later, "a relabelled goal is some step's achieved_goal, every leaf from the same step"
        for key in goal:  # the same goal in both stacks' frames, and handed to compute_reward
            np.testing.assert_array_equal(batch.next_obs["desired_goal"][key][row, -1], goal[key])
            np.testing.assert_array_equal(desired[key][j], goal[key])
        np.testing.assert_allclose(batch.reward[row], -np.abs(achieved["kettle"][j] - desired["kettle"][j]).sum(),
                                   rtol=1e-6)
    store.close()
    other = gym.spaces.Dict({"achieved_goal": gym.spaces.Dict({"kettle": box(7)}),
                             "desired_goal": gym.spaces.Dict({"kettle": box(6)})})
    with ReplayStore.create(tmp_path / "o.zarr", 64, other, gym.spaces.Discrete(2)) as odd, \
            pytest.raises(ConfigError, match="'achieved_goal' and 'desired_goal' differ in Dict"):
        odd.sample(4, sampler=HindsightSampler(compute_reward))


def test_what_takes_flat_dicts_only_says_what_to_flatten(tmp_path: Path) -> None:
    """SB3's policies take flat Dicts only; the Keras DQN takes the structure (test_trainer_nested.py),
    and says so to a model of one array."""
    store, _ = filled(tmp_path / "s.zarr", SPACES["dict-of-dicts"], moves=30, frame_stack=1)
    store.close()
    pytest.importorskip("keras")
    from replaystore.trainer import DQN, TrainerError, mlp

    with pytest.raises(TrainerError, match="cannot take the store's stacks, batches of \\{achieved_goal: \\{kettle: "
                                           ".*observation: .*that structure of stacks"):
        DQN(mlp((1, 5), 3), tmp_path / "s.zarr").fit_offline(10)
    pytest.importorskip("stable_baselines3")
    from replaystore.integrations.sb3 import ReplayStoreBuffer

    with pytest.raises(ConfigError, match="SB3's policies take a Dict .* not a nested Dict or a Tuple"):
        ReplayStoreBuffer(100, SPACES["dict-of-dicts"], gym.spaces.Discrete(3), path=tmp_path / "sb3.zarr")


def test_a_vector_env_of_tuples_writes_one_stream_each(tmp_path: Path) -> None:
    """Blackjack's Tuple observations from a vector env (each leaf ``(n,)`` rows), with next-step
    autoreset: every sampled transition is a move the env made, in its structure."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("Blackjack-v1")] * 3)
    store = ReplayStore.create(tmp_path / "b.zarr", 300, envs.single_observation_space, envs.single_action_space,
                               num_streams=3)
    obs, _ = envs.reset(seed=0)
    seen: set[tuple[int, ...]] = set()
    for _ in range(80):
        actions = envs.action_space.sample()
        nxt, reward, terminated, truncated, info = envs.step(actions)
        store.add_batch(obs, actions, reward, nxt, terminated, truncated, info, env_done=terminated | truncated)
        seen.update(tuple(int(leaf[i]) for leaf in obs) for i in range(3))
        obs = nxt
    store.flush()
    batch = store.sample(40, rng=np.random.default_rng(0))
    assert isinstance(batch.obs, tuple) and len(batch.obs) == 3 and batch.obs[0].shape == (40, 1)
    for j in range(40):
        assert tuple(int(leaf[j, -1]) for leaf in batch.obs) in seen
    assert store.observation_space == envs.single_observation_space
    store.close()
