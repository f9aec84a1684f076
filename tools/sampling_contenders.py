"""The sampling benchmark's contenders, each run in a child process by bench_sampling.py (so that
its peak RSS is its own): the store's sampler, the in-RAM ring, the tutorial deque and ``as_dataset``.
Each ``child_*`` returns a dict of what it measured; bench_sampling.py prints and compares them."""

from __future__ import annotations

import collections
import random
import threading
import time
from pathlib import Path

import numpy as np
from atari_frames import OUT

BATCH = 32
STACK = 4
STORE = OUT / "bench_sampling.zarr"


def pss_mb(pid: int) -> float:
    """A process's proportional set size: its private memory plus its share of memory it shares (the
    decode processes' frame blocks, which this one maps too, are split between those that touched
    them, so summing it over processes counts them once)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -------------------------------------------------------------------------------------------------
# Contenders (each in a child process)


def run_threads(sample_once, threads: int, seconds: float, cpu: dict | None = None) -> float:
    """Batches/s of ``threads`` threads each calling ``sample_once(rng)`` for ``seconds``; ``cpu`` (a
    dict) receives the process's CPU microseconds per batch over the timed part."""
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def work(i: int) -> None:
        rng = np.random.default_rng(100 + i)
        try:
            for _ in range(20):
                sample_once(rng)
        except BaseException:
            start.abort()  # do not leave the others waiting at the barrier
            raise
        start.wait()
        while time.perf_counter() < stop_at[0]:
            sample_once(rng)
            counts[i] += 1

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    stop_at[0] = time.perf_counter() + 1e9
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    stop_at[0] = t0 + seconds
    for t in pool:
        t.join()
    if cpu is not None:
        cpu["cpu_us_per_batch"] = (time.process_time() - c0) / max(sum(counts), 1) * 1e6
    return sum(counts) / (time.perf_counter() - t0)


def child_store(threads: int, seconds: float, prioritized: bool, batch: int = BATCH) -> dict:
    from replaystore import ReplayStore

    store = ReplayStore.open(STORE)
    t0 = time.perf_counter()
    warmed = store.warm_cache()
    warm_s = time.perf_counter() - t0
    if prioritized:
        slots = np.flatnonzero(store.ring.valid)
        store.update_priorities(slots, np.random.default_rng(0).uniform(0.01, 2.0, slots.size))
    cpu: dict = {}
    rate = run_threads(lambda rng: store.sample(batch, rng=rng, prioritized=prioritized), threads, seconds, cpu)
    return {"batches_per_s": rate, "transitions_per_s": rate * batch, "cache_hit_rate": store.cache_hit_rate,
            "cache_mb": store.cache_bytes_held / 2**20, "warm_cache_mb": warmed / 2**20, "warm_cache_s": warm_s, **cpu}


def child_sequences(threads: int, seconds: float, length: int, windows: int) -> dict:
    """``sample_sequences(windows, length)``: ``windows * length`` transitions a call, their stacks built
    as ``sample`` builds them (and one more stack a window)."""
    from replaystore import ReplayStore

    store = ReplayStore.open(STORE)
    store.warm_cache()
    if not hasattr(store, "sample_sequences"):
        return {"batches_per_s": 0.0, "transitions_per_s": 0.0, "missing": True}
    cpu: dict = {}
    rate = run_threads(lambda rng: store.sample_sequences(windows, length, rng=rng), threads, seconds, cpu)
    return {"batches_per_s": rate, "transitions_per_s": rate * windows * length, **cpu}


def store_frames(transitions: int):
    """Yield ``(positions, frames, ep_step, is_last)`` blocks of the benchmark store, oldest first, so
    the baselines hold exactly the store's frames without loading the recording (whose RAM would
    count in their peak RSS)."""
    from replaystore import ReplayStore

    store = ReplayStore.open(STORE)
    ring = store.ring
    lo = ring.lo
    end = min(ring.added, lo + transitions + 1)
    for start in range(lo, end, 8192):
        positions = np.arange(start, min(start + 8192, end), dtype=np.int64)
        slots = positions % ring.capacity
        yield positions - lo, store.reader.gather(positions), ring.ep_step[slots].astype(np.int64), ring.is_last[slots].copy()
    store.close()


def child_ring(threads: int, seconds: float, transitions: int) -> dict:
    """A numpy ring in RAM holding each frame once: the store's frames, the same stacking rules."""
    frames = np.empty((transitions + 1, 84, 84), np.uint8)
    ep_step = np.zeros(transitions + 1, np.int64)
    is_last = np.zeros(transitions + 1, bool)
    for offsets_, block, ep, last in store_frames(transitions):
        frames[offsets_] = block
        ep_step[offsets_] = ep
        is_last[offsets_] = last
    n = int(offsets_[-1]) + 1
    ok = np.flatnonzero(~is_last[: n - 1] & (np.arange(n - 1) >= STACK))
    offsets = np.arange(STACK - 1, -1, -1)
    local = threading.local()

    def sample_once(rng: np.random.Generator) -> tuple:
        # Output buffers reused per thread: a fresh 0.9 MB pair per batch measured ~10x slower here
        # (page faults), and the ceiling should be a good ring, not a naive one.
        if not hasattr(local, "obs"):
            local.obs = np.empty((BATCH, STACK, 84, 84), np.uint8)
            local.next_obs = np.empty((BATCH, STACK, 84, 84), np.uint8)
        t = ok[rng.integers(0, ok.size, BATCH)]
        stacks = t[:, None] - np.minimum(offsets[None, :], ep_step[t][:, None])
        nxt = t + 1
        next_stacks = nxt[:, None] - np.minimum(offsets[None, :], ep_step[nxt][:, None])
        # mode="clip" (indices are in range): the default "raise" gathers into a temporary copy of
        # ``out`` first, ~3x slower; the store's reader does the same.
        np.take(frames, stacks, axis=0, out=local.obs, mode="clip")
        np.take(frames, next_stacks, axis=0, out=local.next_obs, mode="clip")
        return local.obs, local.next_obs

    return {"batches_per_s": run_threads(sample_once, threads, seconds)}


def child_deque(threads: int, seconds: float, transitions: int) -> dict:
    """The tutorial baseline: a deque of (state, action, reward, next_state, done) of stacked frames;
    consecutive transitions share the state array, as ``state = next_state`` does in that code."""
    memory: collections.deque = collections.deque(maxlen=transitions)
    window: collections.deque = collections.deque(maxlen=STACK)
    prev_next = None
    for _, block, ep, last in store_frames(transitions):
        for i in range(block.shape[0]):
            if ep[i] == 0 or prev_next is None:  # an episode starts (or the store's oldest step is mid-episode)
                window.extend([block[i]] * STACK)
                prev_next = np.stack(window)
            else:
                window.append(block[i])
                state, prev_next = prev_next, np.stack(window)
                memory.append((state, 0, 0.0, prev_next, bool(last[i])))

    def sample_once(rng: np.random.Generator) -> tuple:
        batch = random.sample(memory, BATCH)
        states, actions, rewards, next_states, dones = zip(*batch, strict=True)
        return np.array(states), np.array(actions), np.array(rewards), np.array(next_states), np.array(dones)

    return {"batches_per_s": run_threads(sample_once, threads, seconds), "transitions": len(memory)}


def child_tfdata(threads: int, seconds: float, batches_per_call: int, bridge_only: bool = False,
                 in_graph: bool = False, processes: bool | None = None) -> dict:
    """``as_dataset`` iterated by an empty consumer: a Python ``next`` per batch, or (``in_graph``) a
    ``tf.function`` that pulls 64 batches per call the way Keras's ``fit`` and a compiled training
    step do, so that no Python runs per batch on the consumer's side. ``bridge_only``: the
    prefetcher hands over a few blocks drawn beforehand, over and over, so only TensorFlow's side
    (the ``numpy_function`` call, the slicing and the consumer's ``next``) is measured."""
    from replaystore import ReplayStore

    store = ReplayStore.open(STORE)
    store.warm_cache()
    import tensorflow as tf  # imported here so its start-up is not timed

    ds = store.as_dataset(BATCH, threads=threads, batches_per_call=batches_per_call, prefetch=16, seed=0,
                          processes=processes)
    if bridge_only:
        prefetcher = ds.prefetcher
        blocks = [prefetcher.next_block() for _ in range(4)]
        turn = iter(range(1 << 62))
        prefetcher.next_block = lambda: blocks[next(turn) % len(blocks)]  # fetch() looks it up per call
    it = iter(ds)
    per_call = 64 if in_graph else 1

    @tf.function
    def pull() -> tf.Tensor:  # an empty consumer inside the graph: only the loop and one scalar per batch
        total = tf.constant(0, tf.int64)
        for _ in tf.range(per_call):
            total += next(it)["index"][0]
        return total

    step = pull if in_graph else (lambda: next(it))
    for _ in range(200 // per_call):
        step()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        step()
        n += per_call
    result = {"batches_per_s": n / (time.perf_counter() - t0), "cpu_us_per_batch": (time.process_time() - c0) / n * 1e6,
              "batches_per_call": batches_per_call, "decode_processes": 0, "decode_processes_pss_mb": 0.0}
    workers = ds.prefetcher.processes
    if workers is not None:
        pids = workers.pids()
        result["decode_processes"] = len(pids)
        result["decode_processes_pss_mb"] = sum(pss_mb(pid) for pid in pids)
    return result
