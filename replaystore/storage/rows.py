"""A vector env's step into the streams it writes (``ReplayStore.add_batch``): row ``i`` to the
``i``-th stream written, with the env's autoreset rows recognised and skipped.

Every row is checked before any stream changes; each stream's move is then all or nothing
(stream.py). With next-step autoreset (gymnasium 1.x's default, ale-py's ``AtariVectorEnv``) the
row after an episode end is the sub-env's reset: its ``obs`` is the episode's last observation and
it carries no move, so it is skipped and the next episode starts from its ``next_obs``. With
same-step autoreset the true last observation of an ended episode is ``info["final_obs"]``, and
its last move's info (extras given as the env's info) is ``info["final_info"]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, InvalidTransitionError, StoreWriteError
from replaystore.format.dictobs import DictSpec
from replaystore.format.schema import Schema
from replaystore.format.validate import check_obs
from replaystore.storage.stream import StreamWriter

AUTORESET_MODES = {"next_step": "next_step", "nextstep": "next_step", "same_step": "same_step",
                   "samestep": "same_step", "disabled": "disabled"}


def autoreset_mode(mode: Any) -> str:
    """``mode`` (a string, or gymnasium's ``AutoresetMode``) as one of ``AUTORESET_MODES``' values."""
    key = str(getattr(mode, "value", mode)).lower()
    if key not in AUTORESET_MODES:
        raise ConfigError(f"autoreset_mode is {mode!r}; use 'next_step' (gymnasium's default), 'same_step' or "
                          "'disabled', or pass envs.metadata['autoreset_mode']")
    return AUTORESET_MODES[key]


def add_rows(writers: list[StreamWriter], schema: Schema, where: str | Path, rows: tuple[Any, ...], *, mode: str,
             env_done: Any, info: Mapping[str, Any] | None, skip: frozenset[int] = frozenset(),
             extras: dict[str, np.ndarray] | None = None) -> None:
    """Write ``rows`` (``check_rows``' checked obs, actions, rewards, next_obs, terminated, truncated)
    into ``writers``, row ``i`` into ``writers[i]``; the rows in ``skip`` carry no move and are
    neither checked against their stream nor written. ``extras``: field -> checked rows
    (extras.check_extras)."""
    obs_a, act, rew, next_a, term, trunc = rows
    n = len(writers)
    done = [t or u for t, u in zip(term, trunc)]
    ended = done
    if env_done is not None:
        flags = np.asarray(env_done)
        if flags.shape != (n,) or flags.dtype.kind not in "biu":
            raise InvalidTransitionError(f"env_done is {env_done!r}; it must hold {n} bools, one per stream")
        ended = [bool(x) for x in flags.tolist()]
    if mode == "same_step" and any(done):
        next_a = _final_obs(schema, where, info, next_a, np.array(done))
    reset_rows = set()
    for i, writer in enumerate(writers):  # every row checked before any is written
        if i in skip:
            continue
        if mode == "next_step" and writer.reset_next is not None and not (
                writer.reset_optional and (done[i] or not same(obs_a[i], writer.reset_next, writer.dict_spec))):
            _check_reset_row(writer, i, obs_a[i], done[i] or ended[i], where)
            reset_rows.add(i)
        else:
            check_continues(writer, obs_a[i], f"obs[{i}]", where)
    kept: list[int] = []
    for i, writer in enumerate(writers):
        if i in skip:
            continue
        if i in reset_rows:
            writer.reset_next, writer.reset_optional = None, False
            continue
        try:
            writer.add(obs_a[i], act[i], rew[i], next_a[i], term[i], trunc[i],
                       {name: values[i] for name, values in extras.items()} if extras else None)
        except StoreWriteError as exc:
            raise StoreWriteError(exc.errno, f"stream {writer.index} (row {i}): {exc.strerror or exc}; streams {kept} "
                                  "kept this move, the others did not change") from exc
        kept.append(writer.index)
        if mode == "next_step" and ended[i]:
            writer.reset_next = next_a[i].copy()


def check_continues(writer: StreamWriter, obs: np.ndarray, name: str, where: str | Path) -> None:
    """``obs`` must be the observation the stream's episode in progress stopped at."""
    if writer.head_obs is not None and not same(obs, writer.head_obs, writer.dict_spec):
        raise InvalidTransitionError(
            f"{name} does not continue the episode in progress in {where} (stream {writer.index}): it differs from "
            "the previous transition's next_obs; pass that next_obs as obs, or end the episode (terminated or "
            "truncated) before starting a new one"
        )


def final_extras(extras: Any, n: int) -> Any:
    """``extras`` given as a same-step vector env's ``info``: an ended row's own values are the reset's
    (the info its episode's last move returned is ``info["final_info"]``), so each key of
    ``final_info`` replaces those rows (``_final_info``, and the key's own ``_key`` mask there).
    Anything else is returned as it is."""
    if not isinstance(extras, Mapping) or not isinstance(extras.get("final_info"), Mapping):
        return extras
    final = extras["final_info"]
    ended = np.asarray(extras.get("_final_info", np.ones(n, bool)), dtype=bool)
    out = dict(extras)
    for name, value in final.items():
        got = np.asarray(value) if not (isinstance(name, str) and name.startswith("_")) else None
        if got is None or got.dtype.kind not in "biuf" or got.shape[:1] != (n,) or ended.shape != (n,):
            continue
        rows = ended & np.asarray(final.get(f"_{name}", np.ones(n, bool)), dtype=bool)
        base = np.asarray(extras[name]) if name in extras else np.zeros_like(got)
        if base.shape != got.shape:
            continue  # (refused as it is by the extras' own check)
        out[name] = np.where(rows.reshape(n, *[1] * (got.ndim - 1)), got, base)
        out[f"_{name}"] = np.asarray(extras.get(f"_{name}", np.zeros(n, bool)), dtype=bool) | rows
    return out


def _final_obs(schema: Schema, where: str | Path, info: Mapping[str, Any] | None, next_a: np.ndarray,
               done: np.ndarray) -> np.ndarray:
    """``next_obs`` with the rows that ended an episode replaced by ``info["final_obs"]`` (same-step autoreset)."""
    if info is None or "final_obs" not in info:
        raise InvalidTransitionError(
            "autoreset_mode='same_step' and an episode ended, but info has no 'final_obs'; pass the info "
            "returned by envs.step (its final_obs holds the true last observations)")
    final = info["final_obs"]
    mask = np.asarray(info.get("_final_obs", done))
    out = next_a.copy()
    for i in np.flatnonzero(done).tolist():
        if not bool(mask[i]) or final[i] is None:
            raise InvalidTransitionError(f"row {i} ended its episode but info['final_obs'][{i}] is missing")
        out[i] = check_obs(schema, where, final[i], f"info['final_obs'][{i}]")
    return out


def _check_reset_row(writer: StreamWriter, i: int, obs: np.ndarray, done: bool, where: str | Path) -> None:
    """A next-step autoreset row: the sub-env returns the reset observation and nothing else."""
    if done or not same(obs, writer.reset_next, writer.dict_spec):
        raise InvalidTransitionError(
            f"row {i} (stream {writer.index}) follows the end of an episode, so with autoreset_mode='next_step' it "
            "should be the vector env's reset step (obs = the previous row's next_obs, not done); it is not. If your "
            "vector env resets in the same step pass autoreset_mode='same_step' and info; if you reset ended envs "
            f"yourself pass autoreset_mode='disabled' ({where}; nothing was written)")


def same(a: np.ndarray, b: np.ndarray | None, spec: DictSpec | None = None) -> bool:
    """Whether two observations of the store's dtype are equal (NaN equals NaN): a byte compare
    first, ~6x cheaper than ``np.array_equal`` on an Atari frame and ~10x on CartPole's; floats whose
    bytes differ may still be equal (-0.0 and 0.0, NaNs of other payloads). ``spec``: the Dict the
    frames pack, whose entries are compared as values where the bytes differ (a frame of mixed
    dtypes is bytes, and its float entries' -0.0 and 0.0 are still equal)."""
    if b is None:
        return False
    if a.shape == b.shape and a.tobytes() == b.tobytes():
        return True
    if spec is not None and a.shape == b.shape:
        return all(same(x, y) for x, y in zip(spec.views(a).values(), spec.views(b).values()))
    return a.dtype.kind not in "biu" and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
