"""Minari datasets in and out of a replay store: ``store_from_minari`` and ``minari_from_store``.

Minari (Farama) is the common format of offline-RL datasets: d3rlpy, TorchRL and CORL read it. A
dataset is a list of episodes, each ``observations`` ``(T + 1, ...)`` (the one each move was made
from, then the last), ``actions``, ``rewards``, ``terminations`` and ``truncations`` ``(T, ...)``,
which is exactly how a stream of the store keeps an episode (sampling/episodes.py).

**In** (``store_from_minari``): every episode of the dataset, in its order, becomes an episode of a
new store of one stream, through ``ReplayStore.add``, so every value is checked as a writer's would
be. Uniform, n-step and prioritized batches, sequences, ``as_dataset`` and ``jax_blocks`` then come
straight from the compressed chunks, out of core, which is what offline DQN-style learners on an
Atari dataset need (Minari reads whole episodes; its HDF5 is not compressed). Observations that are
frame stacks (a dataset recorded behind ``FrameStackObservation`` or ``VecFrameStack``) are found as
``ReplayStoreBuffer`` finds them (stacking.py) and stored once a frame; every episode is checked to
be such stacks before any of it is written. The store is built beside ``path`` and renamed onto it
when whole (``Backend.staging``/``publish``, as ``compact`` does): an error, or a crash, leaves no
store at ``path``.

- An episode whose last move is neither terminated nor truncated (a dataset cut short) is closed as
  truncated: nothing of it continues, so its last observation is not bootstrapped as terminal.
- An episode that ends before its last move, or whose arrays disagree in length, is refused, naming
  the episode; so is an observation or action outside the space, or a reward beyond float32.
- ``infos`` and episode seeds are not kept (the store has no place for them).

**Out** (``minari_from_store``): each whole episode of the store (its first and last steps live),
stream by stream, oldest first, into a new Minari dataset that ``minari.load_dataset`` reads. The
observations are the stored frames, or with ``stacks=True`` the frame stacks the agent saw, padded
as the store pads them. Episodes the ring has cut at their start, and episodes in progress, are
left out and counted. The dataset is written in a hidden folder under Minari's datasets root and
renamed to its id when whole, so a failure leaves no dataset behind. Its images are stored raw
(``jpeg_encoding=False``; Minari's own default, JPEG, is lossy).

Needs ``pip install 'replaystore[minari]'`` (Minari with h5py); Minari is imported only when one of
these functions runs.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import (
    ConfigError,
    CorruptStoreError,
    InvalidTransitionError,
    ReplayStoreError,
    SampleError,
    StoreExistsError,
    StoreNotFoundError,
    StoreWriteError,
)
from replaystore.format.spaces import action_from_space, box_from_space
from replaystore.integrations.stacking import StackLayout, choose
from replaystore.sampling.episodes import Episode, episode_table
from replaystore.storage.backend import Backend
from replaystore.storage.choose import open_backend
from replaystore.store import ReplayStore

Progress = Callable[[int, int], None]  # (done, total): steps read in, or episodes written out

__all__ = ["MinariExport", "MinariImport", "minari_from_store", "store_from_minari"]


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


@dataclass(frozen=True)
class MinariExport:
    """What ``minari_from_store`` wrote."""

    dataset_id: str
    path: str  # the dataset's folder
    episodes: int
    moves: int
    partial: int  # live episodes whose first steps the ring had overwritten, left out
    in_progress: int  # episodes still being written, left out
    observation_shape: tuple[int, ...]


# -------------------------------------------------------------------------------------------------
# In


def store_from_minari(dataset: Any, path: str | Path, *, frame_stack: Any = "auto", stack_axis: Any = None,
                      padding: Any = None, capacity: int | None = None, layout: Any = None,
                      storage_options: dict[str, Any] | None = None,
                      progress: Progress | None = None) -> MinariImport:
    """Make a new store at ``path`` holding every episode of ``dataset`` (a ``MinariDataset``, a
    dataset id in Minari's local datasets, or a dataset's folder), and return what was written.

    ``frame_stack`` (``"auto"``, 1 or k), ``stack_axis`` and ``padding``: whether the dataset's
    observations are frame stacks, as for ``ReplayStoreBuffer`` (``"auto"`` detects them from the
    first episode; 1 stores whole observations). ``capacity``: steps the store holds, by default
    every step of the dataset (its moves plus one last observation per episode); a smaller one keeps
    the newest episodes. ``layout`` and ``storage_options`` (an ``s3://`` path) are as for
    ``ReplayStore.create``. ``progress(done, total)`` is called with the moves written so far.
    """
    data, name = _load(dataset)
    obs_space, action_space = data.observation_space, data.action_space
    try:
        box_from_space(obs_space)
        action_from_space(action_space)
    except ConfigError as exc:
        raise ConfigError(f"the Minari dataset {name} cannot be stored: {exc}") from None
    obs_shape = tuple(int(s) for s in obs_space.shape)
    total_moves, total_episodes = int(data.total_steps), len(data)
    if total_episodes == 0:
        raise ConfigError(f"the Minari dataset {name} holds no episodes")
    need = total_moves + total_episodes
    if capacity is None:
        capacity = need
    target = open_backend(path, storage_options)
    if target.exists():
        raise StoreExistsError(f"{target.where} already exists; store_from_minari makes a new store: choose a new "
                               "path, or delete what is there")
    episodes = _read(data, name)
    first = next(episodes)
    stack = _detect(first, obs_shape, name, frame_stack=frame_stack, stack_axis=stack_axis, padding=padding)
    staged = target.staging()
    if staged.exists():
        staged.destroy()  # this process's own leftover
    counts = {"episodes": 0, "moves": 0, "closed": 0, "empty": 0}
    try:
        store = ReplayStore.create(staged.where, capacity, _frame_space(stack, obs_space), action_space,
                                   stack.frame_stack, layout=layout, cache_bytes=0, frame_padding=stack.padding,
                                   storage_options=storage_options)
        with store:
            for episode in chain([first], episodes):
                _add_episode(store, episode, stack, f"the Minari dataset {name}, episode {episode.id}", counts)
                if progress is not None:
                    progress(counts["moves"], total_moves)
            store.flush()
            stored = sum(store.backend.stored_bytes().values())
    except BaseException:
        _discard(staged)
        raise
    target.publish(staged)
    return MinariImport(dataset_id=name, path=target.where, episodes=counts["episodes"], moves=counts["moves"],
                        closed=counts["closed"], empty=counts["empty"], stacking=_describe(stack),
                        frame_stack=stack.frame_stack, bytes_on_disk=stored)


def _load(dataset: Any) -> tuple[Any, str]:
    """The ``MinariDataset`` that ``dataset`` names, and its id."""
    minari = _minari()
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


def _detect(first: Any, obs_shape: tuple[int, ...], name: str, **options: Any) -> StackLayout:
    """How the dataset's observations are kept, from its first episode's first observation."""
    obs = np.asarray(first.observations)
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


def _add_episode(store: ReplayStore, episode: Any, stack: StackLayout, where: str, counts: dict[str, int]) -> None:
    """One Minari episode into ``store``'s stream, checked whole before its first move is added."""
    obs = np.asarray(episode.observations)
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
    for t in range(moves):
        try:
            store.add(obs[t], action[t], reward[t], obs[t + 1], terminated[t], truncated[t])
        except InvalidTransitionError as exc:  # (the staged store is then discarded whole)
            raise InvalidTransitionError(f"{where}, move {t}: {exc}") from None
    if not done[-1]:
        store.end_episode()
        counts["closed"] += 1
    counts["episodes"] += 1
    counts["moves"] += moves


def _discard(staged: Backend) -> None:
    """Remove an unfinished store."""
    try:
        staged.destroy()
    except Exception as exc:  # noqa: BLE001 - the first error is the one to report
        print(f"warning: could not remove the unfinished store at {staged.where} ({exc}); delete it", file=sys.stderr)


# -------------------------------------------------------------------------------------------------
# Out


def minari_from_store(src: str | Path | ReplayStore, dataset_id: str, *, stacks: bool = False, env: Any = None,
                      eval_env: Any = None, author: str | None = None, author_email: str | None = None,
                      algorithm_name: str | None = None, code_permalink: str | None = None,
                      description: str | None = None, data_format: str = "hdf5", jpeg_encoding: bool = False,
                      storage_options: dict[str, Any] | None = None,
                      progress: Progress | None = None) -> MinariExport:
    """Write every whole episode of the store ``src`` (a path or URL, or an open ``ReplayStore``) as
    a new Minari dataset ``dataset_id`` (``namespace/name-vN``) under Minari's datasets root
    (``MINARI_DATASETS_PATH``), and return what was written; ``minari.load_dataset(dataset_id)``
    reads it.

    ``stacks``: each observation as the ``frame_stack`` frames the agent saw (a new first axis,
    oldest first) instead of the stored frame. ``env``/``eval_env`` (an env id, ``EnvSpec`` or env)
    let ``dataset.recover_environment()`` make the env; ``author`` ... ``description`` are Minari's
    metadata; ``data_format`` and ``jpeg_encoding`` Minari's storage options.
    ``progress(done, total)`` is called with the episodes written so far.
    """
    minari = _minari()
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.dataset.minari_storage import MinariStorage
    from minari.namespace import create_namespace, list_local_namespaces
    from minari.storage.datasets_root_dir import get_dataset_path

    try:
        namespace = parse_dataset_id(dataset_id)[0]
    except (ValueError, TypeError, AttributeError):
        raise ConfigError(f"dataset_id is {dataset_id!r}; Minari ids are (namespace/)name-vN, such as "
                          "'replaystore/breakout/dqn-v0'") from None
    final = get_dataset_path(dataset_id)
    if final.exists():
        raise StoreExistsError(f"a Minari dataset {dataset_id} already exists at {final}; choose another id (or "
                               "version), or delete it with minari.delete_dataset")
    env_spec, eval_spec = _spec(env, "env"), _spec(eval_env, "eval_env")
    store = src if isinstance(src, ReplayStore) else ReplayStore.open(src, storage_options=storage_options)
    try:
        count, moves, partial, in_progress = _whole_episodes(store)
        if not count:
            raise ConfigError(f"{store.path} holds no whole episode to export ({partial} cut at their start by the "
                              f"ring, {in_progress} in progress)")
        obs_space = _stack_space(store) if stacks else store.observation_space
        metadata: dict[str, Any] = {"dataset_id": dataset_id, "minari_version": minari.__version__,
                                    "replaystore": {"source": str(store.path), "frame_stack": store.frame_stack,
                                                    "frame_padding": store.schema.frame_padding,
                                                    "stacks": bool(stacks)}}
        given = {"author": author, "author_email": author_email, "algorithm_name": algorithm_name,
                 "code_permalink": code_permalink}
        metadata.update({k: ({v} if k.startswith("author") else v) for k, v in given.items() if v is not None})
        metadata["description"] = description if description is not None else (
            f"{count} episodes exported by replaystore from the replay store {store.path}")
        if eval_spec is not None:
            metadata["eval_env_spec"] = eval_spec.to_json()
        root = get_dataset_path()
        staging = root / f".replaystore-export-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)  # this process's own leftover
        _check_room(root, dataset_id, count, moves, store, obs_space)
        try:
            staging.mkdir()
            storage = MinariStorage.new(staging / "data", observation_space=obs_space,
                                        action_space=store.action_space, env_spec=env_spec, data_format=data_format,
                                        jpeg_encoding=jpeg_encoding)
            storage.update_metadata(metadata)
            storage.update_episodes(_buffers(store, count, stacks, progress))
            written = minari.MinariDataset(staging / "data")
            if (len(written), written.total_steps) != (count, moves):
                raise SampleError(f"{store.path} changed while it was exported ({len(written)} episodes and "
                                  f"{written.total_steps} moves written, {count} and {moves} listed); export from a "
                                  "store no one is writing to")
            if namespace is not None and namespace not in list_local_namespaces():
                create_namespace(namespace)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    finally:
        if store is not src:
            store.close()
    return MinariExport(dataset_id=dataset_id, path=str(final), episodes=count, moves=moves, partial=partial,
                        in_progress=in_progress, observation_shape=tuple(int(s) for s in obs_space.shape))


def _whole_episodes(store: ReplayStore) -> tuple[int, int, int, int]:
    """How many whole episodes with a move the store holds, and their moves; how many live episodes
    the ring has cut at their start, and how many are in progress."""
    whole = moves = partial = in_progress = 0
    for ring in store.rings.streams:
        table = episode_table(ring)
        chosen = table["whole"] & (table["lengths"] > 0)
        whole += int(np.count_nonzero(chosen))
        moves += int(table["lengths"][chosen].sum())
        in_progress += int(np.count_nonzero(~table["ended"]))
        partial += int(np.count_nonzero(table["ended"] & ~table["whole"]))
    return whole, moves, partial, in_progress


def _check_room(root: Path, dataset_id: str, episodes: int, moves: int, store: ReplayStore, obs_space: Any) -> None:
    """Refuse, before anything is written, an export that the disk under ``root`` cannot hold: Minari's
    HDF5 is not compressed, and HDF5 may crash the process (not raise) when the disk fills mid-write."""
    obs_bytes = int(np.prod(obs_space.shape)) * np.dtype(obs_space.dtype).itemsize
    action_bytes = max(1, int(np.prod(store.action_space.shape or (1,)))) * 8
    need = (moves + episodes) * obs_bytes + moves * (action_bytes + 4 + 2) + episodes * 16_384 + (1 << 20)
    free = shutil.disk_usage(root).free
    if need > free:
        raise StoreWriteError(errno.ENOSPC, f"the Minari dataset {dataset_id} would take about {need / 1e6:,.1f} MB "
                              f"({episodes:,} episodes, {moves:,} moves, uncompressed) under {root}, which has "
                              f"{free / 1e6:,.1f} MB free; nothing was written: free space there, or point "
                              "MINARI_DATASETS_PATH at a larger disk")


def _buffers(store: ReplayStore, count: int, stacks: bool, progress: Progress | None) -> Iterator[Any]:
    """Each whole episode as Minari's ``EpisodeBuffer``, read one at a time."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    for done, episode in enumerate(store.iter_episodes(whole=True)):
        obs = _stacked(episode, store.frame_stack, store.schema.frame_padding) if stacks else episode.obs
        yield EpisodeBuffer(observations=obs, actions=episode.action, rewards=episode.reward,
                            terminations=episode.terminated, truncations=episode.truncated, infos={})
        if progress is not None:
            progress(done + 1, count)


def _stacked(episode: Episode, k: int, padding: str) -> np.ndarray:
    """The episode's observations as the stacks of ``k`` frames the agent saw, ``(moves + 1, k, *frame)``:
    before the first frame, that frame again (``"reset"``) or zeros (``"zero"``)."""
    frames = episode.obs
    back = np.arange(len(frames))[:, None] - np.arange(k - 1, -1, -1)[None, :]
    out = frames[np.maximum(back, 0)]
    if padding == "zero":
        out[back < 0] = 0
    return out


def _stack_space(store: ReplayStore) -> Any:
    import gymnasium as gym

    space, k = store.observation_space, store.frame_stack
    shape = (k, *space.shape)
    return gym.spaces.Box(low=np.broadcast_to(space.low, shape), high=np.broadcast_to(space.high, shape),
                          shape=shape, dtype=space.dtype)


def _spec(env: Any, name: str) -> Any:
    """The ``EnvSpec`` of an env id, spec or env (None stays None)."""
    if env is None:
        return None
    import gymnasium as gym

    if isinstance(env, gym.envs.registration.EnvSpec):
        return env
    if isinstance(env, str):
        try:
            return gym.spec(env)
        except gym.error.Error as exc:
            raise ConfigError(f"{name} is {env!r}, which gymnasium does not know ({exc}); register it first") from None
    if isinstance(env, gym.Env) and env.spec is not None:
        return env.spec
    raise ConfigError(f"{name} is {env!r}; pass an env id, a gymnasium EnvSpec, or an env made with gym.make")


def _minari() -> Any:
    try:
        import minari
    except ImportError as exc:
        raise ReplayStoreError(f"Minari is not installed ({exc}): pip install 'replaystore[minari]'") from None
    return minari


def _shape(a: np.ndarray) -> str:
    return f"{a.shape} {a.dtype}"
