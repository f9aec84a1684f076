"""Positions -> Batch: frame stacks, n-step returns and discounts, all vectorised.

``obs[i]`` is the stack of ``frame_stack`` frames ending at the sampled step, oldest first, padded
at the start of an episode by repeating its first frame: what gymnasium's
``FrameStackObservation(env, frame_stack, padding_type="reset")`` showed the agent. ``next_obs[i]`` is
the stack at the step ``m`` moves later (``m = n_step``, or fewer if the episode ended first).
``reward`` is ``sum_j gamma**j * r[t+j]`` over those moves and ``discount`` is ``gamma**m``, or 0 when
the last move terminated (a truncation bootstraps from the stored last observation). The sum is
that of Dopamine's buffer of the DQN Replay Dataset's time, bit for bit (the dataset imports as a
store: integrations/dopamine): each ``gamma**j`` computed in float64 and rounded to float32, each
product rounded to float32, the products summed in float64 (what its ``discounts.dot(rewards)``
does below 32 terms) and the sum rounded to float32.
Every frame a batch needs is fetched once, through one ``FrameReader`` plan. ``prepare`` reads the
ring (call it under the store's lock); ``Pending.finish`` decodes the frames (no lock needed).
``prepare(..., batches=K)`` prepares K batches at once (the prefetcher's blocks): the ring is read
with one set of vectorised operations for all of them, and each batch gets its own plan, decoded
on its own (one batch's chunks stay in cache between decoding and gathering; K batches' would not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replaystore.sampling.draws import n_step_span
from replaystore.sampling.pending import Pending
from replaystore.storage.reader import FrameReader
from replaystore.storage.rings import Rings


@dataclass(frozen=True)
class Batch:
    """A batch of transitions; every field has the batch as its first axis.

    ``index`` holds the ring slots sampled (pass it to ``update_priorities``); ``weight`` holds
    importance-sampling weights (all ones for uniform sampling). A Dict store's ``obs`` and
    ``next_obs`` are dicts of such arrays, one per key (format/dictobs.py). ``extras`` holds the
    store's extras of each transition's (first) move, by name (format/extras.py; empty without).
    """

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    discount: np.ndarray
    index: np.ndarray
    weight: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict, kw_only=True)

    def __len__(self) -> int:
        return int(self.index.shape[0])


def prepare(ring: Rings, reader: FrameReader, positions: np.ndarray, *, n_step: int = 1, gamma: float = 0.99,
            weight: np.ndarray | None = None, out: list[np.ndarray] | None = None, batches: int = 1,
            result: Callable[..., Any] = Batch, single: dict[str, np.ndarray] | None = None,
            extra: dict[str, np.ndarray] | None = None,
            complete: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], None] | None = None) -> Pending:
    """Read everything ``batches`` batches need from the ring and plan their frame reads.

    ``positions`` holds the batches one after another. ``out`` (optional with one batch, required
    with more) is a list of C-contiguous ``(batches, n, frame_stack, *obs_shape)`` arrays that
    receive the batches' ``obs`` and ``next_obs`` (and each of ``single``). ``single``: more frame
    fields, each one frame a row (a position per row, filling its whole stack); ``extra``: more
    fields, as they are; ``complete``: run on the frames and fields once decoded (``Pending``)."""
    positions = np.asarray(positions, dtype=np.int64)
    slots = ring.slots(positions)
    m, _ = n_step_span(ring, positions, n_step)
    next_positions = positions + m

    if n_step == 1:
        reward = ring.reward[slots].astype(np.float32)
        last_slots = slots
    else:
        j = np.arange(n_step, dtype=np.int64)
        within = j[None, :] < m[:, None]
        steps = ring.slots(positions[:, None] + np.minimum(j[None, :], m[:, None] - 1))
        disc = (float(gamma) ** j.astype(np.float64)).astype(np.float32)  # (as Dopamine's buffer: see below)
        reward = (ring.reward[steps] * disc[None, :] * within).sum(axis=1, dtype=np.float64).astype(np.float32)
        last_slots = ring.slots(positions + m - 1)
    terminated = ring.terminated[last_slots].copy()
    truncated = ring.truncated[last_slots].copy()
    discount = np.where(terminated, 0.0, float(gamma) ** m.astype(np.float64)).astype(np.float32)

    # (batches, 2, n, k): per batch, one plan whose two rows are ``obs`` and ``next_obs`` (without an
    # ``out``, one contiguous output split without a copy)
    n = positions.size // batches
    stacks = [ring.stack_positions(np.concatenate([positions, next_positions]))]
    single = single or {}
    stacks += [np.repeat(np.asarray(at, dtype=np.int64)[:, None], ring.frame_stack, axis=1) for at in single.values()]
    rows = 2 + len(single)
    both = np.concatenate(stacks).reshape(rows, batches, n, -1).transpose(1, 0, 2, 3)
    if batches > 1 and out is None:
        raise ValueError("prepare(..., batches > 1) needs an out array for the frames")
    outs: list = [None] if out is None else [[out[r][i] for r in range(rows)] for i in range(batches)]
    fields = {
        "action": ring.action[slots].astype(ring.action_dtype, copy=False),
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "discount": discount,
        "index": slots,
        "weight": np.ones(positions.size, dtype=np.float32) if weight is None else weight.astype(np.float32),
        **{name: values[slots] for name, values in ring.extras.items()},
        **(extra or {}),
    }
    return Pending(fields, reader.plan_many(both, outs), ("obs", "next_obs", *single), out, result, complete)
