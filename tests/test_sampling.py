"""Sampling beyond the basics: prioritized replay (distribution, weights, saved priorities, the sum
tree kept in step while the ring wraps), determinism, the chunk cache, the RAM budget, and samplers
on other threads while the writer adds."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import fill, fill_truth, frame, make_store, small_spaces
from groundtruth import SHAPE, check_stack, step
from groundtruth import frame as truth_frame

from replaystore import ConfigError, Layout, ReplayStore, SampleError
from replaystore.sampling.priority import SumTree
from replaystore.store import DEFAULT_CACHE_BYTES


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """Upper ``z``-sigma point (p ~ 0.001) of chi-square(df), Wilson-Hilferty approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi_square(counts: np.ndarray, expected_p: np.ndarray) -> float:
    expected = expected_p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.fixture
def prioritized(store_path: Path) -> tuple[ReplayStore, np.ndarray, np.ndarray]:
    """A wrapped store whose sampleable slots have random priorities between 0.05 and 5."""
    store = make_store(store_path, capacity=128, frame_stack=2, shard_len=32, chunk_len=4)
    fill(store, 297, episode_len=11)  # 27 whole episodes
    slots = np.flatnonzero(store.ring.valid)
    prio = np.random.default_rng(7).uniform(0.05, 5.0, slots.size)
    store.update_priorities(slots, prio)
    return store, slots, prio


def test_prioritized_draws_follow_the_priorities(prioritized) -> None:
    store, slots, prio = prioritized
    alpha = 0.7
    rng = np.random.default_rng(0)
    drawn = np.concatenate([store.sample(100, rng=rng, prioritized=True, alpha=alpha).index for _ in range(600)])
    counts = np.bincount(np.searchsorted(slots, drawn), minlength=slots.size)
    assert set(drawn.tolist()) <= set(slots.tolist())
    expected = prio**alpha / (prio**alpha).sum()
    stat, critical = chi_square(counts, expected), chi_square_critical(slots.size - 1)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}: draws do not follow p**alpha"
    # The test has power: the same counts are far from uniform, and from p**1.
    assert chi_square(counts, np.full(slots.size, 1 / slots.size)) > 5 * critical
    assert chi_square(counts, prio / prio.sum()) > critical


def test_importance_weights(prioritized) -> None:
    store, slots, prio = prioritized
    alpha, beta = 0.6, 0.4
    batch = store.sample(100, rng=np.random.default_rng(1), prioritized=True, alpha=alpha, beta=beta)
    p_all = prio**alpha / (prio**alpha).sum()
    n = slots.size
    by_slot = dict(zip(slots.tolist(), p_all.tolist(), strict=True))
    want = np.array([(n * by_slot[s]) ** -beta for s in batch.index.tolist()]) / (n * p_all.min()) ** -beta
    np.testing.assert_allclose(batch.weight, want, rtol=1e-5)
    assert batch.weight.max() <= 1.0 + 1e-6
    uniform = store.sample(64, rng=np.random.default_rng(1))
    assert np.all(uniform.weight == 1.0)


def test_new_transitions_enter_with_the_max_priority(prioritized) -> None:
    store, slots, prio = prioritized
    before = store.added
    fill(store, 5, start=10_000, episode_len=5)
    new_slots = np.arange(before, store.added - 1) % store.capacity
    new_slots = new_slots[store.ring.valid[new_slots]]
    assert new_slots.size >= 3
    np.testing.assert_allclose(store.priorities(new_slots), np.float32(prio.max()))


def test_priorities_are_saved_and_sampled_after_reopen(prioritized, store_path: Path) -> None:
    store, slots, prio = prioritized
    rng_a = np.random.default_rng(3)
    first = [store.sample(32, rng=rng_a, prioritized=True, n_step=2).index for _ in range(5)]
    store.close()
    again = ReplayStore.open(store_path)
    np.testing.assert_allclose(again.priorities(slots), prio.astype(np.float32))
    rng_b = np.random.default_rng(3)
    second = [again.sample(32, rng=rng_b, prioritized=True, n_step=2).index for _ in range(5)]
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    # A reader may reprioritize in RAM; nothing is written.
    again.update_priorities(slots[:3], np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(ReplayStore.open(store_path).priorities(slots[:3]), prio[:3].astype(np.float32))


def test_sum_tree_stays_in_step_while_the_ring_wraps(store_path: Path) -> None:
    store = make_store(store_path, capacity=96, frame_stack=3, shard_len=32, chunk_len=4)
    rng = np.random.default_rng(5)
    counter = 0
    obs = frame(counter)
    for round_ in range(60):
        for _ in range(int(rng.integers(1, 12))):  # rounds end mid-episode as often as not
            counter += 1
            nxt = frame(counter)
            done = bool(rng.random() < 0.15)
            store.add(obs, 0, 1.0, nxt, done, False)
            counter += done
            obs = frame(counter) if done else nxt
        if round_ % 7 == 3:
            store.flush()
        if len(store) >= 8:
            batch = store.sample(8, rng=rng, prioritized=True, alpha=0.5, n_step=int(rng.integers(1, 4)))
            store.update_priorities(batch.index, rng.uniform(0, 3, 8))
            tree = store._priorities.tree
            want = np.where(store.ring.valid, np.asarray(store.ring.priority, dtype=np.float64) ** 0.5, 0.0)
            np.testing.assert_allclose(tree.leaves(np.arange(store.capacity)), want, rtol=1e-12)
            assert tree.total == pytest.approx(want.sum())
            assert tree.min_leaf == pytest.approx(want[want > 0].min())
            assert np.all(store.ring.valid[batch.index])


def test_sum_tree_find_against_cumsum() -> None:
    rng = np.random.default_rng(0)
    for capacity in (1, 2, 5, 64, 65, 1000, 5000):
        values = rng.uniform(0, 1, capacity) * (rng.random(capacity) > 0.3)
        values[0] = 0.5  # a non-empty tree
        tree = SumTree(capacity, lambda slots, v=values: v[slots])
        tree.rebuild()
        assert tree.total == pytest.approx(values.sum())
        assert tree.min_leaf == values[values > 0].min()
        mass = np.concatenate([rng.uniform(0, tree.total, 500), [0.0, np.nextafter(tree.total, 0)]])
        want = np.searchsorted(np.cumsum(values), mass, side="right")
        got = tree.find(mass)
        np.testing.assert_array_equal(got[:-1], want[:-1])
        assert values[got].min() > 0  # (even the last mass, which rounding may carry past the end)
        slots = rng.integers(0, capacity, 7)
        values[slots] = rng.uniform(0, 2, 7)
        tree.refresh(slots)
        assert tree.total == pytest.approx(values.sum())


def test_same_seed_same_batches(store_path: Path) -> None:
    store = make_store(store_path, capacity=64)
    fill(store, 100)
    store.close()
    for kwargs in ({}, {"prioritized": True, "n_step": 3}):
        a = ReplayStore.open(store_path).sample(16, rng=np.random.default_rng(11), **kwargs)
        b = ReplayStore.open(store_path).sample(16, rng=np.random.default_rng(11), **kwargs)
        for field in ("obs", "next_obs", "action", "reward", "discount", "index", "weight"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def test_bad_priority_updates_are_refused(prioritized) -> None:
    store, slots, prio = prioritized
    before = store.priorities(slots)
    for index, priority, message in [
        (slots[:2], [1.0, float("nan")], "finite"),
        (slots[:2], [1.0, -1.0], ">= 0"),
        (slots[:2], [1.0], "shape"),
        ([store.capacity], [1.0], "outside"),
        ([[1, 2]], [[1.0, 2.0]], "1-D"),
        (slots[:2], [1.0, 1e39], "beyond float32"),  # (stored as float32 it would be inf: every draw would fail)
    ]:
        with pytest.raises(SampleError, match=message):
            store.update_priorities(np.asarray(index), np.asarray(priority))
    np.testing.assert_array_equal(store.priorities(slots), before)
    with pytest.raises(SampleError, match="alpha"):
        store.sample(4, prioritized=True, alpha=2.0)
    store.update_priorities(slots[:1], [3.0e38])  # (the largest float32 is kept, and draws go on)
    assert store.sample(4, prioritized=True, rng=np.random.default_rng(0)).index.shape == (4,)


def test_cache_hit_rate_and_bytes_held(store_path: Path) -> None:
    store = make_store(store_path, capacity=256, shard_len=32, chunk_len=4)
    fill(store, 250)
    store.close()
    reader = ReplayStore.open(store_path, cache_bytes=1 << 20)
    rng = np.random.default_rng(0)
    reader.sample(64, rng=rng)
    cold = reader.cache_hit_rate
    for _ in range(50):
        reader.sample(64, rng=rng)
    assert reader.cache_hit_rate > max(cold, 0.8)
    assert 0 < reader.cache_bytes_held <= 1 << 20
    warm = ReplayStore.open(store_path)
    assert warm.warm_cache() > 0 and warm.cache_bytes_held == warm.warm_cache() + warm.cache_bytes_held
    np.testing.assert_array_equal(warm.sample(64, rng=np.random.default_rng(2)).obs,
                                  reader.sample(64, rng=np.random.default_rng(2)).obs)
    assert warm.cache_hit_rate == 1.0
    assert ReplayStore.open(store_path, cache_bytes=200).warm_cache() <= 200
    tiny = ReplayStore.open(store_path, cache_bytes=0)
    batch = tiny.sample(64, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(batch.obs, reader.sample(64, rng=np.random.default_rng(0)).obs)
    assert tiny.cache_bytes_held == 0 and tiny.cache_hit_rate == 0.0


def check_batch(store: ReplayStore, batch_size: int, rng: np.random.Generator) -> None:
    """Sample a batch of 2-frame stacks and check every transition against the ground truth."""
    batch = store.sample(batch_size, rng=rng)
    for j in range(batch_size):
        k, p = check_stack(batch.obs[j], 2)
        assert check_stack(batch.next_obs[j], 2) == (k, p + 1)
        assert (batch.action[j], batch.reward[j]) == (step(k, p).action, step(k, p).reward)


def test_small_frames_are_kept_decoded(store_path: Path) -> None:
    """Frames of a few bytes: the ring is kept decoded within ``cache_bytes`` (storage/mirror.py) and
    batches come from it, exactly the ground truth's while the writer wraps the ring (each shard it
    rewrites forgotten there) and after a reopen; larger frames, or a ring over half of
    ``cache_bytes``, are decoded per batch as before."""
    store = make_store(store_path, capacity=128, frame_stack=2, shard_len=32, chunk_len=4)
    mirror = store.reader.mirror
    assert mirror is not None and mirror.nbytes == 128 * 12  # (3, 4) uint8 frames
    assert store.reader.cache.cache_bytes == DEFAULT_CACHE_BYTES - mirror.nbytes  # within cache_bytes
    assert store.memory_estimate()["chunk_cache"] == DEFAULT_CACHE_BYTES
    fill_truth(store, 40)
    rng = np.random.default_rng(0)

    def check(s: ReplayStore) -> None:
        check_batch(s, 32, rng)

    for r in range(16):  # ~6 wraps of the ring, flushed now and then
        fill_truth(store, 47, start=store.ring.added - 1)
        if r % 3 == 0:
            store.flush()
        for _ in range(4):
            check(store)
    assert mirror.valid.any()
    misses = store.reader.misses
    for _ in range(20):  # nothing written since: every frame from RAM, nothing read or decoded
        check(store)
    assert store.reader.misses == misses
    store.close()
    with ReplayStore.open(store_path) as again:
        assert again.reader.mirror is not None and not again.reader.mirror.valid.any()
        for _ in range(5):
            check(again)
        assert again.reader.mirror.valid.any()
    assert ReplayStore.open(store_path, cache_bytes=2 * 128 * 12 - 1).reader.mirror is None
    big = make_store(store_path.parent / "big.zarr", capacity=64, shape=(32, 33))  # 1,056-byte frames
    assert big.reader.mirror is None


def test_memory_budget(tmp_path: Path) -> None:
    obs_space, act_space = small_spaces((84, 84))
    path = tmp_path / "big.zarr"
    with pytest.raises(ConfigError, match="lower capacity"):
        ReplayStore.create(path, 100_000_000, obs_space, act_space, 4, memory_budget=512 * 2**20, cache_bytes=1 << 20)
    with pytest.raises(ConfigError, match="lower cache_bytes"):
        ReplayStore.create(path, 100_000, obs_space, act_space, 4, memory_budget=300 * 2**20, cache_bytes=1 << 30)
    assert not path.exists()
    with pytest.raises(ConfigError, match="memory_budget is -1"):
        ReplayStore.create(path, 100_000, obs_space, act_space, 4, memory_budget=-1)
    store = ReplayStore.create(path, 100_000, obs_space, act_space, 4, memory_budget=512 * 2**20)
    parts = store.memory_estimate()
    assert parts["scalars"] == 100_000 * 7 and parts["chunk_cache"] == 128 * 2**20  # the default: a quarter
    assert parts["cache_lookup"] == 8 * 25 * (4096 // 8)  # a slot per chunk of the 25 shards' chunk grid
    assert sum(parts.values()) <= 512 * 2**20
    store.close()
    with pytest.raises(ConfigError, match="lower cache_bytes"):
        ReplayStore.open(path, memory_budget=100 * 2**20, cache_bytes=2**30)


@pytest.mark.parametrize("mirrored", [True, False], ids=["decoded-kept", "decoded-per-batch"])
def test_samplers_on_other_threads_while_adding(store_path: Path, mirrored: bool) -> None:
    """Frames spell their step (tests/groundtruth.py); every transition of every batch drawn while the
    writer adds and wraps must be exactly the ground truth's: its stack, its next stack, its move;
    with small frames kept decoded (mirror.py) or decoded per batch."""
    obs_space, act_space = small_spaces(SHAPE)
    store = ReplayStore.create(store_path, 128, obs_space, act_space, 2, layout=Layout(shard_len=32, obs_chunk_len=4),
                               cache_bytes=None if mirrored else 2 * 128 * 12 - 1)
    assert (store.reader.mirror is not None) == mirrored
    fill_truth(store, 40)
    errors: list[BaseException] = []
    stop = threading.Event()
    counts = [0, 0]

    def sampler(i: int) -> None:
        rng = np.random.default_rng(i)
        try:
            while not stop.is_set():
                batch = store.sample(16, rng=rng, prioritized=bool(i))
                for j in range(16):
                    k, p = check_stack(batch.obs[j], 2)
                    assert check_stack(batch.next_obs[j], 2) == (k, p + 1)
                    assert (batch.action[j], batch.reward[j]) == (step(k, p).action, step(k, p).reward)
                counts[i] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=sampler, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        fill_truth(store, 1500, start=store.ring.added - 1)  # the stream goes on, wrapping the ring ~14 times
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    assert min(counts) > 0


def test_layout_rejects_nothing_new(store_path: Path) -> None:
    assert Layout(16, 4).shard_len == 16
    assert frame(1).shape == (3, 4)


def test_block_plans_match_batch_by_batch_reads(store_path: Path) -> None:
    """``plan_many`` (one unique and one cache pass for several batches, as the prefetcher plans its
    blocks) reads exactly what separate ``gather`` calls read, with part of every batch in the
    shard the writer holds in RAM, chunks shared between batches, and ``obs``/``next_obs`` kept apart."""
    store = make_store(store_path, capacity=64, frame_stack=3, shard_len=16, chunk_len=4)
    fill_truth(store, 90)  # wrapped; the newest steps are still in the shard the writer holds in RAM
    reader, ring = store.reader, store.ring
    assert reader.live_regions()
    rng = np.random.default_rng(5)
    k, n = 4, 6

    def truth(positions: np.ndarray) -> np.ndarray:
        return np.stack([truth_frame(0, int(p)) for p in positions.ravel()]).reshape(*positions.shape, *SHAPE)

    sampleable = np.array([p for p in range(ring.lo, ring.added) if ring.valid[p % ring.capacity]])
    for _ in range(20):
        positions = sampleable[rng.integers(0, sampleable.size, (k, 2, n))]  # (stacks within the live steps)
        stacks = ring.stack_positions(positions.ravel()).reshape(k, 2, n, -1)
        obs = np.empty((k, n, stacks.shape[-1], *reader.shape), reader.dtype)
        nxt = np.empty_like(obs)
        plans = reader.plan_many(stacks, [[obs[i], nxt[i]] for i in range(k)])
        for i, plan in enumerate(plans):
            reader.finish(plan)
            np.testing.assert_array_equal(obs[i], truth(stacks[i][0]))
            np.testing.assert_array_equal(nxt[i], truth(stacks[i][1]))
    single = reader.plan(stacks[0])  # one array out, the plain sampler's way
    np.testing.assert_array_equal(reader.finish(single), truth(stacks[0]))
    store.close()


@pytest.mark.parametrize("mirrored", [True, False], ids=["decoded-kept", "decoded-per-batch"])
def test_frames_read_while_the_writer_fills_its_shard(store_path: Path, mirrored: bool) -> None:
    """The shard the writer is filling stays in RAM compressed, one chunk raw (openshard.py), and the
    reader serves its frames from there: sampled after every move, every frame is the ground truth's,
    through wraps of the ring, flushes in the middle of a chunk, and a reopen in the middle of a shard
    (its chunks loaded back and each decoded when the writer reaches it), with small frames kept
    decoded (mirror.py: a chunk leaves it when the writer opens it) or decoded per batch."""
    obs_space, act_space = small_spaces(SHAPE)
    cache = None if mirrored else 2 * 128 * 12 - 1  # a decoded ring of 128 frames needs twice its size
    store = ReplayStore.create(store_path, 128, obs_space, act_space, 2, layout=Layout(shard_len=32, obs_chunk_len=4),
                               cache_bytes=cache)
    assert (store.reader.mirror is not None) == mirrored
    rng = np.random.default_rng(3)

    def check(s: ReplayStore) -> None:
        check_batch(s, 32, rng)

    fill_truth(store, 70)
    for i in range(400):  # ~3 wraps
        fill_truth(store, 1, start=store.ring.added - 1)
        check(store)
        if i % 11 == 5:
            store.flush()  # (the open chunk is written without being sealed)
        if i == 250:
            added = store.ring.added
            store.close()
            store = ReplayStore.open(store_path, mode="a", cache_bytes=cache)
            assert store.ring.added == added and store.writers[0].shards.frames.open_index == -1
            check(store)
    writer = store.writers[0].shards
    assert writer.frames.open_index >= 0 and any(c is not None for c in writer.frames.chunks)
    np.testing.assert_array_equal(  # the open shard as a whole: each slot the truth's newest frame there
        writer.frames.decoded().reshape(32, -1)[:, :3],
        np.stack([truth_frame(0, max(p for p in range(store.ring.added) if p % 128 == s)).reshape(-1)[:3]
                  for s in range(writer.region * 32, writer.region * 32 + 32)]))
    store.close()
