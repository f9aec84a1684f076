"""A store's whole episodes out as a new Minari dataset: ``minari_from_store`` (see the package's docstring)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import (
    ConfigError,
    SampleError,
    StoreExistsError,
    StoreWriteError,
)
from replaystore.format import nesting
from replaystore.integrations.minari.common import Progress, minari_module
from replaystore.sampling.episodes import Episode, episode_table
from replaystore.storage.outside import check_not_in_store
from replaystore.store import ReplayStore

#: The name that a dataset being exported has under Minari's root, before its process and host.
STAGING = ".replaystore-export-"


@dataclass(frozen=True)
class MinariExport:
    """What ``minari_from_store`` wrote."""

    dataset_id: str
    path: str  # the dataset's folder
    episodes: int
    moves: int
    partial: int  # live episodes whose first steps the ring had overwritten, left out
    in_progress: int  # episodes still being written, left out
    observation_shape: tuple[int, ...]  # () for a Dict


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
    minari = minari_module()
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
    check_not_in_store(final, what=f"the Minari dataset {dataset_id} (MINARI_DATASETS_PATH)")
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
        staging = _staging(root)
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
                        in_progress=in_progress, observation_shape=tuple(int(s) for s in obs_space.shape or ()))


def _staging(root: Path) -> Path:
    """This process's folder to write a dataset in, under Minari's datasets ``root``
    (``.replaystore-export-HOST-PID``). What exports on this machine left there when their process
    died mid-write (killed, out of memory) is removed first, and so is this process's own leftover;
    a folder of a process that is alive, or of another machine sharing the root, is left alone
    (``.replaystore-export-PID``, without a host, is an earlier version's name for this machine's)."""
    host = socket.gethostname()
    for leftover in root.glob(f"{STAGING}*"):
        owner, _, pid = leftover.name.removeprefix(STAGING).rpartition("-")
        if owner in (host, "") and pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            shutil.rmtree(leftover, ignore_errors=True)
    return root / f"{STAGING}{host}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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


def _leaf_spaces(space: Any) -> list[Any]:
    """The spaces of a Dict's or a Tuple's entries, nested ones' included (a space that is neither: itself)."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        subs = space.spaces.values() if isinstance(space, gym.spaces.Dict) else space.spaces
        return [leaf for sub in subs for leaf in _leaf_spaces(sub)]
    return [space]


def _check_room(root: Path, dataset_id: str, episodes: int, moves: int, store: ReplayStore, obs_space: Any) -> None:
    """Refuse, before anything is written, an export that the disk under ``root`` cannot hold: Minari's
    HDF5 is not compressed, and HDF5 may crash the process (not raise) when the disk fills mid-write."""
    obs_bytes = sum(int(np.prod(box.shape)) * np.dtype(box.dtype).itemsize for box in _leaf_spaces(obs_space))
    action_bytes = max(1, int(np.prod(store.action_space.shape or (1,)))) * 8
    extra_bytes = sum(e.step_bytes for e in store.schema.extras)
    need = ((moves + episodes) * (obs_bytes + extra_bytes) + moves * (action_bytes + 4 + 2) + episodes * 16_384
            + (1 << 20))
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
                            terminations=episode.terminated, truncations=episode.truncated, infos=_infos(episode))
        if progress is not None:
            progress(done + 1, count)


def _infos(episode: Episode) -> dict[str, np.ndarray]:
    """The store's extras of the episode's moves as Minari's ``infos``, one value per observation:
    the info each move returned follows the observation it led to; the reset's, which the store does
    not keep, is zeros."""
    return {name: np.concatenate([np.zeros((1, *values.shape[1:]), values.dtype), values])
            for name, values in episode.extras.items()}


def _stacked(episode: Episode, k: int, padding: str) -> Any:
    """The episode's observations as the stacks of ``k`` frames the agent saw, ``(moves + 1, k, *frame)``:
    before the first frame, that frame again (``"reset"``) or zeros (``"zero"``). A Dict's per key (a
    nested one's and a Tuple's per entry)."""
    return nesting.map_structure(lambda frames: _stack(frames, k, padding), episode.obs)


def _stack(frames: np.ndarray, k: int, padding: str) -> np.ndarray:
    back = np.arange(len(frames))[:, None] - np.arange(k - 1, -1, -1)[None, :]
    out = frames[np.maximum(back, 0)]
    if padding == "zero":
        out[back < 0] = 0
    return out


def _stack_space(store: ReplayStore) -> Any:
    import gymnasium as gym

    space, k = store.observation_space, store.frame_stack
    if isinstance(space, gym.spaces.Dict):  # (another entry: gymnasium's own stack of it)
        return gym.spaces.Dict([(key, _box_stack(box, k) if isinstance(box, gym.spaces.Box)
                                 else gym.vector.utils.batch_space(box, k)) for key, box in space.spaces.items()])
    if not isinstance(space, gym.spaces.Box):  # a Discrete, MultiBinary or MultiDiscrete: gymnasium's stack of it
        return gym.vector.utils.batch_space(space, k)
    return _box_stack(space, k)


def _box_stack(space: Any, k: int) -> Any:
    import gymnasium as gym

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
        if env.startswith("ALE/"):  # (ale-py registers its ids only when asked: gym.register_envs)
            with contextlib.suppress(ImportError):
                import ale_py

                gym.register_envs(ale_py)
        try:
            return gym.spec(env)
        except gym.error.Error as exc:
            raise ConfigError(f"{name} is {env!r}, which gymnasium does not know ({exc}); register it first") from None
    if isinstance(env, gym.Env) and env.spec is not None:
        return env.spec
    raise ConfigError(f"{name} is {env!r}; pass an env id, a gymnasium EnvSpec, or an env made with gym.make")
