"""What a Q-network takes: stacks of a store's observations, as the store returns them.

A store of Box observations (and of Discrete, MultiBinary or MultiDiscrete ones, kept as the Box of
their ints) gives one array a batch, ``(batch, frame_stack, *frame_shape)``. A store of Dict
observations (a goal env's ``observation``, ``achieved_goal`` and ``desired_goal``) gives a dict of
such arrays, one per key in the space's order, each entry stacked on its own (format/dictobs.py).
``StackSpec`` describes either, built from an observation space (the env's, or the store's) and a
frame stack, so that the model checks, the learner's input signature, acting, evaluation, the
store checks and ``agent.json`` all speak of the same thing.

The helpers below treat "an array, or a dict of arrays" alike (``tree_map``), so the acting and
evaluation loops stack a Dict env's observations with the code that stacks frames.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import ConfigError
from replaystore.format.dictobs import dict_from_space, is_dict_space
from replaystore.format.spaces import observation_from_space

from .config import TrainerError

Tree = Any  # an np.ndarray, or a dict of them (a Dict space's keys)


def tree_map(fn: Callable[..., Any], tree: Tree, *rest: Tree) -> Tree:
    """``fn`` on each array of ``tree`` (and the matching arrays of ``rest``): a dict keeps its keys."""
    if isinstance(tree, Mapping):
        return {key: fn(value, *(r[key] for r in rest)) for key, value in tree.items()}
    return fn(tree, *rest)


@dataclass(frozen=True)
class StackSpec:
    """Stacks of ``frame_stack`` frames: one array of ``entries[0]``'s frame shape and dtype (``keys``
    None), or a dict with one per key (a Dict space; ``keys`` in its order)."""

    frame_stack: int
    entries: tuple[tuple[str, tuple[int, ...], np.dtype], ...]  # (key, frame shape, dtype); key "" for one array
    keyed: bool

    @classmethod
    def of_space(cls, space: Any, frame_stack: int) -> StackSpec:
        """The stacks a store of ``space`` gives (TrainerError for a space no store keeps)."""
        try:
            if is_dict_space(space):
                spec = dict_from_space(space)
                if spec.tree is not None:
                    raise TrainerError(f"the observation space is {spec.describe()}; this DQN takes a Dict of Boxes "
                                       "and the like, not a nested Dict or a Tuple: flatten it (gymnasium's "
                                       "FlattenObservation on the env) into a new store")
                return cls(int(frame_stack), tuple((e.key, tuple(e.shape), np.dtype(e.dtype)) for e in spec.entries),
                           True)
            box, _ = observation_from_space(space)
        except ConfigError as exc:
            raise TrainerError(f"the observation space {space} cannot be stacked: {exc}") from None
        return cls(int(frame_stack), (("", tuple(box.shape), np.dtype(box.dtype)),), False)

    @classmethod
    def single(cls, shape: tuple[int, ...], dtype: Any) -> StackSpec:
        """One array of stacks shaped ``shape`` (``(frame_stack, *frame_shape)``)."""
        return cls(int(shape[0]), (("", tuple(int(d) for d in shape[1:]), np.dtype(dtype)),), False)

    # What the stacks are ------------------------------------------------------------------------

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for key, _, _ in self.entries)

    @property
    def shape(self) -> tuple[int, ...]:
        """One array's stack shape, ``(frame_stack, *frame_shape)`` (a Dict's: TrainerError)."""
        if self.keyed:
            raise TrainerError("a Dict store's stacks have one shape per key")
        return (self.frame_stack, *self.entries[0][1])

    @property
    def dtype(self) -> np.dtype:
        return self.entries[0][2]

    def describe(self) -> str:
        """``(4, 84, 84) uint8``, or ``{observation: (1, 6) int8, desired_goal: (1, 6) int8}``."""
        parts = [f"{(self.frame_stack, *shape)} {dtype.name}" for _, shape, dtype in self.entries]
        if not self.keyed:
            return parts[0]
        return "{" + ", ".join(f"{key}: {part}" for key, part in zip(self.keys, parts, strict=True)) + "}"

    # Arrays of them -----------------------------------------------------------------------------

    def zeros(self, n: int, *, frames: bool = False) -> Tree:
        """``n`` stacks of zeros (``frames``: ``n`` single frames instead)."""
        lead = (n,) if frames else (n, self.frame_stack)
        out = {key: np.zeros((*lead, *shape), dtype) for key, shape, dtype in self.entries}
        return out if self.keyed else out[""]

    def batch(self, obs: Any) -> tuple[Tree, bool]:
        """``obs`` as a batch of stacks, and whether it was one stack; TrainerError if it is neither."""
        if self.keyed != isinstance(obs, Mapping) or (self.keyed and set(obs) != set(self.keys)):
            raise TrainerError(f"act takes a stack of {self.describe()} or a batch of them, not {_looks(obs)}; "
                               "stack frames oldest first, as the store returns them")
        arrays = {key: np.asarray(obs[key] if self.keyed else obs) for key in self.keys}
        single = all(arrays[key].shape == (self.frame_stack, *shape) for key, shape, _ in self.entries)
        many = all(arrays[key].shape[1:] == (self.frame_stack, *shape) for key, shape, _ in self.entries)
        many = many and len({arrays[key].shape[0] for key in self.keys}) == 1
        if not single and not many:
            raise TrainerError(f"act takes a stack of {self.describe()} or a batch of them, not {_looks(obs)}; "
                               "stack frames oldest first, as the store returns them")
        if single:
            arrays = {key: value[None] for key, value in arrays.items()}
        return (arrays if self.keyed else arrays[""]), single

    def tf_signature(self) -> Any:
        """The learner's ``tf.function`` input signature for a batch of these stacks."""
        import tensorflow as tf

        out = {key: tf.TensorSpec((None, self.frame_stack, *shape), tf.as_dtype(dtype))
               for key, shape, dtype in self.entries}
        return out if self.keyed else out[""]

    # Against spaces and stores ------------------------------------------------------------------

    def takes_frames_of(self, space: Any) -> bool:
        """Whether an env observing ``space`` gives this spec's frames (its stacks are these)."""
        try:
            other = StackSpec.of_space(space, self.frame_stack)
        except TrainerError:
            return False
        return other == self

    def to_json(self, n_actions: int) -> dict[str, Any]:
        """``agent.json``'s ``stacks``: ``shape`` and ``dtype`` (one array), or ``entries`` (a Dict)."""
        if self.keyed:
            return {"frame_stack": self.frame_stack, "actions": n_actions,
                    "entries": [[key, list(shape), dtype.name] for key, shape, dtype in self.entries]}
        return {"shape": list(self.shape), "dtype": self.dtype.name, "actions": n_actions}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> tuple[StackSpec, int]:
        """``to_json``'s document back (KeyError, TypeError or ValueError if it is damaged)."""
        if "entries" in doc:
            entries = tuple((str(key), tuple(int(d) for d in shape), np.dtype(dtype)) for key, shape, dtype in doc["entries"])
            if not entries:
                raise ValueError("no entries")
            return cls(int(doc["frame_stack"]), entries, True), int(doc["actions"])
        return cls.single(tuple(int(d) for d in doc["shape"]), np.dtype(doc["dtype"])), int(doc["actions"])


def _looks(obs: Any) -> str:
    """What ``obs`` is, for a message."""
    if isinstance(obs, Mapping):
        return "{" + ", ".join(f"{key}: {np.shape(value)}" for key, value in obs.items()) + "}"
    return f"shape {np.shape(obs)}"


def stacks_of(frames: Tree, frame_stack: int) -> Tree:
    """A batch of stacks that each hold one frame of ``frames`` ``(n, *frame)`` in every slot (the
    first observations of ``n`` episodes: the store's padding)."""
    return tree_map(lambda f: np.repeat(np.asarray(f)[:, None], frame_stack, axis=1), frames)


def push_frames(stacks: Tree, frames: Tree, restart: np.ndarray) -> None:
    """Move a batch of stacks on by one frame each (``frames``, ``(n, *frame)``), in place; the rows
    ``restart`` start a new episode at their frame instead (every slot holds it)."""
    any_restart = bool(restart.any())

    def push(stack: np.ndarray, frame: Any) -> None:
        frame = np.asarray(frame)
        stack[:, :-1] = stack[:, 1:]
        stack[:, -1] = frame
        if any_restart:
            stack[restart] = frame[restart][:, None]

    tree_map(push, stacks, frames)


def one_of(stack: Tree) -> Tree:
    """One stack as a batch of one."""
    return tree_map(lambda s: s[None], stack)
