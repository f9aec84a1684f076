"""Feeding the learner: the sampling pipeline and the gradient steps due.

The loop says how many gradient steps are due (one per ``train_frequency`` env steps once learning
has started) and ``Learning`` takes them, ``steps_per_call`` K at a time: each call of the learner's
``train_block`` (learner.py) runs K gradient steps on a block of K batches, compiled as one call, on
the backend Keras runs on:

- **TensorFlow** (the default): blocks from ``store.as_dataset(..., blocks=True)`` (tf.data), one
  ``tf.function`` call each (a ``tf.while_loop`` over the block); with K = 1, batches from
  ``as_dataset`` as they come.
- **JAX** (``KERAS_BACKEND=jax``): blocks from ``store.jax_blocks``, put on the device ahead by a
  feeder thread; one ``jax.jit`` call each (``lax.scan``).
- **PyTorch** (``KERAS_BACKEND=torch``): numpy blocks from ``store.blocks``; a loop of eager steps
  each.

Due steps accumulate and each full block is taken; steps still due when the run stops carry over
(``state.due_steps``, checkpointed), so a run takes its gradient steps at most one block late. With
prioritized replay the new priorities are written after each call.

With a replay ratio R (> 0, the default) the gradient steps are not taken inside the acting loop: a
learner thread takes them as fast as the ratio allows (ratio.py), while the loop acts and only
reports each env step to the limiter. Checkpoints pause the learner between two calls (``paused``).
Each call's loss, mean Q and sampling time are queued (``done``) for the acting thread, which hands
them to the callbacks: callbacks run on one thread only.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from replaystore import ReplayStore, ReplayStoreError
from replaystore.sampling.samplers import Sampler

from .config import DQNConfig, TrainerError
from .learnerbase import Learner
from .ratio import RatioLimiter
from .state import RunState

PRIORITY_EPS = 1e-6


class Learning:
    """Starts the sampling pipeline once learning starts and takes the gradient steps the loop asks for."""

    def __init__(self, config: DQNConfig, store: ReplayStore, learner: Learner, state: RunState, *,
                 sampler: Sampler | None = None) -> None:
        """``state``: the run's checkpointed state, where the steps due but not yet taken are kept
        (``due_steps``), so that a resumed run takes them. ``sampler``: one of the store's samplers
        (a ``HindsightSampler``) instead of the one the hyperparameters describe."""
        self.args, self.store, self.agent, self.state = config, store, learner, state
        self.sampler = sampler
        self.jax = learner.backend == "jax"
        self.steps_per_call = config.calls(learner.backend)
        self.source: Any = None  # the dataset iterator (TF) or the device blocks (JAX)
        #: each call's (mean loss, mean Q(s, a), sampling seconds a step), for the acting thread to report
        self.done: collections.deque[tuple[float, float, float]] = collections.deque()
        self.learned = learner.train_steps  # gradient steps taken, this run's before this fit included
        self.limiter: RatioLimiter | None = None  # decoupled (--replay-ratio > 0): the learner thread's
        self._lock = threading.Lock()  # held by the learner thread during a call, and by checkpoints
        self._thread: threading.Thread | None = None
        self._sampleable = False
        self.error: BaseException | None = None
        self._ages: list[float] = []
        self._since = (0, time.perf_counter())  # (gradient steps, time) at the last metrics()

    # Decoupled acting and learning -------------------------------------------------------------

    @property
    def decoupled(self) -> bool:
        return self.limiter is not None

    def start_thread(self, global_step: int) -> None:
        """Run the learner on its own thread, held to the replay ratio (ratio.py)."""
        args = self.args
        self.limiter = RatioLimiter(args.ratio(), args.batch_size, args.learning_starts,
                                    steps_per_call=self.steps_per_call, inserted=global_step,
                                    learned=int(self.agent.train_steps))
        self._since = (self.limiter.learned, time.perf_counter())
        self._thread = threading.Thread(target=self._learner, name="replaystore-learner", daemon=True)
        self._thread.start()

    def acted(self, n: int, *, wait: bool = True) -> None:
        """The acting loop added ``n`` env steps: count them, and (``wait``) wait here while the
        learner is too far behind. Raises the learner thread's error if it failed."""
        assert self.limiter is not None
        self.limiter.insert(n)
        if wait and self.sampleable():  # (until the learner has enough to sample, waiting for it could never end)
            self.limiter.wait_actor()
        if self.error is not None:
            if isinstance(self.error, ReplayStoreError | TrainerError):  # (a refusal: said as it is, in one line)
                raise self.error
            raise RuntimeError(f"the learner thread failed: {self.error!r}") from self.error

    def sampleable(self) -> bool:
        """Whether the store holds enough for the learner's first batch (then it stays so): from
        then on the actor is held to the ratio, also while the learner builds its feed and compiles
        its first call (acting on meanwhile would run ahead of the ratio by that long)."""
        if not self._sampleable:
            self._sampleable = self.started or self.can_sample()
        return self._sampleable

    def can_sample(self) -> bool:
        """Whether the store holds enough for a first batch: ``batch_size`` transitions with their
        n-step returns (and, for hindsight relabelling, one finished episode to draw from)."""
        store = self.store
        if len(store) < self.args.batch_size + self.args.n_step:
            return False
        if self.sampler is None:
            return True
        return any(ring.added and bool(ring.is_last[:].any()) for ring in store.rings.streams)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The learner between two calls (for a checkpoint: weights and optimizer state consistent)."""
        with self._lock:
            yield

    def _learner(self) -> None:
        limiter = self.limiter
        assert limiter is not None
        try:
            while limiter.wait_learner():
                if not self.started:
                    if not self.can_sample():
                        time.sleep(0.01)
                        continue
                    self.start(limiter.inserted)
                with self._lock:
                    self.call()
                limiter.learned_steps(self.steps_per_call)
        except BaseException as exc:  # noqa: BLE001 - raised in the acting thread by acted()
            self.error = exc
            limiter.close()

    def _note_ages(self, index: np.ndarray) -> None:
        """Env steps since each sampled transition was added (for the replay/sample_age scalar)."""
        if self.decoupled:
            rings = self.store.rings
            positions = rings.positions_of_slots(np.asarray(index, dtype=np.int64).ravel())
            self._ages.append(float(np.mean(rings.heads(positions) - positions)))

    def metrics(self) -> dict[str, float]:
        """The decoupled loop's scalars since the last call (empty when learning is lockstep)."""
        limiter = self.limiter
        if limiter is None:
            return {}
        now, steps = time.perf_counter(), limiter.learned
        rate = (steps - self._since[0]) / max(now - self._since[1], 1e-9)
        self._since = (steps, now)
        sampled = steps * self.args.batch_size
        out = {"replay/inserted": limiter.inserted, "replay/sampled": sampled,
               "replay/ratio": sampled / max(1, limiter.inserted - self.args.learning_starts), "charts/learner_steps_per_s": rate,
               "replay/learner_wait_s": limiter.learner_wait_s, "replay/actor_wait_s": limiter.actor_wait_s}
        if self._ages:
            out["replay/sample_age"] = float(np.mean(self._ages))
            self._ages.clear()
        return out

    def replay_ratio(self, step: int) -> float:
        """Transitions sampled per transition inserted since learning started (NaN before it did)."""
        inserted = step - self.args.learning_starts
        return self.learned * self.args.batch_size / inserted if inserted > 0 else float("nan")

    @property
    def started(self) -> bool:
        return self.source is not None

    def start(self, global_step: int) -> None:
        args, store, k = self.args, self.store, self.steps_per_call
        kwargs: dict[str, Any] = {"threads": args.sample_threads, "seed": args.seed * 1_000_003 + global_step}
        if self.sampler is not None:
            kwargs["sampler"] = self.sampler
        else:
            kwargs.update(n_step=args.n_step, gamma=args.gamma, prioritized=args.prioritized, alpha=args.alpha,
                          beta=args.beta)
        if self.jax:
            self.source = store.jax_blocks(args.batch_size, batches_per_block=k, **kwargs)
            self._close = self.source.close
            return
        if self.agent.backend == "torch":  # numpy blocks, which the learner wraps as tensors without a copy
            self.source = store.blocks(args.batch_size, batches_per_block=k, **kwargs)
            self._close = self.source.close
            return
        import tensorflow as tf

        if k > 1:
            dataset = store.as_dataset(args.batch_size, batches_per_call=k, blocks=True, **kwargs)
            self.source = iter(dataset)
        else:  # batches as they come (the bridge's cost spread over 32 of them), each a block of one
            dataset = store.as_dataset(args.batch_size, batches_per_call=32, **kwargs)
            self.source = (tf.nest.map_structure(lambda v: tf.expand_dims(v, 0), batch) for batch in dataset)
        self._close = dataset.prefetcher.close

    def steps(self, n: int) -> None:
        """Take ``n`` more gradient steps: every full block of them now, the rest later."""
        if not self.started:
            return
        self.state.due_steps += n
        while self.state.due_steps >= self.steps_per_call:
            self.call()
            self.state.due_steps -= self.steps_per_call

    def call(self) -> None:
        """One learner call: ``steps_per_call`` gradient steps on the next block."""
        t0 = time.perf_counter()
        block = next(self.source)
        sample_s = time.perf_counter() - t0
        loss, q_mean, abs_td = self.agent.train_block(block)
        index = np.asarray(block["index"])
        self._note_ages(index)
        if self.args.prioritized:
            self.store.update_priorities(index.ravel(), abs_td.ravel() + PRIORITY_EPS)
        self.learned += len(loss)
        self.done.append((float(np.mean(loss)), float(np.mean(q_mean)), sample_s / len(loss)))

    def close(self) -> None:
        """Stop the learner thread (after its current call), then the sampling workers (the
        dataset's prefetcher, or the device feeder)."""
        if self.limiter is not None:
            self.limiter.close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.source is not None:
            self.source = None
            self._close()
