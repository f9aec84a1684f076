"""Hindsight experience replay in the DQN (Andrychowicz et al. 2017): a goal env's Dict store
sampled through ``replaystore.HindsightSampler``, which relabels ``her_n_sampled_goal`` of every
``her_n_sampled_goal + 1`` transitions with a goal the episode reached later (``her_strategy``) and
their reward with the env's ``compute_reward``. The sampling, the relabelling and the episode index
are the store's (sampling/hindsight.py); here the agent finds the reward function, checks that its
stacks are a goal env's, and binds the sampler to its store.

``compute_reward`` is not saved with the agent (it is the env's code): each ``fit`` takes it from
the env (``env.unwrapped.compute_reward``, a gymnasium ``SyncVectorEnv``'s first env's) or from
``compute_reward=``, and ``fit_offline`` from its ``eval_env`` or ``compute_reward=``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replaystore import HindsightSampler, ReplayStore, ReplayStoreError
from replaystore.format import nesting

from .config import KEYWORDS, DQNConfig, Names, TrainerError
from .stacks import StackSpec

ACHIEVED, DESIRED = "achieved_goal", "desired_goal"


def reward_function(env: Any) -> Callable[..., Any] | None:
    """The goal env's vectorised ``compute_reward(achieved_goal, desired_goal, info)``: the env's
    (unwrapped), or a ``SyncVectorEnv``'s first env's; None where there is none to take."""
    if env is None:
        return None
    if hasattr(env, "num_envs"):
        envs = getattr(env, "envs", None)  # (a SyncVectorEnv's; an AsyncVectorEnv's live in other processes)
        if not envs:
            return None
        env = envs[0]
    function = getattr(getattr(env, "unwrapped", env), "compute_reward", None)
    return function if callable(function) else None


def choose_reward(config: DQNConfig, given: Callable[..., Any] | None, *envs: Any) -> Callable[..., Any] | None:
    """The reward function hindsight relabelling uses (None without ``her_n_sampled_goal``):
    ``given``, else the first of ``envs`` that has one. TrainerError where there is none, or where
    one is given without hindsight relabelling."""
    if not config.her_n_sampled_goal:
        if given is not None:
            raise TrainerError("compute_reward is for hindsight relabelling, which is off: set her_n_sampled_goal "
                               "(4 is HER's usual k) or pass no compute_reward")
        return None
    if given is not None:
        if not callable(given):
            raise TrainerError(f"compute_reward is {given!r}; pass the goal env's compute_reward(achieved_goal, "
                               "desired_goal, info), vectorised over a batch")
        return given
    for env in envs:
        found = reward_function(env)
        if found is not None:
            return found
    raise TrainerError("her_n_sampled_goal is set, but no compute_reward was found (the env has none, or it is a "
                       "vector env whose envs live in other processes): pass compute_reward=env.unwrapped."
                       "compute_reward, vectorised over a batch")


def check_goals(stacks: StackSpec, names: Names = KEYWORDS) -> None:
    """Refuse stacks that are not a goal env's: Dict observations with ``achieved_goal`` and
    ``desired_goal`` entries of one shape and dtype (nested ones: of one structure, leaf for leaf)."""
    achieved, desired = _goal(stacks, ACHIEVED), _goal(stacks, DESIRED)
    if achieved is None or desired is None:
        raise TrainerError(f"{names('her_n_sampled_goal')} is set, but the observations are {stacks.describe()}; "
                           f"hindsight relabelling needs a goal env's Dict observations, with {ACHIEVED!r} and "
                           f"{DESIRED!r} entries (or set {names.given('her_n_sampled_goal', 0)})")
    if achieved != desired:
        raise TrainerError(f"{ACHIEVED} is {_told(achieved)} but {DESIRED} is {_told(desired)}; a relabelled goal is "
                           "copied from one to the other, so they must have one shape and dtype (one structure)")


def _goal(stacks: StackSpec, key: str) -> tuple[Any, list[tuple[tuple[int, ...], Any]]] | None:
    """The top-level entry ``key``: its structure (a lone leaf: 0) and its leaves' (shape, dtype)."""
    if not stacks.keyed:
        return None
    if stacks.tree is None:
        found = [(shape, dtype) for name, shape, dtype in stacks.entries if name == key]
        return (0, found) if found else None
    entry = nesting.child(stacks.tree, key)
    if entry is None:
        return None
    tree, indices = entry
    return tree, [stacks.entries[i][1:] for i in indices]


def _told(goal: tuple[Any, list[tuple[tuple[int, ...], Any]]]) -> str:
    leaves = [f"{shape} {dtype.name}" for shape, dtype in goal[1]]
    return leaves[0] if goal[0] == 0 else nesting.describe(goal[0], leaves)


def hindsight_sampler(config: DQNConfig, store: ReplayStore,
                      compute_reward: Callable[..., Any] | None) -> HindsightSampler | None:
    """The store's hindsight sampler for ``config`` (None without ``her_n_sampled_goal``), bound to
    ``store``; TrainerError for a store it cannot relabel."""
    if not config.her_n_sampled_goal:
        return None
    assert compute_reward is not None
    sampler = HindsightSampler(compute_reward, strategy=config.her_strategy, n_sampled_goal=config.her_n_sampled_goal,
                               gamma=config.gamma)
    try:
        return sampler.bind(store.schema)
    except ReplayStoreError as exc:
        raise TrainerError(f"{store.path} cannot be relabelled: {exc}") from None
