"""The learner's side of the training loop: the sampling pipeline and the gradient steps due.

The loop says how many gradient steps are due (one per ``train_frequency`` env steps once learning
has started) and ``Learning`` takes them, on the backend Keras runs on:

- **TensorFlow** (the default): batches from ``store.as_dataset`` (tf.data), one ``tf.function``
  gradient step each.
- **JAX** (``KERAS_BACKEND=jax``): blocks of ``--steps-per-call`` batches from ``store.jax_blocks``,
  put on the device ahead by a feeder thread; due steps accumulate and each full block is one
  compiled call of that many steps (agent_jax.py). Steps still due when the run stops carry over
  to the next call, so a run takes its gradient steps at most one block late.

With ``--prioritized`` the new priorities are written after each call.
"""

from __future__ import annotations

import time
from typing import Any

from replaystore import ReplayStore
from trainer.args import Args

PRIORITY_EPS = 1e-6
#: Gradient steps per compiled call on JAX when ``--steps-per-call`` is not given.
DEFAULT_STEPS_PER_CALL = 32


class Learning:
    """Starts the sampling pipeline once learning starts and takes the gradient steps the loop asks for."""

    def __init__(self, args: Args, store: ReplayStore, agent: Any, report: Any, state: dict[str, Any]) -> None:
        """``state``: the run's checkpointed state, where the steps due but not yet taken are kept
        (``due_steps``), so that a resumed run takes them."""
        self.args, self.store, self.agent, self.report, self.state = args, store, agent, report, state
        self.jax = hasattr(agent, "train_block")
        self.steps_per_call = (args.steps_per_call or DEFAULT_STEPS_PER_CALL) if self.jax else 1
        self.source: Any = None  # the dataset iterator (TF) or the device blocks (JAX)
        state.setdefault("due_steps", 0)

    @property
    def started(self) -> bool:
        return self.source is not None

    def start(self, global_step: int) -> None:
        args, store = self.args, self.store
        kwargs = {"n_step": args.n_step, "gamma": args.gamma, "prioritized": args.prioritized, "alpha": args.alpha,
                  "beta": args.beta, "threads": args.sample_threads, "seed": args.seed * 1_000_003 + global_step}
        if self.jax:
            self.source = store.jax_blocks(args.batch_size, batches_per_block=self.steps_per_call, **kwargs)
            self._close = self.source.close
        else:
            dataset = store.as_dataset(args.batch_size, **kwargs)
            self.source, self._close = iter(dataset), dataset.prefetcher.close

    def steps(self, n: int) -> None:
        """Take ``n`` more gradient steps (on JAX: every full block of them now, the rest later)."""
        if not self.started:
            return
        if not self.jax:
            n, self.state["due_steps"] = n + self.state["due_steps"], 0  # (left by a JAX run this one resumes)
            for _ in range(n):
                self._tf_step()
            return
        self.state["due_steps"] += n
        while self.state["due_steps"] >= self.steps_per_call:
            self._jax_block()
            self.state["due_steps"] -= self.steps_per_call

    def _tf_step(self) -> None:
        t0 = time.perf_counter()
        batch = next(self.source)
        sample_s = time.perf_counter() - t0
        loss, q_mean, abs_td = self.agent.train(batch, self.args.gamma)
        if self.args.prioritized:
            self.store.update_priorities(batch["index"].numpy(), abs_td.numpy() + PRIORITY_EPS)
        self.report.trained(float(loss), float(q_mean), sample_s)

    def _jax_block(self) -> None:
        t0 = time.perf_counter()
        block = next(self.source)
        sample_s = time.perf_counter() - t0
        loss, q_mean, abs_td = self.agent.train_block(block)
        if self.args.prioritized:
            self.store.update_priorities(block["index"].ravel(), abs_td.ravel() + PRIORITY_EPS)
        for i in range(len(loss)):
            self.report.trained(float(loss[i]), float(q_mean[i]), sample_s / len(loss))

    def close(self) -> None:
        """Stop the sampling workers (the dataset's prefetcher, or the device feeder)."""
        if self.source is not None:
            self.source = None
            self._close()
