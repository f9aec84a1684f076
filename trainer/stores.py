"""Where an agent's replay store is, and how it is opened: to append (``fit``: created on the first
run when there is none, checked against the environment), to read (``fit_offline``, ``DQN.load``:
nothing in it changes), and how ``agent.json`` refers to it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from replaystore import ReplayStore, StoreNotFoundError

from .config import TrainerError


def open_to_append(location: str | Path, *, cache_bytes: int, options: dict[str, Any]) -> ReplayStore | None:
    """The store at ``location`` opened for appending; None when there is none."""
    try:
        return ReplayStore.open(location, mode="a", cache_bytes=cache_bytes, **options)
    except StoreNotFoundError:
        return None


def open_to_read(location: str | Path, *, cache_bytes: int, options: dict[str, Any]) -> ReplayStore:
    """The store at ``location`` opened read-only; TrainerError when there is none."""
    try:
        return ReplayStore.open(location, mode="r", cache_bytes=cache_bytes, **options)
    except StoreNotFoundError:
        raise TrainerError(f"{location} holds no replay store; learning offline needs an existing one (written by "
                           "fit or replaystore-train, or made from a Minari dataset by store_from_minari or "
                           "`replaystore import-minari`)") from None


def check_for_env(store: ReplayStore, observation_space: Any, action_space: Any, num_streams: int) -> None:
    """Refuse a store that the env's steps cannot be appended to, saying why."""
    if not store.writing:
        raise TrainerError(f"{store.path} is open read-only; DQN adds what it acts to the store: open it with "
                           "mode='a'")
    if store.observation_space.shape != observation_space.shape or store.action_space != action_space:
        raise TrainerError(f"{store.path} stores {store.observation_space} with {store.action_space}, which the "
                           f"environment's {observation_space} and {action_space} do not match")
    if len(store.writing) != num_streams:
        raise TrainerError(f"{store.path} is written here in {len(store.writing)} streams, but the environment "
                           f"steps {num_streams} envs: each env needs its own stream (create the store with "
                           f"num_streams={num_streams}, or open it with streams=[...])")


def check_for_eval(store: ReplayStore, observation_space: Any, action_space: Any) -> None:
    """Refuse an evaluation env whose frames or actions are not the store's (so not the model's)."""
    if observation_space.shape != store.observation_space.shape or action_space.n != store.action_space.n:
        raise TrainerError(f"the evaluation env gives frames of {observation_space} with {action_space}, but {store.path} "
                           f"holds {store.observation_space} with {store.action_space}: evaluate on the env the "
                           "store was written from (with its wrappers, but without a frame stack)")


def check_dataset(store: ReplayStore, batch_size: int, n_step: int, eval_spaces: tuple[Any, Any] | None) -> None:
    """Refuse a store to learn from offline that holds too few transitions for one batch of n-step
    returns, or whose frames or actions the evaluation env's ``eval_spaces`` differ from."""
    if eval_spaces is not None:
        check_for_eval(store, *eval_spaces)
    if len(store) < batch_size + n_step:
        raise TrainerError(f"{store.path} holds {len(store)} transitions; a batch of {batch_size} with {n_step}-step "
                           f"returns needs at least {batch_size + n_step}")


def store_ref(location: str | Path, directory: Path) -> str:
    """Where the store is, as ``agent.json`` keeps it: a local path relative to the agent's directory
    (so the two move together), a URL as it is."""
    text = str(location)
    if "://" in text:
        return text
    return os.path.relpath(Path(text).resolve(), directory.resolve())


def store_at(ref: str, directory: Path) -> str | Path:
    """The location ``store_ref`` wrote, for an agent loaded from ``directory``."""
    return ref if "://" in ref or os.path.isabs(ref) else directory / ref
