"""The numpy side of ``ReplayStoreBuffer`` (integrations/sb3.py): ``StoreSide`` opens, creates and
continues the store at the buffer's path, turns what SB3 passes to ``add`` into the store's rows
(stacks stored a frame a step, done split into terminated/truncated), and samples batches as numpy
arrays in SB3's layout, normalized and n-step as SB3 does. It needs neither torch nor SB3; the
buffer class converts at the edges."""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, InvalidTransitionError, StoreNotFoundError
from replaystore.format.dictobs import Packed, dict_from_space, is_dict_space
from replaystore.format.extras import extras_from_arg
from replaystore.format.spaces import DiscreteSpec, action_from_space, observation_from_space
from replaystore.integrations.stacking import StackChecker, StackLayout, choose, from_frames
from replaystore.sampling.hindsight import HindsightSampler, goal_entries
from replaystore.storage.where import normalized
from replaystore.store import ReplayStore

log = logging.getLogger("replaystore.integrations.sb3")

__all__ = ["StoreSide", "buffer_action_space"]


class StoreSide:
    """What the buffer does with the store, in numpy (no torch): the SB3 class converts at the edges.

    ``path``: where the store is (a directory, or an ``s3://`` URL with ``storage_options``).
    ``frame_stack`` (``"auto"``, 1 or k), ``stack_axis`` (0, -1) and ``padding`` (``"zero"``,
    ``"reset"``): the stacking layout, see stacking.choose. ``overwrite``: replace a store at
    ``path`` instead of continuing it. ``layout``, ``cache_bytes``: as for ``ReplayStore.create``.
    ``hindsight``: a ``HindsightSampler`` (not yet bound) that ``sample`` draws with, for
    ``ReplayStoreHerBuffer``; it needs a Dict space with ``achieved_goal`` and ``desired_goal``.
    ``info_keys``: keys of the infos SB3 passes to ``add`` to keep with each move as the store's
    extras (format/extras.py): a list of names (each one's shape and dtype taken from the first
    ``add`` whose infos hold it) or a dict of name -> dtype, ``(shape, dtype)`` or Box. An env whose
    info lacks a key at a step keeps 0 there. A store continued keeps the extras it was made with.
    """

    def __init__(self, buffer_size: int, observation_space: Any, action_space: Any, n_envs: int, *, path: Any,
                 frame_stack: Any = "auto", stack_axis: Any = None, padding: Any = None, n_steps: int = 1,
                 gamma: float = 0.99, handle_timeout_termination: bool = True, overwrite: bool = False,
                 layout: Any = None, cache_bytes: int | None = None,
                 storage_options: dict[str, Any] | None = None, seed: int | None = None,
                 hindsight: HindsightSampler | None = None, info_keys: Any = None) -> None:
        if path is None or str(path) == "":
            raise ConfigError("ReplayStoreBuffer needs a path: replay_buffer_kwargs={'path': 'runs/replay.zarr'}")
        # a Dict's steps are packed into the store's frames here and stored whole (no stack to find)
        self.dict_spec = dict_from_space(observation_space) if is_dict_space(observation_space) else None
        if self.dict_spec is not None and self.dict_spec.tree is not None:
            raise ConfigError(f"the observation space is {self.dict_spec.describe()}; SB3's policies take a Dict of "
                              "Boxes and the like, not a nested Dict or a Tuple: flatten it (gymnasium's "
                              "FlattenObservation on the env, or on its nested entries)")
        # a Discrete, MultiBinary or MultiDiscrete space: its values, stored whole and checked to lie in it
        self.entry = None if self.dict_spec is not None else observation_from_space(observation_space)[1]
        if (self.dict_spec is not None or self.entry is not None) and frame_stack not in ("auto", None, 1):
            raise ConfigError(f"frame_stack is {frame_stack!r}, but {type(observation_space).__name__} observations "
                              "are stored whole; leave frame_stack out (a VecFrameStack's stacks are stored as they "
                              "are)")
        if hindsight is not None:
            if self.dict_spec is None:
                raise ConfigError(f"hindsight relabelling (ReplayStoreHerBuffer) needs a Dict observation space with "
                                  f"'achieved_goal' and 'desired_goal', but the env observes {observation_space}; "
                                  "use ReplayStoreBuffer for it")
            goal_entries(self.dict_spec)  # the goal entries there, of one shape and dtype
            if n_steps != 1:
                raise ConfigError(f"n_steps is {n_steps!r}, but a relabelled reward is one step's: hindsight "
                                  "relabelling takes n_steps=1 (as SB3's HerReplayBuffer)")
        self.hindsight = hindsight
        self.info_keys = info_keys
        self.info_names = _info_names(info_keys)  # (a dict's checked here, before anything is made)
        self.stored_actions = buffer_action_space(action_space)
        if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or not 1 <= n_steps <= 1000:
            raise ConfigError(f"n_steps is {n_steps!r}; it must be an int from 1 (one-step returns) to 1000")
        if not 0.0 <= float(gamma) <= 1.0:
            raise ConfigError(f"gamma is {gamma!r}; it must be in [0, 1]")
        self.path = path
        self.buffer_size, self.n_envs = int(buffer_size), int(n_envs)
        self.observation_space, self.action_space = observation_space, action_space
        self.obs_shape = (self.dict_spec.stored.shape if self.dict_spec is not None
                          else tuple(int(s) for s in observation_space.shape))
        whole = self.dict_spec is not None or self.entry is not None
        self.options = {"frame_stack": 1 if whole else frame_stack, "stack_axis": stack_axis, "padding": padding}
        self.n_steps, self.gamma = int(n_steps), float(gamma)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.overwrite = bool(overwrite)
        self.layout_arg, self.cache_bytes, self.storage_options = layout, cache_bytes, storage_options
        self.rng = np.random.default_rng(np.random.randint(2**31) if seed is None else seed)
        self.store: ReplayStore | None = None
        self.stacks: StackLayout | None = None
        self.checker: StackChecker | None = None
        self.skipped = 0  # autoreset rows recognised and not stored
        self.handed_over = False  # a newer buffer of this process writes the store now
        if not self.overwrite:
            self.reopen()

    # ---------------------------------------------------------------------------------------------
    # The store

    def reopen(self) -> bool:
        """Continue the store at ``path`` if there is one; returns whether there was. A buffer of
        this process that still writes it (the one ``load_replay_buffer`` replaces) hands it over:
        it is flushed and closed, and refuses further use."""
        key = _key(self.path)
        old = _WRITING.get(key)
        if old is not None and old is not self and old.store is not None:
            log.info("buffer handing its store %s over to a new buffer (load_replay_buffer)", self.path)
            old.close()
            old.handed_over = True
        try:
            store = ReplayStore.open(self.path, mode="a", cache_bytes=self.cache_bytes,
                                     storage_options=self.storage_options)
        except StoreNotFoundError:
            return False
        try:
            self._check_fits(store)
            stacks = from_frames(self.obs_shape, store.schema.observation.shape, store.frame_stack,
                                 store.schema.frame_padding, str(store.path))
            said = self.options["frame_stack"]
            if said not in ("auto", None) and int(said) != stacks.frame_stack:
                raise ConfigError(f"frame_stack is {said}, but the store at {store.path} holds stacks of "
                                  f"{stacks.frame_stack}; pass its frame_stack or use a new path")
            self._check_infos(store)
            store.end_episode()  # the envs were reset: their episodes cannot go on
        except BaseException:
            store.close()
            raise
        self.store, self.stacks = store, stacks
        self.checker = StackChecker(stacks, self.n_envs, self.dict_spec)
        _WRITING[key] = self
        log.info("continuing replay store %s: %d transitions, %s", store.path, len(store), stacks.describe())
        return True

    def _check_fits(self, store: ReplayStore) -> None:
        schema, where = store.schema, store.path
        if schema.num_streams != self.n_envs:
            raise ConfigError(f"the store at {where} has {schema.num_streams} streams, one per env, but this run has "
                              f"{self.n_envs} envs; use as many envs, or a new path")
        if schema.observation_dict != self.dict_spec:
            held = "Box" if schema.observation_dict is None else schema.observation_dict.describe()
            gives = "Box" if self.dict_spec is None else self.dict_spec.describe()
            raise ConfigError(f"the store at {where} holds {held} observations, this env gives {gives}; use a new path")
        if schema.observation_entry != self.entry and self.dict_spec is None:
            raise ConfigError(f"the store at {where} holds {schema.observation_space()} observations, this env gives "
                              f"{self.observation_space}; use a new path")
        if np.dtype(schema.observation.dtype) != np.dtype(self.observation_space.dtype) and self.dict_spec is None:
            raise ConfigError(f"the store at {where} holds {schema.observation.dtype} observations, this env gives "
                              f"{np.dtype(self.observation_space.dtype)}; use a new path")
        if action_from_space(self.stored_actions) != schema.action:
            raise ConfigError(f"the store at {where} holds actions of {schema.action}, this env's action space is "
                              f"{self.action_space} (stored as {self.stored_actions}); use a new path")

    def _check_infos(self, store: ReplayStore) -> None:
        """The store continued keeps the info keys it was made with: the same as ``info_keys``, if given."""
        held = tuple(e.name for e in store.schema.extras)
        if self.info_names is None:
            self.info_names = held
        elif tuple(self.info_names) != held:
            raise ConfigError(f"the store at {store.path} keeps the info keys {list(held)}, but info_keys names "
                              f"{list(self.info_names)}; pass the store's keys or use a new path")
        elif isinstance(self.info_keys, Mapping) and extras_from_arg(self.info_keys) != store.schema.extras:
            raise ConfigError(f"the store at {store.path} keeps its info keys as "
                              f"{[(e.name, e.shape, e.dtype) for e in store.schema.extras]}, not as info_keys "
                              "declares them; pass the store's or use a new path")

    def _extras(self, infos: Any) -> dict[str, Any] | None:
        """How the store keeps ``info_names``: as declared, or each as its first value in ``infos``."""
        if not self.info_names:
            return None
        if isinstance(self.info_keys, Mapping):
            return dict(self.info_keys)
        out = {}
        for name in self.info_names:
            value = next((info[name] for info in _info_list(infos, self.n_envs) if name in info), None)
            if value is None:
                raise ConfigError(f"info_keys names {name!r}, but no env's first info holds it, so its shape and "
                                  f"dtype are not known; declare them: info_keys={{{name!r}: 'float32', ...}}")
            arr = np.asarray(value)
            out[name] = (arr.shape, arr.dtype.name)
        return out

    def create(self, first: np.ndarray, infos: Any = None) -> None:
        """Make the store, its stacking layout found from ``first`` (the first observations), keeping
        ``info_names`` as found in ``infos`` (the first infos)."""
        stacks = choose(self.obs_shape, first, **self.options)
        capacity = max(2, self.buffer_size // self.n_envs) * self.n_envs
        self.store = ReplayStore.create(
            self.path, capacity, stacks.frame_space(self.observation_space), self.stored_actions, stacks.frame_stack,
            num_streams=self.n_envs, frame_padding=stacks.padding if stacks.frame_stack > 1 else "reset",
            layout=self.layout_arg, overwrite=self.overwrite, cache_bytes=self.cache_bytes,
            storage_options=self.storage_options, extras=self._extras(infos))
        self.stacks, self.checker = stacks, StackChecker(stacks, self.n_envs, self.dict_spec)
        _WRITING[_key(self.path)] = self
        log.info("created replay store %s for %d steps: %s", self.store.path, capacity, stacks.describe())

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def flush(self) -> None:
        if self.store is not None:
            self.store.flush()

    # ---------------------------------------------------------------------------------------------
    # SB3's add and sample, in numpy

    def _usable(self) -> None:
        if self.handed_over:
            raise ConfigError(f"this buffer handed its store {self.path} over to the buffer that replaced it "
                              "(load_replay_buffer); use model.replay_buffer")

    def add(self, obs: Any, next_obs: Any, action: Any, reward: Any, done: Any, infos: Any) -> None:
        self._usable()
        n = self.n_envs
        obs_a = self._rows(obs, "obs")
        next_a = self._rows(next_obs, "next_obs")
        act = np.asarray(action)
        shape = (n, *self.stored_actions.shape)
        if act.size != math.prod(shape):
            raise InvalidTransitionError(f"action has shape {act.shape}; this buffer takes one action per env: {shape}")
        done_a = np.asarray(done).reshape(-1)
        if done_a.shape != (n,):
            raise InvalidTransitionError(f"done has shape {np.shape(done)}; this buffer takes one flag per env ({n})")
        if done_a.dtype.kind not in "biuf" or (done_a.dtype.kind != "b" and not np.isin(done_a, (0, 1)).all()):
            raise InvalidTransitionError(f"done is {done_a!r}; it must hold bools (or 0 and 1), one per env")
        done_b = done_a.astype(bool)
        timeouts = np.zeros(n, dtype=bool)
        if self.handle_timeout_termination and isinstance(infos, (list, tuple)):
            timeouts = np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos], dtype=bool)
        if self.store is None:
            self.create(obs_a, infos)
        assert self.checker is not None and self.stacks is not None and self.store is not None
        end, skip = self.checker.check(obs_a, next_a)
        store = self.store
        if end:
            store.end_episode(streams=end)
        stacks = self.stacks
        extras = None
        if store.schema.extras:  # each env's value of each kept key (0 where its info lacks it)
            given = _info_list(infos, n)
            extras = {e.name: np.array([info.get(e.name, np.zeros(e.shape, e.dtype)) for info in given])
                      for e in store.schema.extras}
        store.add_batch(self._given(stacks.newest(obs_a)), act.reshape(shape), np.asarray(reward).reshape(n),
                        self._given(stacks.newest(next_a)),
                        done_b & ~timeouts, done_b & timeouts, autoreset_mode="disabled", skip=skip, extras=extras)
        self.checker.advance(next_a, done_b, skip)
        self.skipped += len(skip)

    def _rows(self, value: Any, name: str) -> np.ndarray:
        """``value`` as one row per env: a Dict's packed into the store's frames (checked there)."""
        if self.dict_spec is not None:
            return self.dict_spec.pack(value, name=name, path=self.path, lead=(self.n_envs,))
        arr = np.asarray(value)
        if arr.shape != (self.n_envs, *self.obs_shape):
            if arr.size == self.n_envs * math.prod(self.obs_shape):
                return arr.reshape(self.n_envs, *self.obs_shape)
            raise InvalidTransitionError(f"{name} has shape {arr.shape}; this buffer takes "
                                         f"{(self.n_envs, *self.obs_shape)} (one row per env)")
        return arr

    def _given(self, frames: np.ndarray) -> Any:
        """Rows of frames as ``add_batch`` takes them: a Dict store's as the frames ``_rows`` packed
        (and checked), which the store takes without packing them again."""
        if self.dict_spec is None:
            return frames
        assert self.store is not None and self.store.schema.observation_dict is not None
        return Packed(self.store.schema.observation_dict, frames)  # (the store's own spec: found by identity)

    def _observations(self, stacks: Any) -> Any:
        """Sampled stacks as SB3's observations: rebuilt, or a Dict store's per key, ``(n, *shape)``."""
        if isinstance(stacks, dict):
            return {key: value.reshape(len(value), *value.shape[2:]) for key, value in stacks.items()}
        assert self.stacks is not None
        if isinstance(self.entry, DiscreteSpec):  # (n, 1), as SB3's own buffer keeps a Discrete observation
            return stacks.reshape(len(stacks), 1)
        return self.stacks.rebuild(stacks)

    def sample(self, batch_size: int, env: Any = None) -> dict[str, Any]:
        """A batch as numpy arrays shaped as SB3's ``ReplayBufferSamples`` fields."""
        self._usable()
        if self.store is None:
            raise ConfigError("the buffer is empty: add transitions before sampling")
        store = self.store
        held = len(store)
        if 0 < held < batch_size:  # SB3 draws with replacement from what it has
            parts = [self._draw(held) for _ in range(-(-batch_size // held))]
            batch = {k: _join([p[k] for p in parts], batch_size) for k in parts[0]}
        else:
            batch = self._draw(batch_size)
        obs, next_obs = self._observations(batch["obs"]), self._observations(batch["next_obs"])
        reward = batch["reward"].reshape(-1, 1)
        if env is not None:
            obs, next_obs = env.normalize_obs(obs), env.normalize_obs(next_obs)
            if self.n_steps > 1 and getattr(env, "norm_reward", False):
                raise ConfigError("n_steps > 1 with a VecNormalize that normalizes rewards: SB3 normalizes (and clips) "
                                  "each step's reward before summing, which this buffer does not; use norm_reward=False "
                                  "or n_steps=1")
            reward = env.normalize_reward(reward).astype(np.float32)
        terminated = batch["terminated"].reshape(-1, 1)
        out = {"observations": obs, "actions": batch["action"].reshape(len(reward), -1), "next_observations": next_obs,
               "dones": terminated.astype(np.float32), "rewards": reward, "discounts": None}
        if self.n_steps > 1:  # gamma ** m; where the last move terminated SB3's target ignores it
            full = np.float32(self.gamma) ** np.float32(self.n_steps)
            out["discounts"] = np.where(terminated, full, batch["discount"].reshape(-1, 1)).astype(np.float32)
        return out

    def _draw(self, n: int) -> dict[str, Any]:
        store = self.store
        assert store is not None
        if self.hindsight is not None:
            self.hindsight = self.hindsight.bind(store.schema)  # (once: a bound sampler binds to itself)
            b = store.sample(n, rng=self.rng, sampler=self.hindsight)
        else:
            b = store.sample(n, rng=self.rng, n_step=self.n_steps, gamma=self.gamma)
        return {"obs": b.obs, "next_obs": b.next_obs, "action": b.action, "reward": b.reward,
                "terminated": b.terminated, "discount": b.discount}

    def __len__(self) -> int:
        return 0 if self.store is None else len(self.store)


def _info_names(info_keys: Any) -> tuple[str, ...] | None:
    """The names ``info_keys`` gives (None: none given), checked."""
    if info_keys is None:
        return None
    if isinstance(info_keys, Mapping):
        return tuple(e.name for e in extras_from_arg(info_keys))
    if isinstance(info_keys, str) or not all(isinstance(k, str) for k in info_keys):
        raise ConfigError(f"info_keys is {info_keys!r}; pass a list of the info keys to keep, such as "
                          "['is_success'], or a dict of key -> dtype")
    names = tuple(info_keys)
    extras_from_arg({name: "float32" for name in names})  # (the names checked)
    if len(set(names)) != len(names):
        raise ConfigError(f"info_keys is {info_keys!r}; name each key once")
    return names


def _info_list(infos: Any, n: int) -> list[dict[str, Any]]:
    """SB3's infos (a list of one dict per env) as such a list, checked."""
    if not isinstance(infos, (list, tuple)) or len(infos) != n or not all(isinstance(i, dict) for i in infos):
        raise InvalidTransitionError(f"infos is {type(infos).__name__}; this buffer keeps info keys, so add takes "
                                     f"infos as SB3 passes them: a list of {n} dicts, one per env")
    return list(infos)


def _join(parts: list[Any], n: int) -> Any:
    """The first ``n`` rows of ``parts`` (arrays, or dicts of them) one after another."""
    if isinstance(parts[0], dict):
        return {key: np.concatenate([p[key] for p in parts])[:n] for key in parts[0]}
    return np.concatenate(parts)[:n]


def buffer_action_space(action_space: Any) -> Any:
    """The action space of the actions SB3 hands its buffer: a Discrete as it is; a Box as
    ``Box(-1, 1)`` of its shape in float32 (SB3's off-policy algorithms store the policy's squashed
    action, and SB3's own buffer keeps float64 as float32). Any other is a ``ConfigError``."""
    import gymnasium as gym

    action_from_space(action_space)  # refuses what a store cannot hold
    if isinstance(action_space, gym.spaces.Box):
        return gym.spaces.Box(-1.0, 1.0, shape=action_space.shape, dtype=np.float32)
    return action_space


#: The buffer of this process writing each store (by path): a new one for the same path takes over.
_WRITING: weakref.WeakValueDictionary[str, StoreSide] = weakref.WeakValueDictionary()


def _key(path: Any) -> str:
    return normalized(str(path))
