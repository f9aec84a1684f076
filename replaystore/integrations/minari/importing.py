"""A Minari dataset into a new store: ``store_from_minari`` (see the package's docstring)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import (
    ConfigError,
    CorruptStoreError,
    InvalidTransitionError,
    StoreExistsError,
    StoreNotFoundError,
)
from replaystore.format import nesting
from replaystore.format.dictobs import DictSpec, dict_from_space, is_dict_space
from replaystore.format.extras import ExtraSpec, extras_from_arg
from replaystore.format.spaces import action_from_space, observation_from_space
from replaystore.integrations.minari.common import Progress, minari_module
from replaystore.integrations.stacking import StackLayout, choose
from replaystore.sampling.memory import memory_limit
from replaystore.storage.backend import Backend
from replaystore.storage.choose import open_backend
from replaystore.store import ReplayStore


@dataclass(frozen=True)
class MinariImport:
    """What ``store_from_minari`` wrote."""

    dataset_id: str
    path: str
    episodes: int  # stored
    moves: int  # transitions stored (steps with a move)
    closed: int  # episodes that ended neither terminated nor truncated, closed as truncated
    empty: int  # episodes without a move, left out
    stacking: str  # how observations are kept (StackLayout.describe)
    frame_stack: int
    bytes_on_disk: int
    infos: tuple[str, ...] = ()  # the info keys kept, as extras of the moves (format/extras.py)
    infos_left: tuple[str, ...] = ()  # the info keys left out, each with why
    kept_steps: int = 0  # the steps the store holds: all of them, or the newest that fit a smaller capacity


def store_from_minari(dataset: Any, path: str | Path, *, frame_stack: Any = "auto", stack_axis: Any = None,
                      padding: Any = None, capacity: int | None = None, layout: Any = None,
                      storage_options: dict[str, Any] | None = None, infos: Any = True,
                      progress: Progress | None = None) -> MinariImport:
    """Make a new store at ``path`` holding every episode of ``dataset`` (a ``MinariDataset``, a
    dataset id in Minari's local datasets, or a dataset's folder), and return what was written.

    ``frame_stack`` (``"auto"``, 1 or k), ``stack_axis`` and ``padding``: whether the dataset's
    observations are frame stacks, as for ``ReplayStoreBuffer`` (``"auto"`` detects them from the
    first episode; 1 stores whole observations). ``capacity``: steps the store holds, by default
    every step of the dataset (its moves plus one last observation per episode); a smaller one keeps
    the newest episodes. ``layout`` and ``storage_options`` (an ``s3://`` path) are as for
    ``ReplayStore.create``. ``infos``: which of the episodes' ``infos`` keys to keep, as extras of
    the moves (``batch.extras[key]``): True (the default) every one a store can keep (numbers of a
    fixed shape, at most 4 KB a move in all; the others are named in ``infos_left``), False none, or
    a list of keys (each must be keepable). Move ``t`` keeps ``infos[key][t + 1]``, the info its
    step returned; the reset's info (``infos[key][0]``) has no move and is not kept.
    ``progress(done, total)`` is called with the moves written so far.
    """
    data, name = _load(dataset)
    obs_space, action_space = data.observation_space, data.action_space
    try:  # a Dict's observations are packed into the store's frames (format/dictobs.py) and stored whole
        spec = dict_from_space(obs_space) if is_dict_space(obs_space) else None
        entry = None if spec is not None else observation_from_space(obs_space)[1]  # (Discrete, MultiBinary, ...)
        action_from_space(action_space)
    except ConfigError as exc:
        raise ConfigError(f"the Minari dataset {name} cannot be stored: {exc}") from None
    if spec is not None or entry is not None:
        if frame_stack not in ("auto", None, 1):
            raise ConfigError(f"frame_stack is {frame_stack!r}, but the Minari dataset {name} has "
                              f"{type(obs_space).__name__} observations, which are stored whole; leave frame_stack out")
        frame_stack = 1
    obs_shape = spec.stored.shape if spec is not None else tuple(int(s) for s in obs_space.shape)
    total_moves, total_episodes = int(data.total_steps), len(data)
    if total_episodes == 0:
        raise ConfigError(f"the Minari dataset {name} holds no episodes")
    counted = capacity is None
    if capacity is None:  # (the metadata's count, checked against the episodes as they are read)
        capacity = total_moves + total_episodes  # each episode's moves and its last observation
    target = open_backend(path, storage_options)
    if target.exists():
        raise StoreExistsError(f"{target.where} already exists; store_from_minari makes a new store: choose a new "
                               "path, or delete what is there")
    _check_declared(data, name, obs_shape if spec is None else None)
    episodes = _read(data, name)
    first = next(episodes)
    stack = _detect(first, obs_shape, name, spec, frame_stack=frame_stack, stack_axis=stack_axis, padding=padding)
    extras, left = _choose_infos(first, infos, name)
    staged = target.staging()
    if staged.exists():
        staged.destroy()  # this process's own leftover
    counts = {"episodes": 0, "moves": 0, "closed": 0, "empty": 0}
    try:
        space = obs_space if spec is not None or entry is not None else _frame_space(stack, obs_space)
        store = ReplayStore.create(staged.where, capacity, space, action_space,
                                   stack.frame_stack, layout=layout, cache_bytes=0, frame_padding=stack.padding,
                                   storage_options=storage_options, extras=extras)
        with store:
            for episode in chain([first], episodes):
                _add_episode(store, episode, stack, f"the Minari dataset {name}, episode {episode.id}", counts, spec)
                if counted and counts["moves"] > total_moves:  # (the default capacity would drop the oldest)
                    raise CorruptStoreError(f"the Minari dataset {name}'s metadata says {total_moves:,} moves, but "
                                            f"its episodes hold more ({counts['moves']:,} by episode {episode.id}): "
                                            "its metadata is wrong; give capacity (--capacity) for every step, or "
                                            "fix the dataset")
                if progress is not None:
                    progress(counts["moves"], total_moves)
            store.flush()
            kept = min(store.added, store.capacity)
            stored = sum(store.backend.stored_bytes().values())
    except BaseException:
        _discard(staged)
        raise
    target.publish(staged, replace=False)  # (never over a store made at the path meanwhile)
    return MinariImport(dataset_id=name, path=target.where, episodes=counts["episodes"], moves=counts["moves"],
                        closed=counts["closed"], empty=counts["empty"], stacking=_describe(stack),
                        frame_stack=stack.frame_stack, bytes_on_disk=stored, infos=tuple(extras),
                        infos_left=tuple(left), kept_steps=kept)


def _load(dataset: Any) -> tuple[Any, str]:
    """The ``MinariDataset`` that ``dataset`` names, and its id."""
    minari = minari_module()
    if isinstance(dataset, minari.MinariDataset):
        return dataset, str(dataset.spec.dataset_id)
    if not isinstance(dataset, (str, os.PathLike)):
        raise ConfigError(f"dataset is {type(dataset).__name__}; pass a minari.MinariDataset, a dataset id such as "
                          "'mujoco/hopper/expert-v0', or a dataset's folder")
    folder = Path(dataset)
    data_path = next((p for p in (folder / "data", folder) if (p / "metadata.json").is_file()), None)
    if data_path is None:
        from minari.storage.datasets_root_dir import get_dataset_path

        data_path = get_dataset_path(str(dataset)) / "data"
        if not (data_path / "metadata.json").is_file():
            raise StoreNotFoundError(f"no Minari dataset {str(dataset)!r}: neither a dataset's folder nor an id under "
                                     f"Minari's datasets root {get_dataset_path()} (MINARI_DATASETS_PATH); fetch it "
                                     f"first with `minari download {dataset}`")
    try:
        data = minari.MinariDataset(data_path)
    except (ValueError, KeyError, AssertionError, OSError) as exc:
        raise ConfigError(f"could not read the Minari dataset at {data_path}: {exc}") from None
    return data, str(data.spec.dataset_id)


def _check_declared(data: Any, name: str, obs_shape: tuple[int, ...] | None) -> None:
    """Refuse, before any episode is read, an HDF5 dataset whose episodes declare arrays they cannot
    hold: longer than one per observation (``rewards`` counts the moves), observations of another
    shape than the space's, or more bytes than half of what this process may use (a small file can
    declare gigabytes, which h5py would allocate before any check)."""
    path = Path(getattr(getattr(data, "storage", None), "data_path", "") or "") / "main_data.hdf5"
    if not path.is_file():
        return  # (another storage format: its episodes are checked as they are read)
    import h5py

    limit, said = memory_limit()
    try:
        _check_groups(h5py, path, name, obs_shape, limit, said)
    except (OSError, KeyError, ValueError, TypeError) as exc:
        if isinstance(exc, CorruptStoreError):
            raise
        raise CorruptStoreError(f"could not read the Minari dataset {name}: {type(exc).__name__}: {exc}") from None


def _check_groups(h5py: Any, path: Path, name: str, obs_shape: tuple[int, ...] | None, limit: int | None,
                  said: str) -> None:
    """``_check_declared``'s walk over the episodes' groups of an open HDF5 file."""
    with h5py.File(path, "r") as f:
        for key in f:
            group = f[key]
            if not isinstance(group, h5py.Group) or not isinstance(group.get("rewards"), h5py.Dataset):
                continue  # (read as it is, and refused there)
            moves = int(group["rewards"].shape[0]) if group["rewards"].shape else 0
            sizes: list[tuple[str, tuple[int, ...], int]] = []
            group.visititems(lambda sub, obj: sizes.append((sub, tuple(obj.shape), obj.size * obj.dtype.itemsize))
                             if isinstance(obj, h5py.Dataset) else None)
            for sub, shape, _ in sizes:
                bad = not shape or shape[0] > moves + 1  # (shorter ones, and frames, are checked as they are read)
                if bad:
                    raise CorruptStoreError(f"the Minari dataset {name}'s {key}/{sub} declares shape {shape}, but the "
                                            f"episode has {moves:,} moves: the dataset is damaged or lies; fix it, or "
                                            "leave it out")
            total = sum(n for _, _, n in sizes)
            if limit is not None and total > limit // 2:
                raise CorruptStoreError(f"the Minari dataset {name}'s {key} declares {total / 2**20:,.0f} MB of arrays, "
                                        f"more than half of what this process may use ({said}); split its episodes")


def _read(data: Any, name: str) -> Iterator[Any]:
    """The dataset's episodes, one at a time; what Minari or h5py raise on a damaged file, as
    ``CorruptStoreError``."""
    episodes = iter(data.iterate_episodes())
    while True:
        try:
            episode = next(episodes)
        except StopIteration:
            return
        except (KeyError, ValueError, TypeError, AssertionError, OSError) as exc:
            raise CorruptStoreError(f"could not read the Minari dataset {name}: {type(exc).__name__}: {exc}") from None
        yield episode


def _choose_infos(first: Any, infos: Any, name: str) -> tuple[dict[str, tuple[tuple[int, ...], str]], list[str]]:
    """The info keys to keep (``store_from_minari``'s ``infos``), as extras declared from the first
    episode's arrays, and the keys left out, each with why."""
    given = first.infos if isinstance(first.infos, dict) else {}
    if infos is False or infos is None:
        return {}, [f"{key} (infos=False)" for key in given]
    asked = None if infos is True else ([infos] if isinstance(infos, str) else list(infos))
    if asked is not None:
        missing = [key for key in asked if key not in given]
        if missing:
            raise ConfigError(f"infos names {missing}, which the Minari dataset {name}'s first episode does not hold "
                              f"(it holds {sorted(given)})")
    moves = len(np.asarray(first.rewards))
    kept: dict[str, tuple[tuple[int, ...], str]] = {}
    left = []
    for key in given if asked is None else asked:
        why = _unkeepable(key, given[key], moves)
        if why is None:
            arr = np.asarray(given[key])
            kept[key] = (arr.shape[1:], arr.dtype.name)
            try:
                extras_from_arg(kept)
                continue
            except ConfigError as exc:
                del kept[key]
                why = str(exc)
        if asked is not None:
            raise ConfigError(f"the Minari dataset {name}'s info {key!r} cannot be kept: {why}; leave it out of infos")
        left.append(f"{key} ({why})")
    return kept, left


def _unkeepable(key: str, value: Any, moves: int) -> str | None:
    """Why an episode's info ``value`` cannot be kept as an extra (None: it can)."""
    if isinstance(value, dict):
        return "a nested dict"
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):
        return "not an array"
    if arr.dtype.kind not in "biuf":
        return f"dtype {arr.dtype}, not numbers"
    if arr.ndim == 0 or len(arr) != moves + 1:
        return f"shape {arr.shape}, not one value per observation ({moves + 1})"
    return None


def _infos(episode: Any, extras: tuple[ExtraSpec, ...], where: str) -> dict[str, np.ndarray]:
    """The kept infos of an episode, one row a move: ``infos[key][1:]`` (the info each move returned)."""
    given = episode.infos if isinstance(episode.infos, dict) else {}
    moves = len(np.asarray(episode.rewards))
    out = {}
    for extra in extras:
        if extra.name not in given:
            raise InvalidTransitionError(f"{where}: its infos have no {extra.name!r}, which the first episode's have; "
                                         "import with infos=False, or with the keys every episode holds")
        arr = np.asarray(given[extra.name])
        if arr.shape != (moves + 1, *extra.shape):
            raise InvalidTransitionError(f"{where}: info {extra.name!r} has shape {arr.shape}, not "
                                         f"{(moves + 1, *extra.shape)} (one value per observation, as in the first "
                                         "episode)")
        out[extra.name] = arr[1:]
    return out


def _observations(episode: Any, spec: DictSpec | None, where: str) -> np.ndarray:
    """An episode's observations: as they are, or a Dict dataset's packed into the store's frames."""
    if spec is None:
        return np.asarray(episode.observations)
    steps = len(np.asarray(episode.rewards)) + 1
    try:
        return spec.pack(episode.observations, name="observations", path="the store", lead=(steps,))
    except InvalidTransitionError as exc:
        raise InvalidTransitionError(f"{where} ({steps - 1} moves): {exc}") from None


def _detect(first: Any, obs_shape: tuple[int, ...], name: str, spec: DictSpec | None, **options: Any) -> StackLayout:
    """How the dataset's observations are kept, from its first episode's first observation."""
    obs = _observations(first, spec, f"the Minari dataset {name}, episode {first.id}")
    if obs.ndim == 0 or obs.shape[1:] != obs_shape:
        raise InvalidTransitionError(f"the Minari dataset {name}, episode {first.id}: observations are "
                                     f"{_shape(obs)}, not (moves + 1, *{obs_shape})")
    try:
        return choose(obs_shape, obs[:1], **options)
    except ConfigError as exc:
        raise ConfigError(f"the Minari dataset {name}: {exc}") from None


def _frame_shape(stack: StackLayout) -> tuple[int, ...]:
    """The stored frame: one slice of the stack, without its axis where frames are stacked on a new
    first axis (``FrameStackObservation``), so that sampled stacks are the dataset's observations."""
    if stack.frame_stack > 1 and stack.axis == 0 and stack.channels == 1:
        return stack.obs_shape[1:]
    return stack.frame_shape


def _describe(stack: StackLayout) -> str:
    shape = _frame_shape(stack)
    if shape == stack.frame_shape:
        return stack.describe()
    return f"{stack.frame_stack} frames of {shape} stacked on a new first axis, {stack.padding}-padded"


def _frame_space(stack: StackLayout, space: Any) -> Any:
    import gymnasium as gym

    frame = stack.frame_space(space)
    shape = _frame_shape(stack)
    return gym.spaces.Box(low=frame.low.reshape(shape), high=frame.high.reshape(shape), dtype=frame.dtype)


def _add_episode(store: ReplayStore, episode: Any, stack: StackLayout, where: str, counts: dict[str, int],
                 spec: DictSpec | None = None) -> None:
    """One Minari episode into ``store``'s stream, checked whole before its first move is added."""
    obs = _observations(episode, spec, where)
    action = np.asarray(episode.actions)
    reward = np.asarray(episode.rewards)
    terminated = np.asarray(episode.terminations)
    truncated = np.asarray(episode.truncations)
    moves = len(reward)
    lengths = {"actions": len(action), "terminations": len(terminated), "truncations": len(truncated)}
    wrong = {k: n for k, n in lengths.items() if n != moves}
    if reward.ndim != 1 or wrong or obs.ndim == 0 or len(obs) != moves + 1:
        raise InvalidTransitionError(f"{where}: {moves} rewards, so {moves + 1} observations and {moves} of each "
                                     f"other field, but it holds observations {_shape(obs)}, "
                                     + ", ".join(f"{k} {n}" for k, n in lengths.items()))
    if moves == 0:
        counts["empty"] += 1
        return
    done = terminated.astype(bool) | truncated.astype(bool)
    if done[:-1].any():
        at = int(np.flatnonzero(done[:-1])[0])
        raise InvalidTransitionError(f"{where}: move {at} of {moves} ends the episode (terminated or truncated "
                                     "before its last move); a Minari episode ends at its last move only")
    if stack.frame_stack > 1:
        if obs.shape[1:] != stack.obs_shape or not (stack.padded(obs[:1]).all()
                                                    and stack.shifted(obs[:-1], obs[1:]).all()):
            raise InvalidTransitionError(f"{where}: its observations are not {_describe(stack)} as the first "
                                         "episode's are, so the store could not rebuild them exactly; pass "
                                         "frame_stack=1 to store whole observations")
        obs = stack.newest(obs).reshape(len(obs), *_frame_shape(stack))
    given = store.schema.obs_view(obs)  # (a Dict store's: dicts of views)
    infos = _infos(episode, store.schema.extras, where)
    for t in range(moves):
        try:
            store.add(_step(given, t), action[t], reward[t], _step(given, t + 1), terminated[t], truncated[t],
                      extras={key: values[t] for key, values in infos.items()} if infos else None)
        except InvalidTransitionError as exc:  # (the staged store is then discarded whole)
            raise InvalidTransitionError(f"{where}, move {t}: {exc}") from None
    if not done[-1]:
        store.end_episode()
        counts["closed"] += 1
    counts["episodes"] += 1
    counts["moves"] += moves


def _step(obs: Any, t: int) -> Any:
    """Step ``t`` of an episode's observations (a Dict's, nested ones' and a Tuple's: each leaf's)."""
    return nesting.map_structure(lambda values: values[t], obs)


def _discard(staged: Backend) -> None:
    """Remove an unfinished store."""
    try:
        staged.destroy()
    except Exception as exc:  # noqa: BLE001 - the first error is the one to report
        print(f"warning: could not remove the unfinished store at {staged.where} ({exc}); delete it", file=sys.stderr)


def _shape(a: np.ndarray) -> str:
    return f"{a.shape} {a.dtype}"
