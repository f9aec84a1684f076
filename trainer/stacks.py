"""What a Q-network takes: stacks of a store's observations, as the store returns them.

A store of Box observations (and of Discrete, MultiBinary or MultiDiscrete ones, kept as the Box of
their ints) gives one array a batch, ``(batch, frame_stack, *frame_shape)``. A store of Dict
observations (a goal env's ``observation``, ``achieved_goal`` and ``desired_goal``) gives a dict of
such arrays, one per key in the space's order, each entry stacked on its own (format/dictobs.py); a
nested Dict or a Tuple (Blackjack's three Discrete) gives its own structure of dicts and tuples with
such an array at each leaf (format/nesting.py). ``StackSpec`` describes any of them, built from an
observation space (the env's, or the store's) and a frame stack, so that the model checks, the
learner's input signature, acting, evaluation, the store checks and ``agent.json`` all speak of the
same thing.

The helpers below treat "an array, or a structure of dicts and tuples of arrays" alike
(``tree_map``), so the acting and evaluation loops stack a Dict env's observations with the code
that stacks frames.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, InvalidTransitionError
from replaystore.format import nesting
from replaystore.format.dictobs import dict_from_space, is_dict_space
from replaystore.format.spaces import observation_from_space

from .config import TrainerError

Tree = Any  # an np.ndarray, or a dict of them (a Dict space's keys), or dicts and tuples of them (nested)


def tree_map(fn: Callable[..., Any], tree: Tree, *rest: Tree) -> Tree:
    """``fn`` on each array of ``tree`` (and the matching arrays of ``rest``): a dict keeps its keys,
    a tuple its order, at any depth."""
    if isinstance(tree, Mapping):
        return {key: tree_map(fn, value, *(r[key] for r in rest)) for key, value in tree.items()}
    if isinstance(tree, tuple):
        return tuple(tree_map(fn, value, *(r[i] for r in rest)) for i, value in enumerate(tree))
    return fn(tree, *rest)


@dataclass(frozen=True)
class StackSpec:
    """Stacks of ``frame_stack`` frames: one array of ``entries[0]``'s frame shape and dtype (not
    ``keyed``), or a dict with one per key (a Dict space; ``keys`` in its order), or, with ``tree``
    (a nested Dict or a Tuple), that structure with one at each leaf (``keys``: the leaves' paths)."""

    frame_stack: int
    entries: tuple[tuple[str, tuple[int, ...], np.dtype], ...]  # (key, frame shape, dtype); key "" for one array
    keyed: bool
    tree: nesting.Nesting | None = None  # a nested Dict's or a Tuple's structure (its leaves: entries' indices)

    @classmethod
    def of_space(cls, space: Any, frame_stack: int) -> StackSpec:
        """The stacks a store of ``space`` gives (TrainerError for a space no store keeps)."""
        try:
            if is_dict_space(space):
                spec = dict_from_space(space)
                return cls(int(frame_stack), tuple((e.key, tuple(e.shape), np.dtype(e.dtype)) for e in spec.entries),
                           True, spec.tree)
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

    @property
    def images(self) -> bool:
        """Whether the frames are images (2-D or 3-D; a Dict's or a Tuple's are not): what picks
        the hyperparameters' preset (config.PRESETS) and the default frame stack."""
        return not self.keyed and len(self.entries[0][1]) >= 2

    def describe(self) -> str:
        """``(4, 84, 84) uint8``, or ``{observation: (1, 6) int8, desired_goal: (1, 6) int8}``, or a
        nested one's structure (``((1,) int64, (1,) int64)`` for a Tuple)."""
        parts = [f"{(self.frame_stack, *shape)} {dtype.name}" for _, shape, dtype in self.entries]
        if not self.keyed:
            return parts[0]
        if self.tree is not None:
            return nesting.fold(self.tree, parts, lambda items: "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}",
                                lambda items: "(" + ", ".join(items) + ")")
        return "{" + ", ".join(f"{key}: {part}" for key, part in zip(self.keys, parts, strict=True)) + "}"

    def structured(self, leaves: dict[str, Any]) -> Tree:
        """One value per entry (by key) in this spec's form: the lone value, a dict, or the structure."""
        if not self.keyed:
            return leaves[""]
        if self.tree is not None:
            return nesting.nest(self.tree, [leaves[key] for key in self.keys])
        return leaves

    # Arrays of them -----------------------------------------------------------------------------

    def zeros(self, n: int, *, frames: bool = False) -> Tree:
        """``n`` stacks of zeros (``frames``: ``n`` single frames instead)."""
        lead = (n,) if frames else (n, self.frame_stack)
        return self.structured({key: np.zeros((*lead, *shape), dtype) for key, shape, dtype in self.entries})

    def random(self, n: int, rng: np.random.Generator) -> Tree:
        """``n`` stacks of random values that any model of them takes: floats drawn from a normal,
        ``uint8`` frames (images) from 0..255, other integers 0 (a state an embedding has)."""

        def draw(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            full = (n, self.frame_stack, *shape)
            if np.issubdtype(dtype, np.floating):
                return rng.standard_normal(full).astype(dtype)
            if dtype == np.uint8:
                return rng.integers(0, 256, full, dtype=np.uint8)
            return np.zeros(full, dtype)

        return self.structured({key: draw(shape, dtype) for key, shape, dtype in self.entries})

    def leaves(self, obs: Any) -> dict[str, Any] | None:
        """``obs``'s value for each entry, by key (None when ``obs`` is not of this spec's form)."""
        if not self.keyed:
            return None if isinstance(obs, Mapping | tuple) else {"": obs}
        if self.tree is not None:
            try:
                values = nesting.flatten(self.tree, obs, name="obs", path="the model", expected=self.describe)
            except InvalidTransitionError:
                return None
            return dict(zip(self.keys, values, strict=True))
        if not isinstance(obs, Mapping) or set(obs) != set(self.keys):
            return None
        return {key: obs[key] for key in self.keys}

    def is_frame(self, obs: Any) -> bool:
        """Whether ``obs`` is one frame (what one env returns), not a stack or a batch of stacks."""
        leaves = self.leaves(obs)
        return leaves is not None and all(np.shape(leaves[key]) == shape for key, shape, _ in self.entries)

    def frames(self, obs: Any, *, rows: int | None) -> Tree:
        """``obs`` (one frame, or with ``rows`` a batch of that many) as a batch of frames in this
        spec's dtypes; TrainerError when it is not."""
        leaves = self.leaves(obs)
        lead = (1,) if rows is None else (rows,)
        if leaves is None or not all(np.shape(leaves[key]) == (lead[1:] if rows is None else lead) + shape
                                     for key, shape, _ in self.entries):
            what = "one env's observation" if rows is None else f"{rows} envs' observations (one per restart flag)"
            raise TrainerError(f"act takes {what} of {self.describe_frames()}, not {_looks(obs)}")
        return self.structured({key: np.asarray(leaves[key], dtype).reshape(lead + shape)
                                for key, shape, dtype in self.entries})

    def describe_frames(self) -> str:
        """One frame's shape and dtype (a Dict's: per key)."""
        parts = [f"{shape} {dtype.name}" for _, shape, dtype in self.entries]
        return parts[0] if not self.keyed else "{" + ", ".join(f"{k}: {p}" for k, p in zip(self.keys, parts, strict=True)) + "}"

    def batch(self, obs: Any) -> tuple[Tree, bool]:
        """``obs`` as a batch of stacks, and whether it was one stack; TrainerError if it is neither."""
        leaves = self.leaves(obs)
        if leaves is None:
            raise TrainerError(f"act takes a stack of {self.describe()} or a batch of them, not {_looks(obs)}; "
                               "stack frames oldest first, as the store returns them")
        arrays = {key: np.asarray(value) for key, value in leaves.items()}
        single = all(arrays[key].shape == (self.frame_stack, *shape) for key, shape, _ in self.entries)
        many = all(arrays[key].shape[1:] == (self.frame_stack, *shape) for key, shape, _ in self.entries)
        many = many and len({arrays[key].shape[0] for key in self.keys}) == 1
        if not single and not many:
            raise TrainerError(f"act takes a stack of {self.describe()} or a batch of them, not {_looks(obs)}; "
                               "stack frames oldest first, as the store returns them")
        if single:
            arrays = {key: value[None] for key, value in arrays.items()}
        return self.structured(arrays), single

    def tf_signature(self) -> Any:
        """The learner's ``tf.function`` input signature for a batch of these stacks."""
        import tensorflow as tf

        return self.structured({key: tf.TensorSpec((None, self.frame_stack, *shape), tf.as_dtype(dtype))
                                for key, shape, dtype in self.entries})

    # Against spaces and stores ------------------------------------------------------------------

    def takes_frames_of(self, space: Any) -> bool:
        """Whether an env observing ``space`` gives this spec's frames (its stacks are these)."""
        try:
            other = StackSpec.of_space(space, self.frame_stack)
        except TrainerError:
            return False
        return other == self

    def to_json(self, actions: Any) -> dict[str, Any]:
        """``agent.json``'s ``stacks``: ``shape`` and ``dtype`` (one array), or ``entries`` (a Dict),
        and a nested one's ``tree`` (format/nesting.py's, as lists)."""
        if self.keyed:
            doc = {"frame_stack": self.frame_stack, "actions": actions,
                   "entries": [[key, list(shape), dtype.name] for key, shape, dtype in self.entries]}
            if self.tree is not None:
                doc["tree"] = self.tree
            return doc
        return {"shape": list(self.shape), "dtype": self.dtype.name, "actions": actions}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> tuple[StackSpec, Any]:
        """``to_json``'s document back, with its ``actions`` as given (KeyError, TypeError or
        ValueError if it is damaged)."""
        if "entries" in doc:
            entries = tuple((str(key), tuple(int(d) for d in shape), np.dtype(dtype)) for key, shape, dtype in doc["entries"])
            if not entries:
                raise ValueError("no entries")
            tree = _tree_from_json(doc["tree"], len(entries)) if doc.get("tree") is not None else None
            return cls(int(doc["frame_stack"]), entries, True, tree), doc["actions"]
        return cls.single(tuple(int(d) for d in doc["shape"]), np.dtype(doc["dtype"])), doc["actions"]


def _tree_from_json(doc: Any, n_leaves: int) -> nesting.Nesting:
    """A ``Nesting`` from its JSON lists; ValueError unless it numbers each of ``n_leaves`` leaves once."""
    seen: list[int] = []

    def build(node: Any, depth: int) -> Any:
        if isinstance(node, int) and not isinstance(node, bool):
            seen.append(node)
            return node
        if depth > nesting.MAX_DEPTH or not isinstance(node, list) or len(node) != 2 or not isinstance(node[1], list):
            raise ValueError("not a structure")
        kind, children = node
        if kind == "Dict" and all(isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) for c in children):
            return ("Dict", tuple((str(key), build(child, depth + 1)) for key, child in children))
        if kind == "Tuple":
            return ("Tuple", tuple(build(child, depth + 1) for child in children))
        raise ValueError(f"a node of kind {kind!r}")

    tree = build(doc, 1)
    if sorted(seen) != list(range(n_leaves)) or isinstance(tree, int):
        raise ValueError("the structure's leaves are not the entries")
    return tree


def _looks(obs: Any) -> str:
    """What ``obs`` is, for a message."""
    if isinstance(obs, Mapping):
        return "{" + ", ".join(f"{key}: {_looks(value).removeprefix('shape ')}" for key, value in obs.items()) + "}"
    if isinstance(obs, tuple):
        return "(" + ", ".join(_looks(value).removeprefix("shape ") for value in obs) + ")"
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


class RecentFrames:
    """The last ``frame_stack`` frames of each env an agent acts on raw observations of, as the
    batch of stacks its Q-network takes: a new episode's stack holds its first frame in every slot
    (the store's padding, gymnasium's ``FrameStackObservation(padding_type="reset")``)."""

    def __init__(self) -> None:
        self.stacks: Tree = None
        self.rows = 0

    def reset(self) -> None:
        """Forget every env's frames: the next ones begin new episodes."""
        self.stacks, self.rows = None, 0

    def push(self, spec: StackSpec, obs: Any, restart: bool | np.ndarray) -> Tree:
        """Take each env's newest frame (``obs``: one env's frame, or with ``restart`` an array, one
        frame per env) and return the stacks; rows where ``restart`` is True begin episodes."""
        flags = np.asarray(restart, dtype=bool)
        rows = None if flags.ndim == 0 else int(flags.shape[0])
        frames = spec.frames(obs, rows=rows)
        flags = flags.reshape(-1)
        if self.stacks is None or self.rows != (rows or 1):
            self.stacks, self.rows = stacks_of(frames, spec.frame_stack), rows or 1
        else:
            push_frames(self.stacks, frames, flags)
        return self.stacks
