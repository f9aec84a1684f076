"""Stepping N environments into N streams of the store: the acting half of ``--num-envs N``, shared by
the trainer's own loop (dqn.py) and by Ray actor processes (actors.py).

``VectorActing`` owns a vector env in next-step autoreset mode (``envs.make_vector_env``) and the
agent's frame stacks. Each ``step`` picks every env's action epsilon-greedily (one forward pass),
steps the envs, writes each env's move to its stream with ``store.add_batch``, and returns how many
env steps were taken (a row that only resets an ended env is none) and the episodes that ended.
Atari rewards are clipped to their sign for learning and a lost life ends the stream's episode
while the game goes on (``env_done=``), as for one env.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from replaystore import ReplayStore
from trainer.args import Args
from trainer.envs import is_atari, make_vector_env, vector_frames


class VectorActing:
    """N envs acting epsilon-greedily into the streams ``store`` writes (in ``store.writing`` order)."""

    def __init__(self, args: Args, store: ReplayStore, num_envs: int, n_actions: int, *, seed: int) -> None:
        self.args, self.store, self.n, self.n_actions = args, store, num_envs, n_actions
        self.atari = is_atari(args.env_id)
        self.clip = self.atari and args.clip_reward
        self.envs = make_vector_env(args.env_id, num_envs)
        obs, info = self.envs.reset(seed=seed)
        self.obs = vector_frames(obs)
        self.stacks = np.repeat(self.obs[:, None], args.frame_stack, axis=1)
        self.lives = np.asarray(info["lives"]) if "lives" in info else None
        self.resetting = np.zeros(num_envs, dtype=bool)  # rows the vector env answers with a reset, not a move
        self.ep_return = np.zeros(num_envs)
        self.ep_length = np.zeros(num_envs, dtype=np.int64)

    def step(self, act: Callable[[np.ndarray], np.ndarray], epsilon: float,
             rng: np.random.Generator) -> tuple[int, list[tuple[float, int]]]:
        """One vector step: returns (env steps taken, [(return, length) of each episode that ended])."""
        args, n = self.args, self.n
        explore = rng.random(n) < epsilon
        actions = rng.integers(self.n_actions, size=n)
        if not explore.all():
            actions = np.where(explore, actions, act(self.stacks))
        next_obs, reward, terminated, truncated, info = self.envs.step(actions)
        next_obs = vector_frames(next_obs)
        env_done = terminated | truncated
        now = np.asarray(info["lives"]) if "lives" in info else None
        if now is not None and self.lives is not None:
            lost = (now < self.lives) & ~self.resetting
        else:
            lost = np.zeros(n, dtype=bool)
        end_learning = terminated | (self.atari and args.terminal_on_life_loss) & lost
        self.store.add_batch(self.obs, actions, np.sign(reward) if self.clip else reward, next_obs, end_learning,
                             truncated & ~end_learning, env_done=env_done, autoreset_mode="next_step")
        moved = ~self.resetting
        self.ep_return += np.where(moved, reward, 0.0)
        self.ep_length += moved
        ended = [(float(self.ep_return[i]), int(self.ep_length[i])) for i in np.flatnonzero(env_done).tolist()]
        self.ep_return[env_done], self.ep_length[env_done] = 0.0, 0
        stacks = self.stacks
        stacks[:, :-1] = stacks[:, 1:]
        stacks[:, -1] = next_obs
        restart = self.resetting | (end_learning & ~env_done)  # a new (store) episode starts at next_obs
        if restart.any():
            stacks[restart] = next_obs[restart][:, None]
        self.resetting, self.lives, self.obs = env_done, now, next_obs
        return int(moved.sum()), ended

    def close(self) -> None:
        self.envs.close()

