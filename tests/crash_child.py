"""Child process for the crash tests: appends deterministic transitions forever, flushing at random.

Usage: python crash_child.py STORE LOG SEED. Every step's content is a function of its position, so
a killed child's store can be checked, and a new child continues it exactly. After each flush the
committed ``added`` is appended to LOG (fsynced): the parent checks that much survived. Once the
child has committed something of its own it prints ``writing`` (the parent kills only after that).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from frames import frame  # noqa: E402 - (not conftest: its torch import costs ~3 s a child)

from replaystore import Layout, ReplayStore  # noqa: E402
from replaystore.errors import StoreLockedError, StoreNotFoundError  # noqa: E402

SHAPE = (8, 8)
CAPACITY, SHARD, CHUNK, STACK = 256, 32, 4, 3


def move(h: int) -> tuple[int, float, bool, bool]:
    """Action, reward, terminated, truncated of the move made from step ``h``."""
    end = (h * 2654435761) % 97 < 5
    return h % 4, float(h % 7) - 3.0, end and h % 2 == 0, end and h % 2 == 1


#: the extras each move carries (format/extras.py), functions of the step it is made from
EXTRAS = {"h": "int64", "half": ((2,), "float32")}


def move_extras(h: int) -> dict[str, object]:
    return {"h": h, "half": [h / 2, -h / 2]}


def main(path: str, log: str, seed: int) -> None:
    import gymnasium as gym

    rng = np.random.default_rng(seed)
    # a store at a URL: the lease of a killed child expires after CRASH_LEASE_TTL seconds; wait for it
    options = {"lease_ttl": float(os.environ["CRASH_LEASE_TTL"])} if "://" in path else None
    while True:
        try:
            store = ReplayStore.open(path, mode="a", storage_options=options)
            break
        except StoreNotFoundError:
            store = ReplayStore.create(path, CAPACITY, gym.spaces.Box(0, 255, SHAPE, np.uint8), gym.spaces.Discrete(4),
                                       STACK, layout=Layout(shard_len=SHARD, obs_chunk_len=CHUNK),
                                       storage_options=options, extras=EXTRAS)
            break
        except StoreLockedError:
            time.sleep(0.2)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    started, ready = store.committed.added, False
    while True:
        h = store.added - 1 if store.episode_in_progress else store.added
        action, reward, term, trunc = move(h)
        store.add(frame(h, SHAPE), action, reward, frame(h + 1, SHAPE), term, trunc, extras=move_extras(h))
        if rng.random() < 0.02:
            store.flush()
            os.write(fd, f"{store.committed.added}\n".encode())
            os.fsync(fd)
        if not ready and store.committed.added > started:  # the handshake: this child has committed
            sys.stdout.write("writing\n")
            sys.stdout.flush()
            ready = True


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
