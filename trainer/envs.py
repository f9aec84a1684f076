"""Environments and the agent's frame stacks.

``make_env`` builds any gymnasium env with a Discrete action space. ``ALE/...`` ids get the standard
Atari preprocessing (AtariPreprocessing on a ``frameskip=1`` base env: 84x84 gray, frame skip 4, up
to 30 no-op starts); rewards stay raw game scores. Reward clipping and "terminal on life loss" are
done by the acting (acting.py), which ends the *store's* episode at a lost life without resetting the
game (like cleanrl's EpisodicLife).

``FrameStacker`` builds the agent's observation exactly as the store builds a stack at sample time:
the last ``k`` frames of the store's episode, the episode's first frame repeated as padding (the
same as gymnasium's ``FrameStackObservation(padding_type="reset")``; tests/test_trainer.py checks it
against ``store.sample``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from .config import TrainerError

#: The observation spaces the trainer stacks: a Box's frames, or the ints of the others.
STACKABLE = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete)


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def make_env(env_id: str) -> gym.Env:
    """The environment for ``env_id``, wrapped for training; raises TrainerError for an unusable id."""
    if is_atari(env_id):
        import ale_py

        gym.register_envs(ale_py)
    env: gym.Env
    try:
        if is_atari(env_id):
            env = gym.wrappers.AtariPreprocessing(gym.make(env_id, frameskip=1), noop_max=30, frame_skip=4,
                                                  screen_size=84, terminal_on_life_loss=False, grayscale_obs=True)
        else:
            env = gym.make(env_id)
    except gym.error.Error as exc:
        raise TrainerError(f"unknown environment id {env_id!r} ({exc}); use a registered id such as CartPole-v1 "
                           "or ALE/Breakout-v5") from exc
    if not isinstance(env.action_space, gym.spaces.Discrete):
        env.close()
        raise TrainerError(f"{env_id} has action space {env.action_space}; DQN needs a Discrete action space "
                           "(try CartPole-v1 or an ALE/... game)")
    if not isinstance(env.observation_space, STACKABLE):
        env.close()
        raise TrainerError(f"{env_id} has observation space {env.observation_space}; the trainer needs a Box "
                           "(images or vectors), a Discrete, a MultiBinary or a MultiDiscrete")
    return env


def make_vector_env(env_id: str, num_envs: int) -> Any:
    """``num_envs`` copies of ``env_id`` stepped together, in next-step autoreset mode, observing
    single frames (the store stacks them). ALE ids use ale-py's C++ ``AtariVectorEnv`` with the same
    preprocessing as ``make_env`` (84x84 gray, frame skip 4 with max-pooling, up to 30 no-op starts,
    v5's sticky actions, raw rewards, no episodic life: the loop ends learning episodes at a lost
    life itself); other ids a gymnasium ``SyncVectorEnv``."""
    if is_atari(env_id):
        from ale_py.vector_env import AtariVectorEnv

        game = atari_game(env_id)
        return AtariVectorEnv(game, num_envs=num_envs, stack_num=1, img_height=84, img_width=84, grayscale=True,
                              frameskip=4, maxpool=True, noop_max=30, repeat_action_probability=0.25,
                              reward_clipping=False, episodic_life=False, use_fire_reset=False,
                              max_num_frames_per_episode=108_000)
    make_env(env_id).close()  # an unusable id fails here with the trainer's message
    return gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


def atari_game(env_id: str) -> str:
    """ale-py's ROM name for an ``ALE/<Game>-v5`` id (``ALE/MsPacman-v5`` -> ``ms_pacman``)."""
    import ale_py.roms

    name = env_id.split("/", 1)[1].rsplit("-", 1)[0]
    wanted = name.lower().replace("_", "")
    for rom in ale_py.roms.get_all_rom_ids():
        if rom.replace("_", "") == wanted:
            return rom
    raise TrainerError(f"{env_id} names no ALE game ale-py has; use an id such as ALE/Breakout-v5")


def vector_frame_space(envs: Any) -> gym.spaces.Box:
    """A vector env's observation space of one frame (``vector_frames``' rows)."""
    space = envs.single_observation_space
    if len(space.shape) == 3 and space.shape[0] == 1:
        return gym.spaces.Box(space.low[0], space.high[0], space.shape[1:], space.dtype)
    return space


def vector_frames(obs: np.ndarray) -> np.ndarray:
    """A vector env's observations as one frame per env (AtariVectorEnv adds a stack axis of 1)."""
    return obs[:, 0] if obs.ndim == 4 and obs.shape[1] == 1 else obs


def default_frame_stack(observation_space: gym.spaces.Box) -> int:
    """4 for images (2-D or 3-D frames), 1 for vectors."""
    return 4 if len(observation_space.shape) >= 2 else 1


class FrameStacker:
    """The last ``k`` frames of the current episode, oldest first; one reused buffer."""

    def __init__(self, k: int, frame_shape: tuple[int, ...], dtype: Any) -> None:
        self.k = k
        self.stack = np.zeros((k, *frame_shape), dtype=dtype)

    def reset(self, frame: np.ndarray) -> np.ndarray:
        """Start an episode at ``frame``: every slot holds it (the store's padding)."""
        self.stack[:] = frame
        return self.stack

    def push(self, frame: np.ndarray) -> np.ndarray:
        """The episode moved on to ``frame``."""
        if self.k > 1:
            self.stack[:-1] = self.stack[1:]
        self.stack[-1] = frame
        return self.stack


def env_spaces(env: Any) -> tuple[Any, Any]:
    """The observation space of one frame and the action space of ``env`` (a gymnasium env or a
    vector env); TrainerError unless they are a Box (or a Discrete, MultiBinary or MultiDiscrete:
    stacks of their ints, which the model embeds) and a Discrete."""
    vector = hasattr(env, "num_envs")
    observation_space = vector_frame_space(env) if vector else env.observation_space
    action_space = env.single_action_space if vector else env.action_space
    if not isinstance(action_space, gym.spaces.Discrete):
        raise TrainerError(f"the environment's action space is {action_space}; DQN needs a Discrete one "
                           "(one Q-value per action)")
    if not isinstance(observation_space, STACKABLE):
        raise TrainerError(f"the environment's observation space is {observation_space}; this DQN takes Box, "
                           "Discrete, MultiBinary or MultiDiscrete observations (stacked): flatten a Dict with "
                           "gymnasium's FlattenObservation, or learn from a Dict store with SB3's MultiInputPolicy (a "
                           "goal env: with ReplayStoreHerBuffer; docs/sb3.md)")
    return observation_space, action_space
