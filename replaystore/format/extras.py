"""Extras: per-move fields the user declares at ``create`` (``info["is_success"]``, a behaviour
policy's log-probabilities, ``info["lives"]``...), kept beside ``action`` and ``reward``.

An extra is a name, a shape and a dtype. Step ``t`` holds the extras given with the move made from
it (``add(obs, action, ..., extras={...})``), as it holds that move's action and reward; an
episode's last step holds zeros. Each extra is one array over the slots, ``extras/<name>`` in the
zarr group (a subgroup, so zarr itself reads it), sharded as the other per-step fields are and
kept whole in RAM with them (schema.scalar_fields). A sampled transition carries its first move's
extras (``batch.extras[name]``), a window its moves', an episode each of its moves'.

The group attributes list them in the schema (``"extras": [[name, {"shape": [...], "dtype":
...}], ...]``) together with ``"requires": ["extras"]``: a reader refuses a store that requires a
feature it does not know (``FormatVersionError``), so a store is never appended to by code that
would leave some of its arrays behind.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, CorruptStoreError, FormatVersionError, InvalidTransitionError

#: the array name prefix (a zarr subgroup) of the extras; also their field names in ``Pending``
PREFIX = "extras/"
MAX_EXTRAS = 64
#: bytes a step may hold in extras (they are kept in RAM for every slot, as the scalars are)
MAX_STEP_BYTES = 4096
MAX_NDIM = 4
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64")
#: the features this replaystore knows in a store's ``requires`` list
KNOWN_FEATURES = ("extras",)


@dataclass(frozen=True)
class ExtraSpec:
    """One extra: its name, the shape of one move's value and its dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def field(self) -> str:
        """Its array's name in the group, and its field name in the rings."""
        return PREFIX + self.name

    @property
    def step_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


# --------------------------------------------------------------------------------------------------
# Declared at create


def extras_from_arg(extras: Any) -> tuple[ExtraSpec, ...]:
    """``create(extras=...)`` checked: a mapping of name -> a dtype (one value a move), a
    ``(shape, dtype)`` pair, or a gymnasium ``Box`` (its shape and dtype; the bounds are not kept)."""
    if extras is None:
        return ()
    if not isinstance(extras, Mapping):
        raise ConfigError(f"extras is {extras!r}; pass a dict of name -> dtype, (shape, dtype) or gymnasium Box, "
                          "such as {'is_success': 'bool', 'logits': ((18,), 'float32')}")
    if len(extras) > MAX_EXTRAS:
        raise ConfigError(f"extras names {len(extras)} fields; at most {MAX_EXTRAS} are allowed")
    specs = tuple(_spec(name, value) for name, value in extras.items())
    total = sum(s.step_bytes for s in specs)
    if total > MAX_STEP_BYTES:
        raise ConfigError(f"extras hold {total} bytes a move; at most {MAX_STEP_BYTES} are allowed (every slot's "
                          "extras are kept in RAM): keep large per-step data in the observation")
    return specs


def _spec(name: Any, value: Any) -> ExtraSpec:
    if not isinstance(name, str) or not NAME.fullmatch(name) or name.startswith("__") or name == "zarr.json":
        raise ConfigError(f"extras name {name!r} is not allowed; use 1 to 64 letters, digits, '_', '.' or '-', "
                          "starting with a letter or one '_' (such as 'is_success' or 'TimeLimit.truncated'; "
                          "'zarr.json' names the group's own file)")
    shape: Any
    if hasattr(value, "shape") and hasattr(value, "dtype") and type(value).__name__ == "Box":
        shape, dtype = value.shape, value.dtype
    elif isinstance(value, tuple) and len(value) == 2 and not isinstance(value[0], str):
        shape, dtype = value
    else:
        shape, dtype = (), value
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise ConfigError(f"extras[{name!r}] has dtype {dtype!r}, which numpy does not know; use one of "
                          f"{', '.join(DTYPES)}") from exc
    if dt.name not in DTYPES:
        raise ConfigError(f"extras[{name!r}] has dtype {dt}; use one of {', '.join(DTYPES)} (strings and objects "
                          "are not stored: encode them as numbers)")
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    if (not isinstance(shape, (tuple, list)) or len(shape) > MAX_NDIM
            or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1 for d in shape)):
        raise ConfigError(f"extras[{name!r}] has shape {shape!r}; use a tuple of at most {MAX_NDIM} positive ints, "
                          "or () for one value a move")
    return ExtraSpec(name, tuple(int(d) for d in shape), dt.name)


# --------------------------------------------------------------------------------------------------
# The group attributes


def extras_attrs(specs: tuple[ExtraSpec, ...]) -> list[list[Any]]:
    return [[s.name, {"shape": list(s.shape), "dtype": s.dtype}] for s in specs]


def parse_extras(value: Any, where: str) -> tuple[ExtraSpec, ...]:
    """The ``extras`` list of the schema attributes read back, checked."""

    def bad(why: str) -> str:
        return f"{where} is damaged ({why}); the store's zarr.json is damaged"

    if not isinstance(value, list) or len(value) > MAX_EXTRAS:
        raise CorruptStoreError(bad(f"expected a list of at most {MAX_EXTRAS} [name, spec] pairs"))
    specs = []
    for item in value:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[1], dict)
                or not isinstance(item[1].get("shape"), list) or not isinstance(item[1].get("dtype"), str)):
            raise CorruptStoreError(bad(f"entry {item!r} is not [name, {{'shape': [...], 'dtype': ...}}]"))
        name, doc = item
        if doc["dtype"] not in DTYPES:
            raise CorruptStoreError(bad(f"extra {name!r} has dtype {doc['dtype']!r}"))
        try:
            spec = _spec(name, (tuple(doc["shape"]), doc["dtype"]))
        except ConfigError as exc:
            raise CorruptStoreError(bad(str(exc))) from exc
        specs.append(spec)
    if len({s.name for s in specs}) != len(specs) or sum(s.step_bytes for s in specs) > MAX_STEP_BYTES:
        raise CorruptStoreError(bad("names repeat, or the extras are too large"))
    return tuple(specs)


def check_requires(value: Any, where: str) -> tuple[str, ...]:
    """The schema's ``requires`` list: every feature must be one this replaystore knows."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CorruptStoreError(f"{where}.requires is {value!r}, expected a list of feature names; the store's "
                                "zarr.json is damaged")
    unknown = [v for v in value if v not in KNOWN_FEATURES]
    if unknown:
        raise FormatVersionError(f"{where} requires {unknown}, which this replaystore does not know (it knows "
                                 f"{list(KNOWN_FEATURES)}); upgrade replaystore to open it")
    return tuple(value)


# --------------------------------------------------------------------------------------------------
# Given with moves


def check_extras(specs: tuple[ExtraSpec, ...], extras: Any, path: str | Path, lead: tuple[int, ...] = ()
                 ) -> dict[str, np.ndarray]:
    """``extras`` given to ``add`` (``lead`` ()) or ``add_batch`` (``lead`` (n,)), checked against the
    store's ``specs``: every declared name there (a mapping with more keys, such as an env's
    ``info``, is fine: only the declared ones are taken), each an array of ``lead + shape`` that
    its dtype holds exactly. Returns ``field -> array`` in the store's dtypes."""
    if not specs:
        if extras is not None:
            raise InvalidTransitionError(f"extras were given, but {path} declares none; create the store with "
                                         "extras={name: dtype, ...} to keep them")
        return {}
    if not isinstance(extras, Mapping):
        names = ", ".join(repr(s.name) for s in specs)
        raise InvalidTransitionError(f"{path} keeps extras {names} with every move; pass extras={{...}} (a dict, "
                                     f"or the env's info dict holding them), not {type(extras).__name__}; nothing "
                                     "was written")
    missing = [s.name for s in specs if s.name not in extras]
    if missing:
        raise InvalidTransitionError(f"extras has no {missing}, which {path} keeps with every move; pass them "
                                     f"(it holds {sorted(map(str, extras))[:20]}); nothing was written")
    out = {}
    for s in specs:
        out[s.field] = _value(s, extras[s.name], path, lead)
    return out


def _value(spec: ExtraSpec, value: Any, path: str | Path, lead: tuple[int, ...]) -> np.ndarray:
    name = f"extras[{spec.name!r}]"
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise InvalidTransitionError(f"{name} is not an array ({exc}); nothing was written") from exc
    want = (*lead, *spec.shape)
    if arr.shape != want:
        rows = f" (one row per stream written, then {spec.shape})" if lead else ""
        raise InvalidTransitionError(f"{name} has shape {arr.shape}, but {path} keeps it as {want}{rows}; nothing "
                                     "was written")
    dt = np.dtype(spec.dtype)
    if arr.dtype.kind not in "biuf":
        raise InvalidTransitionError(f"{name} has dtype {arr.dtype}; {path} keeps it as {dt}: pass numbers")
    if arr.dtype == dt:
        return arr
    if dt.kind == "b":  # (0 and 1 of any dtype: gymnasium-robotics reports is_success as a float)
        if arr.size and not np.isin(arr, (0, 1)).all():
            raise InvalidTransitionError(f"{name} holds {_first(arr, ~np.isin(arr, (0, 1)))}; {path} keeps it as bool: "
                                         "pass bools or 0/1; nothing was written")
        return arr.astype(dt)
    if dt.kind in "iu":
        if arr.dtype.kind == "f":
            raise InvalidTransitionError(f"{name} has dtype {arr.dtype}; {path} keeps it as {dt}: pass ints "
                                         "(or create the store with a float dtype for it)")
        info = np.iinfo(dt)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise InvalidTransitionError(f"{name} holds {_first(arr, (arr < info.min) | (arr > info.max))}, outside "
                                         f"{dt} ([{info.min}, {info.max}]) as {path} keeps it; nothing was written")
        return arr.astype(dt)
    converted = arr.astype(dt)
    overflow = np.isinf(converted) & np.isfinite(arr)
    if overflow.any():
        raise InvalidTransitionError(f"{name} holds {_first(arr, overflow)}, beyond {dt} as {path} keeps it (it "
                                     "would be stored as inf); scale it, or create the store with float64 for it")
    return converted


def _first(arr: np.ndarray, where: np.ndarray | None = None) -> str:
    """The first value of ``arr`` (where ``where``), for a message."""
    flat = (arr if where is None else arr[where]).reshape(-1)
    return repr(flat[0].item()) if flat.size else "nothing"


def group(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with the ``extras/<name>`` ones gathered into one ``extras`` dict (what batches,
    blocks and dataset elements give: ``batch.extras[name]``, ``block["extras"][name]``)."""
    if not any(k.startswith(PREFIX) for k in fields):
        return fields
    out: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for k, v in fields.items():
        if k.startswith(PREFIX):
            extras[k[len(PREFIX):]] = v
        else:
            out[k] = v
    out["extras"] = extras
    return out
