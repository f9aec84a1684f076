"""Samplers: the parts that say which steps a batch holds and what it is made of.

A ``Sampler`` draws positions from the rings (under the store's lock) and plans the batch: it reads
the scalars the batch needs from the rings and plans the frame reads with the store's
``FrameReader``; the returned ``Pending`` is finished (frames decoded) without the lock, by
``sample`` or by the prefetcher's workers into block memory. Everything that feeds batches
(``sample``, ``blocks``, ``as_dataset``, ``jax_blocks``) takes a sampler and asks it what its
batches hold (``spec``), so a new way of sampling is one new class here:

- ``UniformSampler``: transitions drawn uniformly, with n-step returns (assemble.py);
- ``PrioritizedSampler``: transitions drawn in proportion to their priorities (priority.py keeps
  the state it shares with the store: the sum tree and the priority new transitions get);
- ``SequenceSampler``: windows of consecutive transitions inside one episode (sequences.py);
- ``HindsightSampler``: transitions of a goal-conditioned Dict store, a share of each batch with its
  goal relabelled (HER, hindsight.py); made by the user and passed as ``sampler=``, bound to the
  store's schema (``bind``).
"""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from replaystore.errors import SampleError
from replaystore.format.schema import Schema, batch_action
from replaystore.sampling.assemble import Batch, prepare
from replaystore.sampling.draws import count_sampleable, sample_prioritized, sample_uniform
from replaystore.sampling.pending import FieldSpec, Pending
from replaystore.sampling.priority import Priorities
from replaystore.storage.reader import FrameReader
from replaystore.storage.rings import Rings


class Sampler(ABC):
    """What a batch holds (``spec``) and how one is drawn and planned (``plan``)."""

    #: the fields that hold frame stacks, decoded from the frame chunks; every other field is a scalar
    frames: tuple[str, ...] = ()

    @abstractmethod
    def spec(self, batch_size: int, schema: Schema) -> dict[str, FieldSpec]:
        """Every field of a batch of ``batch_size``: its shape (the batch first) and dtype."""

    @abstractmethod
    def plan(self, rings: Rings, reader: FrameReader, batch_size: int, rng: np.random.Generator, *,
             batches: int = 1, out: list[np.ndarray] | None = None) -> Pending:
        """Draw ``batches`` batches of ``batch_size`` and plan them (call under the store's lock).
        ``out``: for each of ``frames``, a C-contiguous ``(batches, *spec shape)`` array that
        receives the frames (required with ``batches`` > 1). Raises ``SampleError`` when the store
        cannot give what is asked."""

    def bind(self, schema: Schema) -> Sampler:
        """This sampler for a store of ``schema`` (a store calls it on a sampler it is given): itself,
        or a copy that knows what it needs of the schema. Raises ``ConfigError`` for a store it
        cannot sample."""
        return self

    def describe(self) -> str:
        """How error messages name this way of sampling."""
        return type(self).__name__


class UniformSampler(Sampler):
    """Transitions drawn uniformly (with replacement) over every stream, with ``n_step`` returns
    discounted by ``gamma`` (assemble.py)."""

    frames: tuple[str, ...] = ("obs", "next_obs")
    n_step: int
    gamma: float

    def __init__(self, *, n_step: int = 1, gamma: float = 0.99) -> None:
        if isinstance(n_step, bool) or not isinstance(n_step, numbers.Integral) or not 1 <= n_step <= 1000:
            raise SampleError(f"n_step is {n_step!r}; it must be an int between 1 and 1000")
        check_unit(gamma, "gamma")
        self.n_step = int(n_step)
        self.gamma = float(gamma)

    def spec(self, batch_size: int, schema: Schema) -> dict[str, FieldSpec]:
        stack = (batch_size, schema.frame_stack, *schema.observation.shape)
        frame = np.dtype(schema.observation.dtype)
        one = (batch_size,)
        act_shape, act_dtype = batch_action(schema.action)
        return {"obs": (stack, frame), "next_obs": (stack, frame), "action": ((batch_size, *act_shape), np.dtype(act_dtype)),
                "reward": (one, np.dtype(np.float32)), "terminated": (one, np.dtype(bool)),
                "truncated": (one, np.dtype(bool)), "discount": (one, np.dtype(np.float32)),
                "index": (one, np.dtype(np.int64)), "weight": (one, np.dtype(np.float32)),
                **extras_spec(schema, one)}

    def available(self, rings: Rings) -> int:
        """How many transitions this sampler can return."""
        return count_sampleable(rings, self.n_step)

    def draw(self, rings: Rings, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
        """``count`` positions, and their importance weights (None: all ones)."""
        return sample_uniform(rings, count, rng, n_step=self.n_step), None

    def plan(self, rings: Rings, reader: FrameReader, batch_size: int, rng: np.random.Generator, *,
             batches: int = 1, out: list[np.ndarray] | None = None) -> Pending:
        available = self.available(rings)
        if batch_size > available:
            raise SampleError(f"asked for {batch_size} transitions but the store holds {available} sampleable "
                              f"(n_step={self.n_step}); add more transitions first or sample at most {available}")
        positions, weight = self.draw(rings, batches * batch_size, rng)
        return prepare(rings, reader, positions, n_step=self.n_step, gamma=self.gamma, weight=weight, out=out,
                       batches=batches, result=Batch)

    def describe(self) -> str:
        return f"uniform sampling (n_step={self.n_step})"


class PrioritizedSampler(UniformSampler):
    """Transitions drawn with probability ``p**alpha / sum p**alpha`` and importance weights
    ``(N P(i))**-beta`` normalised so the largest possible weight is 1 (priority.py). ``priorities``
    is the store's: the state every prioritized sampler of the store shares, saved with the store."""

    def __init__(self, priorities: Priorities, *, alpha: float = 0.6, beta: float = 0.4, n_step: int = 1,
                 gamma: float = 0.99) -> None:
        super().__init__(n_step=n_step, gamma=gamma)
        check_unit(alpha, "alpha")
        check_unit(beta, "beta")
        self.priorities = priorities
        self.alpha = float(alpha)
        self.beta = float(beta)

    def draw(self, rings: Rings, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
        tree = self.priorities.sync(self.alpha)
        positions = sample_prioritized(rings, tree, count, rng, n_step=self.n_step)
        return positions, self.priorities.weights(tree, rings.slots(positions), self.beta)

    def describe(self) -> str:
        return f"prioritized sampling (n_step={self.n_step})"


def extras_spec(schema: Schema, lead: tuple[int, ...]) -> dict[str, FieldSpec]:
    """The store's extras as fields of a batch whose moves have shape ``lead``."""
    return {e.field: ((*lead, *e.shape), np.dtype(e.dtype)) for e in schema.extras}


def check_unit(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise SampleError(f"{name} is {value!r}; it must be a number in [0, 1]")


def check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise SampleError(f"batch_size is {batch_size!r}; it must be a positive int")
    return int(batch_size)
