"""A Dopamine run's rows as the store's steps: which rows are kept, where episodes start and end.

A run's checkpoints, ordered by ``add_count``, cover rows ``[add_count - capacity, add_count)`` of the
run (rows counted from its first add). ``plan_run`` takes each checkpoint's rows not already
taken (rows two checkpoints share are stored once, and checked to agree), so the run becomes
*fragments* of consecutive rows: one, or one more after each *gap*, rows the buffer overwrote
between two saves.

Dopamine's rows and the store's steps (docs/format.md, "The data model"):

- Dopamine writes ``k - 1`` zero rows before each episode's first row (the run's first add, or
  one after a terminal row). Those pad rows are left out; the store pads stacks with zeros
  (``frame_padding="zero"``), which is what the pad rows gave each stack.
- A row holds an observation and the move made from it: it becomes one step. A terminal row's
  successor was never stored: the store's last step of that episode holds a zero frame, which is
  the frame Dopamine's next state ended with (the next episode's first pad row).
- A fragment's oldest row (but at row 0) is in no state Dopamine's buffer samples (``invalid_range``
  holds the ``k`` rows from the cursor on, the oldest first): it is left out.
- The first fragment of a run that does not start at row 0 starts mid-episode (unless the row
  left out ended one): its first step's ``ep_step`` is ``k - 1``, so, as in Dopamine's buffer, no
  state reaches below the oldest row kept (the first ``k - 1`` rows are only stacked, never sampled).
- A fragment that a gap follows ends its last episode there: its last row becomes the episode's
  last step, and the move into it is ``truncated`` (a lone row is left out). The rows after a gap
  start a new episode (``ep_step`` 0), so their first ``k - 1`` are sampled with padded stacks,
  where Dopamine's buffer does not sample them.
- The run's newest episode stays in progress, as the writer left it.

Everything is vectorised over the run's rows (a few bytes a row); the frames are not read here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from replaystore.errors import ConfigError, CorruptStoreError
from replaystore.integrations.dopamine.checkpoints import Checkpoint, added, find, load


@dataclass(frozen=True)
class Segment:
    """Rows ``first .. stop - 1`` of the run, whose frames come from ``checkpoint``."""

    checkpoint: Checkpoint
    first: int
    stop: int


@dataclass
class RunPlan:
    """One run as steps: ``scalars`` for ``load_steps``, and how to make its frames from the rows."""

    folder: Path
    segments: list[Segment]
    keep: np.ndarray  # per row taken: stored as a step
    pad: np.ndarray  # per row taken: a pad row (checked to be zeros)
    zero_after: np.ndarray  # per row taken: a zero-frame last step follows it
    scalars: dict[str, np.ndarray]
    stack: int
    horizon: int
    frame_shape: tuple[int, ...]
    frame_dtype: np.dtype
    checkpoints: int
    rows: int  # rows taken
    shared: int  # rows two checkpoints held, stored once
    gaps: list[tuple[int, int]] = field(default_factory=list)  # rows the buffer overwrote between saves
    max_action: int = 0

    @property
    def steps(self) -> int:
        return len(self.scalars["ep_step"])


def plan_run(folder: str | Path) -> RunPlan:
    """Read the scalars of every checkpoint of the run in ``folder`` and plan its steps."""
    where, numbers = find(folder)
    counts = {n: added(where, n) for n in numbers}
    numbers = sorted((n for n in numbers if counts[n] > 0), key=lambda n: (counts[n], n))
    if not numbers:
        raise ConfigError(f"every checkpoint in {where} is empty (add_count 0); there is nothing to import")
    head = load(where, numbers[0])
    segments: list[Segment] = []
    parts: dict[str, list[np.ndarray]] = {"action": [], "reward": [], "terminal": []}
    starts: list[int] = []  # index (among rows taken) where each fragment starts
    gaps: list[tuple[int, int]] = []
    have, taken, shared = 0, 0, 0
    tail = {name: np.zeros(0, dtype) for name, dtype in (("action", head.action.dtype), ("reward", np.float32),
                                                          ("terminal", bool))}  # the newest rows taken
    for number in numbers:  # one checkpoint's scalars at a time
        c = head if number == head.number else load(where, number)
        same = (c.capacity, c.stack, c.frame_shape, c.frame_dtype) == (head.capacity, head.stack, head.frame_shape,
                                                                         head.frame_dtype)
        if not same:
            raise ConfigError(f"{c} has a ring of {c.capacity:,} rows of {c.frame_shape} {c.frame_dtype} frames, "
                              f"stacks of {c.stack}; {head} has {head.capacity:,} of {head.frame_shape} "
                              f"{head.frame_dtype}, stacks of {head.stack}: the folder mixes runs; one run a folder")
        lo = c.oldest
        first = max(have, lo)
        mine = {"action": c.action, "reward": c.reward, "terminal": c.terminal}
        if segments and lo < have:  # rows the checkpoints before hold too: they must agree
            overlap = min(have, c.add_count) - lo
            slots = np.arange(lo, lo + overlap) % c.capacity
            for name, values in mine.items():
                if not np.array_equal(tail[name][len(tail[name]) - (have - lo):][:overlap], values[slots]):
                    raise CorruptStoreError(f"{c} and the checkpoint before it disagree on the {name} of rows they "
                                            "both hold: they are not from one run; one run a folder")
            shared += overlap
        if first >= c.add_count:
            continue
        if segments and lo > have:
            gaps.append((have, lo))
        if not segments or lo > have:
            starts.append(taken)
        slots = np.arange(first, c.add_count) % c.capacity
        for name, values in mine.items():
            parts[name].append(values[slots])
            tail[name] = np.concatenate([tail[name], values[slots]])[-c.capacity:]
        segments.append(Segment(_light(c), first, c.add_count))
        taken += c.add_count - first
        have = c.add_count
    action, reward, terminal = (np.concatenate(parts[name]) for name in ("action", "reward", "terminal"))
    del tail, parts
    if (action < 0).any() or int(action.max(initial=0)) >= 2**31 - 1:
        raise CorruptStoreError(f"the checkpoints in {where} hold a negative action; Dopamine's are indices of the "
                                "game's actions")
    plan = _steps(action, reward, terminal, np.array(starts + [taken], dtype=np.int64), head.stack,
                  run_start=segments[0].first == 0, where=where)
    return RunPlan(folder=where, segments=segments, stack=head.stack, horizon=head.horizon,
                   frame_shape=head.frame_shape, frame_dtype=head.frame_dtype, checkpoints=len(numbers), rows=taken,
                   shared=shared, gaps=gaps, max_action=int(action.max(initial=0)), **plan)


def _light(c: Checkpoint) -> Checkpoint:
    """``c`` without its scalars (the plan keeps what it took of them)."""
    empty = np.zeros(0)
    return replace(c, action=empty, reward=empty, terminal=empty)


def _steps(action: np.ndarray, reward: np.ndarray, terminal: np.ndarray, bounds: np.ndarray, k: int, *,
           run_start: bool, where: Path) -> dict:
    """The steps of rows split into fragments at ``bounds`` (see the module docstring)."""
    m = len(action)
    frag = np.zeros(m, dtype=np.int32)
    frag[bounds[1:-1]] = 1
    frag = np.cumsum(frag, dtype=np.int32)
    pad = np.zeros(m, dtype=bool)
    ends = np.flatnonzero(terminal)
    for d in range(1, k):
        after = ends + d
        ok = after < m
        after = after[ok]
        pad[after[frag[after] == frag[ends[ok]]]] = True
    if run_start:
        pad[: min(k - 1, bounds[1])] = True
    if (pad & ((action != 0) | (reward != 0) | terminal)).any():
        bad = int(np.flatnonzero(pad & ((action != 0) | (reward != 0) | terminal))[0])
        raise CorruptStoreError(f"row {bad:,} taken from {where} should be one of the zero rows Dopamine writes before "
                                "an episode's first, and is not: these are not Dopamine's DQN replay checkpoints")
    keep = ~pad
    for f in range(len(bounds) - 1):  # a fragment's oldest row is in no state Dopamine samples (see above)
        if bounds[f] < m and (f or not run_start):
            keep[bounds[f]] = False
    last_row = np.zeros(m, dtype=bool)  # rows kept as an episode's last step (before a gap)
    for f in range(len(bounds) - 2):  # every fragment but the newest ends at a gap
        kept = np.flatnonzero(keep[bounds[f]:bounds[f + 1]]) + bounds[f]
        if not len(kept) or terminal[kept[-1]]:
            continue
        r = kept[-1]
        if len(kept) == 1 or kept[-2] != r - 1 or terminal[kept[-2]]:
            keep[r] = False  # a lone row: an episode of no move
        else:
            last_row[r] = True
    del frag
    zero_after = keep & terminal
    n = keep.astype(np.int8) + zero_after
    total = int(n.sum(dtype=np.int64))
    ix = np.int32 if total < 2**31 else np.int64  # (indices of a step: half the RAM of int64s)
    pos = np.cumsum(n, dtype=ix) - n
    del n
    out = {"action": np.zeros(total, np.int32), "reward": np.zeros(total, np.float32),
           "terminated": np.zeros(total, bool), "truncated": np.zeros(total, bool), "is_last": np.zeros(total, bool),
           "ep_step": np.zeros(total, np.int32), "priority": np.ones(total, np.float32)}
    src = np.flatnonzero(keep & ~last_row).astype(ix)  # rows kept with their move
    dst = pos[src]
    out["action"][dst] = action[src]
    out["reward"][dst] = reward[src]
    out["terminated"][dst] = terminal[src]
    del src, dst
    lasts = pos[np.flatnonzero(last_row)]
    out["is_last"][lasts] = True
    out["truncated"][lasts - 1] = True
    out["is_last"][pos[np.flatnonzero(zero_after)] + 1] = True
    # ep_step: steps since the episode's first (an episode starts after a last step, at a fragment's first row)
    first = np.zeros(total, dtype=bool)
    if total:
        first[0] = True
        first[1:] = out["is_last"][:-1]
        frag_first = pos[bounds[:-1][bounds[:-1] < m]]
        first[frag_first[frag_first < total]] = True
    del pos
    index = np.arange(total, dtype=ix)
    ep_step: np.ndarray = index - np.maximum.accumulate(np.where(first, index, 0))
    del index
    if total and not run_start and not terminal[0]:  # the oldest rows are mid-episode: only stacked
        first_end = int(np.argmax(first[1:])) + 1 if first[1:].any() else total
        ep_step[:first_end] += k - 1
    if ep_step.max(initial=0) >= 2**31:
        raise ConfigError(f"an episode in {where} is longer than a store's episode can be (2**31 steps)")
    out["ep_step"] = ep_step.astype(np.int32, copy=False)
    return {"keep": keep, "pad": pad, "zero_after": zero_after, "scalars": out}
