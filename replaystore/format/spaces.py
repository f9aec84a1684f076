"""Gymnasium spaces as a store describes them: ``BoxSpec`` (observations, and continuous actions),
``DiscreteSpec``, and the round trip from a space and back; ``space_attrs`` is a spec as the group
attributes write it (bounds as strict JSON). schema.py holds the rest of a store's description.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import ConfigError

#: A per-step field's shape (beyond the step axis) and dtype.
StepField = tuple[tuple[int, ...], str]


@dataclass(frozen=True)
class BoxSpec:
    """A gymnasium ``Box`` space (the observations; the actions of continuous control): shape, dtype and bounds."""

    shape: tuple[int, ...]
    dtype: str
    low: Any  # a number when uniform, else nested lists of numbers (infinities as floats)
    high: Any

    @property
    def frame_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_space(self) -> Any:
        import gymnasium as gym

        dtype = np.dtype(self.dtype)
        # whole arrays: gymnasium takes a uniform bound as a number, but no numpy bool is one
        low = np.broadcast_to(np.asarray(self.low, dtype=dtype), self.shape).copy()
        high = np.broadcast_to(np.asarray(self.high, dtype=dtype), self.shape).copy()
        return gym.spaces.Box(low=low, high=high, shape=self.shape, dtype=dtype)


@dataclass(frozen=True)
class DiscreteSpec:
    """A gymnasium ``Discrete`` action space: ``n`` actions starting at ``start``."""

    n: int
    start: int = 0

    def to_space(self) -> Any:
        import gymnasium as gym

        return gym.spaces.Discrete(self.n, start=self.start)


@dataclass(frozen=True)
class MultiBinarySpec:
    """A gymnasium ``MultiBinary`` entry of a Dict observation: 0/1 values, kept as int8. ``n`` as
    gymnasium holds it (an int, or a tuple of ints: ``MultiBinary(8)`` and ``MultiBinary([8])`` are
    different spaces to gymnasium)."""

    n: int | tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n,) if isinstance(self.n, int) else self.n

    def to_space(self) -> Any:
        import gymnasium as gym

        return gym.spaces.MultiBinary(self.n if isinstance(self.n, int) else list(self.n))


@dataclass(frozen=True)
class MultiDiscreteSpec:
    """A gymnasium ``MultiDiscrete`` entry of a Dict observation: ints of ``shape`` in ``dtype``,
    element ``i`` in ``start[i] .. start[i] + nvec[i] - 1`` (``nvec`` and ``start`` flattened)."""

    shape: tuple[int, ...]
    nvec: tuple[int, ...]
    start: tuple[int, ...]
    dtype: str = "int64"

    def to_space(self) -> Any:
        import gymnasium as gym

        return gym.spaces.MultiDiscrete(np.array(self.nvec, dtype=self.dtype).reshape(self.shape),
                                        dtype=np.dtype(self.dtype),
                                        start=np.array(self.start, dtype=self.dtype).reshape(self.shape))


#: What one entry of a Dict observation can be: a Box, a Discrete (one int), a MultiBinary or a MultiDiscrete.
EntrySpec = BoxSpec | DiscreteSpec | MultiBinarySpec | MultiDiscreteSpec


def stored_box(spec: EntrySpec) -> BoxSpec:
    """The Box a Dict entry is kept as: a Box as it is; a ``Discrete(n, start)`` as one int64 in
    ``[start, start + n - 1]`` (gymnasium's dtype for it); a ``MultiBinary`` as int8 0/1 values."""
    if isinstance(spec, DiscreteSpec):
        return BoxSpec((), "int64", spec.start, spec.start + spec.n - 1)
    if isinstance(spec, MultiBinarySpec):
        return BoxSpec(spec.shape, "int8", 0, 1)
    if isinstance(spec, MultiDiscreteSpec):
        low = np.array(spec.start, dtype=np.int64).reshape(spec.shape)
        return BoxSpec(spec.shape, spec.dtype, _bound(low), _bound(low + np.array(spec.nvec).reshape(spec.shape) - 1))
    return spec


def observation_from_space(space: Any) -> tuple[BoxSpec, EntrySpec | None]:
    """A Box, Discrete, MultiBinary or MultiDiscrete observation space (not a Dict): the Box its
    observations are kept as (``stored_box``), and the space itself when it is not a Box (its values
    are checked to lie in it, and the store gives it back)."""
    spec = entry_from_space(space)
    if isinstance(spec, BoxSpec):
        return spec, None
    return stored_box(spec), spec


def entry_from_space(space: Any) -> EntrySpec:
    """Describe a Dict observation's entry: a Box, Discrete, MultiBinary or MultiDiscrete
    (``ConfigError`` for any other)."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return DiscreteSpec(n=int(space.n), start=int(space.start))
    if isinstance(space, gym.spaces.MultiBinary):
        return MultiBinarySpec(int(space.n) if isinstance(space.n, (int, np.integer)) else tuple(int(s) for s in space.n))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiDiscreteSpec(tuple(int(s) for s in space.shape), tuple(int(v) for v in space.nvec.ravel()),
                                 tuple(int(v) for v in space.start.ravel()), np.dtype(space.dtype).name)
    return box_from_space(space)


#: An action space a store holds: ``Discrete`` (one int a step, stored as int32) or ``Box``
#: (continuous control: an array of the Box's shape and dtype a step).
ActionSpec = DiscreteSpec | BoxSpec
#: Most elements in one ``Box`` action (its bytes are kept for every slot in RAM, like the scalars).
MAX_ACTION_SIZE = 1024


def compact_bound(bound: np.ndarray) -> Any:
    """A Box bound for JSON: one number when uniform, else nested lists; infinities (and NaN) as the
    strings ``"inf"``/``"-inf"`` (``"nan"``) anywhere, so the document is strict JSON."""
    flat = np.asarray(bound).ravel()
    if flat.size and np.all(flat == flat[0]):
        return _json_number(flat[0])
    return _json_numbers(np.asarray(bound).tolist())


def _json_numbers(value: Any) -> Any:
    if isinstance(value, list):
        return [_json_numbers(v) for v in value]
    return _json_number(value)


def _json_number(x: Any) -> Any:
    x = np.asarray(x).item()
    if isinstance(x, float) and not np.isfinite(x):
        return "inf" if x > 0 else ("-inf" if x < 0 else "nan")
    return x


def _bound(bound: np.ndarray) -> Any:
    """A Box bound as a spec holds it: a number when uniform, else nested lists."""
    return parse_bound(compact_bound(bound))


def parse_bound(b: Any) -> Any:
    if isinstance(b, str):
        return float(b)
    if isinstance(b, list):
        return [parse_bound(v) for v in b]
    return b


def box_from_space(space: Any) -> BoxSpec:
    """Describe a gymnasium Box; any other observation space is a ``ConfigError``."""
    import gymnasium as gym

    if not isinstance(space, gym.spaces.Box):
        raise ConfigError(
            f"observation_space is {space!r}, but replaystore stores Box, Discrete, MultiBinary and MultiDiscrete "
            "observations, or Dict and Tuple observations of those (nested ones too); wrap the env (e.g. "
            "FlattenObservation) so it yields one of those"
        )
    return BoxSpec(
        shape=tuple(int(s) for s in space.shape),
        dtype=np.dtype(space.dtype).name,
        low=_bound(space.low),
        high=_bound(space.high),
    )


def action_from_space(space: Any) -> ActionSpec:
    """Describe a gymnasium Discrete or Box action space; any other is a ``ConfigError``."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return DiscreteSpec(n=int(space.n), start=int(space.start))
    if not isinstance(space, gym.spaces.Box):
        raise ConfigError(
            f"action_space is {space!r}, but replaystore stores Discrete or Box actions only; "
            "wrap the env so its actions are one of those (gymnasium's TransformAction can map a Box onto "
            "a Dict, Tuple or MultiDiscrete)"
        )
    spec = box_from_space(space)
    size = int(np.prod(spec.shape, dtype=np.int64))
    if np.dtype(spec.dtype).kind not in "biuf" or not 0 < size <= MAX_ACTION_SIZE or len(spec.shape) > 8:
        raise ConfigError(f"action_space is {space!r}; a Box action must hold 1..{MAX_ACTION_SIZE} bool, int or "
                          "float values in at most 8 dimensions (each is kept in RAM for every slot)")
    return spec


def space_attrs(spec: EntrySpec) -> dict[str, Any]:
    """A space's entry in the attributes: its type, then its fields (a Box's bounds as strict JSON)."""
    if isinstance(spec, DiscreteSpec):
        return {"type": "Discrete", **dataclasses.asdict(spec)}
    if isinstance(spec, MultiBinarySpec):
        return {"type": "MultiBinary", "n": spec.n if isinstance(spec.n, int) else list(spec.n)}
    if isinstance(spec, MultiDiscreteSpec):
        return {"type": "MultiDiscrete", "shape": list(spec.shape), "nvec": list(spec.nvec), "start": list(spec.start),
                "dtype": spec.dtype}
    box = dataclasses.asdict(spec)
    box["shape"] = list(box["shape"])
    box["low"] = compact_bound(np.asarray(parse_bound(box["low"])))
    box["high"] = compact_bound(np.asarray(parse_bound(box["high"])))
    return {"type": "Box", **box}
