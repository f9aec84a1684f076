"""Which stream of the store each of TorchRL's transitions goes to (records.py's ``Records``
writes them): ``Chains`` follows each stream's episode in progress.

A collector's batch of ``n`` envs flattened to ``[n * T]`` holds ``n`` runs of consecutive
transitions. A transition goes to the stream whose last next observation it continues (the same
bytes: a stack continued is rebuilt from the bytes stored before), or, if it starts an episode, to a
stream whose episode ended (the one with the fewest steps, so the streams fill evenly). A stack that
neither continues a stream nor starts an episode cannot be rebuilt from frames and is refused.
"""

from __future__ import annotations

import numpy as np

from replaystore.errors import InvalidTransitionError


class Chains:
    """The store's ``n`` streams as ``assign`` sees them; ``describe``: the stack layout, for messages."""

    def __init__(self, n: int, describe: str = "") -> None:
        self.streams = [_Stream() for _ in range(n)]
        self.describe = describe

    def assign(self, obs: np.ndarray, nxt: np.ndarray, done: np.ndarray, padded: np.ndarray, chained: np.ndarray,
               seq: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's stream, and whether its stream's episode must be ended first (see the module
        docstring); the streams' states move on to the end of the batch."""
        state = self.streams
        rows = len(obs)
        assigned = np.empty(rows, dtype=np.int64)
        ends = np.zeros(rows, dtype=bool)
        for i in range(rows):
            s = -1
            if i and chained[i] and state[assigned[i - 1]].open:
                s = int(assigned[i - 1])  # continues the row before (the same env's run)
            if s < 0:
                s = next((k for k, st in enumerate(state) if st.open and same_bytes(obs[i], st.last)), -1)
            if s < 0:
                if not padded[i]:
                    raise InvalidTransitionError(
                        f"row {i}'s observation neither continues an episode the store holds nor starts a new one "
                        f"({self.describe}), so the store could not rebuild it from "
                        f"frames; nothing was written. Pass streams= the number of envs your collector steps (the "
                        f"store has {len(state)}), or frame_stack=1 to store whole observations")
                free = [k for k, st in enumerate(state) if not st.open]
                if free:
                    s = min(free, key=lambda k: state[k].steps)
                else:  # none free: end the episode of the stream written least lately
                    s = min(range(len(state)), key=lambda k: state[k].when)
                    ends[i] = True
            assigned[i] = s
            st = state[s]
            st.open, st.last, st.steps, st.when = not done[i], nxt[i], st.steps + 1, seq + i
        for k in set(assigned.tolist()):  # (the batch's memory may be the collector's, reused)
            last = state[k].last
            state[k].last = None if last is None else last.copy()
        return assigned, ends


class _Stream:
    """Where a stream stands for ``Chains.assign``: its episode open or not, its last next observation, its
    steps and the ``rb.seq`` it was last written at."""

    __slots__ = ("open", "last", "steps", "when")

    def __init__(self) -> None:
        self.open = False
        self.last: np.ndarray | None = None
        self.steps = 0
        self.when = -1


def continues(obs: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    """Row ``i``'s observation has the bytes of row ``i - 1``'s next one (row 0: False). Bytes, not
    values: a stack continued is rebuilt from the bytes stored before (-0.0 is not 0.0 here)."""
    out = np.zeros(len(obs), dtype=bool)
    if len(obs) > 1:
        a = np.ascontiguousarray(obs[1:]).view(np.uint8).reshape(len(obs) - 1, -1)
        b = np.ascontiguousarray(nxt[:-1]).view(np.uint8).reshape(len(obs) - 1, -1)
        out[1:] = (a == b).all(axis=1)
    return out


def count_envs(obs: np.ndarray, nxt: np.ndarray, done: np.ndarray) -> int:
    """The envs a collector's first batch (``[envs * time]``, flattened) comes from: one run of
    consecutive transitions each, broken where a row neither follows the row before nor starts
    after an episode's end."""
    chained = continues(obs, nxt)
    breaks = ~chained[1:] & ~done[:-1]
    return int(breaks.sum()) + 1




def same_bytes(a: np.ndarray, b: np.ndarray | None) -> bool:
    return b is not None and a.shape == b.shape and a.tobytes() == b.tobytes()
