"""A Hypothesis state machine drives ReplayStore and a plain in-RAM model side by side.

The model is a list of steps (frame, action, reward, flags, extras, ep_step, is_last) by position. Rules add
transitions with random episode ends, flush, close-and-reopen, compact in place (with a random chunk
length), and sample with random n-step; every
sampled transition is recomputed from the model with a textbook n-step return and must match.
Small capacities with tiny shards make the ring wrap many times per run.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
from conftest import frame, small_spaces
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from replaystore import Layout, ReplayStore
from replaystore.cli.compact import compact_store
from replaystore.store import DEFAULT_CACHE_BYTES

SHAPE = (2, 3)

#: Compactions in one run of the state machine (the rest of its steps add, sample and reopen).
COMPACTIONS = 2


class StoreVersusModel(RuleBasedStateMachine):
    @initialize(
        capacity=st.sampled_from([8, 12, 16, 24, 40]),
        frame_stack=st.integers(1, 3),
        chunk_len=st.sampled_from([1, 2, 4]),
        end_percent=st.sampled_from([3, 10, 40]),
        cache_bytes=st.sampled_from([DEFAULT_CACHE_BYTES, 100, 0]),
    )
    def create(self, capacity: int, frame_stack: int, chunk_len: int, end_percent: int, cache_bytes: int) -> None:
        # cache_bytes: the default keeps every frame decoded too (storage/mirror.py); 100 bytes does for
        # the smaller capacities only; 0 decodes every batch from disk
        self.end_percent, self.cache_bytes = end_percent, cache_bytes
        self.dir = Path(tempfile.mkdtemp())
        self.path = self.dir / "r.zarr"
        shard_len = 8 if capacity % 8 == 0 else 4
        obs_space, act_space = small_spaces(SHAPE, n=4)
        self.store = ReplayStore.create(self.path, capacity, obs_space, act_space, frame_stack, cache_bytes=cache_bytes,
                                        layout=Layout(shard_len=shard_len, obs_chunk_len=min(chunk_len, shard_len)),
                                        extras={"x": ((2,), "float32"), "flag": "bool"})
        self.capacity, self.k = capacity, frame_stack
        self.steps: list[dict] = []  # by position
        self.counter = 0
        self.compactions = 0  # at most COMPACTIONS a run: each rewrites the store (most of a run's time)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ model
    @property
    def lo(self) -> int:
        return max(0, len(self.steps) - self.capacity)

    def in_progress(self) -> bool:
        return bool(self.steps) and not self.steps[-1]["is_last"]

    def span(self, p: int, n: int) -> int | None:
        """Moves to the n-step successor of p, or None if p is not sampleable with n."""
        steps, lo = self.steps, self.lo
        if not lo <= p < len(steps) - 1 or steps[p]["is_last"]:
            return None
        if p - min(self.k - 1, steps[p]["ep"]) < lo:
            return None
        for m in range(1, n + 1):
            if p + m >= len(steps):
                return None
            if steps[p + m]["is_last"] or m == n:
                return m
        return None

    def stack(self, p: int) -> np.ndarray:
        ep = self.steps[p]["ep"]
        return np.stack([self.steps[p - min(o, ep)]["obs"] for o in range(self.k - 1, -1, -1)])

    # ------------------------------------------------------------------ rules
    @rule(action=st.integers(0, 3), reward=st.floats(-5, 5, width=32), roll=st.integers(0, 199),
          x=st.lists(st.floats(-1e6, 1e6, width=32), min_size=2, max_size=2), flag=st.booleans())
    def add(self, action: int, reward: float, roll: int, x: list[float], flag: bool) -> None:
        end = "" if roll >= 2 * self.end_percent else ("term" if roll % 2 else "trunc")
        if self.in_progress():
            obs = self.steps[-1]["obs"]
        else:
            self.counter += 1
            obs = frame(self.counter, SHAPE)
            self.steps.append(dict(obs=obs, ep=0, is_last=False))
        self.counter += 1
        nxt = frame(self.counter, SHAPE)
        head = self.steps[-1]
        head.update(action=action, reward=np.float32(reward), term=end == "term", trunc=end == "trunc",
                    x=np.array(x, np.float32), flag=flag)
        self.steps.append(dict(obs=nxt, ep=head["ep"] + 1, is_last=bool(end)))
        self.store.add(obs, action, reward, nxt, end == "term", end == "trunc", extras={"x": x, "flag": flag})

    @rule()
    def flush(self) -> None:
        self.store.flush()

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = ReplayStore.open(self.path, mode="a", cache_bytes=self.cache_bytes)

    @precondition(lambda self: self.compactions < COMPACTIONS)
    @rule(chunk_len=st.sampled_from([None, 1, 2, 4]))
    def compact(self, chunk_len: int | None) -> None:
        """Rewrite the store in place; the model's live steps become positions 0.. (oldest first)."""
        self.compactions += 1
        self.store.close()
        compact_store(self.path, chunk_len=chunk_len)
        self.steps = self.steps[self.lo:]
        self.store = ReplayStore.open(self.path, mode="a", cache_bytes=self.cache_bytes)
        assert self.store.added == len(self.steps)

    @rule(data=st.data())
    def obs_must_continue_episode(self, data: st.DataObject) -> None:
        if not self.in_progress():
            return
        wrong = frame(10**6 + self.counter, SHAPE)
        try:
            self.store.add(wrong, 0, 0.0, wrong, False, False, extras={"x": [0, 0], "flag": False})
        except ValueError:
            return
        raise AssertionError("add accepted an obs that does not continue the episode")

    @precondition(lambda self: len(self.steps) > 1)
    @rule(n_step=st.integers(1, 3), seed=st.integers(0, 2**16), reader=st.booleans())
    def sample(self, n_step: int, seed: int, reader: bool) -> None:
        gamma = 0.9
        positions = {p % self.capacity: p for p in range(self.lo, len(self.steps))}
        count = sum(self.span(p, n_step) is not None for p in positions.values())
        store = self.store
        if reader:
            self.store.flush()
            store = ReplayStore.open(self.path, cache_bytes=self.cache_bytes)
        try:
            if count == 0:
                try:
                    store.sample(1, n_step=n_step)
                except ValueError:
                    return
                raise AssertionError("sample succeeded on a store with nothing sampleable")
            batch = store.sample(min(count, 6), rng=np.random.default_rng(seed), n_step=n_step, gamma=gamma)
        finally:
            if reader:
                store.close()
        for i, slot in enumerate(batch.index.tolist()):
            p = positions[slot]
            m = self.span(p, n_step)
            assert m is not None, f"sampled position {p} is not sampleable"
            exp_reward = sum(gamma**j * float(self.steps[p + j]["reward"]) for j in range(m))
            last = self.steps[p + m - 1]
            np.testing.assert_array_equal(batch.obs[i], self.stack(p))
            np.testing.assert_array_equal(batch.next_obs[i], self.stack(p + m))
            assert batch.action[i] == self.steps[p]["action"]
            np.testing.assert_array_equal(batch.extras["x"][i], self.steps[p]["x"])
            assert batch.extras["flag"][i] == self.steps[p]["flag"]
            assert np.isclose(batch.reward[i], exp_reward, rtol=1e-5, atol=1e-5)
            assert batch.terminated[i] == last["term"] and batch.truncated[i] == last["trunc"]
            assert np.isclose(batch.discount[i], 0.0 if last["term"] else gamma**m)

    @invariant()
    def length_matches(self) -> None:
        if hasattr(self, "store"):
            positions = range(self.lo, len(self.steps))
            assert len(self.store) == sum(self.span(p, 1) is not None for p in positions)


StoreVersusModel.TestCase.settings = settings(
    max_examples=40, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_store_matches_model = StoreVersusModel.TestCase
