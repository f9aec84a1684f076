"""import-dopamine: Dopamine's replay checkpoints into a store, sampled as Dopamine's buffer samples them.

The checkpoints are written in Dopamine's exact format (tests/dopamine_format.py); every transition
the store can sample is compared, bits and all, with every one Dopamine's buffer can sample from
the checkpoints (stacks, action, n-step return, next stack, terminal)."""

from __future__ import annotations

import gzip
import os
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from dopamine_format import DopamineBuffer, play

from replaystore import ReplayStore
from replaystore.cli.main import main
from replaystore.errors import ConfigError, CorruptStoreError, StoreExistsError
from replaystore.integrations.dopamine import store_from_dopamine
from replaystore.sampling.assemble import Batch, prepare
from replaystore.sampling.draws import accept
from replaystore.sampling.samplers import UniformSampler


class _Every(UniformSampler):
    """Every transition the store can sample with ``n_step``, once each."""

    def plan(self, rings, reader, batch_size, rng, *, batches=1, out=None):  # type: ignore[no-untyped-def]
        lo, hi = rings.live_ranges()
        positions = np.concatenate([np.arange(a, b + 1, dtype=np.int64) for a, b in zip(lo, hi, strict=True)])
        positions = positions[accept(rings, positions, self.n_step)]
        return prepare(rings, reader, positions, n_step=self.n_step, gamma=self.gamma, result=Batch)


def store_transitions(path: Path, n_step: int = 1, gamma: float = 0.99) -> Counter:
    with ReplayStore.open(path) as store:
        batch = store.sample(1, sampler=_Every(n_step=n_step, gamma=gamma))
    return Counter((batch.obs[i].tobytes(), int(batch.action[i]), batch.reward[i].tobytes(),
                    batch.next_obs[i].tobytes(), bool(batch.terminated[i])) for i in range(len(batch)))


def dopamine_transitions(snapshots: list[DopamineBuffer]) -> dict[int, tuple]:
    """Row -> transition over every snapshot (a row two snapshots both sample is the same in both)."""
    out: dict[int, tuple] = {}
    for buffer in snapshots:
        for index in buffer.valid_indices():
            state, action, reward, following, terminal, row = buffer.transition(index)
            item = (state, action, np.float32(reward).tobytes(), following, terminal)
            assert out.setdefault(row, item) == item
    return out


def newest_ends(buffer: DopamineBuffer) -> int:
    """The newest ``horizon`` rows whose episode ended within them: their n-step transition is whole,
    and the store samples it; Dopamine's buffer waits for more adds (they are in its invalid range)."""
    cap, k, n, cursor = buffer.capacity, buffer.stack, buffer.horizon, buffer.cursor()
    count = 0
    for back in range(1, n + 1):
        i = (cursor - back) % cap
        ended = buffer.terminal[[(i + j) % cap for j in range(back)]].any()
        crossing = buffer.terminal[[(i - k + 1 + j) % cap for j in range(k - 1)]].any()
        count += int(ended and not crossing)
    return count


def record(folder: Path, *, capacity: int, stack: int, horizon: int, every: int, saves: int, seed: int,
           keep: list[int] | None = None) -> list[DopamineBuffer]:
    """A run whose buffer is saved every ``every`` adds ``saves`` times; returns a copy at each save."""
    rng = np.random.default_rng(seed)
    buffer = DopamineBuffer(capacity, stack, horizon)
    snapshots, t = [], 0
    for number in range(saves):
        t = play(buffer, rng, every, start=t)
        if keep is None or number in keep:
            buffer.save(folder, number)
            snap = DopamineBuffer(capacity, stack, horizon)
            snap.__dict__.update({k: np.copy(v) if isinstance(v, np.ndarray) else v for k, v in buffer.__dict__.items()})
            snapshots.append(snap)
    return snapshots


@pytest.mark.parametrize(("capacity", "every", "saves", "horizon", "keep", "seed"), [
    (400, 150, 1, 1, None, 3),  # one checkpoint, not full
    (120, 50, 6, 1, None, 3),  # overlapping checkpoints of a wrapped ring
    pytest.param(120, 50, 6, 3, None, 3, marks=pytest.mark.slow),  # the same with 3-step returns (the default
    # run keeps 3-step returns in test_gaps_between_saves[3])
    (120, 50, 7, 1, [3, 4, 5, 6], 4),  # the oldest checkpoints gone: the run's start is not held
    pytest.param(120, 50, 7, 3, [3, 4, 5, 6], 6, marks=pytest.mark.slow),
])
def test_every_transition_is_what_dopamine_samples(tmp_path, capacity, every, saves, horizon, keep, seed):
    snaps = record(tmp_path / "run", capacity=capacity, stack=4, horizon=horizon, every=every, saves=saves, seed=seed,
                   keep=keep)
    r = store_from_dopamine([tmp_path / "run"], tmp_path / "s.zarr")
    want = Counter(dopamine_transitions(snaps).values())
    got = store_transitions(tmp_path / "s.zarr", n_step=horizon)
    assert not want - got
    assert sum((got - want).values()) == newest_ends(snaps[-1])  # (see newest_ends)
    assert len(want) > 100
    (run,) = r.runs
    assert run.gaps == 0 and run.checkpoints == len(snaps)
    held = sum(min(int(s.add_count), capacity) for s in snaps)
    assert run.shared == held - (int(snaps[-1].add_count) - max(0, int(snaps[0].add_count) - capacity))


@pytest.mark.parametrize("horizon", [1, 3])
def test_gaps_between_saves(tmp_path, horizon):
    """Saves further apart than the ring: the rows in between are gone; every transition Dopamine
    samples is still there, plus only the few the docs name (k - 1 after each gap, n - 1 before)."""
    snaps = record(tmp_path / "run", capacity=100, stack=4, horizon=horizon, every=130, saves=5, seed=5)
    r = store_from_dopamine([tmp_path / "run"], tmp_path / "s.zarr")
    want = Counter(dopamine_transitions(snaps).values())
    got = store_transitions(tmp_path / "s.zarr", n_step=horizon)
    assert r.runs[0].gaps == 4 and r.runs[0].rows_lost == 4 * 30
    assert not want - got  # every transition Dopamine's buffer samples
    assert 0 < sum((got - want).values()) <= (3 + horizon - 1) * 4 + sum(newest_ends(s) for s in snaps)


def test_runs_as_streams_and_the_cli(tmp_path, capsys):
    a = record(tmp_path / "a" / "replay_logs", capacity=90, stack=4, horizon=1, every=40, saves=4, seed=1)
    b = record(tmp_path / "b", capacity=90, stack=4, horizon=1, every=70, saves=2, seed=2)
    assert main(["import-dopamine", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "s.zarr"),
                 "--quiet"]) == 0
    said = capsys.readouterr().out
    assert "2 runs" in said and "stream 1" in said
    with ReplayStore.open(tmp_path / "s.zarr") as store:
        assert store.num_streams == 2 and store.frame_stack == 4
    want = Counter(dopamine_transitions(a).values()) + Counter(dopamine_transitions(b).values())
    got = store_transitions(tmp_path / "s.zarr")
    assert not want - got and sum((got - want).values()) == newest_ends(a[-1]) + newest_ends(b[-1])
    assert main(["inspect", str(tmp_path / "s.zarr")]) == 0


def test_refusals_leave_nothing(tmp_path, capsys):
    record(tmp_path / "run", capacity=60, stack=4, horizon=1, every=30, saves=2, seed=4)
    dst = tmp_path / "s.zarr"

    def refused(*runs: Path, error: type = CorruptStoreError) -> str:
        with pytest.raises(error) as info:
            store_from_dopamine(list(runs), dst)
        assert not dst.exists() and not any(p.name.startswith(".s.zarr") for p in tmp_path.iterdir())
        return str(info.value)

    assert "holds no Dopamine replay checkpoint" in refused(tmp_path, error=ConfigError)
    (tmp_path / "run" / "add_count_ckpt.1.gz").rename(tmp_path / "gone.gz")
    assert "lacks add_count_ckpt.1.gz" in refused(tmp_path / "run", error=ConfigError)
    (tmp_path / "gone.gz").rename(tmp_path / "run" / "add_count_ckpt.1.gz")

    def swap(name: str, data: bytes) -> bytes:
        path = tmp_path / "run" / name
        old = path.read_bytes()
        path.write_bytes(data)
        return old

    # a pickle where an array should be: refused, never unpickled
    old = swap("add_count_ckpt.1.gz", gzip.compress(pickle.dumps(os.system)))
    assert "not a gzip'd .npy" in refused(tmp_path / "run")
    swap("add_count_ckpt.1.gz", old)
    # an object array
    buf = __import__("io").BytesIO()
    np.save(buf, np.array([1, "x"], dtype=object), allow_pickle=True)
    old = swap("$store$_reward_ckpt.0.gz", gzip.compress(buf.getvalue()))
    assert "numbers only" in refused(tmp_path / "run")
    swap("$store$_reward_ckpt.0.gz", old)
    # a header that declares a ring of a billion frames (a small file): refused before anything is read
    header = __import__("io").BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (2**30, 6, 5)})
    old = swap("$store$_observation_ckpt.0.gz", gzip.compress(header.getvalue()))
    assert "declares a ring of 1,073,741,824 rows" in refused(tmp_path / "run", error=ConfigError)
    swap("$store$_observation_ckpt.0.gz", old)
    # observations cut short: found while the frames are read, after the store was begun
    old = swap("$store$_observation_ckpt.1.gz", gzip.compress(gzip.decompress(
        (tmp_path / "run" / "$store$_observation_ckpt.1.gz").read_bytes())[:-100]))
    assert "cut short" in refused(tmp_path / "run") or "ends" in refused(tmp_path / "run")
    swap("$store$_observation_ckpt.1.gz", old)
    # a FIFO in a file's place is refused at once, not waited on
    fifo = tmp_path / "run" / "invalid_range_ckpt.0.gz"
    old = fifo.read_bytes()
    fifo.unlink()
    os.mkfifo(fifo)
    assert "not a regular file" in refused(tmp_path / "run", error=OSError)
    fifo.unlink()
    fifo.write_bytes(old)
    # two runs in one folder
    other = record(tmp_path / "other", capacity=60, stack=4, horizon=1, every=30, saves=3, seed=9)
    assert other
    (tmp_path / "other" / "$store$_action_ckpt.2.gz").rename(tmp_path / "run" / "$store$_action_ckpt.1.gz")
    assert "not from one run" in refused(tmp_path / "run")
    # the destination exists
    record(tmp_path / "ok", capacity=60, stack=4, horizon=1, every=30, saves=1, seed=4)
    dst.mkdir()
    with pytest.raises(StoreExistsError):
        store_from_dopamine([tmp_path / "ok"], dst)
    assert main(["import-dopamine", str(tmp_path / "ok"), str(dst)]) == 1
    assert capsys.readouterr().err.startswith("error: ") and list(dst.iterdir()) == []


def test_fit_offline_learns_from_the_import(tmp_path):
    """The imported store is an ordinary one: DQN.fit_offline takes gradient steps from it."""
    from replaystore.trainer import DQN, mlp

    record(tmp_path / "run", capacity=200, stack=4, horizon=1, every=150, saves=2, seed=7)
    store_from_dopamine([tmp_path / "run"], tmp_path / "s.zarr")
    agent = DQN(mlp((4, 6, 5), 6, hidden_sizes=(16,)), tmp_path / "s.zarr", batch_size=16, train_frequency=1,
                steps_per_call=8, cql_alpha=1.0)
    history = agent.fit_offline(32)
    agent.close()
    assert np.isfinite(history.history["loss"]).all()
