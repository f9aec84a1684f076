"""Hindsight relabelling (sampling/hindsight.py) against ground truth recorded from a real goal env.

Every step of every episode is recorded beside the store, keyed by the point's bytes and the step
counter (``observation`` and ``steps``, which relabelling leaves alone), so each sampled row names
its episode and step, and its relabelled goal can be checked against the ``achieved_goal`` values
the episode really reached afterwards."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pytest
from goal_env import Reach, reach_reward

from replaystore import ConfigError, HindsightBatch, HindsightSampler, ReplayStore, SampleError


@dataclass
class Truth:
    """What was added: per episode its achieved goals (step 0 ..), goal, and whether it ended; per
    step key, (episode, step, the store position)."""

    achieved: list[list[np.ndarray]] = field(default_factory=list)
    goal: list[np.ndarray] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    steps: dict[tuple[bytes, int], tuple[int, int, int]] = field(default_factory=dict)
    added: int = 0

    def where(self, obs: dict, i: int) -> tuple[int, int, int]:
        return self.steps[(obs["observation"][i, -1].tobytes(), int(obs["steps"][i, -1, 0]))]


def fill(store: ReplayStore, episodes: int, *, limit: int = 9, seed: int = 0, leave_open: bool = False) -> Truth:
    """``episodes`` episodes of Reach with random actions (the last left in progress with ``leave_open``)."""
    env, rng, truth = Reach(limit=limit), np.random.default_rng(seed), Truth()
    for e in range(episodes):
        obs, _ = env.reset(seed=seed * 1000 + e)
        truth.achieved.append([obs["achieved_goal"].copy()])
        truth.goal.append(obs["desired_goal"].copy())
        truth.ended.append(False)
        truth.steps[(obs["observation"].tobytes(), 0)] = (e, 0, truth.added)
        for t in range(1, limit + 1):
            action = rng.uniform(-1, 1, 2).astype(np.float32)
            nxt, reward, terminated, truncated, _ = env.step(action)
            store.add(obs, action, reward, nxt, terminated, truncated)
            truth.added += 1
            truth.achieved[e].append(nxt["achieved_goal"].copy())
            truth.steps[(nxt["observation"].tobytes(), t)] = (e, t, truth.added)
            obs = nxt
            if leave_open and e == episodes - 1 and t == limit // 2:
                return truth
            if terminated or truncated:
                truth.ended[e] = True
                truth.added += 1  # (the episode's last step)
                break
    return truth


def make(tmp_path, capacity: int = 2000, frame_stack: int = 1) -> ReplayStore:
    return ReplayStore.create(tmp_path / "her.zarr", capacity, Reach().observation_space, Reach().action_space,
                              frame_stack)


def check(batch: HindsightBatch | dict, truth: Truth, strategy: str, *, ratio: float = 0.8, batches: int = 1,
          live_from: int = 0) -> None:
    """Every row a transition of a finished episode; the relabelled rows' goals reached later in it
    (``strategy``), their rewards recomputed; the others as stored."""
    get = batch.__getitem__ if isinstance(batch, dict) else batch.__getattribute__
    obs, next_obs = get("obs"), get("next_obs")
    flat = {name: {k: v.reshape(-1, *v.shape[-2:]) for k, v in frames.items()}
            for name, frames in (("obs", obs), ("next_obs", next_obs))}
    relabelled, reward = get("relabelled").reshape(-1), get("reward").reshape(-1)
    n = relabelled.size // batches
    assert [int(r.sum()) for r in relabelled.reshape(batches, n)] == [int(ratio * n)] * batches
    for i in range(relabelled.size):
        e, t, _ = truth.where(flat["obs"], i)
        assert truth.ended[e], "a transition of an episode in progress was drawn"
        assert truth.where(flat["next_obs"], i)[:2] == (e, t + 1)
        goals = np.concatenate([flat["obs"]["desired_goal"][i], flat["next_obs"]["desired_goal"][i]])
        assert (goals == goals[0]).all(), "every frame of both stacks has the same goal"
        goal = goals[0]
        achieved = truth.achieved[e]
        if not relabelled[i]:
            assert np.array_equal(goal, truth.goal[e])
            assert reward[i] == pytest.approx(-np.linalg.norm(achieved[t + 1] - truth.goal[e]), abs=1e-5)
            continue
        last = len(achieved) - 1
        first = {"future": t + 1, "final": last, "episode": 1}[strategy]
        matches = [g for g in range(first, last + 1) if np.array_equal(achieved[g], goal)]
        assert matches, f"row {i}: goal {goal} is not an achieved goal of episode {e} at steps {first}..{last}"
        if strategy == "episode":
            position = truth.steps[(truth_obs_key(truth, e, matches[-1]))][2]
            assert position >= live_from, "a goal from a step the ring no longer holds"
        assert reward[i] == pytest.approx(float(reach_reward(achieved[t + 1], goal, {})), abs=1e-5)


def truth_obs_key(truth: Truth, e: int, t: int) -> tuple[bytes, int]:
    return next(key for key, (ee, tt, _) in truth.steps.items() if (ee, tt) == (e, t))


@pytest.mark.parametrize("frame_stack", [1, 3])
@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_relabelled_goals_are_reached_later_in_the_episode(tmp_path, strategy, frame_stack):
    store = make(tmp_path, frame_stack=frame_stack)
    truth = fill(store, 30, leave_open=True)
    sampler = HindsightSampler(reach_reward, strategy=strategy)
    for seed in range(4):
        batch = store.sample(64, sampler=sampler, rng=np.random.default_rng(seed))
        assert isinstance(batch, HindsightBatch)
        assert batch.obs["desired_goal"].shape == (64, frame_stack, 2)
        check(batch, truth, strategy)
    # the share relabelled is HER's k / (k + 1); k = 0 relabels nothing
    check(store.sample(50, sampler=HindsightSampler(reach_reward, n_sampled_goal=1, strategy=strategy)), truth,
          strategy, ratio=0.5)
    check(store.sample(50, sampler=HindsightSampler(reach_reward, n_sampled_goal=0)), truth, strategy, ratio=0.0)


def test_future_goals_cover_every_later_step(tmp_path):
    """``future`` draws uniformly from the steps after the transition: from a transition at step 0
    of a 9-move episode, each of the steps 1..9 is drawn about as often."""
    store = make(tmp_path)
    truth = fill(store, 12, limit=9)
    counts = np.zeros(10)
    sampler, rng = HindsightSampler(reach_reward, n_sampled_goal=1000), np.random.default_rng(0)
    for _ in range(60):
        batch = store.sample(100, sampler=sampler, rng=rng)
        for i in np.flatnonzero(batch.relabelled):
            e, t, _ = truth.where(batch.obs, i)
            if t != 0 or len(truth.achieved[e]) != 10:
                continue
            goal = batch.obs["desired_goal"][i, 0]
            counts[[g for g in range(1, 10) if np.array_equal(truth.achieved[e][g], goal)]] += 1
    assert counts[0] == 0 and counts[1:].min() > 0.5 * counts[1:].mean(), counts


def test_only_finished_episodes_are_drawn_and_none_finished_is_refused(tmp_path):
    store = make(tmp_path)
    env = Reach(limit=50)
    obs, _ = env.reset(seed=0)
    for _ in range(10):
        nxt, reward, _, _, _ = env.step(np.zeros(2, np.float32))
        store.add(obs, np.zeros(2, np.float32), reward, nxt, False, False)
        obs = nxt
    sampler = HindsightSampler(reach_reward)
    held = len(store)
    with pytest.raises(SampleError, match="no episode has ended in the store yet.*learning_starts"):
        store.sample(4, sampler=sampler)
    assert len(store) == held
    assert store.sample(4).obs["observation"].shape == (4, 1, 2)  # uniform sampling is not refused
    store.end_episode()  # (marks the newest step the episode's last, after it was added)
    batch = store.sample(4, sampler=sampler)
    assert batch.relabelled.sum() == 3 and (batch.obs["steps"][:, 0, 0] < 10).all()
    obs, _ = env.reset(seed=1)  # a second episode, left in progress: still only the first is drawn
    for _ in range(5):
        nxt, reward, _, _, _ = env.step(np.zeros(2, np.float32))
        store.add(obs, np.zeros(2, np.float32), reward, nxt, False, False)
        obs = nxt
    batch = store.sample(14, sampler=sampler, rng=np.random.default_rng(0))
    first_goal = batch.next_obs["desired_goal"][~batch.relabelled][:, -1]
    assert len(first_goal) and (first_goal == first_goal[0]).all()
    assert batch.index.max() < 10  # the first episode's ten moves (slots 0..9)


def test_goals_come_only_from_steps_the_ring_still_holds(tmp_path):
    """A ring smaller than the data: the oldest episode is cut; ``episode`` draws goals only from its
    live steps, and every row still checks out."""
    store = make(tmp_path, capacity=100)
    truth = fill(store, 40, limit=9)
    assert truth.added > 150
    for strategy in ("episode", "future", "final"):
        batch = store.sample(80, sampler=HindsightSampler(reach_reward, strategy=strategy),
                             rng=np.random.default_rng(1))
        check(batch, truth, strategy, live_from=truth.added - 100)


def test_streams_of_a_vector_env(tmp_path):
    """Episodes of three streams written by a vector env's rows: each goal from its own stream's episode."""
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: Reach(limit=7) for _ in range(3)])  # (next-step autoreset)
    store = ReplayStore.create(tmp_path / "v.zarr", 600, envs.single_observation_space, envs.single_action_space, 1,
                               num_streams=3)
    obs, _ = envs.reset(seed=3)
    for _ in range(100):
        action = envs.action_space.sample()
        nxt, reward, terminated, truncated, _ = envs.step(action)
        store.add_batch(obs, action, reward, nxt, terminated, truncated)
        obs = nxt
    batch = store.sample(200, sampler=HindsightSampler(reach_reward), rng=np.random.default_rng(0))
    rel = batch.relabelled
    assert rel.sum() == 160
    # each relabelled goal is a point its own transition's stream reached later: re-check the rewards and
    # that the goal differs from the original only where relabelled (the points are random floats)
    np.testing.assert_allclose(batch.reward[rel], reach_reward(batch.next_obs["achieved_goal"][rel, -1],
                                                               batch.obs["desired_goal"][rel, -1], {}), atol=1e-6)
    assert np.array_equal(batch.obs["desired_goal"], batch.next_obs["desired_goal"])
    streams = batch.index // store.rings.stride
    assert set(streams.tolist()) == {0, 1, 2}


@pytest.mark.parametrize("processes", [False, True])
def test_blocks_relabel_as_sample_does(tmp_path, processes):
    store = make(tmp_path)
    truth = fill(store, 25)
    sampler = HindsightSampler(reach_reward, strategy="future")
    if processes and os.cpu_count() is None:
        pytest.skip("no cpu count")
    with store.blocks(32, batches_per_block=3, sampler=sampler, seed=5, processes=processes) as it:
        blocks = [next(it) for _ in range(3)]
        for block in blocks:
            assert block["relabelled"].shape == (3, 32)
            check(dict(block.items()), truth, "future", batches=3)
    with store.blocks(32, batches_per_block=3, sampler=sampler, seed=5, processes=not processes) as it:
        again = next(it)
        assert np.array_equal(again["reward"], blocks[0]["reward"])
        assert np.array_equal(again["obs"]["desired_goal"], blocks[0]["obs"]["desired_goal"])


def test_as_dataset_and_jax_blocks(tmp_path):
    store = make(tmp_path)
    truth = fill(store, 20)
    sampler = HindsightSampler(reach_reward, strategy="final")
    ds = store.as_dataset(16, sampler=sampler, seed=0, device=None)
    try:
        assert ds.element_spec["relabelled"].shape == (16,)
        element = next(iter(ds))
        batch = {k: ({kk: vv.numpy() for kk, vv in v.items()} if isinstance(v, dict) else v.numpy())
                 for k, v in element.items()}
        check(batch, truth, "final")
    finally:
        ds.prefetcher.close()
    with store.jax_blocks(16, batches_per_block=2, sampler=sampler, seed=0) as it:
        block = next(it)
        batch = {k: ({kk: np.asarray(vv) for kk, vv in v.items()} if isinstance(v, dict) else np.asarray(v))
                 for k, v in block.items()}
        check(batch, truth, "final", batches=2)


def test_what_cannot_be_relabelled_is_refused(tmp_path):
    import gymnasium as gym

    box = ReplayStore.create(tmp_path / "box.zarr", 100, gym.spaces.Box(-1, 1, (4,), np.float32),
                             gym.spaces.Discrete(2), 1)
    with pytest.raises(ConfigError, match="needs a store of Dict observations"):
        box.sample(1, sampler=HindsightSampler(reach_reward))
    store = make(tmp_path)
    fill(store, 3)
    before = len(store)
    cases = [
        (dict(achieved_key="reached"), "have no \\['reached'\\].*achieved_key="),
        (dict(achieved_key="steps"), "'steps' is int64\\(1,\\) but 'desired_goal' is float32\\(2,\\)"),
        (dict(achieved_key="desired_goal"), "both 'desired_goal'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            store.sample(1, sampler=HindsightSampler(reach_reward, **kwargs))
    for kwargs, message in [(dict(strategy="past"), "future, final, episode"),
                            (dict(n_sampled_goal=-1), "n_sampled_goal is -1"),
                            (dict(n_sampled_goal=2.5), "n_sampled_goal is 2.5"),
                            (dict(gamma=2), "gamma is 2")]:
        with pytest.raises((ConfigError, SampleError), match=message):
            HindsightSampler(reach_reward, **kwargs)
    with pytest.raises(ConfigError, match="compute_reward is 3"):
        HindsightSampler(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="together with n_step, prioritized"):
        store.sample(1, sampler=HindsightSampler(reach_reward), n_step=3, prioritized=True)
    with pytest.raises(ConfigError, match="pass a replaystore sampler"):
        store.sample(1, sampler="her")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not bound to a store"):
        HindsightSampler(reach_reward).plan(store.rings, store.reader, 1, np.random.default_rng())

    def broken(achieved, desired, info):
        raise KeyError("distance_threshold")

    with pytest.raises(SampleError, match="compute_reward raised KeyError: 'distance_threshold'"):
        store.sample(8, sampler=HindsightSampler(broken))
    with pytest.raises(SampleError, match="compute_reward returned float64 of shape \\(2,\\) for 6 goals"):
        store.sample(8, sampler=HindsightSampler(lambda a, d, i: np.zeros(2)))
    with pytest.raises(SampleError, match="returned <U1"):
        store.sample(8, sampler=HindsightSampler(lambda a, d, i: np.array(["x"] * len(a))))
    with pytest.raises(SampleError, match="returned 6 rewards that are NaN or infinite"):
        store.sample(8, sampler=HindsightSampler(lambda a, d, i: np.full(len(a), np.nan)))
    assert len(store) == before


def test_episode_ends_found_by_the_scan_and_by_the_enumeration(tmp_path):
    """``EpisodeEnds.last`` (the index of episode ends, brought up to date as steps are added, episodes
    of many lengths) and ``transitions`` (the fallback over the whole live range) against a plain
    loop, on a wrapped three-stream ring with an episode in progress in each stream, checked after
    every few steps while it fills and wraps."""
    import gymnasium as gym

    from replaystore.sampling.hindsight import EpisodeEnds

    envs = gym.vector.SyncVectorEnv([lambda limit=limit: Reach(limit=limit) for limit in (5, 90, 150)])
    store = ReplayStore.create(tmp_path / "e.zarr", 3 * 256, envs.single_observation_space, envs.single_action_space,
                               num_streams=3)
    obs, _ = envs.reset(seed=1)
    index = EpisodeEnds(store.rings)
    for step in range(400):
        action = np.zeros((3, 2), np.float32)  # (no move: no early success, every episode runs to its limit)
        nxt, reward, terminated, truncated, _ = envs.step(action)
        store.add_batch(obs, action, reward, nxt, terminated, truncated)
        obs = nxt
        if step % 37 == 0 or step == 399:
            index.update()
            _check_ends(store.rings, index, final=step == 399)


def _check_ends(rings, index, *, final: bool) -> None:
    lo, hi = rings.live_ranges()
    positions = np.concatenate([np.arange(a, b) for a, b in zip(lo.tolist(), hi.tolist())])
    positions = positions[rings.valid[rings.slots(positions)]]
    expected = []
    for p in positions.tolist():
        head = rings.heads(np.array([p]))[0]
        q = p + 1
        while q < head and not rings.is_last[rings.slots(np.array([q]))[0]]:
            q += 1
        expected.append(q if q < head else -1)
    expected_a = np.array(expected, dtype=np.int64)
    np.testing.assert_array_equal(index.last(positions), expected_a)
    if final:
        assert (expected_a == -1).any() and (expected_a - positions > 64).any()  # in progress, and long episodes
    everyone, ends = index.transitions()
    finished = expected_a >= 0
    np.testing.assert_array_equal(np.sort(everyone), np.sort(positions[finished]))
    np.testing.assert_array_equal(ends[np.argsort(everyone)], expected_a[finished][np.argsort(positions[finished])])


def test_a_zero_padded_stacks_padding_stays_zeros(tmp_path):
    """Relabelling writes the new goal into a stack's real frames only: a zero-padded store's padding
    frames (before the episode's first step) keep their zeros, as the rows not relabelled show them."""
    store = ReplayStore.create(tmp_path / "z.zarr", 500, Reach().observation_space, Reach().action_space, 3,
                               frame_padding="zero")
    fill(store, 20, limit=6)
    batch = store.sample(100, sampler=HindsightSampler(reach_reward), rng=np.random.default_rng(0))
    for name in ("obs", "next_obs"):
        frames = getattr(batch, name)
        padding = (frames["observation"] == 0).all(axis=-1)  # (the points are random floats: never exactly 0)
        assert padding[batch.relabelled].any() and (~padding).all(axis=1).any()
        assert (frames["desired_goal"][padding] == 0).all()
        real = frames["desired_goal"][~padding].reshape(-1, 2)
        assert (real != 0).all()
        newest = frames["desired_goal"][:, -1]
        assert np.array_equal(np.broadcast_to(newest[:, None], frames["desired_goal"].shape)[~padding],
                              frames["desired_goal"][~padding])
