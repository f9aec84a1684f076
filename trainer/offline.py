"""Learning offline: ``DQN.fit_offline`` trains on a store as it is, acting nowhere.

A store written earlier (by ``fit``, by another agent, or made from a Minari dataset with
``store_from_minari``) is a fixed dataset: the learner samples it exactly as it samples a run's
replay (the same feed, blocks of ``steps_per_call`` batches, n-step returns, prioritized replay
with the priorities kept in RAM), and the store is opened read-only, so any number of learners
can read one dataset and none of them changes it.

The loop counts gradient steps, not env steps: ``fit_offline(gradient_steps)`` runs until the
learner has taken that many in all (a loaded agent goes on from its count), in whole learner calls.
What a step boundary makes due is what it makes due in ``fit`` (run.py), with gradient steps as
the steps: ``on_steps`` every ``REPORT_STEPS``, a checkpoint every ``checkpoint_frequency``, an
evaluation on ``eval_env`` and the end of an epoch every ``eval_frequency``. The callbacks' logs
are ``fit``'s, except that ``sps`` counts gradient steps a second, ``episodic_return`` is NaN
(nothing acts) and there is no ``epsilon``; ``on_steps`` adds ``charts/learner_steps_per_s``.

Plain DQN learning offline overestimates the actions the data never took, and its greedy policy
follows them; ``cql_alpha`` > 0 (learner.py) adds conservative Q-learning's term, which is the
usual remedy (Kumar et al. 2020, who use 1.0 or 4.0 on Atari datasets).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .callbacks import Hooks, kept_best
from .envs import env_spaces
from .feeding import Learning
from .hindsight import choose_reward, hindsight_sampler
from .models import check_reloads_once
from .run import Run
from .stores import check_dataset, place


class OfflineRun(Run):
    """The loop of one ``fit_offline``: learner calls on the store until ``total`` gradient steps."""

    def learn(self) -> int:
        """Learn, report, checkpoint and evaluate until the end; returns the gradient steps taken in all."""
        learning = self.learning
        step = learning.learned
        self._since = (step, time.perf_counter())
        learning.start(step)
        self.begin_epoch()
        while step < self.total and not self.should_stop() and not self.hooks.stop_training:
            before = step
            learning.call()
            step = learning.learned
            self.report_calls(step)
            self.due(before, step)
        self.last_stretch(step)
        return step

    def position(self) -> int:
        return self.learning.learned

    def metrics(self) -> dict[str, float]:
        """Gradient steps a second since the last time."""
        now, step = time.perf_counter(), self.learning.learned
        rate = (step - self._since[0]) / max(now - self._since[1], 1e-9)
        self._since = (step, now)
        return {"charts/learner_steps_per_s": rate}

    def scalars(self) -> dict[str, float]:
        return {"replay_size": float(len(self.store))}


def learn_offline(agent: Any, gradient_steps: int, callbacks: list[Any], *, eval_env: Any, eval_frequency: int,
                  verbose: int, checkpoint_frequency: int, compute_reward: Callable[..., Any] | None,
                  should_stop: Callable[[], bool] | None, check_reloads: bool, write: Callable[[], object] | None,
                  evaluate: Callable[[], Any] | None) -> Any:
    """``DQN.fit_offline`` once its arguments are checked: the agent's store opened read-only and
    checked as a dataset, then learner calls until ``gradient_steps``; returns the callbacks' ``History``."""
    opened = agent.store is None
    store = agent.replay.for_reading()
    assert store is not None
    config = agent.config
    try:
        agent.replay.check_stacks(store)
        learner = agent.build(store.observation_space, store.action_space)
        if check_reloads:
            check_reloads_once(agent)
        spaces = None if eval_env is None else env_spaces(eval_env)
        check_dataset(store, config.batch_size, config.n_step, spaces)
        sampler = hindsight_sampler(config, store, choose_reward(config, compute_reward, eval_env))
    except BaseException:
        if opened:  # leave the store as it was found: closed
            agent.replay.close()
        raise
    where = place(agent.location)
    if where not in agent.state.written and where not in agent.state.datasets:
        agent.state.datasets.append(where)  # a dataset: fit will not append to it (check_not_dataset)
    learning = Learning(config, store, learner, agent.state, sampler=sampler)
    done = learning.learned
    if done >= gradient_steps:  # nothing to do: the weights stay as they are
        return Hooks(callbacks, learner, verbose=verbose, start_step=done, total=done, every=0,
                     evaluating=False).history
    hooks = Hooks(callbacks, learner, verbose=verbose, start_step=done, total=gradient_steps, every=eval_frequency,
                  evaluating=eval_env is not None, unit="gradient step")
    run = OfflineRun(config, store, learning, agent.state, hooks, act=learner.act_batch, rng=agent.rng,
                     total_timesteps=gradient_steps,
                     evaluate=evaluate,
                     eval_frequency=eval_frequency, checkpoint=write, checkpoint_frequency=checkpoint_frequency,
                     should_stop=should_stop or (lambda: False))
    hooks.train_begin()
    run.through(run.learn)
    hooks.train_end(learning.learned)
    kept_best(callbacks, agent)
    return hooks.history
