"""A run's counters: what the acting loop, the learner and the checkpoint share, in one object (saved
as the checkpoint's JSON ``state``, the same keys as before there was an API)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class RunState:
    global_step: int = 0  # env steps taken (every env's, every actor's)
    episodes: int = 0  # game episodes finished
    resumes: int = 0  # times the run was resumed (seeds each resumed stretch's envs anew)
    epsilon: float = 1.0  # exploration at the last step
    due_steps: int = 0  # gradient steps due but not taken yet (a learner call takes a block of them)
    evaluated_at: int = -1  # the step of the last evaluation
    stored: int = 0  # sampleable transitions in the store at the last checkpoint
    rng: dict[str, Any] | None = None  # the exploration generator's state
    train_steps: int = 0  # gradient steps taken (the optimizer's counter, for readers of the checkpoint)
    written: list[str] = dataclasses.field(default_factory=list)  # stores fit acted into (stores.place)
    datasets: list[str] = dataclasses.field(default_factory=list)  # stores learned from offline, never acted into

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> RunState:
        known = {f.name for f in dataclasses.fields(cls)}
        state = cls(**{k: v for k, v in values.items() if k in known})
        if state.evaluated_at is None:
            state.evaluated_at = -1
        if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in (state.written, state.datasets)):
            raise TypeError("written and datasets must be lists of store locations")
        return state
