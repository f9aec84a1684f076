"""Acting and learning decoupled, held to a replay ratio (``--replay-ratio R``).

With ``R > 0`` (the default, ``auto``: batch-size / train-frequency) the learner runs on its own
thread beside the acting loop instead of taking its gradient steps inside it. ``RatioLimiter`` holds them together the way Reverb's
``SampleToInsertRatio`` does: after ``--learning-starts`` env steps, the learner may have taken

    target = (inserted - learning_starts) * R / batch_size

gradient steps (``R`` sampled transitions per inserted one), and the two sides wait for each other
only at the edges of a band around it:

- the learner waits until ``learning_starts`` env steps were inserted, and then while a call of
  ``k`` more steps would go beyond ``target + slack`` (it is ahead of the data: it would reuse
  transitions more than ``R`` times on average);
- the actor waits while the learner is more than ``slack`` steps behind ``target`` (acting on
  would insert transitions the learner never gets to at ratio ``R``).

``slack`` is at least two learner calls, so neither side waits on every step. A side that stops
(``close``) releases the other. The actor's policy reads the learner's current weights at every
forward pass, so they are at most one learner call (``--steps-per-call`` steps) behind the latest
gradient step.
"""

from __future__ import annotations

import threading
import time


class RatioLimiter:
    """Counts inserted env steps and learner gradient steps, and makes each side wait at the band's edge."""

    def __init__(self, ratio: float, batch_size: int, learning_starts: int, *, steps_per_call: int,
                 inserted: int = 0, learned: int = 0, slack: int | None = None) -> None:
        self.ratio = float(ratio)
        self.batch_size = batch_size
        self.learning_starts = learning_starts
        self.steps_per_call = steps_per_call
        self.slack = max(2 * steps_per_call, 8) if slack is None else slack
        self.inserted = inserted
        self.learned = learned
        self.learner_wait_s = 0.0
        self.actor_wait_s = 0.0
        self._cond = threading.Condition()
        self._closed = False

    def target(self) -> float:
        """Gradient steps the learner may have taken by now."""
        return max(0, self.inserted - self.learning_starts) * self.ratio / self.batch_size

    def insert(self, n: int) -> None:
        """The actor added ``n`` env steps; wakes a waiting learner."""
        with self._cond:
            self.inserted += n
            self._cond.notify_all()

    def wait_actor(self) -> bool:
        """Block the actor while the learner is more than ``slack`` steps behind; False once closed."""
        with self._cond:
            t0 = time.perf_counter()
            while not self._closed and self.learned + self.slack < self.target():
                self._cond.wait(0.5)
            self.actor_wait_s += time.perf_counter() - t0
            return not self._closed

    def wait_learner(self) -> bool:
        """Block the learner until it may take its next call's steps; False once closed."""
        with self._cond:
            t0 = time.perf_counter()
            while not self._closed and (self.inserted <= self.learning_starts
                                        or self.learned + self.steps_per_call > self.target() + self.slack):
                self._cond.wait(0.5)
            self.learner_wait_s += time.perf_counter() - t0
            return not self._closed

    def learned_steps(self, n: int) -> None:
        """The learner took ``n`` gradient steps; wakes a waiting actor."""
        with self._cond:
            self.learned += n
            self._cond.notify_all()

    def close(self) -> None:
        """Release both sides for good (the run is stopping)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
