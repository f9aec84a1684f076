"""What the trainer tells people: TensorBoard scalars and a live progress bar (or log lines).

TensorBoard tags (under ``run_dir/tb``): ``charts/episodic_return``, ``charts/episodic_length``,
``charts/epsilon``, ``charts/SPS``, ``losses/td_loss``, ``losses/q_values``, ``replay/size``,
``replay/cache_hit_rate``, ``replay/sample_ms``, and ``eval/mean_return`` when evaluating. With
``--replay-ratio``: ``replay/inserted``, ``replay/sampled``, ``replay/ratio`` (sampled per inserted
since learning started), ``replay/sample_age`` (mean env steps since the sampled transitions were
added), ``charts/learner_steps_per_s``, ``replay/learner_wait_s`` and ``replay/actor_wait_s``
(seconds each side has waited for the other, cumulative).
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

import tensorflow as tf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

#: Steps between progress refreshes and between log lines without a bar.
REFRESH_STEPS = 100


class Report:
    """TensorBoard writer plus a rich progress bar (``progress=False``: a plain line now and then)."""

    def __init__(self, run_dir: Path, *, total: int, start: int, progress: bool) -> None:
        self.writer = tf.summary.create_file_writer(str(run_dir / "tb"))
        self.returns: collections.deque[float] = collections.deque(maxlen=20)
        self.total = total
        self.start_step = start
        self.start_time = time.perf_counter()
        self.console = Console()
        self._train_sums = [0.0, 0.0, 0.0]
        self._n_train = 0
        self._last = (start, self.start_time)
        self.learner = ""  # the latest averaged loss and Q, once learning has started
        self.line_every = max(REFRESH_STEPS, (total - start) // 20)
        self.last_line = start
        self.progress: Progress | None = None
        if progress:
            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[sps]:>5.0f} SPS  return {task.fields[ret]}  eps {task.fields[eps]:.3f}  "
                           "replay {task.fields[size]:,}{task.fields[learner]}"),
                TimeRemainingColumn(), console=self.console, refresh_per_second=4,
            )
            self.task = self.progress.add_task("train", total=total, completed=start, sps=0.0, ret="-", eps=1.0, size=0,
                                           learner="")
            self.progress.start()

    def sps(self, step: int) -> float:
        return (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)

    def recent_return(self) -> str:
        return f"{sum(self.returns) / len(self.returns):.1f}" if self.returns else "-"

    def scalars(self, step: int, values: dict[str, float]) -> None:
        with self.writer.as_default(step=step):
            for tag, value in values.items():
                tf.summary.scalar(tag, value)

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        self.returns.append(float(episodic_return))
        self.scalars(step, {"charts/episodic_return": episodic_return, "charts/episodic_length": length})

    def trained(self, loss: float, q_mean: float, sample_s: float) -> None:
        """Count one gradient step (averaged into the next ``periodic`` write)."""
        self._train_sums[0] += loss
        self._train_sums[1] += q_mean
        self._train_sums[2] += sample_s
        self._n_train += 1

    def periodic(self, step: int, *, epsilon: float, replay_size: int, cache_hit_rate: float,
                 extra: dict[str, float] | None = None) -> None:
        """Write the step-level scalars, with the learner's averaged since the last call (and
        ``extra``: the decoupled learner's, trainer/learn.py)."""
        now = time.perf_counter()
        values = {"charts/epsilon": epsilon, "replay/size": replay_size, "replay/cache_hit_rate": cache_hit_rate}
        if step > self._last[0]:  # (a second write at the same step has no rate to give)
            values["charts/SPS"] = (step - self._last[0]) / max(now - self._last[1], 1e-9)
        self._last = (step, now)
        values.update(extra or {})
        if self._n_train:
            loss, q, sample_s = (v / self._n_train for v in self._train_sums)
            values.update({"losses/td_loss": loss, "losses/q_values": q, "replay/sample_ms": 1000 * sample_s})
            self.learner = f"  loss {loss:.4f}  Q {q:.3f}"
            self._train_sums = [0.0, 0.0, 0.0]
            self._n_train = 0
        self.scalars(step, values)

    def tick(self, step: int, *, epsilon: float, replay_size: int) -> None:
        """Called every REFRESH_STEPS steps."""
        if self.progress is not None:
            self.progress.update(self.task, completed=step, sps=self.sps(step), ret=self.recent_return(), eps=epsilon,
                                 size=replay_size, learner=self.learner)
        elif step - self.last_line >= self.line_every or step >= self.total:
            self.last_line = step
            self.print(f"step {step:,}/{self.total:,}  {self.sps(step):.0f} SPS  return {self.recent_return()}  "
                       f"eps {epsilon:.3f}  replay {replay_size:,}{self.learner}")

    def print(self, message: str) -> None:
        self.console.print(message, highlight=False, soft_wrap=True)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        self.writer.flush()
        self.writer.close()
