"""The Keras DQN on nested Dict and Tuple observations (format/nesting.py).

The agent's stacks keep the space's structure, dicts and tuples with a stack at each leaf, exactly
as ``store.sample`` returns them (checked leaf for leaf); ``dict_mlp`` takes them (one
``keras.Input`` at each leaf); a nested goal is relabelled leaf for leaf and 8-bit flipping is
learned with it (not without); ``agent.json`` keeps the structure; ``replaystore-train`` learns
Blackjack (a Tuple of three Discrete) and ``load_run`` acts on a tuple. A model that takes one
array, goals of two structures and a damaged structure in ``agent.json`` are refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import keras
import numpy as np
import pytest
from goal_env import NestedBitFlip, Rooms

from replaystore import ReplayStore
from replaystore.trainer import DQN, TrainerError, dict_mlp, load_run, mlp
from replaystore.trainer.cli import main
from replaystore.trainer.stacks import StackSpec, push_frames, stacks_of, tree_map


def box(*shape: int, dtype: Any = np.float32) -> gym.spaces.Box:
    return gym.spaces.Box(-5, 5, shape, dtype)


#: A Tuple inside a Dict and a Dict inside a Tuple, with leaves of every kind the store keeps.
SPACE = gym.spaces.Dict({"pos": box(2), "cards": gym.spaces.Tuple((
    gym.spaces.Discrete(4, start=1), gym.spaces.Dict({"seen": gym.spaces.MultiBinary(3), "d": box(2, 2, dtype=np.int16)})))})


class Sampled(gym.Env):
    """Observations drawn from ``space``; episodes of 3 to 9 moves."""

    def __init__(self, space: Any = SPACE) -> None:
        self.observation_space, self.action_space = space, gym.spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        self.left = int(self.np_random.integers(3, 10))
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.left -= 1
        return self.observation_space.sample(), float(action), self.left == 0, False, {}


def leaf_arrays(spec: StackSpec, value: Any) -> list[np.ndarray]:
    leaves = spec.leaves(value)
    assert leaves is not None
    return [np.asarray(v) for v in leaves.values()]


@pytest.mark.parametrize("env", [Sampled(), Rooms()], ids=["nested", "flat-dict"])
def test_the_agents_stacks_are_the_stores(tmp_path: Path, env: gym.Env) -> None:
    """What the agent stacks at every step, leaf by leaf (key by key), is what ``sample`` returns for
    that move."""
    spec = StackSpec.of_space(env.observation_space, 3)
    if isinstance(env, Sampled):
        assert spec.tree is not None and spec.keys == ("cards/0", "cards/1/d", "cards/1/seen", "pos")
        assert spec.describe() == "{cards: ((3,) int64, {d: (3, 2, 2) int16, seen: (3, 3) int8}), pos: (3, 2) float32}"
    store = ReplayStore.create(tmp_path / "n.zarr", 512, env.observation_space, env.action_space, 3)
    seen: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    obs, _ = env.reset(seed=0)
    batch_of = lambda tree: tree_map(lambda f: np.asarray(f)[None], tree)  # noqa: E731 - one env's frames as a batch of one
    stacks = stacks_of(batch_of(obs), 3)
    for step in range(300):
        nxt, reward, terminated, truncated, _ = env.step(step % 3)
        before = [a[0].copy() for a in leaf_arrays(spec, stacks)]
        store.add(obs, step % 3, reward, nxt, terminated, truncated)
        pushed = [np.concatenate([a[1:], f[None]]) for a, f in zip(before, leaf_arrays(spec, nxt), strict=True)]
        seen[(store.added - 2) % store.capacity] = (before, pushed)
        if terminated or truncated:
            obs, _ = env.reset()
            push_frames(stacks, batch_of(obs), np.array([True]))
        else:
            push_frames(stacks, batch_of(nxt), np.array([False]))
            obs = nxt
    batch = store.sample(200, rng=np.random.default_rng(1))
    for i, slot in enumerate(batch.index):
        for stacks, wanted in zip((batch.obs, batch.next_obs), seen[int(slot)], strict=True):
            row = keras.tree.map_structure(lambda a, i=i: a[i], stacks)
            for got, want in zip(leaf_arrays(spec, row), wanted, strict=True):
                np.testing.assert_array_equal(got, want)
    store.close()


@pytest.mark.slow  # ~15 s of learning; the default run checks nested stacks against the store (test_the_agents_stacks_are_the_stores)
def test_a_nested_goal_is_relabelled_and_learned_saved_loaded_and_acted_on(tmp_path: Path) -> None:
    """8-bit flipping with goals nested a level down, on two envs: learned with HER, not without."""
    def flips(k: int) -> tuple[DQN, float]:
        envs = gym.vector.SyncVectorEnv([lambda: NestedBitFlip(8) for _ in range(2)],
                                        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
        keras.utils.set_random_seed(0)
        agent = DQN(dict_mlp(NestedBitFlip(8).observation_space, 8, hidden_sizes=(128, 128)), tmp_path / f"b{k}.zarr",
                    buffer_size=10_000, learning_starts=300, batch_size=64, train_frequency=1,
                    target_network_frequency=250, learning_rate=1e-3, exploration_fraction=0.5, end_e=0.05,
                    her_n_sampled_goal=k, sample_threads=1, replay_ratio=0)
        agent.fit(envs, 3000, checkpoint_dir=tmp_path / f"agent{k}")
        return agent, float(np.mean(np.array(agent.evaluate(NestedBitFlip(8), 50, seed=3)) > -8))

    agent, with_her = flips(4)
    agent.close()
    without, without_her = flips(0)
    without.close()
    print("greedy success with and without HER", with_her, without_her)
    assert with_her >= 0.8 and without_her <= 0.3
    doc = json.loads((tmp_path / "agent4" / "agent.json").read_text())["stacks"]
    assert doc["tree"] == ["Dict", [["achieved_goal", ["Dict", [["bits", 0]]]], ["desired_goal", ["Dict", [["bits", 1]]]],
                                    ["observation", 2]]]  # (gymnasium's Dict sorts its keys)
    loaded = DQN.load(tmp_path / "agent4")
    env = NestedBitFlip(8)
    obs, _ = env.reset(seed=11)
    stack = keras.tree.map_structure(lambda a: np.asarray(a)[None], obs)  # one frame a stack
    action = loaded.act(stack)
    batch = keras.tree.map_structure(lambda a: np.repeat(a[None], 3, axis=0), stack)
    assert int(action) in range(8) and (loaded.act(batch) == action).all()
    with pytest.raises(TrainerError, match="act takes a stack of \\{achieved_goal: \\{bits: \\(1, 8\\) float32\\}, "
                                           "desired_goal: .* not \\{observation: \\(1, 8\\), achieved_goal: "):
        loaded.act({"observation": stack["observation"], "achieved_goal": stack["achieved_goal"]})
    loaded.close()


def test_what_cannot_work_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TrainerError, match="cannot take the store's stacks, batches of \\(\\(1,\\) int64, \\(1,\\) "
                                           "int64, \\(1,\\) int64\\).*that structure of stacks"):
        DQN(mlp((1, 3), 2), tmp_path / "b.zarr").fit(gym.make("Blackjack-v1"), 100)
    assert not (tmp_path / "b.zarr").exists()
    odd = gym.spaces.Dict({"achieved_goal": gym.spaces.Dict({"bits": box(4)}),
                           "desired_goal": gym.spaces.Dict({"bits": box(4), "more": box(1)})})
    with pytest.raises(TrainerError, match="achieved_goal is Dict\\(bits: \\(4,\\) float32\\) but desired_goal is "
                                           "Dict\\(bits: \\(4,\\) float32, more: \\(1,\\) float32\\)"):
        DQN(dict_mlp(odd, 3), tmp_path / "g.zarr", her_n_sampled_goal=4).fit(Sampled(odd), 100)
    assert not (tmp_path / "g.zarr").exists()
    agent = DQN(dict_mlp(SPACE, 3, hidden_sizes=(8,)), tmp_path / "s.zarr", buffer_size=500, learning_starts=50,
                batch_size=8, sample_threads=1)
    agent.fit(Sampled(), 60, checkpoint_dir=tmp_path / "agent")
    agent.close()
    path = tmp_path / "agent" / "agent.json"
    doc = json.loads(path.read_text())
    doc["stacks"]["tree"] = ["Dict", [["pos", 0], ["cards", ["Tuple", [1, 1]]]]]  # a leaf twice, one missing
    path.write_text(json.dumps(doc))
    with pytest.raises(TrainerError, match="agent.json is damaged: its stacks are"):
        DQN.load(tmp_path / "agent")


@pytest.mark.slow  # ~55 s: a learning check (the default run keeps the nested goal env learned, saved and loaded)
def test_the_command_line_learns_blackjack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Blackjack-v1's Tuple(Discrete(32), Discrete(11), Discrete(2)): a random policy scores about
    -0.40 a game, always standing -0.18, the basic strategy -0.05 (20,000 games each); 2,000 games
    measure a policy to about +-0.02, and a learned one lands at -0.13 to -0.03, so the test also
    asks for the clear-cut moves."""
    run = tmp_path / "bj"
    assert main(["--env-id", "Blackjack-v1", "--total-timesteps", "10000", "--buffer-size", "10000",
                 "--learning-starts", "1000", "--batch-size", "64", "--train-frequency", "1",
                 "--target-network-frequency", "500", "--learning-rate", "0.001", "--exploration-fraction", "0.6",
                 "--end-e", "0.05", "--gamma", "1.0", "--n-step", "1", "--hidden-sizes", "64,64", "--eval-episodes", "2000",
                 "--no-progress", "--sample-threads", "1", "--replay-ratio", "0", "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    mean = json.loads((run / "evals.jsonl").read_text().splitlines()[-1])["mean_return"]
    print("mean return of 2,000 greedy games", mean)
    assert mean >= -0.16 and f"mean score {mean:.2f} over 2000 games" in out
    agent = load_run(run)
    with ReplayStore.open(run / "replay.zarr") as store:
        assert store.observation_space == gym.make("Blackjack-v1").observation_space

    def hits(totals: range) -> float:
        """The share of hits on hard ``totals`` against every dealer card (one batch of tuples)."""
        states = [(total, card) for total in totals for card in range(1, 11)]
        return float(agent.act((np.array([[t] for t, _ in states]), np.array([[c] for _, c in states]),
                                np.zeros((len(states), 1), np.int64))).mean())

    high, low = hits(range(19, 22)), hits(range(4, 12))
    print("hits on 19-21", high, "on 4-11", low)
    assert high <= 0.1 and low >= 0.75  # stand on 19-21, hit on 11 or less
    agent.close()
