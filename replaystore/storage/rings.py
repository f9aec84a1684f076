"""A store's episode streams seen as one: the per-step arrays of every stream, and positions that
say which stream they belong to.

Each stream is a ``Ring`` (ring.py) exactly like a one-stream store's: its own positions (counted
from its creation), live range, ``ep_step`` stacks and sampleable bitmap. Its arrays are views of
the store's arrays, which lay the streams' regions end to end: stream ``k``'s slot ``s`` is the
store's slot ``k * stride + s`` (``stride`` is the stream's capacity rounded up to whole shards, so
no shard file holds two streams; schema.stream_stride).

Sampling works on *global positions*: stream ``k``'s position ``p`` is ``k << SHIFT | p``. Frame
stacks (``p - j``), n-step successors (``p + j``) and comparisons with the stream's head stay within
the stream, so the sampler and the batch assembly use the same arithmetic as for one stream, with
``slots`` and ``heads`` in place of ``% capacity`` and ``added``. With one stream a global position
is the stream's position and a slot is ``p % capacity``: one-stream stores behave as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaystore.format.extras import PREFIX as EXTRAS
from replaystore.format.extras import ExtraSpec
from replaystore.format.schema import MAX_POSITION, batch_action, scalar_fields
from replaystore.format.spaces import ActionSpec
from replaystore.storage.columns import new_columns
from replaystore.storage.ring import Ring, name_fields

SHIFT = MAX_POSITION.bit_length()  # 46: a stream may add 2**46 steps (70 trillion)
MASK = (1 << SHIFT) - 1


#: The position of a frame that is all zeros: the padding of a zero-padded store's stacks.
ZERO_FRAME = -1


class Rings:
    """The store's scalar arrays (``size`` slots) and one ``Ring`` view per stream."""

    # numpy arrays or the narrow columns of columns.py, indexed alike
    action: Any
    reward: Any
    terminated: Any
    truncated: Any
    is_last: Any
    ep_step: StoreEpisodeSteps
    priority: Any

    def __init__(self, num_streams: int, stream_capacity: int, stride: int, frame_stack: int, shard_len: int,
                 action: ActionSpec, *, zero_padding: bool = False, extras: tuple[ExtraSpec, ...] = ()) -> None:
        """``action``: the store's action space (schema.action), which sets the action array's shape
        and dtype, and the dtype sampled actions are returned in (``action_dtype``)."""
        self.num_streams = num_streams
        self.zero_padding = zero_padding
        self.stream_capacity = stream_capacity
        self.stride = stride
        self.size = stride * num_streams
        self.frame_stack = frame_stack
        self.shard_len = shard_len
        columns = new_columns(scalar_fields(action, extras), self.size, action=action)
        self.action_dtype = np.dtype(batch_action(action)[1])
        self.valid = columns["valid"]
        #: the priority a new transition is written with (the prioritized sampler raises it to the
        #: largest priority it has seen, so a new transition is drawn at least as often as any other)
        self.new_priority = 1.0
        self.streams: list[Ring] = []
        for k in range(num_streams):
            self.streams.append(Ring(stream_capacity, frame_stack, shard_len,
                                     columns=Ring.views(columns, k * stride, k * stride + stream_capacity)))
            self.streams[-1].action_dtype = self.action_dtype
        self.fields: dict[str, Any] = {name: c for name, c in columns.items() if name != "valid"}
        self.fields["ep_step"] = StoreEpisodeSteps(self)
        name_fields(self)
        #: the extras' arrays (format/extras.py), by field name
        self.extras = {name: values for name, values in self.fields.items() if name.startswith(EXTRAS)}

    # ---------------------------------------------------------------------------------------------
    # Positions

    def slots(self, positions: np.ndarray) -> np.ndarray:
        """The store's slots of global ``positions`` (any shape)."""
        if self.num_streams == 1:
            return positions % self.stream_capacity
        return (positions >> SHIFT) * self.stride + (positions & MASK) % self.stream_capacity

    def heads(self, positions: np.ndarray) -> np.ndarray | int:
        """For each global position, its stream's ``added`` as a global position: ``p + j`` is stored
        exactly when ``p + j < heads(p)``."""
        if self.num_streams == 1:
            return self.streams[0].added
        return self.global_added()[positions >> SHIFT]

    def global_added(self) -> np.ndarray:
        return np.array([k << SHIFT | r.added for k, r in enumerate(self.streams)], dtype=np.int64)

    def stream_of_slots(self, slots: np.ndarray) -> np.ndarray:
        return slots // self.stride

    def positions_of_slots(self, slots: np.ndarray) -> np.ndarray:
        """The live global position held by each of ``slots`` (slots in a stream's padding, or
        outside its live range, give positions the sampler's acceptance test rejects)."""
        k = slots // self.stride
        s = slots % self.stride
        lo = np.array([r.lo for r in self.streams], dtype=np.int64)[k]
        return (k << SHIFT) | (lo + (s - lo) % self.stream_capacity)

    @property
    def n_valid(self) -> int:
        return sum(r.n_valid for r in self.streams)

    @property
    def added(self) -> int:
        """Steps ever added, over all streams."""
        return sum(r.added for r in self.streams)

    @property
    def live_steps(self) -> int:
        return sum(r.live_steps for r in self.streams)

    def live_ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """Per stream, the global positions ``[lo, added - 1)`` that may be sampleable."""
        ks = np.arange(self.num_streams, dtype=np.int64) << SHIFT
        lo = np.array([r.lo for r in self.streams], dtype=np.int64)
        hi = np.array([max(r.lo, r.added - 1) for r in self.streams], dtype=np.int64)
        return ks | lo, ks | hi

    def stack_positions(self, positions: np.ndarray) -> np.ndarray:
        """``(len, frame_stack)`` global positions of the frames stacked at each step, oldest first.
        A frame before its episode's first step is that first step again (reset padding) or, in a
        zero-padded store, ``ZERO_FRAME`` (the reader fills it with zeros)."""
        offsets = np.arange(self.frame_stack - 1, -1, -1, dtype=np.int64)
        ep = self.ep_step.at(positions)
        stacks = positions[:, None] - np.minimum(offsets[None, :], ep[:, None])
        if self.zero_padding and self.frame_stack > 1:
            stacks[offsets[None, :] > ep[:, None]] = ZERO_FRAME
        return stacks

    def mark_priority_dirty(self, slots: np.ndarray) -> None:
        """Note the scalar shards whose priorities changed, in each stream's own shard numbers."""
        for k, local in zip(*np.unique(np.stack([slots // self.stride, (slots % self.stride) // self.shard_len]),
                                       axis=1)):
            self.streams[int(k)].dirty_priority_shards.add(int(local))


class StoreEpisodeSteps:
    """``ep_step`` by the store's slot or global position: each stream's index (episteps.py)."""

    dtype = np.dtype(np.int32)

    def __init__(self, rings: Rings) -> None:
        self.rings = rings

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.rings.size,)

    @property
    def nbytes(self) -> int:
        return sum(r.ep_step.nbytes for r in self.rings.streams)

    def copy(self) -> np.ndarray:
        """Every slot's value, as a numpy array."""
        return np.asarray(self[np.arange(self.rings.size)])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.copy()
        return out if dtype is None else out.astype(dtype)

    def __len__(self) -> int:
        return self.rings.size

    def __getitem__(self, slots: Any) -> Any:
        """``ep_step`` by the store's slot (0 where no live step is)."""
        rings = self.rings
        if rings.num_streams == 1:
            return rings.streams[0].ep_step[slots]
        slots = np.asarray(slots, dtype=np.int64)
        k, local = slots // rings.stride, slots % rings.stride
        out = np.zeros(slots.shape, dtype=self.dtype)
        for stream in np.unique(k).tolist():
            mask = k == stream
            out[mask] = rings.streams[stream].ep_step[np.minimum(local[mask], rings.stream_capacity - 1)]
        return out

    def at(self, positions: np.ndarray) -> np.ndarray:
        """``ep_step`` of live global ``positions`` (any shape)."""
        rings = self.rings
        if rings.num_streams == 1:
            return rings.streams[0].ep_step.at(positions)
        k = positions >> SHIFT
        local = positions & MASK
        out = np.zeros(np.shape(positions), dtype=np.int64)
        for stream in np.unique(k).tolist():
            mask = k == stream
            out[mask] = rings.streams[stream].ep_step.at(local[mask])
        return out
