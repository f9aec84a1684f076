"""Cross-check import-dopamine against Dopamine itself (dopamine-rl 4.1.2's TF ``OutOfGraphReplayBuffer``).

Dopamine's buffer writes the checkpoints (``add``, ``save``, which also deletes checkpoints four
saves old); every index it accepts (``is_valid_transition`` over ``sample_index_batch``'s range)
is sampled with ``sample_transition_batch(indices=[i])``, over the checkpoints left on disk; the
store made by ``store_from_dopamine`` must hold each of those transitions (state stack, action,
n-step reward, next stack, terminal). Prints, per case, the transitions missing from the store
and those it has beyond Dopamine's (docs/cli.md names the few it samples at gaps).

Dopamine is not a test dependency (its TF module needs gin, and its package pins gym <= 0.25):

    python -m venv --system-site-packages /tmp/dopvenv
    /tmp/dopvenv/bin/pip install gin-config && /tmp/dopvenv/bin/pip install --no-deps dopamine-rl==4.1.2
    /tmp/dopvenv/bin/python tools/dopamine_crosscheck.py

Measured 2026-11-28: every case equal at n = 1 (a gap's 3 + 1 extra moves as documented); at n = 3
only the last bit of some returns differs: Dopamine 4 sums the discounted rewards in float32
(``np.sum``), the buffer of the dataset's time with ``.dot`` (float32 products summed in float64
below 32 terms), which the store does.
"""

import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_dopamine  # noqa: E402  (store_transitions: every transition a store can sample)
from dopamine.tf.replay_memory.circular_replay_buffer import OutOfGraphReplayBuffer  # noqa: E402

from replaystore.integrations.dopamine import store_from_dopamine  # noqa: E402

STACK = 4
CASES = [  # capacity, adds between saves, saves, update horizon, seed, the saves kept (None: all)
    (400, 150, 1, 1, 3, None), (120, 50, 6, 1, 3, None), (120, 50, 6, 3, 3, None), (120, 50, 7, 1, 4, [3, 4, 5, 6]),
    (100, 130, 5, 1, 5, None), (100, 130, 5, 3, 5, None)]


def sampled(buf: OutOfGraphReplayBuffer, capacity: int, horizon: int) -> dict[int, tuple]:
    """Row -> transition for every index Dopamine's buffer can sample now."""
    names = [e.name for e in buf.get_transition_elements(1)]
    cursor, out = buf.cursor(), {}
    drawn = range(cursor - capacity + STACK - 1, cursor - horizon) if buf.is_full() else range(STACK - 1,
                                                                                                  cursor - horizon)
    for index in sorted({raw % capacity for raw in drawn}):
        if not buf.is_valid_transition(index):
            continue
        got = buf.sample_transition_batch(1, indices=[index])
        state, action, reward, following = got[:4]
        terminal = got[names.index("terminal")]
        row = int(buf.add_count) - ((cursor - index) % capacity or capacity)
        out[row] = (np.moveaxis(state[0], -1, 0).tobytes(), int(action[0]), np.float32(reward[0]).tobytes(),
                    np.moveaxis(following[0], -1, 0).tobytes(), bool(terminal[0]))
    return out


def without_reward(c: Counter) -> Counter:
    return Counter({(k[0], k[1], k[3], k[4]): v for k, v in c.items()})


def run(capacity: int, every: int, saves: int, horizon: int, seed: int, keep: list[int] | None) -> int:
    tmp = Path(tempfile.mkdtemp())
    (tmp / "run").mkdir()
    rng = np.random.default_rng(seed)
    buf = OutOfGraphReplayBuffer((6, 5), STACK, capacity, 32, update_horizon=horizon, gamma=0.99)
    by_number, t = {}, 0
    for number in range(saves):
        begun = int(buf.add_count)
        while int(buf.add_count) - begun < every:
            t += 1
            frame = rng.integers(1, 255, (6, 5), dtype=np.uint8)
            frame.flat[0] = t % 251 + 1
            buf.add(frame, int(rng.integers(0, 6)), float(rng.choice([0.0, 0.0, 1.0, -1.0, 4.0, 7.0, 0.3])),
                    int(rng.random() < 1 / 9))
        if keep is None or number in keep:
            buf.save(str(tmp / "run"), number)
            by_number[number] = sampled(buf, capacity, horizon)
    on_disk = sorted({int(f.name.split(".")[-2]) for f in (tmp / "run").glob("add_count_ckpt.*.gz")})
    want: dict[int, tuple] = {}
    for number in on_disk:
        for row, item in by_number[number].items():
            assert want.setdefault(row, item) == item, row
    store_from_dopamine([tmp / "run"], tmp / "s.zarr")
    got = test_dopamine.store_transitions(tmp / "s.zarr", n_step=horizon)
    expected = Counter(want.values())
    missing, extra = sum((expected - got).values()), sum((got - expected).values())
    bits = sum((without_reward(expected) - without_reward(got)).values())
    print(f"ring {capacity}, a save every {every} adds, checkpoints {on_disk}, n {horizon}: Dopamine samples "
          f"{len(want)}, the store {sum(got.values())}; missing from the store {missing} ({missing - bits} of them "
          f"by the reward's last bits alone), more in the store {extra}", flush=True)
    return bits


def main() -> int:
    other = sum(run(*case) for case in CASES)
    print(f"transitions that differ in more than the reward's last bits: {other}")
    return 1 if other else 0


if __name__ == "__main__":
    sys.exit(main())
