"""Checks made before anything is changed: user input to ``add``/``create`` and metadata read from disk.

Every check raises a ``ReplayStoreError`` subclass whose message names the value, the limit and the
fix; none of them touches the store, so a rejected call leaves it exactly as it was.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import (
    ConfigError,
    CorruptStoreError,
    InvalidTransitionError,
)
from replaystore.format.dictobs import describe_entry, dict_from_space, is_dict_space
from replaystore.format.extras import extras_from_arg
from replaystore.format.schema import (
    FRAME_PADDINGS,
    MAX_CAPACITY,
    MAX_STREAMS,
    Layout,
    Schema,
    default_layout,
    scalar_fields,
    slot_count,
)
from replaystore.format.shards import validate_codec
from replaystore.format.spaces import BoxSpec, action_from_space, observation_from_space, parse_bound


def parse_group_doc(raw: bytes, where: str) -> dict[str, Any]:
    """A store's root ``zarr.json`` (read from ``where``) parsed and checked to be a zarr v3 group."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise CorruptStoreError(f"{where}/zarr.json is not valid JSON ({exc}); the store's metadata is damaged") from exc
    if not isinstance(doc, dict) or doc.get("zarr_format") != 3 or doc.get("node_type") != "group":
        raise CorruptStoreError(f"{where}/zarr.json is not a zarr v3 group; this is not a replay store")
    return doc


def check_obs(schema: Schema, path: str | Path, value: Any, name: str) -> np.ndarray:
    """One observation checked, as the store keeps it: in its dtype, or a Dict's packed into a frame."""
    if schema.observation_dict is not None:
        return schema.observation_dict.pack(value, name=name, path=path)
    arr = np.asarray(value)
    spec = schema.observation
    if arr.shape != spec.shape:
        raise InvalidTransitionError(
            f"{name} has shape {arr.shape}, but {path} stores observations of shape {spec.shape}; "
            "preprocess the env the same way (e.g. AtariPreprocessing) or create a new store"
        )
    if arr.dtype != np.dtype(spec.dtype):
        if not np.can_cast(arr.dtype, np.dtype(spec.dtype), casting="safe"):
            raise InvalidTransitionError(
                f"{name} has dtype {arr.dtype}, but {path} stores {spec.dtype} observations; "
                f"convert it with .astype({spec.dtype!r}) or create a store for {arr.dtype}"
            )
        arr = arr.astype(np.dtype(spec.dtype))
    _refuse_nan(arr, name, path)
    _refuse_outside(schema, arr, name, path)
    return arr


def _refuse_outside(schema: Schema, arr: np.ndarray, name: str, path: str | Path, rows: bool = False) -> None:
    """A Discrete, MultiBinary or MultiDiscrete observation must lie in its space (a Box's may not)."""
    if schema.observation_entry is None or not arr.size:
        return
    box = schema.observation
    low, high = (np.asarray(parse_bound(b), dtype=np.int64) for b in (box.low, box.high))
    outside = (arr < low) | (arr > high)
    if outside.any():
        at = np.unravel_index(int(np.argmax(outside)), outside.shape)
        where = f"{name}[{at[0]}]" if rows else name
        raise InvalidTransitionError(f"{where} holds {arr[at].item()!r}, outside the observation space "
                                     f"{describe_entry(schema.observation_entry)} of {path}; pass the env's observation "
                                     "as it is; nothing was written")


def check_action(schema: Schema, path: str | Path, action: Any) -> int | np.ndarray:
    """One step's action: an int in a ``Discrete`` store's range, or an array of a ``Box`` store's
    shape within its bounds (in the store's dtype)."""
    spec = schema.action
    if isinstance(spec, BoxSpec):
        return check_box_actions(spec, path, np.asarray(action), "action", ())[0]
    a = np.asarray(action)
    if a.shape != () or a.dtype.kind not in "iub":
        raise InvalidTransitionError(
            f"action is {action!r}, but {path} stores Discrete({spec.n}) actions: pass one int"
        )
    value = int(a)
    if not spec.start <= value < spec.start + spec.n:
        raise InvalidTransitionError(
            f"action is {value}, outside the action space [{spec.start}, {spec.start + spec.n - 1}] of {path}"
        )
    return value

def check_box_actions(spec: BoxSpec, path: str | Path, arr: np.ndarray, name: str,
                      lead: tuple[int, ...]) -> np.ndarray:
    """Box actions with ``lead`` leading axes (``()``: one action), checked and cast to the store's
    dtype: the Box's shape, a dtype that casts to the store's without turning floats into ints,
    finite, within the Box's bounds (a ``(-1, 1)`` Box holds policies' squashed actions, as SB3's
    buffers do). Returns them with one leading axis."""
    want = (*lead, *spec.shape)
    dtype = np.dtype(spec.dtype)
    if arr.shape != want:
        raise InvalidTransitionError(f"{name} has shape {arr.shape}, but {path} stores Box actions of shape "
                                     f"{spec.shape}: pass an array of shape {want}; nothing was written")
    if arr.dtype.kind not in "biuf" or not np.can_cast(arr.dtype, dtype, casting="same_kind"):
        raise InvalidTransitionError(f"{name} has dtype {arr.dtype}, but {path} stores {spec.dtype} actions: convert "
                                     f"it with .astype({spec.dtype!r}); nothing was written")
    given = arr.reshape(-1, *spec.shape)
    low = np.asarray(spec.low, dtype=np.float64)
    high = np.asarray(spec.high, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # the bounds on the values given (an int64 cast to int32 would wrap)
        rows = given.astype(dtype)
        bad = ~((given >= low) & (given <= high)) | (~np.isfinite(rows) if dtype.kind == "f" else False)
    if bad.any():
        i = np.unravel_index(int(np.argmax(bad)), bad.shape)
        where = name if not lead else f"{name}[{i[0]}]"
        value = given[i].item()
        what = (f"not finite as {spec.dtype}: actions must be finite numbers" if dtype.kind == "f" and not np.isfinite(rows[i]) else
                f"outside the action space's bounds [{np.broadcast_to(low, spec.shape)[i[1:]]:g}, "
                f"{np.broadcast_to(high, spec.shape)[i[1:]]:g}]: clip it, or create the store with the bounds "
                "the policy's actions have")
        raise InvalidTransitionError(f"{where} holds {value!r} at index {tuple(int(j) for j in i[1:])}, {what} "
                                     f"({path}); nothing was written")
    return rows


def check_reward(reward: Any) -> float:
    r = np.asarray(reward)
    if r.shape != () or r.dtype.kind not in "biuf":
        raise InvalidTransitionError(f"reward is {reward!r}; it must be one real number")
    value = float(r)
    if not math.isfinite(value):
        raise InvalidTransitionError(f"reward is {value}; rewards must be finite (check the env or clip the reward)")
    if not _fits_float32(value):
        raise InvalidTransitionError(f"reward is {value}, beyond float32 (the store's reward dtype; largest "
                                     f"{FLOAT32_MAX:.4g}), where it would be stored as inf: scale or clip the reward")
    return value


FLOAT32_MAX = float(np.finfo(np.float32).max)
#: Half a float32 ulp above the largest float32 (2**103): below it a cast rounds down to FLOAT32_MAX,
#: from it on (round half to even: the largest float32's mantissa is odd) it becomes inf.
_FLOAT32_INF_FROM = FLOAT32_MAX + 2.0**103


def _fits_float32(value: float) -> bool:
    """Whether a finite ``value`` stays finite cast to float32 (a comparison, not a cast: this runs
    on every ``add``)."""
    return abs(value) < _FLOAT32_INF_FROM


def _refuse_nan(arr: np.ndarray, name: str, path: str | Path) -> None:
    """NaN observations are refused (inf and values outside the Box's bounds are kept): a NaN in a
    stack makes every Q-value computed from it NaN, and the loss with it."""
    if arr.dtype.kind == "f" and np.isnan(arr).any():
        raise InvalidTransitionError(f"{name} holds NaN ({int(np.isnan(arr).sum())} values); {path} refuses NaN "
                                     "observations (one poisons every Q-value computed from it): check the env's "
                                     "observation, or replace NaN before adding; nothing was written")

def check_flag(flag: Any, name: str) -> bool:
    f = np.asarray(flag)
    if f.shape != () or f.dtype.kind not in "biu" or int(f) not in (0, 1):
        raise InvalidTransitionError(f"{name} is {flag!r}; it must be a bool")
    return bool(f)


def new_schema(capacity: Any, observation_space: Any, action_space: Any, frame_stack: Any, num_streams: Any,
               layout: Layout | None, frame_padding: Any = "reset", extras: Any = None) -> tuple[Schema, Layout]:
    """The schema and layout of a new store, every argument of ``ReplayStore.create`` checked."""
    obs_dict = dict_from_space(observation_space) if is_dict_space(observation_space) else None
    box, entry = (obs_dict.stored, None) if obs_dict is not None else observation_from_space(observation_space)
    action = action_from_space(action_space)
    cap = int_in(capacity, 2, MAX_CAPACITY)
    if cap is None:
        raise ConfigError(f"capacity is {capacity!r}; it must be an int between 2 and {MAX_CAPACITY} steps")
    stack = int_in(frame_stack, 1, 1024)
    if stack is None:
        raise ConfigError(f"frame_stack is {frame_stack!r}; it must be an int between 1 and 1024 (4 for Atari)")
    if frame_padding not in FRAME_PADDINGS:
        raise ConfigError(f"frame_padding is {frame_padding!r}; use 'reset' (a stack repeats its episode's first frame, "
                          "as gymnasium's FrameStackObservation does) or 'zero' (zeros, as SB3's VecFrameStack does)")
    n = int_in(num_streams, 1, MAX_STREAMS)
    if n is None:
        raise ConfigError(f"num_streams is {num_streams!r}; it must be an int between 1 and {MAX_STREAMS} "
                          "(one per environment that writes)")
    if cap % n:
        lower, upper = cap - cap % n, cap - cap % n + n
        raise ConfigError(f"capacity {cap} does not split evenly into {n} streams; use a multiple of {n} "
                          f"such as {lower} or {upper}")
    layout = layout or default_layout(box.frame_bytes, cap // n)
    validate_layout(layout, cap // n)
    return Schema(box, action, cap, stack, n, str(frame_padding), obs_dict, extras_from_arg(extras),
                  observation_entry=entry), layout


def int_in(value: Any, lo: int, hi: int) -> int | None:
    """``value`` as an int when it is an integer (not a bool) in ``lo..hi``, else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    number = int(value)
    return number if lo <= number <= hi else None


def check_streams(n: int, mode: str, streams: Any, where: str) -> list[int]:
    """The streams ``ReplayStore.open`` writes, checked: all for mode "a" by default, none for mode "r"."""
    if streams is None:
        return list(range(n)) if mode == "a" else []
    if mode != "a":
        raise ConfigError("streams= names the streams to write; pass mode='a' with it")
    picked = [streams] if isinstance(streams, numbers.Integral) else list(streams)
    for k in picked:
        if int_in(k, 0, n - 1) is None:
            raise ConfigError(f"streams holds {k!r}, but {where} has streams 0..{n - 1}; pass stream indexes in "
                              "that range")
    if not picked or len(set(picked)) != len(picked):
        raise ConfigError(f"streams is {streams!r}; name each stream to write once, at least one")
    return sorted(int(k) for k in picked)


def validate_layout(layout: Layout, capacity: int) -> None:
    validate_codec(layout.codec)
    if layout.obs_chunk_len < 1 or layout.shard_len < 1 or layout.shard_len % layout.obs_chunk_len:
        raise ConfigError(
            f"layout has shard_len {layout.shard_len} and obs_chunk_len {layout.obs_chunk_len}; "
            "both must be positive and shard_len a multiple of obs_chunk_len"
        )
    if capacity < layout.shard_len:
        raise ConfigError(
            f"capacity {capacity} is smaller than one shard ({layout.shard_len} steps); "
            f"use capacity >= {layout.shard_len} or pass layout=Layout(shard_len=...) with a smaller shard"
        )


def check_arrays(where: str, schema: Schema, layout: Layout, read: Callable[[str], bytes | None]) -> None:
    """The arrays' own zarr.json must describe the layout the group attributes claim (``read(name)``:
    the bytes of array ``name``'s zarr.json, None if it is missing)."""
    expected = {"obs": (schema.observation.shape, schema.observation.dtype, layout.obs_chunk_len)}
    expected.update({name: (shape, dtype, layout.shard_len) for name, (shape, dtype) in scalar_fields(schema.action, schema.extras).items()})
    for name, (shape, dtype, chunk_len) in expected.items():
        path = f"{where}/{name}/zarr.json"
        try:
            raw = read(name)
            if raw is None:
                raise FileNotFoundError(str(path))
            meta = json.loads(raw)
            got_shape = tuple(meta["shape"])
            got_dtype = meta["data_type"]
            shard = meta["chunk_grid"]["configuration"]["chunk_shape"]
            inner = meta["codecs"][0]["configuration"]["chunk_shape"]
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise CorruptStoreError(f"{path} is missing or damaged ({exc!r}); the store's metadata is damaged") from exc
        if got_shape != (slot_count(schema, layout), *shape) or got_dtype != dtype or shard[0] != layout.shard_len or inner[0] != chunk_len:
            raise CorruptStoreError(
                f"{path} describes shape {got_shape}, dtype {got_dtype}, shards {shard}, chunks {inner}, which does not "
                f"match the store's schema ({slot_count(schema, layout)} slots, {dtype}, shard_len {layout.shard_len}); "
                "the store's metadata is damaged"
            )


def check_rows(schema: Schema, path: str | Path, n: int, obs: Any, action: Any, reward: Any, next_obs: Any,
               terminated: Any, truncated: Any) -> tuple[np.ndarray, list[int] | np.ndarray, list[float], np.ndarray,
                                                        list[bool], list[bool]]:
    """``add_batch``'s arguments checked whole: each with a leading axis of ``n`` (one row per
    stream written), every row valid. The error names the field and the first bad row. Returns
    the observation arrays and the per-row scalars as Python lists (what the per-stream writes use;
    a Box store's actions as one array, a row each)."""
    spec = schema.observation

    def rows(value: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
        arr = np.asarray(value)
        if arr.shape != (n, *shape):
            raise InvalidTransitionError(
                f"{name} has shape {arr.shape}, but {path} is written here by {n} streams, so add_batch takes "
                f"{(n, *shape)} (one row per stream, as the vector env returns it)")
        return arr

    if schema.observation_dict is not None:
        obs_a = schema.observation_dict.pack(obs, name="obs", path=path, lead=(n,))
        next_a = schema.observation_dict.pack(next_obs, name="next_obs", path=path, lead=(n,))
    else:
        obs_a = check_obs_rows(spec, path, rows(obs, "obs", spec.shape), "obs")
        next_a = check_obs_rows(spec, path, rows(next_obs, "next_obs", spec.shape), "next_obs")
        _refuse_outside(schema, obs_a, "obs", path, rows=True)
        _refuse_outside(schema, next_a, "next_obs", path, rows=True)
    a = schema.action
    actions: list[int] | np.ndarray
    if isinstance(a, BoxSpec):
        actions = check_box_actions(a, path, np.asarray(action), "action", (n,))
    else:
        act = rows(action, "action", ())
        if act.dtype.kind not in "iub":
            raise InvalidTransitionError(f"action has dtype {act.dtype}; {path} stores Discrete actions: pass ints")
        actions = act.tolist()
        for i, value in enumerate(actions):
            if not a.start <= value < a.start + a.n:
                raise InvalidTransitionError(f"action[{i}] is {value}, outside the action space "
                                             f"[{a.start}, {a.start + a.n - 1}] of {path}; nothing was written")
    rew = rows(reward, "reward", ())
    if rew.dtype.kind not in "biuf":
        raise InvalidTransitionError(f"reward has dtype {rew.dtype}; rewards must be real numbers")
    rewards = [float(r) for r in rew.tolist()]
    for i, value in enumerate(rewards):
        if not math.isfinite(value):
            raise InvalidTransitionError(f"reward[{i}] is {value}; rewards must be finite (check the env or clip the "
                                         "reward); nothing was written")
        if not _fits_float32(value):
            raise InvalidTransitionError(f"reward[{i}] is {value}, beyond float32 (the store's reward dtype; largest "
                                         f"{FLOAT32_MAX:.4g}), where it would be stored as inf: scale or clip the "
                                         "reward; nothing was written")
    flags = []
    for value, name in ((terminated, "terminated"), (truncated, "truncated")):
        f = rows(value, name, ())
        got = f.tolist()
        if f.dtype.kind not in "biu" or any(x not in (0, 1) for x in got):
            raise InvalidTransitionError(f"{name} is {value!r}; it must hold bools, one per stream")
        flags.append([bool(x) for x in got])
    return obs_a, actions, rewards, next_a, flags[0], flags[1]


def check_obs_rows(spec: Any, path: str | Path, arr: np.ndarray, name: str) -> np.ndarray:
    """Observation rows in the store's dtype (a safe cast), else an error naming the field."""
    if arr.dtype != np.dtype(spec.dtype):
        if not np.can_cast(arr.dtype, np.dtype(spec.dtype), casting="safe"):
            raise InvalidTransitionError(
                f"{name} has dtype {arr.dtype}, but {path} stores {spec.dtype} observations; "
                f"convert it with .astype({spec.dtype!r}) or create a store for {arr.dtype}")
        arr = arr.astype(np.dtype(spec.dtype))
    _refuse_nan(arr, name, path)
    return arr
