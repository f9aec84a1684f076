"""Dict observation spaces: a gymnasium ``Dict`` of ``Box``, ``Discrete``, ``MultiBinary`` and
``MultiDiscrete`` entries, kept as one flat frame a step (a ``Discrete`` as one int64, a
``MultiBinary`` as int8 0/1 values, a ``MultiDiscrete`` as its ints: spaces.stored_box; their values
are checked to lie in the space).

Goal-conditioned envs (``observation``, ``achieved_goal``, ``desired_goal``), Minari's maze datasets
and SB3's ``MultiInputPolicy`` observe dicts. The store keeps every step's dict as one frame, so that
everything below the facade (rings, shards, chunk cache, decode processes, stacking, padding) is the
same code that serves Box stores, and each step's entries are fetched together with one chunk read:

- the entries are laid side by side in the space's key order, each as its own bytes in its own
  dtype, each starting at a multiple of its item size (zero bytes pad between them), and the frame's
  length is padded to a multiple of the largest item size, so every entry of a frame whose start is
  aligned is itself aligned;
- where every entry has the same dtype the frame is a 1-D array of that dtype (a plain zarr reader
  sees ``(slots, D)`` values, and no padding is ever needed); with mixed dtypes it is the frame's
  bytes, ``uint8``, so nothing is cast and nothing is stored wider than the env gave it;
- ``pack`` checks a dict (the keys, each entry's shape, a dtype that casts safely, no NaN) and
  writes it into a frame, ``unpack`` views stacked frames as a dict of arrays, without copying.

The group attributes describe the space as ``{"type": "Dict", "spaces": [[key, Box], ...]}``;
replaystore versions before Dict support refuse such a store at open instead of reading flat frames.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, InvalidTransitionError
from replaystore.format import nesting
from replaystore.format.nesting import Nesting
from replaystore.format.spaces import (
    BoxSpec,
    DiscreteSpec,
    EntrySpec,
    MultiBinarySpec,
    MultiDiscreteSpec,
    compact_bound,
    entry_from_space,
    parse_bound,
    space_attrs,
    stored_box,
)

#: Most entries in one Dict observation.
MAX_ENTRIES = 256


@dataclass(frozen=True)
class Entry:
    """Where one key's values lie in a stored frame: ``nbytes`` from ``offset`` bytes in, ``shape`` of ``dtype``."""

    key: str
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    #: the values a Discrete, MultiBinary or MultiDiscrete entry may take, lowest and highest (each an
    #: int, or a MultiDiscrete's per element, flattened); ``pack`` refuses others. None for a Box.
    bounds: tuple[Any, Any] | None = None


@dataclass(frozen=True)
class Packed:
    """Frames that ``pack`` of the same ``DictSpec`` made (checked already): ``pack`` takes them as
    they are, so a caller that packed a dict to look at it (the SB3 buffer's stack checks) does not
    pack it twice. Internal: only ``DictSpec.pack``'s output belongs in one."""

    spec: DictSpec
    frames: np.ndarray


@dataclass(frozen=True)
class DictSpec:
    """A gymnasium ``Dict`` of ``Box``, ``Discrete``, ``MultiBinary`` and ``MultiDiscrete`` entries, in
    its key order, and ``stored``, the flat Box frame that holds one step's dict in the store. A
    nested ``Dict`` or a ``Tuple`` is the flat Dict of its leaves, each named by its path, and
    ``tree``, its structure (format/nesting.py), which ``pack`` takes and ``unpack`` gives."""

    spaces: tuple[tuple[str, EntrySpec], ...]
    tree: Nesting | None = None
    stored: BoxSpec = field(init=False, compare=False, repr=False)
    entries: tuple[Entry, ...] = field(init=False, compare=False, repr=False)
    keys: tuple[str, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        boxes = [stored_box(spec) for _, spec in self.spaces]
        dtypes = [np.dtype(box.dtype) for box in boxes]
        entries, offset = [], 0
        for (key, spec), box, dtype in zip(self.spaces, boxes, dtypes):
            offset = -(-offset // dtype.itemsize) * dtype.itemsize  # aligned to its item size
            bounds = None if isinstance(spec, BoxSpec) else (_flat(box.low), _flat(box.high))
            entries.append(Entry(key, offset, box.shape, dtype, math.prod(box.shape) * dtype.itemsize, bounds))
            offset += entries[-1].nbytes
        widest = max(d.itemsize for d in dtypes)
        nbytes = -(-offset // widest) * widest
        if all(d == dtypes[0] for d in dtypes):  # one dtype: no padding, the values as they are
            lows = [np.broadcast_to(np.asarray(parse_bound(b.low), dtypes[0]), b.shape).ravel() for b in boxes]
            highs = [np.broadcast_to(np.asarray(parse_bound(b.high), dtypes[0]), b.shape).ravel() for b in boxes]
            stored = BoxSpec((nbytes // widest,), dtypes[0].name, parse_bound(compact_bound(np.concatenate(lows))),
                             parse_bound(compact_bound(np.concatenate(highs))))
        else:  # the frame's bytes
            stored = BoxSpec((nbytes,), "uint8", 0, 255)
        object.__setattr__(self, "stored", stored)
        object.__setattr__(self, "entries", tuple(entries))
        object.__setattr__(self, "keys", tuple(key for key, _ in self.spaces))

    def to_space(self) -> Any:
        """The gymnasium ``Dict`` space, its keys in the stored order (a nested one, or a ``Tuple``)."""
        import gymnasium as gym

        if self.tree is not None:
            return nesting.to_space(self.tree, [spec.to_space() for _, spec in self.spaces])
        return gym.spaces.Dict([(key, spec.to_space()) for key, spec in self.spaces])

    def describe(self) -> str:
        """``Dict(observation: float64(4,), mode: Discrete(3), bits: MultiBinary(8,))``, for messages and ``inspect``."""
        if self.tree is not None:
            return nesting.describe(self.tree, [describe_entry(spec) for _, spec in self.spaces])
        return "Dict(" + ", ".join(f"{k}: {describe_entry(spec)}" for k, spec in self.spaces) + ")"

    # ---------------------------------------------------------------------------------------------
    # Observations in and out

    def pack(self, value: Any, *, name: str, path: str | Path, lead: tuple[int, ...] = (),
             out: np.ndarray | None = None) -> np.ndarray:
        """``value`` (a mapping of this space's keys to arrays of ``lead + shape``) checked and written
        into stored frames ``(*lead, *stored.shape)`` (``out``, or a new array). Raises
        ``InvalidTransitionError`` naming the key that is wrong, before anything is written."""
        if (isinstance(value, Packed) and (value.spec is self or value.spec == self)
                and value.frames.shape == (*lead, *self.stored.shape)):
            if out is None:
                return value.frames
            out[...] = value.frames
            return out
        if self.tree is not None:  # a nested Dict or a Tuple: its leaves by their paths
            value = dict(zip(self.keys, nesting.flatten(self.tree, value, name=name, path=str(path),
                                                         expected=self.describe), strict=True))
        if not isinstance(value, Mapping):
            raise InvalidTransitionError(f"{name} is a {type(value).__name__}, but {path} stores Dict observations "
                                         f"{self.describe()}: pass a dict of those keys")
        if len(value) != len(self.keys) or any(k not in value for k in self.keys):
            missing = [k for k in self.keys if k not in value]
            extra = [str(k) for k in value if k not in self.keys]
            raise InvalidTransitionError(
                f"{name} has the keys {sorted(map(str, value))}, but {path} stores Dict observations of the keys "
                f"{list(self.keys)}" + (f"; missing {missing}" if missing else "") + (f"; unknown {extra}" if extra else "")
                + ": pass the env's observation dict as it is, or create a store for its space")
        arrays = []
        for entry in self.entries:
            arr = np.asarray(value[entry.key])
            if arr.shape != (*lead, *entry.shape):
                raise InvalidTransitionError(f"{name}[{entry.key!r}] has shape {arr.shape}, but {path} stores it as "
                                             f"{(*lead, *entry.shape)}; pass the env's observation as it is")
            if arr.dtype != entry.dtype:
                if not np.can_cast(arr.dtype, entry.dtype, casting="safe"):
                    raise InvalidTransitionError(f"{name}[{entry.key!r}] has dtype {arr.dtype}, but {path} stores "
                                                 f"{entry.dtype}; convert it with .astype({entry.dtype.name!r}) or "
                                                 f"create a store for {arr.dtype}")
                arr = arr.astype(entry.dtype)
            if entry.bounds is not None and arr.size:
                low, high = (b if isinstance(b, int) else np.reshape(b, entry.shape) for b in entry.bounds)
                outside = (arr < low) | (arr > high)
                if outside.any():
                    at = np.unravel_index(int(np.argmax(outside)), outside.shape)
                    lo, hi = (b if isinstance(b, int) else int(np.broadcast_to(b, arr.shape)[at]) for b in (low, high))
                    raise InvalidTransitionError(f"{name}[{entry.key!r}] holds {arr[at].item()!r}, outside the "
                                                 f"{lo}..{hi} of its space in {path}; pass the env's observation as "
                                                 "it is; nothing was written")
            if arr.dtype.kind == "f" and np.isnan(arr).any():
                raise InvalidTransitionError(f"{name}[{entry.key!r}] holds NaN ({int(np.isnan(arr).sum())} values); "
                                             f"{path} refuses NaN observations (one poisons every Q-value computed "
                                             "from it): check the env's observation, or replace NaN before adding; "
                                             "nothing was written")
            arrays.append(arr)
        stored = np.dtype(self.stored.dtype)
        frames = np.zeros((*lead, *self.stored.shape), dtype=stored) if out is None else out
        raw = frames.view(np.uint8)
        for entry, arr in zip(self.entries, arrays):
            raw[..., entry.offset : entry.offset + entry.nbytes] = arr.reshape(*lead, -1).view(np.uint8)
        return frames

    def unpack(self, frames: np.ndarray) -> Any:
        """Stored frames ``(..., *stored.shape)`` as this space's dict (a nested space's dicts and
        tuples): each key's values shaped ``(..., *shape)`` in its dtype, views of ``frames`` (no copy)."""
        views = self.views(frames)
        return views if self.tree is None else nesting.nest(self.tree, list(views.values()))

    def views(self, frames: np.ndarray) -> dict[str, np.ndarray]:
        """Stored frames as the flat dict of the leaves (``unpack`` without the nesting)."""
        raw = frames.view(np.uint8)
        lead = frames.shape[:-1]
        return {e.key: raw[..., e.offset : e.offset + e.nbytes].view(e.dtype).reshape((*lead, *e.shape))
                for e in self.entries}  # (a tuple: one frame of a scalar entry reshapes to ())

    # ---------------------------------------------------------------------------------------------
    # To and from the group attributes

    def attrs(self) -> dict[str, Any]:
        """The space's entry in the group attributes."""
        if self.tree is not None:
            return nesting.to_attrs(self.tree, [space_attrs(spec) for _, spec in self.spaces])
        return {"type": "Dict", "spaces": [[key, space_attrs(box)] for key, box in self.spaces]}


def _flat(bound: Any) -> Any:
    """A stored Box bound as ``Entry.bounds`` holds it: an int, or a tuple of ints (flattened)."""
    return int(bound) if not isinstance(bound, list) else tuple(int(v) for v in np.ravel(bound))


def describe_entry(spec: EntrySpec) -> str:
    """One entry as ``describe`` names it: ``float64(4,)``, ``Discrete(3)``, ``MultiBinary(8,)``."""
    if isinstance(spec, DiscreteSpec):
        return f"Discrete({spec.n}" + (f", start={spec.start})" if spec.start else ")")
    if isinstance(spec, MultiBinarySpec):
        return f"MultiBinary({spec.n})" if isinstance(spec.n, int) else f"MultiBinary{spec.n}"
    if isinstance(spec, MultiDiscreteSpec):
        return f"MultiDiscrete{tuple(spec.shape)}"
    return f"{spec.dtype}{tuple(spec.shape)}"


def dict_from_space(space: Any) -> DictSpec:
    """Describe a gymnasium ``Dict`` (or ``Tuple``, nested ones included) of ``Box``, ``Discrete``,
    ``MultiBinary`` and ``MultiDiscrete`` entries (``ConfigError`` for any other entry)."""
    spaces = []
    leaves, tree = nesting.leaves_of(space)
    for key, sub in leaves:
        try:
            spec = entry_from_space(sub)
        except ConfigError:
            raise ConfigError(f"observation_space[{key!r}] is {sub!r}, but a Dict or Tuple observation is stored when "
                              "every entry is a Box, Discrete, MultiBinary or MultiDiscrete (or a Dict or Tuple of "
                              "them); wrap the env so each entry is one") from None
        if isinstance(spec, BoxSpec) and np.dtype(spec.dtype).kind not in "biuf":
            raise ConfigError(f"observation_space[{key!r}] has dtype {spec.dtype}; entries must be bool, int or float")
        spaces.append((key, spec))
    if not 0 < len(spaces) <= MAX_ENTRIES:
        raise ConfigError(f"observation_space has {len(spaces)} entries; a store takes 1 to {MAX_ENTRIES}")
    return DictSpec(tuple(spaces), tree)


def is_dict_space(space: Any) -> bool:
    """Whether ``space`` is stored as a Dict store's: a gymnasium ``Dict`` or ``Tuple`` (without
    importing gymnasium for other spaces)."""
    return nesting.is_structured(space)

