"""Environments and the agent's frame stacks.

``make_env`` builds any gymnasium env with a Discrete action space (the command line's). ``ALE/...`` ids get the standard
Atari preprocessing (AtariPreprocessing on a ``frameskip=1`` base env: 84x84 gray, frame skip 4, up
to 30 no-op starts, v5's sticky actions); rewards stay raw game scores. ``ATARI_SETTINGS`` are the
ALE settings a run may change (``--env-kwargs``), the same on one env and on ale-py's vector env. Reward clipping and "terminal on life loss" are
done by the acting (acting.py), which ends the *store's* episode at a lost life without resetting the
game (like cleanrl's EpisodicLife).

The agent's frame stacks (stacks.py's ``stacks_of`` and ``push_frames``, for acting, evaluation and
``act``) are built exactly as the store builds a stack at sample time: the last ``k`` frames of the
store's episode, the episode's first frame repeated as padding (the same as gymnasium's
``FrameStackObservation(padding_type="reset")``; tests/test_trainer.py checks it against
``store.sample``).
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from .actions import ActionSpec
from .config import TrainerError, image_frames
from .stacks import StackSpec

#: The observation spaces the trainer stacks: a Box's frames, or the ints of the others.
STACKABLE = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete)


#: The ALE settings ``--env-kwargs`` may change for an ``ALE/...`` id, with their defaults (v5's, and
#: the Nature DQN's preprocessing): ones that gymnasium's AtariEnv with AtariPreprocessing and ale-py's
#: AtariVectorEnv both take, so that acting, evaluation and actors play the same game.
ATARI_SETTINGS: dict[str, Any] = {
    "repeat_action_probability": 0.25,  # sticky actions (Machado et al.); 0.0 plays as the Nature DQN did
    "full_action_space": False,  # True: all 18 joystick actions, not the game's minimal set
    "max_num_frames_per_episode": 108_000,  # ALE frames before a game is truncated (30 minutes; the single
                                            # env counts its no-op start's frames in them, the vector env not)
    "noop_max": 30,  # at most this many no-op moves after a reset (0: none)
    "frameskip": 4,  # ALE frames a move repeats, the last two max-pooled
}
#: AtariEnv's keywords that ale-py's vector env does not take, or that the preprocessing sets.
_ATARI_FIXED = {"mode": "ale-py's vector env plays the default mode", "difficulty": "ale-py's vector env plays the default difficulty",
                "obs_type": "the preprocessing makes 84x84 gray frames", "continuous": "DQN needs discrete actions",
                "render_mode": "nothing is rendered while training"}


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def atari_settings(env_id: str, kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``ATARI_SETTINGS`` with ``kwargs`` (--env-kwargs) over them; TrainerError naming the keyword
    for one that is not among them or a value of the wrong kind or range."""
    settings = dict(ATARI_SETTINGS)
    takes = ", ".join(ATARI_SETTINGS)
    for key, value in (kwargs or {}).items():
        if key not in ATARI_SETTINGS:
            why = f" ({_ATARI_FIXED[key]})" if key in _ATARI_FIXED else ""
            raise TrainerError(f"{env_id} does not take the keyword {key!r}{why}; an ALE id takes {takes}")
        default = ATARI_SETTINGS[key]
        if isinstance(default, bool):
            ok = isinstance(value, bool)
            want = "true or false"
        elif isinstance(default, float):
            ok = isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0
            want = "a probability from 0 to 1"
        else:
            low = 0 if key == "noop_max" else 1
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
            want = f"a whole number >= {low}"
        if not ok:
            raise TrainerError(f"{env_id}'s {key} is {json.dumps(value)}; give {want} (the default is {json.dumps(default)})")
        settings[key] = float(value) if isinstance(default, float) else value
    return settings


def make_env(env_id: str, kwargs: dict[str, Any] | None = None, *, render: bool = False) -> gym.Env:
    """The environment for ``env_id``, wrapped for training; raises TrainerError for an unusable id.
    A ``module:Name-v0`` id imports ``module`` first (gymnasium's way to register an env of one's own).
    ``kwargs`` go to ``gym.make``; for an ALE id they are ``ATARI_SETTINGS``. ``render``: made with
    ``render_mode="rgb_array"`` (``env.render()`` gives the screen; TrainerError for an env that
    cannot)."""
    shown: dict[str, Any] = {"render_mode": "rgb_array"} if render else {}
    if is_atari(env_id):
        import ale_py

        gym.register_envs(ale_py)
    env: gym.Env
    try:
        with warnings.catch_warnings():  # (gymnasium warns of a render_mode the env lacks, then fails: checked below)
            warnings.filterwarnings("ignore", message=".*render_mode.*")
            env = _make(env_id, kwargs, shown)
    except TypeError as exc:  # (a keyword the env's constructor does not take)
        if render and "render_mode" in str(exc):
            raise TrainerError(f"{env_id} cannot show its screen: its constructor takes no render_mode; leave out "
                               "--video") from None
        if not kwargs:
            raise
        raise TrainerError(f"{env_id} cannot be made with the keywords {kwargs} ({exc}); give the ones its "
                           "constructor takes") from exc
    except gym.error.Error as exc:
        raise TrainerError(f"unknown environment id {env_id!r} ({exc}); use a registered id such as CartPole-v1 "
                           "or ALE/Breakout-v5, or module:Name-v0 for an env that module registers") from exc
    except ImportError as exc:  # (the module of a module:Name-v0 id)
        module = env_id.split(":", 1)[0]
        raise TrainerError(f"environment id {env_id!r}: its module {module!r} cannot be imported ({exc}); install "
                           "it, or put its folder on PYTHONPATH") from exc
    if not isinstance(env.action_space, gym.spaces.Discrete):
        env.close()
        raise TrainerError(f"{env_id} has action space {env.action_space}; replaystore-train learns by DQN, which "
                           "needs a Discrete action space (try CartPole-v1 or an ALE/... game; for Box actions, "
                           "SAC in Python: DQN(..., rule=SAC()), docs/trainer.md)")
    if render and "rgb_array" not in (env.metadata.get("render_modes") or ()):
        env.close()
        raise TrainerError(f"{env_id} cannot show its screen: its render modes are {env.metadata.get('render_modes')}, "
                           "without rgb_array; leave out --video")
    if not stackable(env.observation_space):
        env.close()
        raise TrainerError(f"{env_id} has observation space {env.observation_space}; replaystore-train needs a "
                           "Box (images or vectors), a Discrete, a MultiBinary or a MultiDiscrete, or Dicts and Tuples "
                           "of them; wrap the env (gymnasium's FlattenObservation makes one Box of a space)")
    return env


def _make(env_id: str, kwargs: dict[str, Any] | None, shown: dict[str, Any]) -> gym.Env:
    if is_atari(env_id):
        s = atari_settings(env_id, kwargs)
        base = gym.make(env_id, frameskip=1, repeat_action_probability=s["repeat_action_probability"],
                        full_action_space=s["full_action_space"],
                        max_num_frames_per_episode=s["max_num_frames_per_episode"], **shown)
        return gym.wrappers.AtariPreprocessing(base, noop_max=s["noop_max"], frame_skip=s["frameskip"], screen_size=84,
                                               terminal_on_life_loss=False, grayscale_obs=True)
    return gym.make(env_id, **(kwargs or {}), **shown)


def make_vector_env(env_id: str, num_envs: int, *, halves: bool = False, kwargs: dict[str, Any] | None = None) -> Any:
    """``num_envs`` copies of ``env_id`` stepped together, in next-step autoreset mode, observing
    single frames (the store stacks them). ALE ids use ale-py's C++ ``AtariVectorEnv`` with the same
    preprocessing as ``make_env`` (84x84 gray, frame skip 4 with max-pooling, up to 30 no-op starts,
    v5's sticky actions, raw rewards, no episodic life: the loop ends learning episodes at a lost
    life itself); other ids a gymnasium ``SyncVectorEnv``. ``halves`` (ALE ids, ``num_envs`` >= 2):
    a ``HalvedVectorEnv``, which ``DQN.fit`` steps one half at a time (acting.py). ``kwargs``: as
    ``make_env``'s (``ATARI_SETTINGS`` for an ALE id)."""
    if is_atari(env_id):
        from ale_py.vector_env import AtariVectorEnv

        game = atari_game(env_id)
        settings = atari_settings(env_id, kwargs)

        def atari(n: int) -> Any:
            return AtariVectorEnv(game, num_envs=n, stack_num=1, img_height=84, img_width=84, grayscale=True,
                                  maxpool=True, reward_clipping=False, episodic_life=False, use_fire_reset=False,
                                  **settings)

        if halves and num_envs >= 2:
            return HalvedVectorEnv([atari(num_envs // 2), atari(num_envs - num_envs // 2)])
        return atari(num_envs)
    make_env(env_id, kwargs).close()  # an unusable id or keyword fails here with the trainer's message
    return gym.vector.SyncVectorEnv([lambda: gym.make(env_id, **(kwargs or {})) for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


class HalvedVectorEnv:
    """N envs as two vector envs of about N/2 each that can step apart: ``halves``, each with
    ale-py's ``send(actions)`` (the step starts on the env's C++ threads and the call returns) and
    ``recv()`` (its results). ``DQN.fit`` acts in them in turn (acting.py's ``PipelinedActing``): one
    half's envs step while the trainer writes the other half's moves and picks its next actions, so
    the envs' time and the forward pass's overlap. As a vector env of its own (``reset``, ``step``:
    both halves stepped together) it is the N envs, the first half's first, ``info["env_id"]``
    counted over all N."""

    def __init__(self, halves: list[Any]) -> None:
        if len(halves) != 2 or not all(hasattr(h, "send") and hasattr(h, "recv") for h in halves):
            raise TrainerError("HalvedVectorEnv takes two vector envs with send/recv (ale-py's AtariVectorEnv)")
        self.halves = halves
        self.sizes = [int(h.num_envs) for h in halves]
        self.num_envs = sum(self.sizes)
        first = halves[0]
        self.single_observation_space = first.single_observation_space
        self.single_action_space = first.single_action_space
        self.observation_space = gym.vector.utils.batch_space(first.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(first.single_action_space, self.num_envs)
        self.metadata = first.metadata

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every env; an int ``seed`` seeds them with consecutive values, as AtariVectorEnv does."""
        if options:
            raise TrainerError("HalvedVectorEnv.reset takes no options; reset the halves themselves")
        results, start = [], 0
        for half, size in zip(self.halves, self.sizes):
            results.append(half.reset(seed=None if seed is None else seed + start))
            start += size
        return self._join(results)

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        """Both halves' step with ``actions`` (one per env), started together."""
        actions = np.asarray(actions)
        self.halves[0].send(actions[:self.sizes[0]])
        self.halves[1].send(actions[self.sizes[0]:])
        return self._join([half.recv() for half in self.halves])

    def close(self) -> None:
        for half in self.halves:
            half.close()

    def _join(self, results: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        *arrays, infos = zip(*results)
        info: dict[str, Any] = {}
        for key in infos[0]:
            parts = [np.asarray(i[key]) for i in infos]
            if key == "env_id":
                parts[1] = parts[1] + self.sizes[0]
            info[key] = np.concatenate(parts)
        return (*(np.concatenate(a) for a in arrays), info)


def atari_game(env_id: str) -> str:
    """ale-py's ROM name for an ``ALE/<Game>-v5`` id (``ALE/MsPacman-v5`` -> ``ms_pacman``)."""
    import ale_py.roms

    name = env_id.split("/", 1)[1].rsplit("-", 1)[0]
    wanted = name.lower().replace("_", "")
    for rom in ale_py.roms.get_all_rom_ids():
        if rom.replace("_", "") == wanted:
            return rom
    raise TrainerError(f"{env_id} names no ALE game ale-py has; use an id such as ALE/Breakout-v5")


def vector_frame_space(envs: Any) -> Any:
    """A vector env's observation space of one frame (``vector_frames``' rows)."""
    space = envs.single_observation_space
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        return space
    if len(space.shape) == 3 and space.shape[0] == 1:
        return gym.spaces.Box(space.low[0], space.high[0], space.shape[1:], space.dtype)
    return space


def vector_frames(obs: Any) -> Any:
    """A vector env's observations as one frame per env (AtariVectorEnv adds a stack axis of 1; a
    Dict or Tuple env's are dicts and tuples of arrays, as they are)."""
    if isinstance(obs, dict | tuple):
        return obs
    return obs[:, 0] if obs.ndim == 4 and obs.shape[1] == 1 else obs


def default_frame_stack(observation_space: Any) -> int:
    """4 for images (2-D or 3-D frames), 1 for vectors, a Discrete's int and a Dict's entries."""
    return 4 if image_frames(observation_space) else 1


def stackable(space: Any) -> bool:
    """Whether the trainer stacks ``space``: a Box, Discrete, MultiBinary or MultiDiscrete, or a Dict
    or Tuple of them (a goal env's; Blackjack's), nested ones too."""
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        try:
            StackSpec.of_space(space, 1)
        except TrainerError:
            return False
        return True
    return isinstance(space, STACKABLE)


def env_spaces(env: Any) -> tuple[Any, Any]:
    """The observation space of one frame and the action space of ``env`` (a gymnasium env or a
    vector env); TrainerError unless they are a Box (or a Discrete, MultiBinary or MultiDiscrete:
    stacks of their ints, which the model embeds; or Dicts and Tuples of those: their structure of
    stacks) and a Discrete or a bounded Box (whose rule learns them is checked when the model is built)."""
    vector = hasattr(env, "num_envs")
    observation_space = vector_frame_space(env) if vector else env.observation_space
    action_space = env.single_action_space if vector else env.action_space
    try:
        ActionSpec.of_space(action_space)
    except TrainerError as exc:
        raise TrainerError(f"the environment has {exc}") from None
    if not stackable(observation_space):
        raise TrainerError(f"the environment's observation space is {observation_space}; this DQN takes Box, "
                           "Discrete, MultiBinary or MultiDiscrete observations, or Dicts and Tuples of them (stacked): "
                           "wrap the env (gymnasium's FlattenObservation makes one Box of a space)")
    return observation_space, action_space
