"""What ``replaystore-train`` tells people, as a callback of ``DQN.fit`` (callbacks.py's own hooks):
TensorBoard scalars, ``evals.jsonl``, and a live progress bar on a terminal or a log line every
``LINE_SECONDS`` elsewhere (a CI log, ``nohup``, a file).

TensorBoard tags (under ``run_dir/tb``, and in ``run_dir/scalars.jsonl``: scalars.py): ``charts/episodic_return`` and ``charts/episodic_length``
(game episodes: the raw score over all lives), ``charts/epsilon``, ``charts/SPS``,
``losses/td_loss``, ``losses/q_values``, ``replay/size``, ``replay/cache_hit_rate``,
``replay/sample_ms``, and ``eval/mean_return`` when evaluating. With the decoupled learner
(``--replay-ratio``): ``replay/inserted``, ``replay/sampled``, ``replay/ratio`` (sampled per inserted
since learning started), ``replay/sample_age`` (mean env steps since the sampled transitions were
added), ``charts/learner_steps_per_s``, ``replay/learner_wait_s`` and ``replay/actor_wait_s``
(seconds each side has waited for the other, cumulative).

The bar's and the log lines' ``score`` is the mean game score of the last 20 games (all lives, raw
rewards), the number Atari papers report. The store's episodes are not games: with
``--terminal-on-life-loss`` (the Atari default) each life is an episode for learning, with clipped
rewards, so ``replaystore inspect`` shows more, shorter episodes with smaller returns.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

import keras
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .callbacks import shown
from .scalars import Scalars

#: Seconds between two log lines when there is no progress bar.
LINE_SECONDS = 30.0
EVALS = "evals.jsonl"
#: ``on_steps`` logs that are TensorBoard tags under another name
TAGS = {"epsilon": "charts/epsilon", "replay_size": "replay/size", "cache_hit_rate": "replay/cache_hit_rate"}


class Report(keras.callbacks.Callback):
    """TensorBoard, ``evals.jsonl`` and the console, for a run directory."""

    def __init__(self, run_dir: Path, *, total: int, start: int, progress: bool, console: Console | None = None,
                 offline: bool = False) -> None:
        """``total`` and ``start`` are env steps, or with ``offline`` (``--offline``) gradient steps:
        then the bar and the lines show gradient steps a second and the latest evaluation's score."""
        super().__init__()
        self.run_dir, self.offline = run_dir, offline
        self.unit = "gradient step" if offline else "step"
        self.evaluated = "-"  # the latest evaluation's mean score (what offline runs show as their score)
        self.writer = Scalars(run_dir)
        self.console = console or Console(soft_wrap=True)
        self.scores: collections.deque[float] = collections.deque(maxlen=20)
        self.total, self.start_step = total, start
        self.start_time = time.perf_counter()
        self._last = (start, self.start_time)  # for charts/SPS between two on_steps
        self._line_at: float | None = self.start_time  # None once closed
        self.learner = ""  # the latest averaged loss and Q, once learning has started
        self.epsilon, self.replay_size = 1.0, 0
        self.step = start
        self.progress: Progress | None = None
        if progress and self.console.is_terminal:
            fields = ("{task.fields[sps]:>5.0f} steps/s  eval {task.fields[score]}  " if offline else
                      "{task.fields[sps]:>5.0f} SPS  score {task.fields[score]}  eps {task.fields[eps]:.3f}  ")
            self.progress = Progress(
                TextColumn("[bold]learn" if offline else "[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn(fields + "replay {task.fields[size]:,}{task.fields[learner]}"),
                TimeRemainingColumn(), console=self.console, refresh_per_second=4,
            )
            self.task = self.progress.add_task("train", total=total, completed=start, sps=0.0, score="-", eps=1.0,
                                               size=0, learner="")
            self.progress.start()

    # Numbers ------------------------------------------------------------------------------------

    def sps(self, step: int) -> float:
        return (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)

    def score(self) -> str:
        if self.offline:
            return self.evaluated
        return shown(sum(self.scores) / len(self.scores)) if self.scores else "-"

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.writer.write(step, values)

    # replaystore's hooks (callbacks.py) ---------------------------------------------------------

    def on_episode_end(self, step: int, logs: dict[str, float]) -> None:
        self.scores.append(float(logs["return"]))
        self.scalars(step, {"charts/episodic_return": logs["return"], "charts/episodic_length": logs["length"]})

    def on_steps(self, step: int, logs: dict[str, float]) -> None:
        """The step-level scalars, with the learner's averaged since the last call."""
        now = time.perf_counter()
        self.step = step
        values = {TAGS.get(name, name): value for name, value in logs.items()}
        if step > self._last[0]:  # (a second write at the same step has no rate to give)
            values["charts/SPS"] = (step - self._last[0]) / max(now - self._last[1], 1e-9)
        self._last = (step, now)
        if "losses/td_loss" in values:
            self.learner = f"  loss {values['losses/td_loss']:.4f}  Q {values['losses/q_values']:.3f}"
        self.scalars(step, values)

    def on_progress(self, step: int, logs: dict[str, float]) -> None:
        self.epsilon, self.replay_size = logs.get("epsilon", self.epsilon), int(logs["replay_size"])
        self.step = step
        if self.progress is not None:
            self.progress.update(self.task, completed=step, sps=self.sps(step), score=self.score(), eps=self.epsilon,
                                 size=self.replay_size, learner=self.learner)
        elif self._line_at is not None and time.perf_counter() - self._line_at >= LINE_SECONDS:
            self.line(step)

    def line(self, step: int) -> None:
        self._line_at = time.perf_counter()
        if self.offline:
            self.print(f"learn {step:,}/{self.total:,}  {self.sps(step):.0f} steps/s  eval {self.score()}  "
                       f"replay {self.replay_size:,}{self.learner}")
            return
        self.print(f"train {step:,}/{self.total:,}  {self.sps(step):.0f} SPS  score {self.score()}  "
                   f"eps {self.epsilon:.3f}  replay {self.replay_size:,}{self.learner}")

    def on_evaluation(self, step: int, logs: dict[str, Any]) -> None:
        returns, mean = logs["returns"], logs["mean_return"]
        self.scalars(step, {"eval/mean_return": mean, **({"eval/success_rate": logs["success_rate"]}
                                                         if "success_rate" in logs else {})})
        record = {"step": step, "mean_return": mean, "returns": returns, "time": time.time(), "eval_s": logs["eval_s"]}
        if "success_rate" in logs:
            record["success_rate"] = logs["success_rate"]
        with open(self.run_dir / EVALS, "a") as f:
            f.write(json.dumps(record) + "\n")
        self.evaluated = shown(mean)
        success = f", {logs['success_rate']:.0%} reached their goal" if "success_rate" in logs else ""
        self.print(f"eval at {self.unit} {step:,}: mean score {shown(mean)} over {len(returns)} games{success}")

    # Keras' hooks -------------------------------------------------------------------------------

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.close()

    # The console --------------------------------------------------------------------------------

    def print(self, message: str) -> None:
        """A line above the bar (or a plain line), never cut."""
        self.console.print(message, highlight=False, soft_wrap=True)

    def close(self) -> None:
        """Stop the bar (or write a last log line), and flush TensorBoard; idempotent."""
        if self.progress is not None:
            self.progress.update(self.task, completed=self.step)
            self.progress.stop()
            self.progress = None
        elif self.step > self.start_step and self._line_at is not None:
            self.line(self.step)
        self._line_at = None
        self.writer.close()
