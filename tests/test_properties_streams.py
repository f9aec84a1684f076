"""A Hypothesis state machine drives a store of streams and a plain in-RAM model side by side.

The model is, per stream, a list of steps by position (as in test_properties.py). Rules write one
vector-env step to every stream with ``add_batch`` in next-step autoreset mode (random episode ends,
the reset row after each), try a batch with one bad row (nothing may change), flush, close and
reopen (the env goes on, or starts afresh as a resumed run's would), compact in place keeping the
streams, refresh a second, read-only handle, and sample with random n-step from the writer or from
that reader; every sampled transition is recomputed from the model and must match. The reader sees
exactly what was committed when it last refreshed. Tiny capacities and shards make rings wrap.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
from conftest import frame, small_spaces
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from replaystore import InvalidTransitionError, Layout, ReplayStore
from replaystore.cli.compact import compact_store
from replaystore.store import DEFAULT_CACHE_BYTES

SHAPE = (2, 2)


class StreamModel:
    """One stream's steps by position, its capacity, and what the next row must start from."""

    def __init__(self, capacity: int, k: int) -> None:
        self.capacity, self.k = capacity, k
        self.steps: list[dict] = []
        self.reset_obs: np.ndarray | None = None  # next-step mode: the frame the next episode starts from
        self.reset_row = False  # the next row is the vector env's reset row
        self.optional = False  # ... as the store reopened sees it: it may also be a fresh env's first row

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

    def count(self) -> int:
        return sum(self.span(p, 1) is not None for p in range(self.lo, len(self.steps)))

    def snapshot(self, upto: int) -> StreamModel:
        """The first ``upto`` steps as they are now (what a reader refreshed now sees)."""
        out = StreamModel(self.capacity, self.k)
        out.steps = [dict(step) for step in self.steps[:upto]]
        return out

    def stack(self, p: int) -> np.ndarray:
        ep = self.steps[p]["ep"]
        return np.stack([self.steps[p - min(o, ep)]["obs"] for o in range(self.k - 1, -1, -1)])

#: Compactions in one run of the state machine (the rest of its steps add, sample, reopen, refresh).
COMPACTIONS = 2


class StreamsVersusModel(RuleBasedStateMachine):
    @initialize(
        n=st.integers(2, 3),
        capacity=st.sampled_from([8, 12, 16]),
        frame_stack=st.integers(1, 3),
        chunk_len=st.sampled_from([1, 2, 4]),
        end_percent=st.sampled_from([5, 15, 40]),
        cache_bytes=st.sampled_from([DEFAULT_CACHE_BYTES, 200, 0]),
    )
    def create(self, n: int, capacity: int, frame_stack: int, chunk_len: int, end_percent: int,
               cache_bytes: int) -> None:
        # cache_bytes: the default keeps every frame decoded too (storage/mirror.py); 200 bytes does for
        # the smaller stores only; 0 decodes every batch from disk
        self.end_percent, self.cache_bytes = end_percent, cache_bytes
        self.dir = Path(tempfile.mkdtemp())
        self.path = self.dir / "r.zarr"
        obs_space, act_space = small_spaces(SHAPE, n=4)
        self.store = ReplayStore.create(self.path, n * capacity, obs_space, act_space, frame_stack, num_streams=n,
                                        cache_bytes=cache_bytes, layout=Layout(shard_len=4, obs_chunk_len=min(chunk_len, 4)))
        self.n = n
        self.models = [StreamModel(capacity, frame_stack) for _ in range(n)]
        self.obs = [self.new_frame() for _ in range(n)]  # each sub-env's current observation
        for model, obs in zip(self.models, self.obs):
            model.reset_obs = obs
        self.reader: ReplayStore | None = None
        self.reader_seen: list[int] = [0] * n  # steps of each stream the reader was shown
        self.compactions = 0  # at most COMPACTIONS a run: each rewrites the store (most of a run's time)

    counter = 0

    def new_frame(self) -> np.ndarray:
        self.counter += 1
        return frame(self.counter, SHAPE)

    def teardown(self) -> None:
        if self.reader is not None:
            self.reader.close()
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ rules
    @rule(data=st.data())
    def add_batch(self, data: st.DataObject) -> None:
        """One vector-env step in next-step autoreset mode: every stream moves, or takes its reset row."""
        rows = data.draw(st.lists(st.tuples(st.integers(0, 3), st.floats(-5, 5, width=32), st.integers(0, 199)),
                                  min_size=self.n, max_size=self.n))
        obs, nxt, term, trunc = [], [], [], []
        for k, (action, reward, roll) in enumerate(rows):
            model = self.models[k]
            end = "" if roll >= 2 * self.end_percent or model.reset_row else ("term" if roll % 2 else "trunc")
            o, x = self.obs[k], self.new_frame()
            obs.append(o)
            nxt.append(x)
            term.append(end == "term")
            trunc.append(end == "trunc")
            model.optional = False
            if model.reset_row:  # the env ignores the action and returns the reset observation
                model.reset_row, model.reset_obs = False, x
            else:
                if not model.in_progress():
                    model.steps.append(dict(obs=model.reset_obs, ep=0, is_last=False))
                head = model.steps[-1]
                head.update(action=action, reward=np.float32(reward), term=end == "term", trunc=end == "trunc")
                model.steps.append(dict(obs=x, ep=head["ep"] + 1, is_last=bool(end)))
                model.reset_row = bool(end)
            self.obs[k] = x
        self.store.add_batch(np.stack(obs), [r[0] for r in rows], [r[1] for r in rows], np.stack(nxt), term, trunc)

    @rule(k=st.integers(0, 2), what=st.sampled_from(["reward", "action", "obs"]))
    def bad_row_changes_nothing(self, k: int, what: str) -> None:
        k %= self.n
        fields = {name: v.copy() for name, v in self.store.rings.fields.items()}
        before = (self.store.added, len(self.store))
        obs = np.stack(self.obs)
        nxt = np.stack([self.new_frame() for _ in range(self.n)])
        action, reward = np.zeros(self.n, int), np.zeros(self.n)
        if what == "reward":
            reward[k] = np.nan
        elif what == "action":
            action[k] = 7
        else:
            obs[k] = frame(10**6 + self.counter, SHAPE)
            model = self.models[k]
            if model.optional or not (model.reset_row or model.in_progress()):
                return  # a row that starts an episode may start from any observation
        try:
            self.store.add_batch(obs, action, reward, nxt, np.zeros(self.n, bool), np.zeros(self.n, bool))
        except InvalidTransitionError as exc:
            assert f"[{k}]" in str(exc) or f"row {k} " in str(exc)
        else:
            raise AssertionError(f"add_batch accepted a bad {what} in row {k}")
        assert (self.store.added, len(self.store)) == before
        for name, values in self.store.rings.fields.items():
            np.testing.assert_array_equal(values, fields[name], err_msg=name)

    @rule()
    def flush(self) -> None:
        self.store.flush()

    def committed(self) -> list[int]:
        """Steps of each stream the writer has committed (it also commits by itself at shard ends)."""
        return [s.added for s in self.store.stream_states()]

    def reopened(self) -> None:
        self.store = ReplayStore.open(self.path, mode="a", cache_bytes=self.cache_bytes)
        for model in self.models:
            model.optional = model.reset_row

    @rule(fresh_envs=st.booleans())
    def reopen(self, fresh_envs: bool) -> None:
        """Close and reopen the writer. The envs go on, or (as a resumed run) end what was in
        progress and start afresh from new observations."""
        self.store.close()
        self.reopened()
        if fresh_envs:
            self.store.end_episode()
            self.store.flush()  # (what a reader is shown must be in the model as it was committed)
            for k, model in enumerate(self.models):
                if model.in_progress():
                    model.steps[-2]["trunc"] = True
                    model.steps[-1]["is_last"] = True
                self.obs[k] = self.new_frame()
                model.reset_obs, model.reset_row, model.optional = self.obs[k], False, False

    @precondition(lambda self: self.reader is None and self.compactions < COMPACTIONS)
    @rule()
    def compact_in_place(self) -> None:
        self.compactions += 1
        self.store.close()
        compact_store(self.path)
        for model in self.models:
            model.steps = model.steps[model.lo:]
        self.reopened()
        assert [r.added for r in self.store.rings.streams] == [len(m.steps) for m in self.models]

    @rule()
    def refresh_reader(self) -> None:
        if self.reader is None:
            self.reader = ReplayStore.open(self.path, cache_bytes=self.cache_bytes)
        else:
            self.reader.refresh()
        self.reader_seen = self.committed()
        self.reader_models = [m.snapshot(seen) for m, seen in zip(self.models, self.reader_seen)]
        assert [r.added for r in self.reader.rings.streams] == self.reader_seen
        assert len(self.reader) == sum(m.count() for m in self.reader_models)

    @precondition(lambda self: self.reader is not None)
    @rule()
    def close_reader(self) -> None:
        self.reader.close()
        self.reader = None

    @rule(n_step=st.integers(1, 3), seed=st.integers(0, 2**16), from_reader=st.booleans())
    def sample(self, n_step: int, seed: int, from_reader: bool) -> None:
        gamma = 0.9
        store = self.reader if from_reader and self.reader is not None else self.store
        models = self.reader_models if store is self.reader else self.models
        stride = store.rings.stride
        where = {}
        count = 0
        for k, model in enumerate(models):
            for p in range(model.lo, len(model.steps)):
                where[k * stride + p % model.capacity] = (k, p)
                count += model.span(p, n_step) is not None
        if count == 0:
            try:
                store.sample(1, n_step=n_step)
            except ValueError:
                return
            raise AssertionError("sample succeeded on a store with nothing sampleable")
        batch = store.sample(min(count, 6), rng=np.random.default_rng(seed), n_step=n_step, gamma=gamma)
        for i, slot in enumerate(batch.index.tolist()):
            k, p = where[slot]
            model = models[k]
            m = model.span(p, n_step)
            assert m is not None, f"sampled stream {k} position {p}, which is not sampleable"
            exp_reward = sum(gamma**j * float(model.steps[p + j]["reward"]) for j in range(m))
            last = model.steps[p + m - 1]
            np.testing.assert_array_equal(batch.obs[i], model.stack(p))
            np.testing.assert_array_equal(batch.next_obs[i], model.stack(p + m))
            assert batch.action[i] == model.steps[p]["action"]
            assert np.isclose(batch.reward[i], exp_reward, rtol=1e-5, atol=1e-5)
            assert batch.terminated[i] == last["term"] and batch.truncated[i] == last["trunc"]

    @invariant()
    def length_matches(self) -> None:
        if hasattr(self, "store"):
            assert len(self.store) == sum(m.count() for m in self.models)


StreamsVersusModel.TestCase.settings = settings(
    max_examples=30, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_streams_match_model = StreamsVersusModel.TestCase
