"""Out-of-core sampling: a store whose compressed frames do not fit the chunk cache.

Builds (or reuses) a ``--transitions`` (5M) step Breakout store from a tiled recording of real frames
(~310 MB compressed at 5M), opens it with ``cache_bytes`` = 1/10 of its compressed frames, and
measures batches of 32 four-frame stacks a second, side by side in one run:

- the page cache *warm* (every store file read just before) and *cold* (every file's pages dropped
  with ``posix_fadvise(DONTNEED)`` just before; the first ``--settle`` seconds, while the chunk
  cache fills, are reported apart);
- ``store.sample`` on 1 and on 2 threads, and the prefetcher (``as_dataset``'s engine: worker
  threads and decode processes) with 2 workers;
- the acting thread's ``add`` rate into the same store, alone and while 2 threads sample;
- ``store.sample`` in 1 and in 2 processes, each with its own handle: the same work with no GIL
  shared, which is what this machine allows two samplers at most;
- warm again with at most 128 shard files open (the store's budget under ``ulimit -n`` 1024; with
  a higher limit it keeps all 1,221 open), where a miss on a closed shard opens its file.

Prints a table and the ratios (2 threads / 1 thread, cold / warm, add with samplers / alone), and
writes tools/out/bench_out_of_core.json. About 10 minutes on 2 cores, 4 with ``--reuse`` (the store
is built once; ``--reuse`` skips that).

    python tools/bench_out_of_core.py [--transitions 5000000] [--seconds 10] [--reuse]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from atari_frames import OUT, record, replay_into  # noqa: E402
from harness import save  # noqa: E402

STORE = OUT / "bench_out_of_core.zarr"
BATCH = 32


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def set_page_cache(path: Path, warm: bool) -> None:
    """Read every file of the store (warm), or drop its pages from the page cache (cold)."""
    for p in path.rglob("*"):
        if not p.is_file():
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            if warm:
                while os.read(fd, 1 << 22):
                    pass
            else:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def build(transitions: int, recorded: int) -> float:
    import gymnasium as gym

    from replaystore import ReplayStore

    data = record(recorded)
    shutil.rmtree(STORE, ignore_errors=True)
    store = ReplayStore.create(STORE, transitions, gym.spaces.Box(0, 255, (84, 84), np.uint8),
                               gym.spaces.Discrete(4), 4)
    t0 = time.perf_counter()
    replay_into(store, data, transitions)
    store.close()
    return transitions / (time.perf_counter() - t0)


def run_samplers(store, threads: int, seconds: float, settle: float, seed: int = 0) -> dict[str, float]:
    """``threads`` threads calling ``store.sample`` for ``settle + seconds``: batches/s in the first
    ``settle`` seconds and in the ``seconds`` after them."""
    stop = threading.Event()
    counts = [[] for _ in range(threads)]  # per thread: the time each batch was done

    def loop(i: int) -> None:
        rng = np.random.default_rng(seed + i)
        while not stop.is_set():
            store.sample(BATCH, rng=rng)
            counts[i].append(time.perf_counter())

    t0 = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    time.sleep(settle + seconds)
    stop.set()
    for w in workers:
        w.join()
    done = np.concatenate([np.array(c) for c in counts]) - t0
    return {"settling": float(np.count_nonzero(done < settle) / settle) if settle else None,
            "batches_per_s": float(np.count_nonzero((done >= settle) & (done < settle + seconds)) / seconds)}


def _sample_in_process(cache: int, seconds: float, settle: float, seed: int, out) -> None:
    from replaystore import ReplayStore

    store = ReplayStore.open(STORE, cache_bytes=cache)
    out.put(run_samplers(store, 1, seconds, settle, seed=100 * seed)["batches_per_s"])
    store.close()


def run_processes(cache: int, processes: int, seconds: float, settle: float) -> float:
    """Batches/s of ``processes`` processes, each sampling its own read-only handle on one thread:
    the same work as threads without a shared GIL (what the machine allows two samplers)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_sample_in_process, args=(cache, seconds, settle, i, out)) for i in range(processes)]
    for proc in procs:
        proc.start()
    rates = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    return float(sum(rates))


def run_prefetcher(store, workers: int, seconds: float, settle: float) -> dict[str, float]:
    from replaystore.feed.prefetch import Prefetcher

    # (a replaystore before samplers were parts took no sampler: tools/ab.py runs this against one)
    first = (store.sampler(),) if hasattr(store, "sampler") else ()
    p = Prefetcher(store, *first, BATCH, batches_per_block=32, threads=workers, depth=2 * workers, seed=0)
    t0 = time.perf_counter()
    done = []
    try:
        while (now := time.perf_counter() - t0) < settle + seconds:
            block = p.next_block()
            done.append((now, block["obs"].shape[0]))
    finally:
        p.close()
    t = np.array([d[0] for d in done])
    n = np.array([d[1] for d in done])
    return {"settling": float(n[t < settle].sum() / settle) if settle else None,
            "batches_per_s": float(n[t >= settle].sum() / seconds)}


def run_adds(path: Path, cache_bytes: int, samplers: int, seconds: float, data: dict) -> float:
    """Adds a second into the store, by this thread, while ``samplers`` threads sample it."""
    from replaystore import ReplayStore

    store = ReplayStore.open(path, mode="a", cache_bytes=cache_bytes)
    store.end_episode()
    frames, idx = data["frames"], data["obs_index"]
    stop = threading.Event()

    def sample(i: int) -> None:
        rng = np.random.default_rng(100 + i)
        while not stop.is_set():
            store.sample(BATCH, rng=rng)

    threads = [threading.Thread(target=sample, args=(i,)) for i in range(samplers)]
    for t in threads:
        t.start()
    n = 0
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            for _ in range(256):
                i = n % idx.size
                j = int(idx[i])
                store.add(frames[j], int(data["action"][i]), float(data["reward"][i]), frames[j + 1],
                          bool(data["terminated"][i]), bool(data["truncated"][i]) or i == idx.size - 1)
                n += 1
        rate = n / (time.perf_counter() - t0)
    finally:
        stop.set()
        for t in threads:
            t.join()
        store.close()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, default=5_000_000)
    ap.add_argument("--record", type=int, default=100_000, help="real Breakout steps recorded, then tiled")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds of each run")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds a cold run fills its cache first")
    ap.add_argument("--cache-fraction", type=float, default=0.1, help="cache_bytes as a fraction of the frames")
    ap.add_argument("--reuse", action="store_true", help="reuse tools/out/bench_out_of_core.zarr if it exists")
    args = ap.parse_args()

    from replaystore import ReplayStore

    OUT.mkdir(exist_ok=True)
    write_rate = None
    if not (args.reuse and (STORE / "zarr.json").exists()):
        print(f"building a {args.transitions:,}-step Breakout store (a {args.record:,}-step recording, tiled) ...")
        write_rate = build(args.transitions, args.record)
        print(f"  written at {write_rate:,.0f} transitions/s")
    frames_bytes = du(STORE / "obs")
    cache = int(frames_bytes * args.cache_fraction)
    print(f"store {STORE}: {du(STORE) / 2**20:.0f} MB on disk, frames {frames_bytes / 2**20:.0f} MB compressed; "
          f"cache_bytes {cache / 2**20:.1f} MB ({args.cache_fraction:.0%})")

    results: dict[str, dict] = {}
    for how, threads in (("sample", 1), ("sample", 2), ("prefetcher", 2)):
        for page_cache in ("cold", "warm", "lazy"):
            set_page_cache(STORE, warm=page_cache != "cold")
            store = ReplayStore.open(STORE, cache_bytes=cache)
            if page_cache == "lazy":  # what a process with `ulimit -n` 1024 gets: 128 shard files open at a time
                store.reader.files.close()
                store.reader.files.max_open = 128
            settle = args.settle if page_cache == "cold" else 2.0
            run = run_samplers if how == "sample" else run_prefetcher
            r = run(store, threads, args.seconds, settle)
            r["hit_rate"] = store.cache_hit_rate
            store.close()
            key = f"{how} x{threads} {page_cache}"
            results[key] = r
            settling = f"  (first {settle:.0f} s: {r['settling']:,.0f})" if page_cache == "cold" else ""
            print(f"{key:22s} {r['batches_per_s']:8,.0f} batches/s  cache hits {r['hit_rate']:.0%}{settling}")

    set_page_cache(STORE, warm=True)
    procs = {n: run_processes(cache, n, args.seconds, 2.0) for n in (1, 2)}
    print(f"sample in 1 process {procs[1]:,.0f} batches/s; in 2 processes {procs[2]:,.0f}")

    data = record(args.record)
    set_page_cache(STORE, warm=True)
    adds_alone = run_adds(STORE, cache, 0, args.seconds, data)
    adds_sampled = run_adds(STORE, cache, 2, args.seconds, data)
    print(f"add alone {adds_alone:,.0f}/s; while 2 threads sample {adds_sampled:,.0f}/s")

    b = {k: v["batches_per_s"] for k, v in results.items()}
    ratios = {
        "2 threads / 1 thread, warm": b["sample x2 warm"] / b["sample x1 warm"],
        "2 threads / 1 thread, cold": b["sample x2 cold"] / b["sample x1 cold"],
        "cold / warm, 1 thread": b["sample x1 cold"] / b["sample x1 warm"],
        "cold / warm, 2 threads": b["sample x2 cold"] / b["sample x2 warm"],
        "cold / warm, prefetcher": b["prefetcher x2 cold"] / b["prefetcher x2 warm"],
        "2 threads / 1 thread, 128 files open": b["sample x2 lazy"] / b["sample x1 lazy"],
        "2 processes / 1 process, warm (no shared GIL)": procs[2] / procs[1],
        "128 files open / all open, prefetcher": b["prefetcher x2 lazy"] / b["prefetcher x2 warm"],
        "add while 2 threads sample / add alone": adds_sampled / adds_alone,
    }
    print()
    print("| batches/s | 1 thread | 2 threads | prefetcher, 2 workers |")
    print("|---|---|---|---|")
    for page_cache, label in (("warm", "page cache warm"), ("cold", "page cache cold"),
                              ("lazy", "warm, 128 shard files open (`ulimit -n` 1024)")):
        print(f"| {label} | {b[f'sample x1 {page_cache}']:,.0f} | {b[f'sample x2 {page_cache}']:,.0f} | "
              f"{b[f'prefetcher x2 {page_cache}']:,.0f} |")
    print()
    for name, value in ratios.items():
        print(f"ratio {name:42s} {value:6.2f}")
    out = {"transitions": args.transitions, "frames_mb": frames_bytes / 2**20, "cache_mb": cache / 2**20,
           "write_transitions_per_s": write_rate, "runs": results, "adds_alone_per_s": adds_alone,
           "adds_while_sampling_per_s": adds_sampled, "processes_batches_per_s": procs, "ratios": ratios}
    save(OUT / "bench_out_of_core.json", out)


if __name__ == "__main__":
    main()
