"""How acting picks moves and reads lives, written once for training (acting.py) and evaluation
(evaluation.py): epsilon-greedy over the learner's actions (greedy ones, or a policy's samples:
``exploring``), and the life-loss rule (a game's ``info["lives"]`` falling ends the store's
episode while the game goes on)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .actions import ActionSpec

Act = Callable[[Any], np.ndarray]  # (n, frame_stack, *frame) stacks (a Dict env's: a dict of them) -> n actions


def exploring(learner: Any, rng: np.random.Generator) -> Act:
    """The learner's actions to explore with: the greedy ones of a value rule (which explores
    epsilon-greedily, drawing nothing from ``rng``), a policy's samples drawn from ``rng``."""
    return lambda stacks: learner.act_batch(stacks, rng)


def epsilon_greedy(act: Act, stacks: Any, n: int | None, actions: ActionSpec, epsilon: float,
                   rng: np.random.Generator) -> np.ndarray:
    """Each of ``n`` envs' next action: ``act``'s on its stack, or with probability ``epsilon``
    uniform among ``actions``. ``n`` None is one env (``stacks`` a batch of one): one draw, and a
    second only when it explores, so a seeded single-env run draws what it always drew; a vector
    env's draws ``n`` of each, and the forward pass is skipped when every env explores."""
    if n is None:
        if rng.random() < epsilon:
            return actions.random(None, rng)
        return np.asarray(act(stacks))[:1]
    explore = rng.random(n) < epsilon
    chosen = actions.random(n, rng)
    if not explore.all():
        chosen = np.where(explore.reshape(n, *[1] * (chosen.ndim - 1)), chosen, act(stacks))
    return chosen


def lives_in(info: Any) -> Any:
    """The lives an env's (or a vector env's) step reports, or None: as an int, or an array per env."""
    lives = info.get("lives") if isinstance(info, dict) else None
    return None if lives is None else np.asarray(lives) if np.ndim(lives) else int(lives)


def lost_life(before: Any, now: Any, resetting: np.ndarray | None = None) -> Any:
    """Where a game lost a life between two steps (``lives_in`` of each): a bool for one env, one per
    env for a vector env, whose ``resetting`` rows (a reset, not a move) lose none."""
    if resetting is not None:
        if before is None or now is None:
            return np.zeros(len(resetting), bool)
        return (now < before) & ~resetting
    return before is not None and now is not None and now < before
