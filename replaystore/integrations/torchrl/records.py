"""The numpy side of ``ReplayStoreStorage`` (storage.py): TorchRL's transitions, addressed by TorchRL's
indices, kept in a replay store with each frame stored once. No torch here; the storage class
converts TensorDicts to and from the flat dicts of numpy leaves this module takes and gives.

**Where each leaf goes.** A transition is a flat dict of nested keys (tuples) to arrays, batch first,
as a collector writes it:

- ``observation_key`` and ``("next", *observation_key)``: the frames. The store keeps the newest frame
  of each stack once (a ``CatFrames`` stack on the first or last axis, padded at reset with the first
  frame, is found from the data as for SB3's stacks, integrations/stacking.py) and rebuilds both
  stacks at read time; observations that are not stacks are stored whole.
- ``"action"``: the store's action, as a ``Box`` of its exact shape and dtype (one-hot or index, as the
  collector wrote it).
- every other leaf (``("next", "reward")``, the done flags, ``("collector", "traj_ids")``,
  ``"step_count"``, a policy's ``"action_value"``...): one of the store's *extras* named
  ``td.<key>.<key>`` (format/extras.py), exactly its shape and dtype. The store's own reward,
  ``terminated`` and ``truncated`` are filled from ``("next", "reward")`` and the done flags too, so
  the store samples, inspects and trains offline like any other.
- two extras of this module's own: ``rb.index``, the TorchRL index each transition was written at, and
  ``rb.seq``, the order it was written in. A reopened store rebuilds TorchRL's index -> transition map
  from them (the newest transition written at each index), so the store on disk is the whole state.

**Streams.** Each env's run of transitions goes to a stream of the store (streams.py's ``Chains``):
the stream it continues, or a free one when it starts an episode (``streams``: their number,
counted in the first batch when not given). Leaves and their extras' names: leaves.py.

**Indices.** ``positions[i]`` is the store position (rings.py) of the transition TorchRL wrote at
index ``i``, -1 for none. The store keeps ``2 * max_size`` steps split among the streams: each
transition is one step and each episode's last observation one more, so the transitions TorchRL can
still return are never overwritten while the streams fill evenly (envs stepped together); a read of
one the store has overwritten all the same is a ``SampleError`` that says so.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, InvalidTransitionError, SampleError, StoreNotFoundError
from replaystore.format.extras import MAX_STEP_BYTES
from replaystore.integrations.stacking import StackLayout, choose
from replaystore.integrations.torchrl.leaves import (
    ACTION,
    LEAF,
    Key,
    Leaves,
    box,
    done_of,
    flags,
    leaf_key,
    leaf_name,
    reward_of,
)
from replaystore.integrations.torchrl.reads import At, live_slots
from replaystore.integrations.torchrl.streams import Chains, continues, count_envs
from replaystore.storage.rings import SHIFT
from replaystore.storage.where import normalized
from replaystore.store import ReplayStore

log = logging.getLogger("replaystore.integrations.torchrl")

#: this module's own two extras: TorchRL's index of each transition, and the order it was written in
INDEX, SEQ = "rb.index", "rb.seq"
#: the key TensorDictReplayBuffer writes each transition's index under (after writing it)
INDEX_KEY: Key = ("index",)


class Records:
    """TorchRL's indices over a replay store (see the module docstring). ``write`` and ``read`` take
    and give flat dicts of numpy leaves; the store is made at the first ``write`` (or opened, if
    ``path`` holds one and ``overwrite`` is false)."""

    def __init__(self, path: Any, max_size: int, *, frame_stack: Any = "auto", stack_axis: Any = None,
                 padding: Any = None, observation_key: Any = "observation", streams: Any = None,
                 cache_bytes: int | None = None, overwrite: bool = False,
                 storage_options: dict[str, Any] | None = None) -> None:
        if path is None or str(path) == "":
            raise ConfigError("ReplayStoreStorage needs a path: ReplayStoreStorage('runs/rb.zarr', max_size=...)")
        if isinstance(max_size, bool) or not isinstance(max_size, (int, np.integer)) or max_size < 1:
            raise ConfigError(f"max_size is {max_size!r}; it must be a positive int (transitions kept)")
        if streams is not None and (isinstance(streams, bool) or not isinstance(streams, (int, np.integer))
                                    or not 1 <= streams <= min(int(max_size), 4096)):
            raise ConfigError(f"streams is {streams!r}; pass the number of envs your collector steps (an int from 1 "
                              f"to {min(int(max_size), 4096)}), or leave it out to count them in the first batch")
        self.obs_key: Key = (observation_key,) if isinstance(observation_key, str) else tuple(observation_key)
        if not self.obs_key or not all(isinstance(p, str) for p in self.obs_key) or self.obs_key[0] == "next":
            raise ConfigError(f"observation_key is {observation_key!r}; pass the key of the observations, such as "
                              "'observation' or 'pixels' (its ('next', ...) twin is found from it)")
        self.next_key: Key = ("next", *self.obs_key)
        self.path, self.max_size, self.streams_arg = path, int(max_size), streams
        self.options = {"frame_stack": frame_stack, "stack_axis": stack_axis, "padding": padding}
        self.cache_bytes, self.storage_options = cache_bytes, storage_options
        self.positions = np.full(self.max_size, -1, dtype=np.int64)
        self.length = 0  # TorchRL's len: writes counted, at most max_size
        self.seq = 0  # transitions written so far (the next one's rb.seq)
        self.store: ReplayStore | None = None
        self.layout: StackLayout | None = None
        self.keys: list[Key] = []  # the leaves kept as extras, in the order the first batch gave them
        self.chains = Chains(0)
        self.overwrite = bool(overwrite)
        if not self.overwrite:
            self._reopen()

    # ---------------------------------------------------------------------------------------------
    # The store

    def _reopen(self) -> None:
        try:
            store = ReplayStore.open(self.path, mode="a", cache_bytes=self.cache_bytes,
                                     storage_options=self.storage_options)
        except StoreNotFoundError:
            return
        try:
            names = [e.name for e in store.schema.extras]
            if INDEX not in names or SEQ not in names:
                raise ConfigError(f"the store at {store.path} was not written by ReplayStoreStorage (it has no "
                                  f"{INDEX} and {SEQ} extras); use a new path, or overwrite=True to replace it")
            self.layout = self._stored_layout(store)
            self.keys = [leaf_key(n) for n in names if n.startswith(LEAF)]
            store.end_episode()  # the collector's envs were reset: no episode goes on
            self.store = store
            self._rebuild()
        except BaseException:
            store.close()
            self.store = None
            raise
        self.chains = Chains(store.schema.num_streams, self.layout.describe())
        log.info("continuing replay store %s: %d transitions at TorchRL's indices", store.path, self.length)

    def _stored_layout(self, store: ReplayStore) -> StackLayout:
        """The stacks of a store made here: its frames, ``frame_stack`` deep on the axis ``stack_axis``
        names, or else the one where a frame is narrower (a channel: CatFrames' ``dim=-3``)."""
        frame, k = tuple(store.schema.observation.shape), store.frame_stack
        if k == 1:
            return StackLayout(frame)
        axis = self.options["stack_axis"]
        if axis is None:
            axis = 0 if frame[0] <= frame[-1] else -1
        axis = axis % len(frame)
        shape = list(frame)
        shape[axis] *= k
        return StackLayout(tuple(shape), k, axis, store.schema.frame_padding)

    def _rebuild(self, before: int | None = None) -> None:
        """TorchRL's index -> position map from the live transitions' ``rb.index`` and ``rb.seq``
        (those written before ``before`` only, when given)."""
        store = self.store
        assert store is not None
        rings = store.rings
        slots = np.flatnonzero(rings.valid)
        index = rings.extras["extras/" + INDEX][slots]
        seq = rings.extras["extras/" + SEQ][slots]
        self.seq = int(seq.max()) + 1 if seq.size else 0
        keep = (index >= 0) & (index < self.max_size) & (seq < (self.seq if before is None else before))
        order = np.argsort(seq, kind="stable")  # the newest write at an index wins: assign oldest first
        order = order[keep[order]]
        self.positions[:] = -1
        self.positions[index[order]] = rings.positions_of_slots(slots[order])
        self.length = int((self.positions >= 0).sum())

    def restore(self, state: Any) -> None:
        """Back to a ``state_dict``'s state (storage.py's ``loads``): the same store, its indices as
        they were then."""
        fields = {"store": str, "max_size": int, "length": int, "seq": int}
        if not isinstance(state, dict) or any(not isinstance(state.get(k), t) for k, t in fields.items()):
            raise ConfigError(f"the state is {str(state)[:200]!r}; a ReplayStoreStorage's state holds "
                              f"{', '.join(fields)} (its state_dict())")
        if state["max_size"] != self.max_size:
            raise ConfigError(f"the checkpoint is of a storage of max_size {state['max_size']}, this one's is "
                              f"{self.max_size}; make the storage with the same max_size")
        if self.store is None:
            self._reopen()
        mine = str(self.store.path) if self.store is not None else str(self.path)
        if normalized(state["store"]) != normalized(mine):
            raise ConfigError(f"the checkpoint is of the store at {state['store']}, this storage's is {mine}; make "
                              "the storage with that path (the store on disk holds the transitions)")
        if self.store is None:
            raise ConfigError(f"the checkpoint's store {state['store']} holds nothing: it is gone, or was never "
                              "written")
        kept = self.positions.copy(), self.length, self.seq
        self._rebuild(before=state["seq"])
        lost = int((self.positions[:state["length"]] < 0).sum())
        if lost:
            self.positions, self.length, self.seq = kept
            raise ConfigError(f"the store at {mine} has moved on since this checkpoint: {lost} of the "
                              f"{state['length']} transitions it indexed were overwritten by later writes; load a "
                              "newer checkpoint, or reopen the store without loads (ReplayStoreStorage(path, "
                              "max_size=...) indexes every transition it holds)")
        self.length = state["length"]

    def _create(self, leaves: Leaves, starts: np.ndarray) -> None:
        """Make the store from the first batch: its leaves, and the rows that start an episode."""
        obs = leaves[self.obs_key]
        n = int(self.streams_arg or count_envs(leaves[self.obs_key], leaves[self.next_key], done_of(leaves)))
        self.layout = choose(obs.shape[1:], obs[starts], **self.options)
        if self.layout.frame_stack == 1 and obs.ndim >= 3:
            log.info("the observations %s are not CatFrames stacks (or their first rows do not start episodes): "
                     "stored whole", obs.shape[1:])
        self.keys = [key for key in leaves if key not in (self.obs_key, self.next_key, ACTION)]
        extras: dict[str, Any] = {INDEX: "int64", SEQ: "int64"}
        for key in self.keys:
            value = leaves[key]
            extras[leaf_name(key)] = (value.shape[1:], value.dtype.name)
        step = 16 + sum(leaves[key][0].nbytes for key in self.keys)
        if step > MAX_STEP_BYTES:
            big = max(self.keys, key=lambda k: leaves[k][0].nbytes)
            raise ConfigError(f"the transitions' keys other than the observations and the action take {step} bytes a "
                              f"step, more than the {MAX_STEP_BYTES} a store keeps beside each frame (the largest: "
                              f"{big!r}); exclude it before extend (td.exclude(...)) or, if it is the frames, pass "
                              f"observation_key={big if len(big) > 1 else big[0]!r}")
        frame_space = self.layout.frame_space(box(obs))
        capacity = max(2, -(-2 * self.max_size // n)) * n
        self.store = ReplayStore.create(
            self.path, capacity, frame_space, box(leaves[ACTION]), self.layout.frame_stack, num_streams=n,
            frame_padding=self.layout.padding if self.layout.frame_stack > 1 else "reset",
            overwrite=self.overwrite, cache_bytes=self.cache_bytes, storage_options=self.storage_options,
            extras=extras)
        self.chains = Chains(n, self.layout.describe())
        log.info("created replay store %s: %d streams of %d steps, %s", self.store.path, n, capacity // n,
                 self.layout.describe())

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def flush(self) -> None:
        if self.store is not None:
            self.store.flush()

    # ---------------------------------------------------------------------------------------------
    # Writing

    def write(self, index: np.ndarray, leaves: Leaves, *, count: bool = True) -> None:
        """Keep the transitions ``leaves`` (each ``(B, ...)``) at TorchRL's ``index`` (``(B,)``).
        ``count``: whether they add to ``length`` (TorchRL's ``set_cursor``)."""
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        if self.store is not None and (INDEX_KEY in leaves) != (INDEX_KEY in self.keys):
            # TensorDictReplayBuffer writes each transition's index into the TensorDicts it extends
            # with (after writing them), so a TensorDict may come with or without it: kept as it came first
            leaves = {k: v for k, v in leaves.items() if k != INDEX_KEY}
            if INDEX_KEY in self.keys:
                leaves[INDEX_KEY] = index
        self._check(index, leaves)
        rows = len(index)
        done = done_of(leaves)
        if self.store is None:  # (the first row, and each row after an episode's end, starts an episode)
            self._create(leaves, np.flatnonzero(np.concatenate([[True], done[:-1]])))
        store, layout = self.store, self.layout
        assert store is not None and layout is not None
        obs, nxt = leaves[self.obs_key], leaves[self.next_key]
        padded = layout.padded(obs) if layout.frame_stack > 1 else np.ones(rows, dtype=bool)
        shifted = layout.shifted(obs, nxt) if layout.frame_stack > 1 else np.ones(rows, dtype=bool)
        bad = np.flatnonzero(~shifted)
        if bad.size:
            raise InvalidTransitionError(
                f"row {bad[0]}'s next observation is not its observation moved on by one frame ({layout.describe()}), "
                "so the store could not rebuild it; nothing was written. Pass frame_stack=1 to store whole "
                "observations")
        chained = continues(obs, nxt)
        assigned, ends = self.chains.assign(obs, nxt, done, padded, chained, self.seq)
        terminated, truncated = flags(leaves, done)
        reward = reward_of(leaves)
        seqs = np.arange(self.seq, self.seq + rows, dtype=np.int64)
        extras = {INDEX: index, SEQ: seqs, **{leaf_name(k): leaves[k] for k in self.keys}}
        frames_obs, frames_next = layout.newest(obs), layout.newest(nxt)
        where = np.empty(rows, dtype=np.int64)
        # rounds: the r-th transition of each stream in this batch, added together
        order = np.argsort(assigned, kind="stable")
        rank = np.empty(rows, dtype=np.int64)
        counts = np.bincount(assigned, minlength=len(self.chains.streams))
        firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rank[order] = np.arange(rows) - firsts[assigned[order]]
        by_round = np.argsort(rank, kind="stable")  # (each round's rows in batch order)
        bounds = [0, *np.cumsum(np.bincount(rank, minlength=1)).tolist()] if rows else [0]
        for lo, hi in zip(bounds, bounds[1:]):
            at = by_round[lo:hi]
            streams = assigned[at].tolist()
            ending = [s for s, i in zip(streams, at.tolist()) if ends[i]]
            if ending:
                store.end_episode(streams=ending)
            store.add_batch(frames_obs[at], leaves[ACTION][at], reward[at], frames_next[at], terminated[at],
                            truncated[at], autoreset_mode="disabled",
                            extras={name: value[at] for name, value in extras.items()}, streams=streams)
            heads = np.array([store.rings.streams[s].added for s in streams], dtype=np.int64)
            where[at] = (np.asarray(streams, dtype=np.int64) << SHIFT if store.rings.num_streams > 1 else 0) | (heads - 2)
        self.positions[index] = where
        self.seq += rows
        if count:
            self.length = min(self.length + rows, self.max_size)

    def _check(self, index: np.ndarray, leaves: Leaves) -> None:
        for key in (self.obs_key, self.next_key, ACTION):
            if key not in leaves:
                held = ", ".join(repr(k if len(k) > 1 else k[0]) for k in leaves)
                raise ConfigError(f"the transitions have no {key if len(key) > 1 else key[0]!r} key (they hold {held}); "
                                  "ReplayStoreStorage keeps a collector's transitions: pass observation_key= for "
                                  "observations kept under another key")
        if ("next", "done") not in leaves and ("next", "terminated") not in leaves:
            raise ConfigError("the transitions have neither ('next', 'done') nor ('next', 'terminated'): the store "
                              "needs to know where episodes end")
        rows = len(index)
        for key, value in leaves.items():
            if value.shape[:1] != (rows,):
                raise InvalidTransitionError(f"{key!r} has shape {value.shape}, not {rows} rows: extend takes a batch "
                                             "of transitions with one batch dimension (collector output [envs, time]: "
                                             "reshape(-1) first)")
        if index.size and (index.min() < 0 or index.max() >= self.max_size):
            raise ConfigError(f"index {int(index.min())}..{int(index.max())} is outside 0..{self.max_size - 1}")
        if self.store is not None:
            kept = set(self.keys) | {self.obs_key, self.next_key, ACTION}
            if set(leaves) != kept:
                more, less = sorted(set(leaves) - kept), sorted(kept - set(leaves))
                raise ConfigError(f"these transitions' keys differ from the store's: {'new ' + str(more) if more else ''}"
                                  f"{' and ' if more and less else ''}{'missing ' + str(less) if less else ''}; "
                                  "extend with the same keys each time (select or exclude them), or use a new path")

    # ---------------------------------------------------------------------------------------------
    # Reading

    def read(self, index: np.ndarray) -> Leaves:
        """The transitions at TorchRL's ``index`` (any shape; the leaves have it as their batch shape)."""
        store, layout = self._opened()
        index = np.asarray(index, dtype=np.int64)
        at = self.at(index.reshape(-1))
        batch = store.sample(at.size, sampler=At(at)) if at.size else None
        lead = index.shape
        out: Leaves = {}
        if batch is None:
            return out
        out[self.obs_key] = layout.rebuild(batch.obs).reshape(*lead, *layout.obs_shape)
        out[ACTION] = batch.action.reshape(*lead, *batch.action.shape[1:])
        out[self.next_key] = layout.rebuild(batch.next_obs).reshape(*lead, *layout.obs_shape)
        for key in self.keys:
            value = batch.extras[leaf_name(key)]
            out[key] = value.reshape(*lead, *value.shape[1:])
        return out

    def column(self, key: Key, rows: np.ndarray, slots: np.ndarray | None = None) -> np.ndarray:
        """Leaf ``key`` of the transitions at TorchRL's indices ``rows`` (1-D): the observations read
        through the store (``read``), every other leaf from the store's columns in RAM, no frame read
        (at the store's ``slots`` of the rows, ``slots(rows)``, when given)."""
        store, _ = self._opened()
        shape, dtype = self.specs()[key]
        if not rows.size:
            return np.empty((0, *shape), dtype=dtype)
        if key in (self.obs_key, self.next_key):
            return self.read(rows)[key]
        if slots is None:
            slots = self.slots(rows)
        rings = store.rings
        values = rings.action[slots] if key == ACTION else rings.extras["extras/" + leaf_name(key)][slots]
        return values.astype(dtype, copy=False).reshape(len(rows), *shape)

    def slots(self, rows: np.ndarray) -> np.ndarray:
        """The store's slots of the transitions at TorchRL's indices ``rows``; ``SampleError`` for one
        that holds nothing, or was overwritten."""
        store, _ = self._opened()
        return live_slots(store.rings, self.at(rows))

    def specs(self) -> dict[Key, tuple[tuple[int, ...], np.dtype]]:
        """Each leaf's shape (one transition's) and dtype, as ``read`` gives them, in its order."""
        store, layout = self._opened()
        frames = (tuple(layout.obs_shape), np.dtype(store.schema.observation.dtype))
        out = {self.obs_key: frames, ACTION: (tuple(store.rings.action.shape[1:]), store.rings.action_dtype),
               self.next_key: frames}
        for spec in store.schema.extras:
            if spec.name.startswith(LEAF):
                out[leaf_key(spec.name)] = (tuple(spec.shape), np.dtype(spec.dtype))
        return {key: out[key] for key in (self.obs_key, ACTION, self.next_key, *self.keys)}

    def at(self, flat: np.ndarray) -> np.ndarray:
        """The store positions of TorchRL's indices ``flat``; ``SampleError`` for one that holds nothing."""
        if flat.size and (flat.min() < 0 or flat.max() >= self.max_size):
            raise SampleError(f"index {int(flat.min())}..{int(flat.max())} is outside 0..{self.max_size - 1}")
        at = self.positions[flat]
        if (at < 0).any():
            raise SampleError(f"index {int(flat[at < 0][0])} holds no transition (the storage holds {self.length})")
        return at

    def _opened(self) -> tuple[ReplayStore, StackLayout]:
        if self.store is None or self.layout is None:
            raise SampleError("this ReplayStoreStorage holds nothing yet: extend it first")
        return self.store, self.layout
