"""A store's spaces read back from its group attributes, checked: typed fields (``get``,
``get_int``) and the observation and action spaces (``parse_box``, ``parse_dict``), so that a
hostile or truncated ``zarr.json`` becomes a ``CorruptStoreError`` naming the bad key rather than a
crash deep inside numpy (schema.py reads the rest of the attributes with the same fields; spaces.py
writes them, ``space_attrs``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from replaystore.errors import CorruptStoreError
from replaystore.format.dictobs import MAX_ENTRIES, DictSpec
from replaystore.format.nesting import MAX_DEPTH, SEPARATOR
from replaystore.format.spaces import (
    BoxSpec,
    DiscreteSpec,
    EntrySpec,
    MultiBinarySpec,
    MultiDiscreteSpec,
    parse_bound,
    stored_box,
)


def get(d: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``d[key]``, which must be there and of ``kind`` (``where``: ``d``'s name in messages)."""
    if not isinstance(d, dict) or key not in d:
        raise CorruptStoreError(f"{where} has no '{key}'; the store's zarr.json is damaged or not a replaystore store")
    value = d[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise CorruptStoreError(
            f"{where}.{key} is {value!r} ({type(value).__name__}), expected {names}; the store's zarr.json is damaged"
        )
    return value


def get_int(d: Any, key: str, where: str, lo: int, hi: int) -> int:
    """``d[key]``, an int in ``[lo, hi]``."""
    value = get(d, key, int, where)
    if not lo <= value <= hi:
        raise CorruptStoreError(f"{where}.{key} is {value}, outside [{lo}, {hi}]; the store's zarr.json is damaged")
    return int(value)


def parse_dict(d: dict[str, Any], where: str) -> DictSpec:
    """A Dict (or Tuple) observation space's entry in the attributes, checked: ``spaces``, a list of
    ``[key, entry]`` pairs with distinct non-empty keys (a Tuple's: a list of entries), each entry a
    Box, Discrete, MultiBinary, MultiDiscrete or (nested: format/nesting.py) another Dict or Tuple."""
    leaves: list[tuple[str, EntrySpec]] = []

    def walk(node: dict[str, Any], path: tuple[str, ...], at: str, depth: int) -> Any:
        if node.get("type") not in ("Box", "Discrete", "MultiBinary", "MultiDiscrete", "Dict", "Tuple"):
            raise CorruptStoreError(f"{at} is {node!r:.200}, expected {{\"type\": \"Box\" (or \"Discrete\", "
                                    "\"MultiBinary\", \"MultiDiscrete\", \"Dict\", \"Tuple\"), ...}; the store's "
                                    "zarr.json is damaged, or was written by a newer replaystore")
        if node["type"] not in ("Dict", "Tuple"):
            if len(leaves) == MAX_ENTRIES:
                raise CorruptStoreError(f"{where} holds more than {MAX_ENTRIES} entries; the store's zarr.json is "
                                        "damaged")
            leaves.append((SEPARATOR.join(path), parse_entry(node, at)))
            return len(leaves) - 1
        if depth > MAX_DEPTH:
            raise CorruptStoreError(f"{at} nests deeper than {MAX_DEPTH} levels; the store's zarr.json is damaged")
        items = get(node, "spaces", list, at)
        if not 0 < len(items) <= MAX_ENTRIES:
            raise CorruptStoreError(f"{at}.spaces holds {len(items)} entries, expected 1 to {MAX_ENTRIES}; the "
                                    "store's zarr.json is damaged")
        if node["type"] == "Tuple":
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    raise CorruptStoreError(f"{at}.spaces[{i}] is {item!r:.200}, expected an entry; the store's "
                                            "zarr.json is damaged")
            return ("Tuple", tuple(walk(item, (*path, str(i)), f"{at}.spaces[{i}]", depth + 1)
                                   for i, item in enumerate(items)))
        children = []
        for i, pair in enumerate(items):
            if (not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str) or not pair[0]
                    or not isinstance(pair[1], dict)):
                raise CorruptStoreError(f"{at}.spaces[{i}] is {pair!r:.200}, expected [key, {{\"type\": ...}}]; the "
                                        "store's zarr.json is damaged")
            children.append((pair[0], walk(pair[1], (*path, pair[0]), f"{at}.spaces[{i}]", depth + 1)))
        if len({key for key, _ in children}) < len(children):
            raise CorruptStoreError(f"{at}.spaces names a key twice; the store's zarr.json is damaged")
        return ("Dict", tuple(children))

    tree = walk(d, (), where, 1)
    if len({key for key, _ in leaves}) < len(leaves):
        raise CorruptStoreError(f"{where} holds two entries at one path; the store's zarr.json is damaged")
    nbytes = sum(math.prod(box.shape) * np.dtype(box.dtype).itemsize for box in (stored_box(e) for _, e in leaves))
    if nbytes > 2**32:
        raise CorruptStoreError(f"{where}.spaces describe frames of {nbytes} bytes; absurd size")
    flat = tree[0] == "Dict" and all(isinstance(child, int) for _, child in tree[1])
    return DictSpec(tuple(leaves), None if flat else tree)


def parse_entry(d: dict[str, Any], where: str) -> EntrySpec:
    """A Dict entry (or an observation space that is one of these) in the attributes, checked: a Box,
    a Discrete, a MultiBinary or a MultiDiscrete."""
    if d["type"] == "Discrete":
        return DiscreteSpec(n=get_int(d, "n", where, 1, 2**62), start=get_int(d, "start", where, -(2**62), 2**62))
    if d["type"] == "MultiBinary":
        n = get(d, "n", (int, list), where)
        shape = _shape([n] if isinstance(n, int) else n, f"{where}.n", shown=n,
                       expected="a positive int or up to 8 of them")
        return MultiBinarySpec(n if isinstance(n, int) else shape)
    if d["type"] == "MultiDiscrete":
        return _parse_multi_discrete(d, where)
    return parse_box(d, where)


def _parse_multi_discrete(d: dict[str, Any], where: str) -> MultiDiscreteSpec:
    shape = _shape(get(d, "shape", list, where), f"{where}.shape", empty=True)
    size = math.prod(shape)
    nvec, start = get(d, "nvec", list, where), get(d, "start", list, where)
    dtype = get(d, "dtype", str, where)
    if dtype not in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        raise CorruptStoreError(f"{where}.dtype is {dtype!r}, expected an integer dtype")
    for name, values, least in (("nvec", nvec, 1), ("start", start, -(2**62))):
        if len(values) != size or not all(isinstance(v, int) and not isinstance(v, bool) and least <= v < 2**62
                                          for v in values):
            raise CorruptStoreError(f"{where}.{name} is {values!r:.200}, expected {size} ints (the shape's elements)")
    return MultiDiscreteSpec(shape, tuple(nvec), tuple(start), dtype)


def parse_box(d: dict[str, Any], where: str) -> BoxSpec:
    """A Box space's entry in the attributes, checked (``where``: the entry's name in messages)."""
    shape = _shape(get(d, "shape", list, where), f"{where}.shape", empty=True)
    dtype = get(d, "dtype", str, where)
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as exc:
        raise CorruptStoreError(f"{where}.dtype is {dtype!r}, not a numpy dtype") from exc
    if np_dtype.kind not in "biuf":
        raise CorruptStoreError(f"{where}.dtype is {dtype!r}, expected a bool, int or float dtype")
    return BoxSpec(shape, np_dtype.name, parse_bound(d.get("low", 0)), parse_bound(d.get("high", 0)))


def _shape(values: list[Any], where: str, *, empty: bool = False, shown: Any = None,
           expected: str = "up to 8 positive ints") -> tuple[int, ...]:
    """A shape in the attributes, checked: up to 8 positive ints (none at all only where ``empty``);
    the error shows ``shown`` (default: the values) and what was ``expected``."""
    if (not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**20 for v in values)
            or len(values) > 8 or not (values or empty)):
        raise CorruptStoreError(f"{where} is {values if shown is None else shown!r}, expected {expected}")
    return tuple(values)
