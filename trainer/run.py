"""One ``DQN.fit``: the loop over a source of env steps (acting.py: one env, a vector env; actors.py:
Ray actor processes), the learner fed beside it (feeding.py), and what is due as the steps go by:
the callbacks' hooks (callbacks.py), checkpoints and evaluations.

Each turn of the loop takes the source's next step(s) with the epsilon of the schedule and adds them
to the run's count. Learning is either decoupled (the learner's own thread, held to the replay
ratio: the loop only counts what it inserted, and waits while the learner is too far behind) or in
lockstep (one gradient step per ``train_frequency`` env steps, taken here, a block at a time). Then
the learner calls finished since the last turn are handed to the callbacks, and whatever a step
boundary makes due runs: every ``REPORT_STEPS`` the ``on_steps`` hook, every
``checkpoint_frequency`` a checkpoint (the learner paused between two calls), every
``eval_frequency`` an evaluation and the end of an epoch. The loop ends at ``total_timesteps``,
when ``should_stop()`` says so (a signal), or when a callback sets ``model.stop_training``; a
checkpoint is written then too.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from .callbacks import Hooks
from .config import DQNConfig, epsilon_at
from .evaluation import Played
from .feeding import Learning
from .state import RunState

#: Env steps between two ``on_steps`` hooks (TensorBoard's scalars, averaged over them).
REPORT_STEPS = 1000
#: Env steps between two refreshes of a progress bar.
TICK_STEPS = 100


class Source(Protocol):
    """Where a run's env steps come from (acting.py, actors.py)."""

    #: whether the loop waits for a learner that is too far behind (actors wait by themselves)
    waits: bool

    def attach(self, learning: Learning) -> None:
        """The run's learner feed (the actors' source holds them to its replay ratio)."""

    def step(self, act: Callable[[np.ndarray], np.ndarray], epsilon: float,
             rng: np.random.Generator) -> tuple[int, list[tuple[float, int]]]:
        """Take env steps with ``act`` (stacks -> greedy actions) and ``epsilon``-random moves; returns
        the env steps taken and the (game return, length) of each game that ended."""

    def close(self) -> None: ...


class Run:
    """The loop of one ``fit`` (see the module docstring)."""

    def __init__(self, config: DQNConfig, store: Any, learning: Learning, state: RunState, hooks: Hooks, *,
                 act: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator, total_timesteps: int,
                 evaluate: Callable[[], Played] | None, eval_frequency: int,
                 checkpoint: Callable[[], object] | None, checkpoint_frequency: int,
                 should_stop: Callable[[], bool], warmup: bool = False) -> None:
        """``warmup``: uniform random moves until ``learning_starts`` (the rule's ``warms_up``)."""
        self.config, self.store, self.learning, self.state, self.hooks = config, store, learning, state, hooks
        self.warmup = config.learning_starts if warmup else 0
        self.act, self.rng, self.total = act, rng, total_timesteps
        self.evaluate, self.eval_frequency = evaluate, eval_frequency
        self.checkpoint, self.checkpoint_frequency = checkpoint, checkpoint_frequency
        self.should_stop = should_stop
        self.epoch = 0
        self.in_epoch = False  # an epoch has begun and not ended
        self._sums = [0.0, 0.0, 0.0, 0]  # loss, q, sample seconds a step, calls: since the last on_steps
        self._pause_to_evaluate = True  # (the source's ``waits``: see end_epoch)

    def loop(self, source: Source) -> int:
        """Act, learn and report until the end; returns the run's env steps."""
        config, state, learning = self.config, self.state, self.learning
        duration = config.exploration_fraction * self.total
        step = state.global_step
        source.attach(learning)
        self._pause_to_evaluate = source.waits
        self.begin_epoch()
        while step < self.total and not self.should_stop() and not self.hooks.stop_training:
            epsilon = epsilon_at(config.start_e, config.end_e, duration, step, warmup=self.warmup)
            moved, ended = source.step(self.act, epsilon, self.rng)
            before = step
            step += moved
            state.global_step = step
            for game_return, length in ended:
                state.episodes += 1
                self.hooks.episode(step, game_return, length)
            if learning.decoupled:
                learning.acted(moved, wait=source.waits)
            elif step > config.learning_starts:
                due = step // config.train_frequency - max(before, config.learning_starts) // config.train_frequency
                if not learning.started and due and learning.can_sample():
                    learning.start(step)
                learning.steps(due)
            state.epsilon = epsilon
            self.report_calls(step)
            self.due(before, step)
        self.last_stretch(step)
        return step

    def last_stretch(self, step: int) -> None:
        """Report what the loop did since the last report, when it ended between two."""
        self.report_calls(step)
        if step % REPORT_STEPS:
            self.hooks.steps(step, self.step_logs(self.metrics()))
        if step % TICK_STEPS:
            self.hooks.progress(step, self.scalars())

    def metrics(self) -> dict[str, float]:
        """The learner's scalars since the last time (the decoupled loop's)."""
        return self.learning.metrics()

    def scalars(self) -> dict[str, float]:
        """What the progress hooks show: the exploration and the store's size."""
        return {"epsilon": self.state.epsilon, "replay_size": float(len(self.store))}

    def through(self, body: Callable[[], object]) -> None:
        """Run ``body`` (the loop) and the end of the run: the learner's feed closed, the last epoch
        ended (evaluating unless the run was stopped early), a checkpoint written (or, without
        checkpoints, what was acted flushed). Ctrl-C writes the checkpoint too."""
        try:
            body()
            self.learning.close()
            self.finish(evaluate=not (self.should_stop() or self.hooks.stop_training))
            if self.checkpoint is not None:
                self.checkpoint()
            elif self.store.writing:
                self.store.flush()  # what was acted is durable, and visible to readers of the store
        except KeyboardInterrupt:
            self.learning.close()
            if self.checkpoint is not None:
                self.checkpoint()
            raise
        finally:
            self.learning.close()

    def finish(self, *, evaluate: bool) -> None:
        """End the last epoch, evaluating unless the run was stopped early."""
        if self.in_epoch:
            self.end_epoch(self.position(), evaluate=evaluate)

    def position(self) -> int:
        """Where the run is, in the steps it counts: env steps."""
        return self.state.global_step

    def report_calls(self, step: int) -> None:
        """Hand the learner calls finished since the last turn to the callbacks."""
        done = self.learning.done
        while done:
            loss, q, sample_s = done.popleft()
            self._sums[0] += loss
            self._sums[1] += q
            self._sums[2] += sample_s
            self._sums[3] += 1
            self.hooks.learner_call(step, loss, q, sample_ms=1000 * sample_s)

    def due(self, before: int, step: int) -> None:
        """What moving from env step ``before`` to ``step`` makes due."""
        if crossed(before, step, REPORT_STEPS):
            self.hooks.steps(step, self.step_logs(self.metrics()))
        if crossed(before, step, TICK_STEPS):
            self.hooks.progress(step, self.scalars())
        if self.checkpoint is not None and self.checkpoint_frequency and crossed(before, step, self.checkpoint_frequency):
            with self.learning.paused():
                self.checkpoint()
        if self.eval_frequency and crossed(before, step, self.eval_frequency) and step < self.total:
            self.end_epoch(step, evaluate=True)
            if not self.hooks.stop_training:
                self.begin_epoch()

    def step_logs(self, metrics: dict[str, float]) -> dict[str, float]:
        """The ``on_steps`` hook's logs: the exploration, the store, the learner's averages since the
        last time, and the decoupled learner's details."""
        logs = {**self.scalars(), "cache_hit_rate": self.store.cache_hit_rate, **metrics}
        loss, q, sample_s, calls = self._sums
        if calls:
            logs.update({"losses/td_loss": loss / calls, "losses/q_values": q / calls,
                         "replay/sample_ms": 1000 * sample_s / calls})
        self._sums = [0.0, 0.0, 0.0, 0]
        return logs

    def begin_epoch(self) -> None:
        self.in_epoch = True
        self.hooks.epoch_begin(self.epoch)

    def end_epoch(self, step: int, *, evaluate: bool) -> None:
        """Evaluate (when there is an evaluation environment and ``evaluate``) and end the epoch, the
        learner paused (so callbacks see, and save, the weights of one moment). A decoupled learner
        is paused from the evaluation's start, so its games are played by the weights the epoch's
        end sees (``best.npz`` keeps those that played): acting waits while the evaluation runs, so
        the learner would only have taken its slack. Not so with Ray actors (a source that does not
        wait): they go on, and the learner with them, until the epoch's end."""
        eval_return = success = None
        early = self._pause_to_evaluate
        with self.learning.paused() if early else contextlib.nullcontext():
            if evaluate and self.evaluate is not None:
                t0 = time.perf_counter()
                played = self.evaluate()
                returns = played.returns
                eval_return = float(np.mean(returns)) if returns else math.nan
                self.state.evaluated_at = step
                logs: dict[str, Any] = {"returns": returns, "mean_return": eval_return,
                                        "eval_s": time.perf_counter() - t0}
                if played.successes:  # (a goal env's: info["is_success"] at each game's end)
                    success = float(np.mean(played.successes))
                    logs.update(successes=played.successes, success_rate=success)
                self.hooks.evaluated(step, logs)
            with contextlib.nullcontext() if early else self.learning.paused():
                self.hooks.epoch_end(self.epoch, step, eval_return, success)
        self.in_epoch = False
        self.epoch += 1


def crossed(before: int, now: int, every: int) -> bool:
    """Whether a multiple of ``every`` lies in ``(before, now]``."""
    return now // every > before // every

