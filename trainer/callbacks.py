"""Keras callbacks, the Keras way: what ``DQN.fit`` tells them, and when.

- ``on_train_begin`` / ``on_train_end``: once a ``fit``.
- ``on_epoch_begin`` / ``on_epoch_end``: an epoch is one evaluation period (``eval_frequency`` env
  steps; the whole run when there is none); its ``logs`` carry ``eval_return`` (the mean raw return
  of the evaluation that ends it) when there is an evaluation environment.
- ``on_train_batch_begin`` / ``on_train_batch_end``: one compiled learner call (``steps_per_call``
  gradient steps); ``batch`` counts within the epoch, as in Keras.

``verbose`` shows Keras' progress bar (``StepProgbar``), counting the epoch's env steps (gradient
steps offline), whose number is known ahead.

``logs`` hold ``loss`` (the TD loss, so ``TerminateOnNaN`` and ``EarlyStopping(monitor="loss")``
work unchanged), ``q_values`` (the mean Q(s, a) of the sampled moves), ``episodic_return`` (the mean
raw game return of the episodes finished lately), ``sps`` (env steps a second), ``replay_ratio``
(transitions sampled per transition inserted since learning started) and, at an epoch's end,
``eval_return``. A value not known yet (no episode finished, no gradient step taken) is NaN.

Callbacks always run on the thread that called ``fit``, also when the learner runs on its own
thread. Before ``on_epoch_end`` and ``on_train_end`` the model's variables hold the learner's
current weights (so ``ModelCheckpoint`` saves them); after ``on_train_end`` the learner takes back
whatever a callback put there (``EarlyStopping(restore_best_weights=True)``). Setting
``model.stop_training = True`` ends the run after the current step, with a checkpoint.

A callback may also define replaystore's own hooks: ``on_episode_end(step, logs)`` (``logs``:
``return``, ``length``), ``on_steps(step, logs)`` (every ``REPORT_STEPS`` env steps: ``epsilon``,
``replay_size``, ``cache_hit_rate``, the learner's averages and the replay ratio's details),
``on_progress(step, logs)`` (every ``TICK_STEPS``: ``epsilon``, ``replay_size``) and
``on_evaluation(step, logs)`` (``returns``: each game's, ``mean_return``, ``eval_s``: seconds spent). ``replaystore-train``'s TensorBoard tags, progress bar and
``evals.jsonl`` are such a callback (report.py).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np

from replaystore.storage.outside import check_not_in_store

from . import checkpoint
from .config import TrainerError
from .learnerbase import Learner

#: replaystore's own hooks, which a callback may define besides Keras' (see the module docstring)
OWN_HOOKS = ("on_episode_end", "on_steps", "on_progress", "on_evaluation")


class Hooks:
    """The run's callbacks (a Keras ``CallbackList`` with a ``History``) and the logs they are given."""

    def __init__(self, callbacks: Sequence[keras.callbacks.Callback], learner: Learner, *, verbose: int,
                 start_step: int, total: int, every: int, evaluating: bool, unit: str = "step",
                 replay_ratio: Callable[[int], float] = lambda step: math.nan) -> None:
        """A run from ``start_step`` to ``total`` steps (env steps; gradient steps offline, ``unit``)
        whose epochs end every ``every`` of them (0: one epoch); ``verbose`` shows Keras' progress
        bar (1) or a line an epoch (2), counting those steps."""
        self.learner = learner
        self.model = learner.model
        self.model.stop_training = False
        self.epochs = Epochs(start_step, total, every)
        shown = list(callbacks) + ([StepProgbar(self.epochs, verbose, unit)] if verbose > 0 else [])
        self.list = keras.callbacks.CallbackList(shown, add_history=True, add_progbar=False, model=self.model,
                                                 epochs=self.epochs.count, steps=None, verbose=verbose)
        self.history: keras.callbacks.History = next(c for c in self.list.callbacks
                                                     if isinstance(c, keras.callbacks.History))
        self.extra = [c for c in shown if any(hasattr(c, hook) for hook in OWN_HOOKS)]
        self.evaluating = evaluating
        self.returns: collections.deque[float] = collections.deque(maxlen=20)
        self.start_step, self.start_time = start_step, time.perf_counter()
        self.batch = 0
        self._epoch: list[tuple[float, float]] = []  # this epoch's (loss, q) per learner call
        self._ratio = replay_ratio

    @property
    def stop_training(self) -> bool:
        return bool(getattr(self.model, "stop_training", False))

    def logs(self, step: int, **extra: float) -> dict[str, float]:
        """The logs every hook gets: the latest return, the speed and the replay ratio, and ``extra``."""
        ret = sum(self.returns) / len(self.returns) if self.returns else math.nan
        sps = (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)
        return {"episodic_return": ret, "sps": sps, "replay_ratio": self._ratio(step), **extra}

    # Keras hooks --------------------------------------------------------------------------------

    def train_begin(self) -> None:
        self.list.on_train_begin({})

    def epoch_begin(self, epoch: int) -> None:
        self._epoch = []
        self.batch = 0  # (Keras' batch index counts within an epoch)
        self.list.on_epoch_begin(epoch, {})

    def learner_call(self, step: int, loss: float, q: float, **extra: float) -> None:
        """One learner call's hooks (its ``steps_per_call`` steps' mean loss and Q)."""
        self.list.on_train_batch_begin(self.batch, {})
        self._epoch.append((loss, q))
        self.list.on_train_batch_end(self.batch, self.logs(step, loss=loss, q_values=q, **extra))
        self.batch += 1

    def epoch_end(self, epoch: int, step: int, eval_return: float | None,
                  eval_success: float | None = None) -> dict[str, float]:
        calls = self._epoch
        loss = sum(c[0] for c in calls) / len(calls) if calls else math.nan
        q = sum(c[1] for c in calls) / len(calls) if calls else math.nan
        logs = self.logs(step, loss=loss, q_values=q)
        if self.evaluating:
            logs["eval_return"] = math.nan if eval_return is None else eval_return
            if eval_success is not None:  # (a goal env's share of games that reached their goal)
                logs["eval_success"] = eval_success
        self.learner.sync_model()
        self.list.on_epoch_end(epoch, logs)
        return logs

    def train_end(self, step: int) -> None:
        self.learner.sync_model()
        self.list.on_train_end(self.logs(step))
        self.learner.pull_model()

    # replaystore's own hooks --------------------------------------------------------------------

    def episode(self, step: int, game_return: float, length: int) -> None:
        self.returns.append(game_return)
        self._own("on_episode_end", step, {"return": game_return, "length": length})

    def steps(self, step: int, logs: dict[str, float]) -> None:
        self._own("on_steps", step, logs)

    def progress(self, step: int, logs: dict[str, float]) -> None:
        self._own("on_progress", step, logs)

    def evaluated(self, step: int, logs: dict[str, Any]) -> None:
        self._own("on_evaluation", step, logs)

    def _own(self, hook: str, *args: Any) -> None:
        for callback in self.extra:
            method = getattr(callback, hook, None)
            if method is not None:
                method(*args)


class Epochs:
    """Where the epochs of a run from ``start`` to ``total`` steps begin and end: at the multiples of
    ``every`` (as the loop ends them: run.py's ``due``), the last at ``total``."""

    def __init__(self, start: int, total: int, every: int) -> None:
        self.start, self.total, self.every = start, total, every
        if total <= start:
            self.count = 0
        else:
            self.count = (total - 1) // every - start // every + 1 if every else 1

    def span(self, epoch: int) -> tuple[int, int]:
        """The first step and the end of ``epoch``."""
        if not self.every:
            return self.start, self.total
        first = self.start if epoch == 0 else (self.start // self.every + epoch) * self.every
        return first, min(self.total, (self.start // self.every + epoch + 1) * self.every)


class StepProgbar(keras.callbacks.Callback):
    """``verbose``: Keras' progress bar, counting the run's steps against each epoch's, which are
    known ahead. (Keras' own ``ProgbarLogger`` counts learner calls, and learns an epoch's count from
    the first epoch, which ``learning_starts`` makes short.) The learner's ``loss`` and ``q_values``
    are averaged over the epoch, as Keras averages them; the other logs are shown as they are."""

    LATEST = ("episodic_return", "sps", "replay_ratio", "sample_ms")

    def __init__(self, epochs: Epochs, verbose: int, unit: str) -> None:
        super().__init__()
        self.epochs, self.verbose, self.unit = epochs, verbose, unit
        self.bar: keras.utils.Progbar | None = None
        self.first = self.target = 0
        self.logs: dict[str, float] = {}

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.first, end = self.epochs.span(epoch)
        self.target = max(1, end - self.first)
        self.logs = {}
        if self.epochs.count > 1:
            print(f"Epoch {epoch + 1}/{self.epochs.count}", flush=True)
        self.bar = keras.utils.Progbar(self.target, verbose=self.verbose, unit_name=self.unit,
                                       stateless_metrics=set(self.LATEST))

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.logs = {k: v for k, v in (logs or {}).items() if k in ("loss", "q_values", *self.LATEST)}

    def on_progress(self, step: int, logs: dict[str, float]) -> None:
        if self.bar is not None and self.verbose == 1:
            self.bar.update(min(max(step - self.first, 0), self.target - 1), list(self.logs.items()))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.bar is not None:
            self.bar.update(self.target, list((logs or self.logs).items()), finalize=True)
            self.bar = None


class BestWeights(keras.callbacks.Callback):
    """The online weights at the end of the run's highest evaluation so far (its mean return), and
    that evaluation (``info``: step, mean return, returns, time), kept in RAM and, with
    ``directory``, written to ``directory/best.npz`` (atomically) each time they change. Taken at
    the epoch's end, the learner paused since the evaluation began (run.py), so they are the
    weights that played (with Ray actors, which go on meanwhile, those at the evaluation's end).
    ``best`` is where a resumed run starts from. With ``restore`` the model takes them back when
    the run ends (Keras' ``EarlyStopping(restore_best_weights=True)``, for the agent's evaluations);
    the run's checkpoint keeps its last weights, to go on from."""

    def __init__(self, directory: Path | None = None, *, say: Callable[[str], None] | None = None,
                 restore: bool = False, best: tuple[list[np.ndarray], dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.directory, self.say, self.restore = directory, say, restore
        self.weights: list[np.ndarray] | None = best[0] if best is not None else None
        self.info: dict[str, Any] | None = best[1] if best is not None else None
        self.pending: dict[str, Any] | None = None

    @property
    def best_return(self) -> float:
        return float(self.info["mean_return"]) if self.info is not None else -math.inf

    def on_evaluation(self, step: int, logs: dict[str, Any]) -> None:
        mean = float(logs["mean_return"])
        self.pending = {"step": step, "mean_return": mean, "returns": list(logs["returns"]), "time": time.time()} \
            if math.isfinite(mean) and mean > self.best_return else None

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.pending is None:
            return
        was = self.best_return
        self.weights, self.info, self.pending = self.model.get_weights(), self.pending, None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            checkpoint.save_best(self.directory, self.weights, self.info)
        if self.say is not None:
            where = f" -> {self.directory / checkpoint.BEST}" if self.directory is not None else ""
            self.say(f"best weights so far{where} (mean score {shown(self.best_return)}"
                     + (f", up from {shown(was)})" if math.isfinite(was) else ")"))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.restore and self.weights is not None:
            self.model.set_weights(self.weights)  # (Hooks.train_end hands them to the learner)


def keeping_best(callbacks: Sequence[keras.callbacks.Callback], agent: Any, eval_env: Any,
                 checkpoint_dir: str | Path | None, restore: bool) -> list[keras.callbacks.Callback]:
    """A run's callbacks with one that keeps the best evaluation's weights (a ``BestWeights`` from
    ``agent.best`` into ``checkpoint_dir``; ``replaystore-train`` passes its own, for its run
    directory)."""
    if restore and eval_env is None:
        raise TrainerError("restore_best_weights=True needs eval_env: the best weights are those of the best evaluation")
    if checkpoint_dir is not None:  # (refused before anything is written there: best.npz, a checkpoint)
        check_not_in_store(checkpoint_dir, what="the agent's checkpoint")
    shown = list(callbacks)
    keeper = next((c for c in shown if isinstance(c, BestWeights)), None)
    if keeper is None and eval_env is not None:
        keeper = BestWeights(None if checkpoint_dir is None else Path(checkpoint_dir), best=agent.best)
        shown.append(keeper)
    if keeper is not None:
        keeper.restore = keeper.restore or restore
    return shown


def kept_best(callbacks: Sequence[keras.callbacks.Callback], agent: Any) -> None:
    """What the run's ``BestWeights`` kept, as ``agent.best``; ``agent.holds`` says whether the
    model took those weights back."""
    keeper = next((c for c in callbacks if isinstance(c, BestWeights)), None)
    if keeper is not None and keeper.weights is not None and keeper.info is not None:
        agent.best = (keeper.weights, keeper.info)
        agent.holds = "best" if keeper.restore else "last"


def shown(score: float) -> str:
    """A mean score for the terminal: one decimal (Atari's 12.8), two below 1 (Blackjack's -0.05)."""
    return f"{score:.1f}" if abs(score) >= 1 or score == 0 else f"{score:.2f}"
