"""Where an agent's replay store is, and how it is opened: to append (``fit``: created on the first
run when there is none, checked against the environment), to read (``fit_offline``, ``DQN.load``:
nothing in it changes), and how ``agent.json`` refers to it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from replaystore import ReplayStore, StoreLockedError, StoreNotFoundError
from replaystore.storage.where import is_url, normalized

from .actions import ActionSpec
from .config import TrainerError
from .stacks import StackSpec


def open_to_append(location: str | Path, *, cache_bytes: int, options: dict[str, Any]) -> ReplayStore | None:
    """The store at ``location`` opened for appending; None when there is none."""
    try:
        return ReplayStore.open(location, mode="a", cache_bytes=cache_bytes, **options)
    except StoreNotFoundError:
        return None


def open_streams(location: str | Path, *, streams: Any, cache_bytes: int, lease_wait: float,
                 options: dict[str, Any]) -> ReplayStore:
    """The store at ``location`` opened to write ``streams``. On object storage the streams of a
    process that died stay leased until the lease expires: wait up to ``lease_wait`` seconds for that."""
    deadline = time.monotonic() + lease_wait
    while True:
        try:
            return ReplayStore.open(location, mode="a", streams=streams, cache_bytes=cache_bytes, **options)
        except StoreLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def open_to_read(location: str | Path, *, cache_bytes: int, options: dict[str, Any]) -> ReplayStore:
    """The store at ``location`` opened read-only; TrainerError when there is none."""
    store = open_if_there(location, cache_bytes=cache_bytes, options=options)
    if store is None:
        raise TrainerError(f"{location} holds no replay store; learning offline needs an existing one (written by "
                           "fit or replaystore-train, or made from a Minari dataset by store_from_minari or "
                           "`replaystore import-minari`)")
    return store


def open_if_there(location: str | Path, *, cache_bytes: int, options: dict[str, Any]) -> ReplayStore | None:
    """The store at ``location`` opened read-only; None when there is none."""
    try:
        return ReplayStore.open(location, mode="r", cache_bytes=cache_bytes, **options)
    except StoreNotFoundError:
        return None


def check_for_env(store: ReplayStore, observation_space: Any, action_space: Any, num_streams: int) -> None:
    """Refuse a store that the env's steps cannot be appended to, saying why."""
    if not store.writing:
        raise TrainerError(f"{store.path} is open read-only; DQN adds what it acts to the store: open it with "
                           "mode='a'")
    if not same_frames(store.observation_space, observation_space) or store.action_space != action_space:
        raise TrainerError(f"{store.path} stores {store.observation_space} with {store.action_space}, which the "
                           f"environment's {observation_space} and {action_space} do not match")
    if len(store.writing) != num_streams:
        raise TrainerError(f"{store.path} is written here in {len(store.writing)} streams, but the environment "
                           f"steps {num_streams} envs: each env needs its own stream (create the store with "
                           f"num_streams={num_streams}, open it with streams=[...], or put its episodes into "
                           f"{num_streams} streams: `replaystore compact {store.path} --streams {num_streams}` in place, "
                           "or with a DST after the path to copy)")


def same_frames(stored: Any, observation_space: Any) -> bool:
    """Whether an env observing ``observation_space`` gives the frames a store of ``stored`` keeps
    (a Dict's keys, and each entry's shape and dtype)."""
    try:
        return StackSpec.of_space(stored, 1) == StackSpec.of_space(observation_space, 1)
    except TrainerError:
        return False


def check_for_eval(store: ReplayStore, observation_space: Any, action_space: Any) -> None:
    """Refuse an evaluation env whose frames or actions are not the store's (so not the model's)."""
    if not same_frames(store.observation_space, observation_space) or not same_actions(store.action_space, action_space):
        raise TrainerError(f"the evaluation env gives frames of {observation_space} with {action_space}, but {store.path} "
                           f"holds {store.observation_space} with {store.action_space}: evaluate on the env the "
                           "store was written from (with its wrappers, but without a frame stack)")


def same_actions(stored: Any, action_space: Any) -> bool:
    """Whether an env acting in ``action_space`` takes the actions a store of ``stored`` keeps."""
    try:
        return ActionSpec.of_space(stored) == ActionSpec.of_space(action_space)
    except TrainerError:
        return False


def check_for_network(observation_space: Any, action_space: Any, stacks: StackSpec, actions: ActionSpec) -> None:
    """Refuse an env (to evaluate on) whose frames or actions are not the model's."""
    if not stacks.takes_frames_of(observation_space) or not actions.matches(action_space):
        raise TrainerError(f"the env gives frames of {observation_space} with {action_space}, but this agent's "
                           f"model takes stacks of {stacks.describe()} and acts in {actions.describe()}: evaluate "
                           "on the env it learned from (with its wrappers, but without a frame stack)")


def check_dataset(store: ReplayStore, batch_size: int, n_step: int, eval_spaces: tuple[Any, Any] | None) -> None:
    """Refuse a store to learn from offline that holds too few transitions for one batch of n-step
    returns, or whose frames or actions the evaluation env's ``eval_spaces`` differ from."""
    if eval_spaces is not None:
        check_for_eval(store, *eval_spaces)
    if len(store) < batch_size + n_step:
        raise TrainerError(f"{store.path} holds {len(store)} transitions; a batch of {batch_size} with {n_step}-step "
                           f"returns needs at least {batch_size + n_step}")


def place(location: str | Path) -> str:
    """A store's location as one string whatever way it was given: a URL as it is, a path made
    absolute with its links resolved (so two spellings of one directory compare equal)."""
    return normalized(str(location))


def check_not_dataset(location: str | Path, datasets: list[str]) -> None:
    """Refuse to act into a store the agent learned from offline and never acted into: ``fit`` would
    append to that dataset (and, once its ring is full, write over its oldest episodes)."""
    if place(location) in datasets:
        raise TrainerError(f"this agent learned offline from {location} and has not acted into it: fit would append "
                           "its env steps to that dataset (and, once its ring is full, write over its oldest "
                           "episodes); give the online run a store of its own with agent.use_store(PATH) or "
                           "DQN.load(DIR, store=PATH). To keep the dataset's moves in the replay too, copy it with "
                           "room to grow first: replaystore compact DATASET PATH --capacity N (and --streams E for a "
                           "vector env of E envs)")


def check_stacks(store: ReplayStore, stacks: StackSpec) -> None:
    """Refuse a store whose stacks are not the learner's."""
    try:
        held = StackSpec.of_space(store.observation_space, store.frame_stack)
    except TrainerError:
        held = None
    if held != stacks:
        what = held.describe() if held is not None else str(store.observation_space)
        raise TrainerError(f"{store.path} holds stacks of {what}, but this agent's Q-network takes "
                           f"{stacks.describe()}: use a store of the agent's frames and frame stack (a path that "
                           "holds no store is created with them)")


def store_ref(location: str | Path, directory: Path) -> str:
    """Where the store is, as ``agent.json`` keeps it: a local path relative to the agent's directory
    (so the two move together), a URL as it is."""
    text = str(location)
    if is_url(text):
        return text
    return os.path.relpath(normalized(text), directory.resolve())


def store_at(ref: str, directory: Path) -> str | Path:
    """The location ``store_ref`` wrote, for an agent loaded from ``directory``."""
    return ref if is_url(ref) or os.path.isabs(ref) else directory / ref


class AgentStore:
    """An agent's replay store: where it is (``location``), and the store while it is open
    (``store``), opened to read (``fit_offline``, ``DQN.load``) or to append (``fit``), and created
    on the first ``fit`` with ``buffer_size`` steps when the location holds none."""

    def __init__(self, store: ReplayStore | str | Path, *, buffer_size: int, frame_stack: int | None,
                 cache_bytes: int, storage_options: dict[str, Any] | None) -> None:
        self.buffer_size, self.frame_stack, self.cache_bytes = buffer_size, frame_stack, cache_bytes
        self.storage_options = dict(storage_options) if storage_options else None
        self.store: ReplayStore | None = None
        self.location: str | Path = ""
        self.reopen = False  # the store was opened here read-only: fit reopens it for appending
        self.stacks: StackSpec | None = None  # the Q-network's stacks, once made
        self.switch(store)

    def check_learnable(self, observation_space: Any, action_space: Any, rule: Any) -> ActionSpec:
        """The actions, refused where ``rule`` cannot learn them (a Discrete space for DQN's rules,
        a bounded Box for SAC's; every observation space a store keeps is stacked: trainer/stacks.py)."""
        where = f"{self.store.path} holds" if self.store is not None else "the environment has"
        try:
            actions = ActionSpec.of_space(action_space)
        except TrainerError as exc:
            raise TrainerError(f"{where} {exc}") from None
        rule.check_actions(actions, where)
        return actions

    def switch(self, store: ReplayStore | str | Path) -> None:
        """Use ``store`` from now on (the current one is closed first)."""
        if not isinstance(store, ReplayStore | str | Path):
            raise TrainerError(f"store is a {type(store).__name__}; pass a ReplayStore or the path or URL of one")
        if isinstance(store, ReplayStore):
            self.check_stacks(store)
        self.close()
        self.store = store if isinstance(store, ReplayStore) else None
        self.location = store.path if isinstance(store, ReplayStore) else store

    def options(self) -> dict[str, Any]:
        return {"storage_options": self.storage_options} if self.storage_options else {}

    def default_stack(self, observation_space: Any) -> int:
        """Frames a stack for a new store: ``frame_stack``, else 4 for image frames and 1 for vectors
        (and for a Dict's entries)."""
        shape = getattr(observation_space, "shape", None)
        return self.frame_stack or (4 if shape is not None and len(shape) >= 2 else 1)

    def check_stacks(self, store: ReplayStore) -> None:
        """Refuse a store whose stacks are not the Q-network's (once it is made)."""
        if self.stacks is not None:
            check_stacks(store, self.stacks)

    def for_append(self, observation_space: Any, action_space: Any, num_streams: int, *,
                   create: bool) -> ReplayStore | None:
        """The store, opened for appending (or, with ``create``, created for ``num_streams`` envs with
        the Q-network's frame stack, else ``default_stack``, when there is none yet), checked
        against the env and the Q-network; None when there is none and ``create`` is False."""
        if self.store is not None and not self.store.writing and self.reopen:
            self.close()  # opened here to read (fit_offline, load): fit appends
        if self.store is None:
            self.store = open_to_append(self.location, cache_bytes=self.cache_bytes, options=self.options())
            if self.store is None:
                if not create:
                    return None
                if self.buffer_size % num_streams:
                    lower = self.buffer_size - self.buffer_size % num_streams
                    raise TrainerError(f"buffer_size {self.buffer_size:,} does not split evenly over the env's "
                                       f"{num_streams} envs (each env writes its own stream of the store); use "
                                       f"{lower:,} or {lower + num_streams:,}")
                self.store = ReplayStore.create(self.location, self.buffer_size, observation_space, action_space,
                                                self.stacks.frame_stack if self.stacks else self.default_stack(observation_space),
                                                cache_bytes=self.cache_bytes, num_streams=num_streams,
                                                **self.options())
        check_for_env(self.store, observation_space, action_space, num_streams)
        self.check_stacks(self.store)
        return self.store

    def for_reading(self, *, missing_ok: bool = False) -> ReplayStore | None:
        """The store open, or the one at ``location`` opened read-only (None, with ``missing_ok``,
        when there is none; else TrainerError)."""
        if self.store is None:
            opener = open_if_there if missing_ok else open_to_read
            self.store = opener(self.location, cache_bytes=self.cache_bytes, options=self.options())
            self.reopen = self.store is not None
        return self.store

    def close(self) -> None:
        """Close the store (flushing what was added); the location stays, to open again."""
        if self.store is not None:
            self.store.close()
        self.store, self.reopen = None, False
