"""Nested observation spaces: a gymnasium ``Dict`` whose entries are ``Dict`` or ``Tuple`` spaces too
(Minari's kitchen datasets: ``achieved_goal`` a Dict of one Box per object), and a ``Tuple`` (gymnasium's
Blackjack: three ``Discrete``), down to ``MAX_DEPTH`` levels.

The store keeps such a space as the flat Dict of its leaves (format/dictobs.py: every step one frame,
each leaf its own bytes), each leaf named by its path, the keys and tuple positions joined by ``/``
(``achieved_goal/kettle``, ``1``), and ``Nesting`` remembers the structure, so that what goes in and
what comes out is the space's own shape: ``add`` takes the env's nested observation, ``sample``,
``episode``, the feeds and the exports give nested dicts and tuples back, and ``observation_space``
is the nested space. A flat Dict has no ``Nesting`` (its attributes are written as before).

A ``Nesting`` is a tree of tuples, hashable and comparable: ``("Dict", ((key, child), ...))`` or
``("Tuple", (child, ...))``, where a child is another node or a leaf's index in the flat Dict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from replaystore.errors import ConfigError, InvalidTransitionError

#: Most levels of nesting (the top-level space is level 1).
MAX_DEPTH = 8
SEPARATOR = "/"

Nesting = tuple[str, tuple[Any, ...]]


def is_structured(space: Any) -> bool:
    """Whether ``space`` is a gymnasium ``Dict`` or ``Tuple`` (without importing gymnasium for others)."""
    try:
        import gymnasium as gym
    except ImportError:
        return False
    return isinstance(space, gym.spaces.Dict | gym.spaces.Tuple)


def leaves_of(space: Any) -> tuple[list[tuple[str, Any]], Nesting | None]:
    """The leaves of a gymnasium ``Dict`` or ``Tuple`` as ``(path, space)`` in order, and its
    ``Nesting`` (None for a Dict of leaves only). ``ConfigError`` for a key that is not a non-empty
    string, a structure deeper than ``MAX_DEPTH``, an empty ``Dict`` or ``Tuple`` inside, or two
    leaves with one path."""
    import gymnasium as gym

    leaves: list[tuple[str, Any]] = []

    def walk(node: Any, path: tuple[str, ...], depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ConfigError(f"observation_space nests deeper than {MAX_DEPTH} levels at {_name(path)}; flatten it "
                              "(gymnasium's FlattenObservation)")
        if isinstance(node, gym.spaces.Dict):
            items = list(node.spaces.items())
            for key, _ in items:
                if not isinstance(key, str) or not key:
                    raise ConfigError(f"observation_space{_name(path, '')} has the key {key!r}; a Dict store's keys "
                                      "must be non-empty strings")
            children: list[Any] = [(key, walk(sub, (*path, key), depth + 1)) for key, sub in items]
            kind = "Dict"
        elif isinstance(node, gym.spaces.Tuple):
            children = [walk(sub, (*path, str(i)), depth + 1) for i, sub in enumerate(node.spaces)]
            kind = "Tuple"
        else:
            leaves.append((SEPARATOR.join(path), node))
            return len(leaves) - 1
        if not children and path:
            raise ConfigError(f"observation_space{_name(path, '')} is an empty {kind}; remove it")
        return (kind, tuple(children))

    tree = walk(space, (), 1)
    paths = [path for path, _ in leaves]
    if len(set(paths)) < len(paths):
        twice = next(p for p in paths if paths.count(p) > 1)
        raise ConfigError(f"observation_space has two entries at the path {twice!r} (a key holding {SEPARATOR!r} "
                          "beside a nested one); rename one")
    flat = tree[0] == "Dict" and all(isinstance(child, int) for _, child in tree[1])
    return leaves, None if flat else tree


def fold(tree: Nesting, leaves: list[Any], on_dict: Callable[[list[tuple[str, Any]]], Any],
         on_tuple: Callable[[list[Any]], Any]) -> Any:
    """The structure rebuilt bottom-up: each leaf index as ``leaves[i]``, each Dict as
    ``on_dict([(key, child), ...])``, each Tuple as ``on_tuple([child, ...])``."""
    def build(node: Any) -> Any:
        if isinstance(node, int):
            return leaves[node]
        kind, children = node
        if kind == "Dict":
            return on_dict([(key, build(child)) for key, child in children])
        return on_tuple([build(child) for child in children])

    return build(tree)


def nest(tree: Nesting, leaves: list[Any]) -> Any:
    """``leaves`` (in the flat order) put into the structure: dicts and tuples."""
    return fold(tree, leaves, dict, tuple)


def flatten(tree: Nesting, value: Any, *, name: str, path: str, expected: Callable[[], str]) -> list[Any]:
    """A nested observation's leaves in the flat order; ``InvalidTransitionError`` naming the first
    place where ``value`` is not the structure (a missing or unknown key, a tuple of another length)."""
    out: list[Any] = [None] * count_leaves(tree)

    def walk(node: Any, item: Any, where: str) -> None:
        if isinstance(node, int):
            out[node] = item
            return
        kind, children = node
        if kind == "Dict":
            if not isinstance(item, Mapping):
                raise InvalidTransitionError(f"{where} is a {type(item).__name__}, but {path} stores a Dict there "
                                             f"({expected()}): pass the env's observation as it is")
            keys = [key for key, _ in children]
            if len(item) != len(keys) or any(key not in item for key in keys):
                missing = [k for k in keys if k not in item]
                extra = [str(k) for k in item if k not in keys]
                raise InvalidTransitionError(f"{where} has the keys {sorted(map(str, item))}, but {path} stores the "
                                             f"keys {keys} there" + (f"; missing {missing}" if missing else "")
                                             + (f"; unknown {extra}" if extra else "")
                                             + ": pass the env's observation as it is, or create a store for its space")
            for key, child in children:
                walk(child, item[key], f"{where}[{key!r}]")
            return
        if not isinstance(item, tuple | list) or len(item) != len(children):
            what = f"a {type(item).__name__}" + (f" of {len(item)}" if isinstance(item, tuple | list) else "")
            raise InvalidTransitionError(f"{where} is {what}, but {path} stores a Tuple of {len(children)} there "
                                         f"({expected()}): pass the env's observation as it is")
        for i, child in enumerate(children):
            walk(child, item[i], f"{where}[{i}]")

    walk(tree, value, name)
    return out


def map_structure(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn`` on each array of a nested value (dicts and tuples kept as they are)."""
    if isinstance(value, Mapping):
        return {key: map_structure(fn, item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(map_structure(fn, item) for item in value)
    return fn(value)


def count_leaves(tree: Nesting) -> int:
    kind, children = tree
    nodes = [child for _, child in children] if kind == "Dict" else list(children)
    return sum(1 if isinstance(node, int) else count_leaves(node) for node in nodes)


def to_space(tree: Nesting, spaces: list[Any]) -> Any:
    """The gymnasium space: ``spaces`` (the leaves', in the flat order) in the structure."""
    import gymnasium as gym

    return fold(tree, spaces, gym.spaces.Dict, gym.spaces.Tuple)


def describe(tree: Nesting, leaves: list[str]) -> str:
    """``Dict(a: Dict(b: float32(2,)), c: Discrete(3))``: the leaves' descriptions in the structure."""
    return fold(tree, leaves, lambda items: "Dict(" + ", ".join(f"{key}: {text}" for key, text in items) + ")",
                lambda items: "Tuple(" + ", ".join(items) + ")")


def to_attrs(tree: Nesting, leaves: list[dict[str, Any]]) -> dict[str, Any]:
    """The group attributes of the space: ``{"type": "Dict", "spaces": [[key, entry], ...]}`` or
    ``{"type": "Tuple", "spaces": [entry, ...]}``, each entry a leaf's attributes or another of these."""
    return fold(tree, leaves, lambda items: {"type": "Dict", "spaces": [[key, entry] for key, entry in items]},
                lambda items: {"type": "Tuple", "spaces": items})


def child(tree: Nesting, key: str) -> tuple[Any, list[int]] | None:
    """Entry ``key`` of a top-level Dict: its structure with its leaves numbered from 0 (a lone leaf:
    0), and their indices in the flat order; None when there is no such entry."""
    kind, children = tree
    if kind != "Dict":
        return None
    for name, node in children:
        if name == key:
            indices: list[int] = []

            def renumber(item: Any) -> Any:
                if isinstance(item, int):
                    indices.append(item)
                    return len(indices) - 1
                sub_kind, subs = item
                if sub_kind == "Dict":
                    return ("Dict", tuple((k, renumber(c)) for k, c in subs))
                return ("Tuple", tuple(renumber(c) for c in subs))

            return renumber(node), indices
    return None


def _name(path: tuple[str, ...], top: str = "the top") -> str:
    return "".join(f"[{p!r}]" for p in path) if path else top
