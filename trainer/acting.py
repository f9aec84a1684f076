"""Acting into the store: where a run's env steps come from. ``DQN.fit`` has one loop (run.py) over a
source of steps, and a vector env (one env is a vector of one) and Ray actor processes (actors.py)
are its sources, each with ``step(act, epsilon, rng) -> (env steps taken, [(game return, length) of
each episode that ended])`` and ``close()``.

- ``VectorActing``: a vector env of N envs (gymnasium's, or ale-py's ``AtariVectorEnv``), one stream
  of the store each; one forward pass picks every env's action and ``store.add_batch`` writes their
  moves (the vector env's autoreset rows are recognised and skipped). One env is acted in as
  gymnasium's ``SyncVectorEnv`` of it (``acting_on``), drawing from the run's generator what a
  single env drew before: one draw a move, and a second only when it explores.
- ``PipelinedActing``: a ``HalvedVectorEnv``'s two halves, each a ``VectorActing`` on its rows of
  the streams, in turn: one half's envs step while the other's moves are written and its next
  actions picked (the forward pass on a GPU was 41-57% of acting time when it waited for the envs).

Both act epsilon-greedily (a policy: on its own samples, explore.py) on frame stacks built
exactly as the store builds them at sample time (the episode's first frame repeated as padding). With ``clip_reward`` the store learns from the sign of
the reward; with ``terminal_on_life_loss`` a lost life (``info["lives"]``) ends the store's episode
while the game goes on. The returns reported are raw game scores over all lives (what the
environment's episode returned), not the store's per-life episodes. A store with extras gets each
from the env's info where it holds that key, else zeros (``info_extras``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from replaystore import ReplayStore

from .actions import ActionSpec
from .config import TrainerError
from .envs import vector_frames
from .explore import Act, epsilon_greedy, exploring, lives_in, lost_life
from .stacks import push_frames, stacks_of

__all__ = ["Act", "PipelinedActing", "VectorActing", "acting_on", "exploring", "info_extras"]


def info_extras(store: ReplayStore, info: Any, n: int | None = None) -> dict[str, Any] | None:
    """A move's extras for a store that keeps them (format/extras.py): each from the env's ``info``
    where it holds that key (a vector env's rows where its ``_key`` mask is set), else zeros; None
    for a store without extras. A same-step vector env's ``final_info`` goes along: ``add_batch``
    takes an ended row's extras from it."""
    if not store.schema.extras:
        return None
    out: dict[str, Any] = {}
    if n is not None and isinstance(info, dict) and "final_info" in info:
        out.update({key: info[key] for key in ("final_info", "_final_info") if key in info})
    for e in store.schema.extras:
        shape = e.shape if n is None else (n, *e.shape)
        value = info.get(e.name) if isinstance(info, dict) else None
        if value is None:
            out[e.name] = np.zeros(shape, e.dtype)
            continue
        arr = np.asarray(value)
        mask = info.get(f"_{e.name}") if n is not None else None
        if mask is not None and arr.shape == shape:
            arr = np.where(np.asarray(mask, bool).reshape(n, *[1] * len(e.shape)), arr, np.zeros((), arr.dtype))
        out[e.name] = arr
    return out


class VectorActing:
    """A vector env's N envs acting epsilon-greedily into the N streams ``store`` writes (in
    ``store.writing`` order), its autoreset in next-step mode."""

    def __init__(self, envs: Any, store: ReplayStore, *, clip_reward: bool, terminal_on_life_loss: bool,
                 seed: int, owned: bool = False, streams: range | None = None, single: bool = False) -> None:
        """``owned``: ``close()`` closes ``envs`` too (they were made for this acting). ``streams``: the
        rows of the store's streams these envs write (``add_batch``'s ``streams``; default: all).
        ``single``: ``envs`` is one env made a vector of one (``acting_on``): a reset row draws
        nothing and takes no forward pass, and a move draws as ``epsilon_greedy`` draws for one env."""
        self.envs, self.store, self.owned, self.single = envs, store, owned, single
        self.n = int(envs.num_envs)
        self.streams = None if streams is None or len(streams) == len(store.writing) else list(streams)
        self.actions = ActionSpec.of_space(envs.single_action_space)
        self.clip, self.life_loss = clip_reward, terminal_on_life_loss
        mode = envs.metadata.get("autoreset_mode", "next_step")
        self.mode = str(getattr(mode, "value", mode)).lower().replace("nextstep", "next_step").replace("samestep",
                                                                                                     "same_step")
        if self.mode not in ("next_step", "same_step"):
            raise TrainerError(f"the vector env's autoreset mode is {mode!r}; DQN acts in vector envs that reset "
                               "ended envs themselves (gymnasium's next_step, the default, or same_step)")
        obs, info = envs.reset(seed=seed)
        self.obs = vector_frames(obs)
        self.stacks = stacks_of(self.obs, store.frame_stack)
        self.lives = lives_in(info)
        self.resetting = np.zeros(self.n, dtype=bool)  # rows the vector env answers with a reset, not a move
        self.ep_return = np.zeros(self.n)
        self.ep_length = np.zeros(self.n, dtype=np.int64)
        self.last: np.ndarray | None = None  # (one env: the actions of its last move)

    waits = True

    def attach(self, learning: Any) -> None:
        pass

    def step(self, act: Act, epsilon: float, rng: np.random.Generator) -> tuple[int, list[tuple[float, int]]]:
        actions = self.choose(act, epsilon, rng)
        return self.record(actions, *self.envs.step(actions))

    def choose(self, act: Act, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        """Each env's next action: greedy on its stack, or random with probability ``epsilon``."""
        if not self.single:
            return epsilon_greedy(act, self.stacks, self.n, self.actions, epsilon, rng)
        if self.resetting[0] and self.last is not None:
            return self.last  # (the vector env resets the env and ignores it)
        self.last = epsilon_greedy(act, self.stacks, None, self.actions, epsilon, rng)
        return self.last

    def record(self, actions: np.ndarray, next_obs: Any, reward: np.ndarray, terminated: np.ndarray,
               truncated: np.ndarray, info: dict[str, Any]) -> tuple[int, list[tuple[float, int]]]:
        """The vector step that ``actions`` took, into the store; the stacks moved on."""
        n = self.n
        next_obs = vector_frames(next_obs)
        env_done = terminated | truncated
        now = lives_in(info)
        lost = lost_life(self.lives, now, self.resetting)
        end_learning = terminated | (self.life_loss & lost)
        self.store.add_batch(self.obs, actions, np.sign(reward) if self.clip else reward, next_obs, end_learning,
                             truncated & ~end_learning, info, env_done=env_done, autoreset_mode=self.mode,
                             extras=info_extras(self.store, info, n), streams=self.streams)
        moved = ~self.resetting
        self.ep_return += np.where(moved, reward, 0.0)
        self.ep_length += moved
        ended = [(float(self.ep_return[i]), int(self.ep_length[i])) for i in np.flatnonzero(env_done).tolist()]
        self.ep_return[env_done], self.ep_length[env_done] = 0.0, 0
        if self.mode == "same_step":  # an ended env's next_obs is already its reset observation
            restart = env_done | end_learning
        else:  # a new (store) episode starts at next_obs: after the reset row, or at a lost life
            restart = self.resetting | (end_learning & ~env_done)
            self.resetting = env_done
        push_frames(self.stacks, next_obs, restart)
        self.lives, self.obs = now, next_obs
        return int(moved.sum()), ended

    def close(self) -> None:
        if self.owned:
            self.envs.close()


class PipelinedActing:
    """The two halves of a ``HalvedVectorEnv`` (envs.py) acting in turn: each ``step`` receives one
    half's vector step (``recv``), writes its moves, picks its next actions (the forward pass) and
    starts them (``send``), while the other half's envs step on ale-py's C++ threads. Each half is a
    ``VectorActing`` writing its rows of the store's streams, so the moves, streams and frame
    stacks are those of ``VectorActing`` on the same N envs, written a half at a time. The first two
    calls start the halves and take no step; ``close`` receives the steps still running, unrecorded."""

    waits = True

    def __init__(self, envs: Any, store: ReplayStore, *, clip_reward: bool, terminal_on_life_loss: bool,
                 seed: int, owned: bool = False) -> None:
        self.envs, self.owned = envs, owned
        self.lanes: list[VectorActing] = []
        start = 0
        for half in envs.halves:
            n = int(half.num_envs)
            self.lanes.append(VectorActing(half, store, clip_reward=clip_reward, seed=seed + start,
                                           terminal_on_life_loss=terminal_on_life_loss, streams=range(start, start + n)))
            start += n
        self.sent: list[np.ndarray | None] = [None, None]  # each half's actions now being stepped
        self.turn = 0

    def attach(self, learning: Any) -> None:
        pass

    def step(self, act: Act, epsilon: float, rng: np.random.Generator) -> tuple[int, list[tuple[float, int]]]:
        turn, lane = self.turn, self.lanes[self.turn]
        moved = 0
        ended: list[tuple[float, int]] = []
        actions = self.sent[turn]
        if actions is not None:
            self.sent[turn] = None
            moved, ended = lane.record(actions, *lane.envs.recv())
        actions = lane.choose(act, epsilon, rng)
        lane.envs.send(actions)
        self.sent[turn] = actions
        self.turn = 1 - turn
        return moved, ended

    def close(self) -> None:
        for lane, actions in zip(self.lanes, self.sent):
            if actions is not None:  # (a step still running: received, so the envs can be reset or closed)
                lane.envs.recv()
        self.sent = [None, None]
        if self.owned:
            self.envs.close()


def acting_on(env: Any, store: ReplayStore, config: Any, *, seed: int) -> VectorActing | PipelinedActing:
    """The source of env steps for ``env`` (a ``HalvedVectorEnv``, another vector env, or one env:
    a ``SyncVectorEnv`` of it, never closed here: the env is the caller's), acting with
    ``config``'s reward clipping and life loss."""
    how = {"clip_reward": config.clip_reward, "seed": seed, "terminal_on_life_loss": config.terminal_on_life_loss}
    if hasattr(env, "halves"):
        return PipelinedActing(env, store, **how)
    if hasattr(env, "num_envs"):
        return VectorActing(env, store, **how)
    env.action_space.seed(seed)
    return VectorActing(gym.vector.SyncVectorEnv([lambda: env]), store, single=True, **how)
