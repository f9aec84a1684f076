"""An agent saved and loaded (``DQN.save``, ``DQN.load``, ``DQN.restore``): the model as a ``.keras``
file, the learner's arrays and the run's counters in ``checkpoint.npz`` (checkpoint.py), what
rebuilds the agent around them in ``agent.json``, and the best evaluation's weights in ``best.npz``.

Which weights a saved agent's model holds is written down (``agent.json``'s ``holds``: ``last``,
the run's latest, which the checkpoint goes on from; ``best``, those of its best evaluation, after
``fit(restore_best_weights=True)``), and ``agent.holds`` says it after ``load``. How the model file
is read back (``custom_objects``, ``safe_mode``) comes from the caller only: a saved file never
turns safe mode off."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import keras
import numpy as np

from replaystore.storage.outside import check_not_in_store

from . import checkpoint
from .config import TrainerError
from .models import Loading, check_reloads_once
from .rule import DoubleDQN
from .rules import rule_from_json, rule_to_json
from .state import RunState
from .stores import place, store_at, store_ref

HOLDS = ("last", "best")


def checkpoint_arrays(agent: Any) -> tuple[dict[str, list[np.ndarray]], dict[str, Any]]:
    """The learner's arrays and the run's counters (the store flushed first)."""
    learner = agent.built()
    if agent.store is not None and agent.store.writing:
        agent.store.flush()
    agent.state.rng = dict(agent.rng.bit_generator.state)
    agent.state.train_steps = learner.train_steps
    agent.state.stored = len(agent.store) if agent.store is not None else 0
    return learner.state(), agent.state.to_json()


def save(agent: Any, directory: Path) -> Path:
    """``DQN.save``: model.keras, checkpoint.npz, agent.json and best.npz, each atomically."""
    check_reloads_once(agent)
    check_not_in_store(directory, what="the agent's checkpoint")
    directory.mkdir(parents=True, exist_ok=True)
    arrays, state = checkpoint_arrays(agent)
    agent.built().sync_model()
    doc = {"config": dataclasses.asdict(agent.config), "store": store_ref(agent.location, directory),
           "optimizer": keras.optimizers.serialize(agent.optimizer), "buffer_size": agent.replay.buffer_size,
           "frame_stack": agent.replay.frame_stack, "storage_options": agent.replay.storage_options,
           "stacks": agent.stacks.to_json(agent.actions.to_json()) if agent.stacks is not None else None,
           "holds": agent.holds, "best": agent.best[1] if agent.best is not None else None,
           "rule": None if isinstance(agent.rule, DoubleDQN) else rule_to_json(agent.rule)}
    if agent.best is not None:
        kept = checkpoint.load_best(directory) if (directory / checkpoint.BEST).is_file() else None
        if kept is None or kept[1] != agent.best[1]:
            checkpoint.save_best(directory, *agent.best)
    checkpoint.save_agent(directory, agent.model, doc, arrays, state)
    return directory


def load(cls: Any, directory: Path, *, store: Any, loading: Loading, best: bool) -> Any:
    """``DQN.load``: the agent in ``directory``, its online weights the best evaluation's with ``best``."""
    model, doc, saved = checkpoint.load_agent(directory, loading)
    kept = checkpoint.load_best(directory)
    if best and kept is None:
        raise TrainerError(f"{directory} holds no {checkpoint.BEST}: an agent keeps the weights of its best evaluation "
                           "once fit evaluated it (eval_env); leave out best=True to take the checkpoint's weights")
    agent = cls(model, store if store is not None else store_at(doc["store"], directory), optimizer=doc["optimizer"],
                buffer_size=doc.get("buffer_size", 1_000_000), frame_stack=doc.get("frame_stack"),
                storage_options=doc.get("storage_options"), custom_objects=loading.custom_objects,
                safe_mode=loading.safe_mode, rule=rule_from_json(doc.get("rule"), str(directory / "agent.json")),
                **doc["config"])
    agent.reloads = True  # (it was just loaded as loading says)
    stacks = checkpoint.saved_stacks(directory, doc)  # (None from agents saved before: made from the store)
    if agent.learner is None and stacks is not None:
        agent.build_for(*stacks)
        agent.replay.for_reading(missing_ok=True)  # (fit reopens it to append; fit_offline only reads)
    restore(agent, *saved)
    agent.best = kept
    holds = doc.get("holds", "last")
    agent.holds = holds if holds in HOLDS else "last"
    if best:
        assert kept is not None
        take_best(agent, kept[0], directory / checkpoint.BEST)
    return agent


def take_best(agent: Any, weights: list[np.ndarray], where: Path) -> None:
    """The best evaluation's weights as the agent's online weights."""
    try:
        agent.model.set_weights(weights)
    except ValueError as exc:
        raise TrainerError(f"{where} does not fit the agent's Q-network ({exc}); delete it") from None
    agent.built().pull_model()
    agent.holds = "best"


def restore(agent: Any, arrays: dict[str, list[np.ndarray]], state: dict[str, Any]) -> None:
    """``DQN.restore``: a checkpoint's arrays and counters; the next ``fit`` goes on."""
    if agent.learner is None:
        store = agent.replay.for_reading()  # (fit reopens it to append; fit_offline only reads)
        assert store is not None
        agent.build(store.observation_space, store.action_space)
    try:
        agent.built().load_state(arrays)
    except (ValueError, IndexError) as exc:
        raise TrainerError(f"the checkpoint's arrays do not fit this model ({exc}); restore a checkpoint "
                           "written by the same model") from None
    try:
        agent.state = RunState.from_json(state)
    except (KeyError, TypeError, ValueError) as exc:
        raise TrainerError(f"the checkpoint's state is damaged ({type(exc).__name__}: {exc}); put back a copy "
                           "of checkpoint.npz, or start a new run") from None
    if "written" not in state and agent.state.global_step > 0:  # saved before it was kept: the store was fit's
        agent.state.written.append(place(agent.location))
    if agent.state.rng is not None:
        agent.rng.bit_generator.state = agent.state.rng
    agent.state.resumes += 1
    agent.resumed = True
    agent.holds = "last"
