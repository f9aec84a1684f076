"""Hindsight relabelling against a plain model, on random stores (Hypothesis): streams of random
episode lengths written in lockstep, rings small enough to wrap, stacks of 1 or 2, each strategy.

Every step carries its own id (``pos``), ``achieved_goal`` is ``10 * id`` and ``desired_goal`` the
negative id of its episode, so a sampled row names its stream, episode and step, and a relabelled
goal names the step it came from. The model says which transitions are sampleable (live, stack
live, successor stored, episode finished) and which goal steps each strategy may pick."""

from __future__ import annotations

import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore import HindsightSampler, ReplayStore, SampleError

ONE = gym.spaces.Box(-1e9, 1e9, (1,), np.float32)
SPACE = gym.spaces.Dict({"pos": ONE, "achieved_goal": ONE, "desired_goal": ONE})


def reward(achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
    return (achieved[:, 0] + desired[:, 0]).astype(np.float32)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams=st.integers(1, 3), capacity=st.integers(6, 30), moves=st.integers(4, 60), frame_stack=st.integers(1, 2),
       strategy=st.sampled_from(["future", "final", "episode"]), seed=st.integers(0, 2**31 - 1))
def test_every_row_is_a_finished_episodes_transition_with_an_allowed_goal(streams, capacity, moves, frame_stack,
                                                                          strategy, seed) -> None:
    rng = np.random.default_rng(seed)
    # per stream: the steps by position: (id, episode, t, last step of its episode or None while in progress)
    steps: list[list[dict]] = [[] for _ in range(streams)]
    episode_of = [0] * streams
    next_id = [1]
    episodes = [0]

    def first(k: int) -> dict:
        episodes[0] += 1
        episode_of[k] = episodes[0]
        return new_step(k, 0)

    def new_step(k: int, t: int) -> dict:
        step = {"id": next_id[0], "episode": episode_of[k], "t": t}
        next_id[0] += 1
        steps[k].append(step)
        return step

    def obs_of(step: dict) -> dict:
        return {"pos": np.array([step["id"]], np.float32), "achieved_goal": np.array([10 * step["id"]], np.float32),
                "desired_goal": np.array([-step["episode"]], np.float32)}

    with tempfile.TemporaryDirectory() as tmp:
        store = ReplayStore.create(Path(tmp) / "h.zarr", streams * capacity, SPACE, gym.spaces.Discrete(2),
                                   frame_stack, num_streams=streams)
        current = [first(k) for k in range(streams)]
        for _ in range(moves):
            ends = rng.random(streams) < 0.25
            nxt = [new_step(k, current[k]["t"] + 1) for k in range(streams)]
            rows = [obs_of(s) for s in current]
            nrows = [obs_of(s) for s in nxt]
            stack = lambda rs: {key: np.stack([r[key] for r in rs]) for key in rs[0]}  # noqa: E731
            store.add_batch(stack(rows), np.zeros(streams, np.int64), np.zeros(streams, np.float32), stack(nrows),
                            ends, np.zeros(streams, bool), autoreset_mode="disabled")
            for k in range(streams):
                if ends[k]:
                    for s in steps[k]:
                        if s["episode"] == nxt[k]["episode"]:
                            s["last"] = nxt[k]["t"]
                    current[k] = first(k)
                else:
                    current[k] = nxt[k]
            # (a new episode's first step is stored by the next add)
        for k in range(streams):
            if steps[k][-1]["t"] == 0 and steps[k][-1] is current[k]:
                steps[k].pop()  # the first step of an episode not yet added
        by_id = {}
        for k in range(streams):
            added = len(steps[k])
            lo = max(0, added - capacity)
            for p, s in enumerate(steps[k]):
                by_id[s["id"]] = (k, p, s, lo)
        def sampleable(k: int, p: int) -> bool:
            s, lo = steps[k][p], max(0, len(steps[k]) - capacity)
            return (p >= lo and p - min(frame_stack - 1, s["t"]) >= lo and p + 1 < len(steps[k])
                    and steps[k][p + 1]["episode"] == s["episode"] and "last" in s)
        expected = {steps[k][p]["id"] for k in range(streams) for p in range(len(steps[k])) if sampleable(k, p)}
        sampler = HindsightSampler(reward, strategy=strategy, n_sampled_goal=3)
        if not expected:
            try:
                store.sample(1, sampler=sampler, rng=rng)
            except SampleError:
                return
            raise AssertionError("a store without a finished episode's transition was sampled")
        batch = store.sample(min(len(store), 40), sampler=sampler, rng=rng)
        n = len(batch)
        assert int(batch.relabelled.sum()) == int(0.75 * n)
        for i in range(n):
            k, p, s, lo = by_id[int(batch.obs["pos"][i, -1, 0])]
            assert s["id"] in expected, (s, p, lo)
            assert int(batch.next_obs["pos"][i, -1, 0]) == steps[k][p + 1]["id"]
            goal = float(batch.obs["desired_goal"][i, 0, 0])
            assert (batch.obs["desired_goal"][i] == goal).all() and (batch.next_obs["desired_goal"][i] == goal).all()
            if not batch.relabelled[i]:
                assert goal == -s["episode"] and batch.reward[i] == 0
                continue
            gk, g, gs, _ = by_id[int(round(goal / 10))]
            assert gk == k and gs["episode"] == s["episode"] and g >= lo
            last = s["last"]
            allowed = {"future": range(s["t"] + 1, last + 1), "final": range(last, last + 1),
                       "episode": range(1, last + 1)}[strategy]
            assert gs["t"] in allowed, (strategy, s, gs)
            assert batch.reward[i] == np.float32(10 * int(batch.next_obs["pos"][i, -1, 0]) + goal)
        store.close()
