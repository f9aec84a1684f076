"""Hindsight experience replay: transitions of a goal-conditioned Dict store, their goals relabelled.

Goal-conditioned envs (gymnasium-robotics' Fetch and maze tasks, anything SB3's ``HerReplayBuffer``
serves) observe a dict with ``achieved_goal`` and ``desired_goal`` and give a sparse reward. HER
(Andrychowicz et al. 2017) learns from failures by replaying a transition as if the goal had been
one the episode reached later: ``HindsightSampler`` draws transitions uniformly, like
``UniformSampler``, and relabels a fixed share of each batch, ``n_sampled_goal / (n_sampled_goal + 1)``
(``int`` of it times the batch, the first rows), as SB3 does:

- the new goal is the ``achieved_goal`` of a later observation of the same episode: for the
  transition from step ``t`` of an episode whose last step is ``L``, the observation at a step drawn
  uniformly from ``t + 1 .. L`` (``"future"``, the default), at ``L`` (``"final"``), or at any step
  ``1 .. L`` of the episode still in the ring (``"episode"``) -- SB3's three strategies, which take
  the ``next_obs`` of a transition of ``t .. L - 1``, ``L - 1`` and ``0 .. L - 1``;
- it replaces ``desired_goal`` in ``obs`` and ``next_obs`` (every frame of a stack: the goal is the
  episode's; a zero-padded stack's padding frames keep their zeros), and ``reward`` becomes
  ``compute_reward(next achieved_goal, new goal, infos)``, called once a batch with
  ``(m, *goal_shape)`` arrays and ``m`` info dicts, each the transition's extras (format/extras.py;
  empty in a store without extras), as SB3 calls the env's ``compute_reward``; ``terminated``
  stays as stored (as in SB3);
- only transitions of *finished* episodes are drawn (their last step is stored), relabelled or not,
  as in SB3: a goal drawn from an episode still in progress would be drawn from part of it.

The goal's frame is planned with the batch, as a third frame field (``_goal``, not part of the
batch), and fetched and decoded with the others through the store's ``FrameReader``; the
relabelling (``Relabel``) runs after decoding, outside the store's lock, on the packed frames: the
goal's bytes are copied from the ``achieved_goal`` entry to the ``desired_goal`` entry, which must
have the same shape and dtype (a nested goal, format/nesting.py: leaf by leaf, the two of one
structure; ``compute_reward`` then gets the goals in that structure). So ``sample``, ``blocks``, ``as_dataset`` and ``jax_blocks`` all
serve relabelled batches, on threads or with decode processes.

A transition's episode end is found in an index of the steps that end an episode (``EpisodeEnds``,
one per store), brought up to date at each draw by scanning only the steps added since: a
``searchsorted`` a transition, whatever the episodes' length.
"""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, SampleError
from replaystore.format.dictobs import DictSpec, Entry
from replaystore.format.extras import PREFIX as EXTRAS
from replaystore.format.nesting import child, nest
from replaystore.format.schema import Schema
from replaystore.sampling.assemble import Batch, prepare
from replaystore.sampling.draws import sample_uniform
from replaystore.sampling.pending import FieldSpec, Pending
from replaystore.sampling.samplers import UniformSampler, check_unit
from replaystore.storage.reader import FrameReader
from replaystore.storage.rings import SHIFT, ZERO_FRAME, Rings

STRATEGIES = ("future", "final", "episode")
MAX_ROUNDS = 4


@dataclass(frozen=True)
class HindsightBatch(Batch):
    """A ``Batch`` whose rows ``relabelled`` have a goal taken from later in their episode (their
    ``desired_goal`` and ``reward`` are the relabelled ones)."""

    relabelled: np.ndarray


class HindsightSampler(UniformSampler):
    """Uniform 1-step transitions of finished episodes, a share of each batch with its goal relabelled
    (see the module docstring). ``compute_reward(achieved_goal, desired_goal, info)``: the env's,
    vectorised over a batch (gymnasium-robotics' ``env.unwrapped.compute_reward``).
    ``n_sampled_goal``: relabelled transitions per real one (HER's k; 4 relabels 80%).
    ``strategy``: ``"future"``, ``"final"`` or ``"episode"``. ``achieved_key``/``desired_key``: the
    Dict store's keys of the two goals. Pass it to a store's ``sample``, ``blocks``, ``as_dataset``
    or ``jax_blocks`` as ``sampler=``; the store checks its keys against its space (``bind``)."""

    frames = ("obs", "next_obs", "_goal")
    compute_reward: Callable[..., Any]
    strategy: str
    n_sampled_goal: int
    ratio: float
    achieved_key: str
    desired_key: str

    def __init__(self, compute_reward: Callable[..., Any], *, strategy: str = "future", n_sampled_goal: int = 4,
                 achieved_key: str = "achieved_goal", desired_key: str = "desired_goal", gamma: float = 0.99) -> None:
        super().__init__(n_step=1, gamma=gamma)
        if not callable(compute_reward):
            raise ConfigError(f"compute_reward is {compute_reward!r}; pass the env's compute_reward(achieved_goal, "
                              "desired_goal, info), e.g. env.unwrapped.compute_reward")
        if strategy not in STRATEGIES:
            raise ConfigError(f"strategy is {strategy!r}; it must be one of {', '.join(STRATEGIES)}")
        if (isinstance(n_sampled_goal, bool) or not isinstance(n_sampled_goal, numbers.Integral)
                or not 0 <= n_sampled_goal <= 1000):
            raise ConfigError(f"n_sampled_goal is {n_sampled_goal!r}; it must be an int from 0 (no relabelling) to "
                              "1000 (HER's k: relabelled transitions per real one)")
        check_unit(gamma, "gamma")
        self.compute_reward = compute_reward
        self.strategy = strategy
        self.n_sampled_goal = int(n_sampled_goal)
        self.ratio = 1.0 - 1.0 / (self.n_sampled_goal + 1)
        self.achieved_key, self.desired_key = str(achieved_key), str(desired_key)
        self.goals: Goals | None = None  # set by bind

    def bind(self, schema: Schema) -> HindsightSampler:
        """This sampler for a store of ``schema``: its two goal entries found and checked (the same
        shape and dtype). Raises ``ConfigError`` for a store it cannot relabel."""
        spec = schema.observation_dict
        if spec is None:
            raise ConfigError(f"hindsight relabelling needs a store of Dict observations with "
                              f"{self.achieved_key!r} and {self.desired_key!r} entries, but this store holds "
                              f"Box observations {schema.observation.dtype}{tuple(schema.observation.shape)}; create "
                              "the store with the goal env's observation_space")
        goals = goal_entries(spec, self.achieved_key, self.desired_key)
        if self.goals == goals:
            return self
        bound = HindsightSampler(self.compute_reward, strategy=self.strategy, n_sampled_goal=self.n_sampled_goal,
                                 achieved_key=self.achieved_key, desired_key=self.desired_key, gamma=self.gamma)
        bound.goals = goals
        return bound

    def spec(self, batch_size: int, schema: Schema) -> dict[str, FieldSpec]:
        return {**super().spec(batch_size, schema), "relabelled": ((batch_size,), np.dtype(bool))}

    def plan(self, rings: Rings, reader: FrameReader, batch_size: int, rng: np.random.Generator, *,
             batches: int = 1, out: list[np.ndarray] | None = None) -> Pending:
        if self.goals is None:
            raise ConfigError("this HindsightSampler is not bound to a store: pass it to the store's sample, blocks, "
                              "as_dataset or jax_blocks as sampler=")
        available = self.available(rings)
        if batch_size > available:
            raise SampleError(f"asked for {batch_size} transitions but the store holds {available} sampleable; add "
                              f"more transitions first or sample at most {available}")
        ends = _ends_of(rings)
        ends.update()
        positions, last = self.draw_finished(rings, ends, batches * batch_size, rng)
        rows = np.zeros((batches, batch_size), dtype=bool)
        rows[:, : int(self.ratio * batch_size)] = True
        relabelled = rows.reshape(-1)
        goal = positions + 1  # (unused where not relabelled: the next observation, whose chunk is read anyway)
        goal[relabelled] = self.goal_steps(rings, positions[relabelled], last[relabelled], rng)
        padding = None
        if rings.zero_padding and rings.frame_stack > 1:  # a zero-padded stack's padding frames stay zeros
            at = positions[relabelled]
            padding = (rings.stack_positions(at) == ZERO_FRAME, rings.stack_positions(at + 1) == ZERO_FRAME)
        relabel = Relabel(self.goals, self.compute_reward, relabelled, rings.frame_stack, padding)
        return prepare(rings, reader, positions, n_step=1, gamma=self.gamma, out=out, batches=batches,
                       result=HindsightBatch, single={"_goal": goal}, extra={"relabelled": relabelled},
                       complete=relabel)

    def draw_finished(self, rings: Rings, ends: EpisodeEnds, count: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``count`` positions drawn uniformly from the transitions of finished episodes, and the
        position of each one's episode's last step (``ends``: the store's index of episode ends)."""
        picked: list[np.ndarray] = []
        lasts: list[np.ndarray] = []
        need, frac = count, 1.0
        for _ in range(MAX_ROUNDS):
            candidates = sample_uniform(rings, int(need / frac * 1.1) + 8, rng)
            last = ends.last(candidates)
            ok = last >= 0
            frac = max(float(ok.mean()), 1e-3)
            picked.append(candidates[ok][:need])
            lasts.append(last[ok][:need])
            need -= picked[-1].size
            if need == 0:
                return np.concatenate(picked), np.concatenate(lasts)
        everyone, their_ends = ends.transitions()
        if everyone.size == 0:
            raise SampleError("no episode has ended in the store yet, and hindsight relabelling draws only from finished "
                              "episodes (a goal comes from an episode's later steps): add steps until one ends (with "
                              "SB3: a learning_starts larger than the env's episode length)")
        chosen = rng.integers(0, everyone.size, size=need)
        picked.append(everyone[chosen])
        lasts.append(their_ends[chosen])
        return np.concatenate(picked), np.concatenate(lasts)

    def goal_steps(self, rings: Rings, positions: np.ndarray, last: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The step whose ``achieved_goal`` becomes each transition's goal (``strategy``)."""
        if self.strategy == "final":
            return last.copy()
        if self.strategy == "future":
            return rng.integers(positions + 1, last + 1)
        first = positions - rings.ep_step[rings.slots(positions)].astype(np.int64)
        lo = rings.live_ranges()[0][positions >> SHIFT]
        return rng.integers(np.maximum(first, lo - 1) + 1, last + 1)  # steps the ring still holds

    def describe(self) -> str:
        return f"hindsight sampling ({self.strategy}, n_sampled_goal={self.n_sampled_goal})"


@dataclass(frozen=True)
class Goals:
    """Where the two goals of a Dict store lie: ``pairs`` of (achieved, desired) entries, one pair a
    leaf of the goal (one, for a goal that is one entry; a nested goal's leaves, in its order), and
    ``tree``, a nested goal's structure (None for one entry), in which ``value`` hands goals to
    ``compute_reward``."""

    pairs: tuple[tuple[Entry, Entry], ...]
    tree: Any = None

    def value(self, arrays: list[np.ndarray]) -> Any:
        return arrays[0] if self.tree is None else nest(self.tree, arrays)


def goal_entries(spec: DictSpec, achieved_key: str = "achieved_goal", desired_key: str = "desired_goal") -> Goals:
    """The two goals of a Dict space, checked: both there, of the same shape and dtype (nested ones:
    of the same structure, leaf for leaf); ``ConfigError`` naming what is wrong."""
    if achieved_key == desired_key:
        raise ConfigError(f"achieved_key and desired_key are both {achieved_key!r}; they name two entries")
    entries = {e.key: e for e in spec.entries}
    found = {key: _goal(spec, entries, key) for key in (achieved_key, desired_key)}
    missing = [key for key, goal in found.items() if goal is None]
    if missing:
        raise ConfigError(f"hindsight relabelling needs the entries {achieved_key!r} and {desired_key!r}, but the "
                          f"observations {spec.describe()} have no {missing}; name the goal entries with achieved_key= "
                          "and desired_key=")
    (a_tree, achieved), (d_tree, desired) = found[achieved_key], found[desired_key]  # type: ignore[misc]
    same = a_tree == d_tree and all((x.shape, x.dtype) == (y.shape, y.dtype) for x, y in zip(achieved, desired))
    if not same:
        shown = (f"{achieved_key!r} and {desired_key!r} differ in {spec.describe()}" if a_tree is not None or d_tree
                 is not None else f"{achieved[0].key!r} is {achieved[0].dtype}{achieved[0].shape} but "
                 f"{desired[0].key!r} is {desired[0].dtype}{desired[0].shape}")
        raise ConfigError(f"{shown}; a goal replaces the other, so they must have the same shape and dtype (nested "
                          "ones: the same structure, leaf for leaf)")
    return Goals(tuple(zip(achieved, desired, strict=True)), a_tree)


def _goal(spec: DictSpec, entries: dict[str, Entry], key: str) -> tuple[Any, list[Entry]] | None:
    """A goal's structure (None for one entry) and its entries; None when the space has no ``key``."""
    if key in entries:
        return None, [entries[key]]
    found = child(spec.tree, key) if spec.tree is not None else None
    if found is None:
        return None
    tree, indices = found
    return tree, [spec.entries[i] for i in indices]


class Relabel:
    """The relabelling of a planned batch, run by ``Pending`` once its frames are decoded: the goal
    frames' ``achieved_goal`` bytes copied into ``desired_goal`` of the relabelled rows' ``obs`` and
    ``next_obs`` stacks, and their rewards computed again."""

    def __init__(self, goals: Goals, compute_reward: Callable[..., Any], relabelled: np.ndarray,
                 frame_stack: int, padding: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """``padding``: for a zero-padded store, which frames of the relabelled rows' ``obs`` and
        ``next_obs`` stacks are padding (``(rows, frame_stack)`` each): they keep their zeros."""
        self.goals = goals
        self.compute_reward = compute_reward
        self.relabelled = relabelled
        self.frame_stack = frame_stack
        self.padding = padding

    def __call__(self, frames: dict[str, np.ndarray], fields: dict[str, np.ndarray]) -> None:
        rows = np.flatnonzero(self.relabelled)
        if rows.size == 0:
            return
        obs, next_obs, goal = (_rows(frames[name], self.frame_stack) for name in ("obs", "next_obs", "_goal"))
        reached, wanted = [], []
        for a, d in self.goals.pairs:  # (one pair; a nested goal's: one a leaf)
            new = goal[rows, -1, a.offset : a.offset + a.nbytes]  # the goal frame's achieved_goal, bytes
            for stacks, pad in zip((obs, next_obs), self.padding or (None, None)):
                if pad is None:
                    stacks[rows, :, d.offset : d.offset + d.nbytes] = new[:, None, :]
                else:
                    keep = ~pad
                    stacks[rows[:, None].repeat(self.frame_stack, 1)[keep], np.nonzero(keep)[1],
                           d.offset : d.offset + d.nbytes] = np.repeat(new[:, None, :], self.frame_stack, 1)[keep]
            reached.append(next_obs[rows, -1, a.offset : a.offset + a.nbytes].copy().view(a.dtype)
                           .reshape(rows.size, *a.shape))
            wanted.append(new.copy().view(d.dtype).reshape(rows.size, *d.shape))
        achieved, desired = self.goals.value(reached), self.goals.value(wanted)
        # each transition's info: the store's extras of its move (empty dicts in a store without extras)
        extras = [(name[len(EXTRAS):], values) for name, values in fields.items() if name.startswith(EXTRAS)]
        infos = [{name: values[r] for name, values in extras} for r in rows]
        try:
            reward = np.asarray(self.compute_reward(achieved, desired, infos))
        except Exception as exc:
            raise SampleError(f"compute_reward raised {type(exc).__name__}: {exc} (called with achieved_goal and "
                              f"desired_goal of shape {reached[0].shape if self.goals.tree is None else 'nested'} "
                              f"and {rows.size} infos holding "
                              f"{[name for name, _ in extras] or 'nothing'})") from exc
        if reward.size != rows.size or reward.dtype.kind not in "biuf":
            raise SampleError(f"compute_reward returned {reward.dtype} of shape {reward.shape} for {rows.size} goals; "
                              f"it must return one number a goal (shape ({rows.size},))")
        reward = reward.reshape(rows.size).astype(np.float32)
        if not np.isfinite(reward).all():
            raise SampleError(f"compute_reward returned {int((~np.isfinite(reward)).sum())} rewards that are NaN or "
                              "infinite (one poisons every Q-value learned from it); check the env's compute_reward")
        fields["reward"][rows] = reward


def _rows(frames: np.ndarray, frame_stack: int) -> np.ndarray:
    """Frame stacks ``(..., n, frame_stack, D)`` as ``(rows, frame_stack, nbytes)`` bytes, a view
    (the arrays a plan fills are C-contiguous)."""
    if not frames.flags.c_contiguous:
        raise ValueError("hindsight relabelling writes into contiguous frame arrays")
    raw = frames.view(np.uint8)
    return raw.reshape(-1, frame_stack, raw.shape[-1])


class EpisodeEnds:
    """The live steps of ``rings`` that end an episode (``is_last``), as one sorted array of global
    positions (the streams' in stream order: a stream's positions sort above the one before's), kept
    up to date a plan at a time by scanning only the steps added since: finding the end of a batch's
    episodes is a ``searchsorted``, whatever the episodes' length. Each stream's newest step is never
    indexed: an episode's end is marked on its newest step (``end_episode``) after it was added, so
    it is looked at on every call instead."""

    def __init__(self, rings: Rings) -> None:
        self.rings = rings
        n = rings.num_streams
        self.scanned = np.zeros(n, dtype=np.int64)  # per stream: positions below this are indexed (not the newest)
        self.seen = np.full(n, -1, dtype=np.int64)  # per stream: its ``added`` at the last update
        self.all = np.zeros(0, dtype=np.int64)  # every stream's indexed ends, global positions, sorted
        self.top = np.arange(n, dtype=np.int64) << SHIFT if n > 1 else np.zeros(1, dtype=np.int64)
        self.newest = np.full(n, -1, dtype=np.int64)  # per stream: its newest step, global
        self.newest_last = np.zeros(n, dtype=bool)  # ... and whether it ends an episode

    def update(self) -> None:
        """Index the steps added since the last call, and forget the ones the ring no longer holds
        (call under the store's lock). Every stream at once: a vector env's many streams cost what a
        few array operations cost, not a loop over them."""
        rings, n = self.rings, self.rings.num_streams
        added = np.fromiter((r.added for r in rings.streams), np.int64, n)
        newest = added - 1
        # end_episode marks the newest step without adding one: looked at on every call
        self.newest_last = (newest >= 0) & rings.is_last[rings.slots(self.top | np.maximum(newest, 0))]
        changed = added != self.seen
        if not changed.any():
            return
        lo = np.fromiter((r.lo for r in rings.streams), np.int64, n)
        self.seen = added
        self.newest = np.where(newest >= 0, self.top | newest, -1)
        refilled = changed & (newest < self.scanned)  # (a store refilled from its start: index it again)
        self.scanned[refilled] = 0
        ends = self.all
        if ends.size:  # the ends the ring no longer holds, and a refilled stream's, go
            first = np.minimum(np.searchsorted(ends, self.top), ends.size - 1)
            mine = (ends[first] >> SHIFT) == (self.top >> SHIFT)
            if (refilled | (mine & (ends[first] < (self.top | lo)))).any():
                k = ends >> SHIFT if n > 1 else np.zeros(ends.size, dtype=np.int64)
                ends = ends[(ends >= (self.top | lo)[k]) & ~refilled[k]]
        start = np.maximum(self.scanned, lo)
        count = np.where(newest > start, newest - start, 0)
        total = int(count.sum())
        if total:  # each stream's new steps but its newest, in stream order: sorted global positions
            stream = np.repeat(np.arange(n, dtype=np.int64), count)
            offset = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
            positions = self.top[stream] | (start[stream] + offset)
            new = positions[rings.is_last[rings.slots(positions)]]
            if new.size:
                ends = np.insert(ends, np.searchsorted(ends, new), new)
            self.scanned = np.where(count > 0, newest, self.scanned)
        self.all = ends

    def last(self, positions: np.ndarray) -> np.ndarray:
        """For each position (a transition), the position of its episode's last step, or -1 where
        the episode has not ended among the stored steps (as of the last ``update``)."""
        positions = np.asarray(positions, dtype=np.int64)
        out = np.full(positions.size, -1, dtype=np.int64)
        if self.all.size:
            at = np.searchsorted(self.all, positions, side="right")
            found = self.all[np.minimum(at, self.all.size - 1)]
            ok = (at < self.all.size) & ((found >> SHIFT) == (positions >> SHIFT))
            out[ok] = found[ok]
        # an episode that ends at its stream's newest step (not indexed: see the class docstring)
        k = positions >> SHIFT if self.rings.num_streams > 1 else np.zeros(positions.size, dtype=np.int64)
        head = self.newest[k]
        at_head = (out < 0) & self.newest_last[k] & (positions < head)
        out[at_head] = head[at_head]
        return out

    def transitions(self) -> tuple[np.ndarray, np.ndarray]:
        """Every sampleable transition of a finished episode and its episode's last step (the whole
        live range: what the draw falls back on when few transitions are in finished episodes)."""
        lo, hi = self.rings.live_ranges()
        positions = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(lo.tolist(), hi.tolist())])
        positions = positions[self.rings.valid[self.rings.slots(positions)]]
        last = self.last(positions)
        ok = last >= 0
        return positions[ok], last[ok]


def _ends_of(rings: Rings) -> EpisodeEnds:
    """The ``EpisodeEnds`` of ``rings``, made on first use and kept as long as ``rings`` lives."""
    ends = _ENDS.get(rings)
    if ends is None:
        ends = _ENDS[rings] = EpisodeEnds(rings)
    return ends


#: Each store's episode-end index (keyed by its rings; shared by every hindsight sampler of the store).
_ENDS: weakref.WeakKeyDictionary[Rings, EpisodeEnds] = weakref.WeakKeyDictionary()
