"""Sampling on one core: ``store.sample(32)`` beside cpprb and a numpy gather from RAM, on the same data.

The peers' frames (tools/peer_contenders.py: five 100k-step random-policy Breakout recordings, 84x84
gray) as ``--transitions`` transitions of zero-padded 4-frame stacks. Each contender runs in its own
process pinned to one core (``taskset -c --core``, tools/harness.py), in ``--rounds`` rounds of
alternating order, and takes ``--batches`` batches of 32 (stacks and next stacks, action, reward,
done) after 200 untimed ones:

- ``cpprb``: ``ReplayBuffer(next_of="obs", stack_compress="obs")`` in RAM, filled by ``add`` (as
  bench_peers.py fills it), ``sample(32)``;
- ``--peers`` (any of bench_peers.py's, tools/peer_contenders.py: ``sb3``, ``sb3-zstd``
  (sb3-extra-buffers), ``torchrl``, ``torchrl-compressed``): filled in the child as bench_peers.py
  fills it (``torchrl``'s memory map under tools/out/, removed after), then sampled. A peer slower
  than ``--batches`` in ``--seconds`` is timed over the batches it takes in ``--seconds``;
- ``numpy``: every frame once in one array in RAM, each transition's stack as indices into it
  (zeros before an episode's first frame): ``frames[idx]`` for a batch's stacks and next stacks.
  The floor of any buffer that keeps frames once;
- ``store-L``: a store of chunks of ``L`` frames (``Layout(obs_chunk_len=L)``, each of
  ``--chunk-lens``), its compressed chunks warmed into the cache: ``sample(32)``, and the same
  batches split into the store's planning (``plan``: the draw, the rings, the chunk plan) and
  ``finish`` (decoding the chunks and gathering the stacks: the store's floor).

Prints batches/s per round and their medians, each contender's ratio to cpprb (the median of the
per-round ratios) and its peak RSS (VmHWM: the fill included) against cpprb's. The stores are built
once under tools/out/.

    python tools/bench_per_core.py [--transitions 500000] [--rounds 3] [--batches 3000] [--core 1]
                                   [--chunk-lens 8 4 2] [--peers sb3 sb3-zstd torchrl torchrl-compressed]
                                   [--seconds 60] [--json tools/out/bench_per_core.json]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from atari_frames import OUT  # noqa: E402
from harness import child, median, order, rate, ratio, report, save  # noqa: E402
from peer_contenders import MAKERS, STACK, Transitions, frames_source  # noqa: E402

BATCH = 32
WARMUP = 200


def stack_indices(rows: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per transition, the frame indices of its stack and next stack (-1: a zero frame before the
    episode's first)."""
    idx = rows["obs_index"].astype(np.int64)
    ended = rows["terminated"] | rows["truncated"]
    start = np.zeros(len(idx), dtype=bool)
    start[0] = True
    start[1:] = ended[:-1]
    first = idx[np.maximum.accumulate(np.where(start, np.arange(len(idx)), 0))]  # the episode's first frame
    back = np.arange(STACK - 1, -1, -1)[None, :]
    obs = idx[:, None] - back
    nxt = obs + 1
    return np.where(obs >= first[:, None], obs, -1), np.where(nxt >= first[:, None], nxt, -1)


def run_numpy(raw: Path, rows_path: Path, n: int, batches: int) -> dict:
    with np.load(rows_path) as z:
        rows = {k: z[k][:n] for k in z.files}
    obs_idx, next_idx = stack_indices(rows)
    count = int(rows["obs_index"][n - 1]) + 2
    frames = np.zeros((count + 1, 84, 84), np.uint8)  # the last one stays zero: index -1
    frames[:count] = np.fromfile(raw, dtype=np.uint8, count=count * 84 * 84).reshape(count, 84, 84)
    action, reward = rows["action"], rows["reward"]
    done = (rows["terminated"]).astype(np.float32)
    rng = np.random.default_rng(0)

    def sample() -> object:
        i = rng.integers(0, n, BATCH)
        return frames[obs_idx[i]], action[i], reward[i], frames[next_idx[i]], done[i]

    return {"batches_per_s": rate(sample, batches, warmup=WARMUP)}


#: The peers bench_per_core.py can run (bench_peers.py's, less the replay stores measured here as ``store-L``).
PEERS = tuple(name for name in MAKERS if "replaystore" not in name)


def timed_rate(fn: Callable[[], object], batches: int, seconds: float) -> float:
    """Calls of ``fn`` a second over ``batches`` calls, or over those made in ``seconds`` if fewer
    (after ``WARMUP`` untimed calls, or those made in a tenth of ``seconds``)."""
    start = time.perf_counter()
    for _ in range(WARMUP):
        fn()
        if time.perf_counter() - start > seconds / 10:
            break
    start, calls = time.perf_counter(), 0
    while calls < batches:
        fn()
        calls += 1
        if time.perf_counter() - start > seconds:
            break
    return calls / (time.perf_counter() - start)


def run_peer(name: str, raw: Path, rows_path: Path, n: int, batches: int, seconds: float) -> dict:
    where = OUT / f"per_core_{name}"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    try:
        c = MAKERS[name](where, n)
        c.load()
        c.create()
        t = Transitions(raw, rows_path, n)
        start = time.perf_counter()
        for i, frame, nxt in t:
            c.add(t, i, frame, nxt)
        c.finish()
        fill_s = time.perf_counter() - start
        return {"batches_per_s": timed_rate(c.sample, batches, seconds), "fill_s": fill_s}
    finally:
        shutil.rmtree(where, ignore_errors=True)


def store_path(n: int, chunk_len: int) -> Path:
    return OUT / f"per_core_{n}_L{chunk_len}.zarr"


def build_store(raw: Path, rows_path: Path, n: int, chunk_len: int) -> dict:
    import gymnasium as gym

    from replaystore import Layout, ReplayStore

    t = Transitions(raw, rows_path, n)
    r = t.rows
    start = time.perf_counter()
    with ReplayStore.create(store_path(n, chunk_len), n, gym.spaces.Box(0, 255, (84, 84), np.uint8),
                            gym.spaces.Discrete(4), frame_stack=STACK, frame_padding="zero", overwrite=True,
                            layout=Layout(obs_chunk_len=chunk_len)) as store:
        for i, frame, nxt in t:
            store.add(frame, int(r["action"][i]), float(r["reward"][i]), nxt, bool(r["terminated"][i]),
                      bool(r["truncated"][i]))
    return {"build_s": time.perf_counter() - start}


def run_store(n: int, chunk_len: int, batches: int) -> dict:
    from replaystore import ReplayStore
    from replaystore.sampling.samplers import UniformSampler

    store = ReplayStore.open(store_path(n, chunk_len))
    store.warm_cache()
    rng = np.random.default_rng(0)
    out = {"batches_per_s": rate(lambda: store.sample(BATCH, rng=rng), batches, warmup=WARMUP)}
    sampler, reader = UniformSampler(), store.reader
    planned, finished = 0.0, 0.0
    for k in range(batches):
        t0 = time.perf_counter()
        pending = store.plan(sampler, BATCH, rng=rng)
        t1 = time.perf_counter()
        pending.finish(reader)
        t2 = time.perf_counter()
        if k >= WARMUP // 4:
            planned, finished = planned + t1 - t0, finished + t2 - t1
    timed = batches - WARMUP // 4
    out.update(plan_us=planned / timed * 1e6, finish_us=finished / timed * 1e6,
               chunks_bytes=store.cache_bytes_held)
    store.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=3000)
    ap.add_argument("--core", type=int, default=1)
    ap.add_argument("--chunk-lens", type=int, nargs="+", default=[8, 4, 2])
    ap.add_argument("--peers", nargs="*", choices=[p for p in PEERS if p != "cpprb"], default=[])
    ap.add_argument("--seconds", type=float, default=60.0, help="the most a contender samples for")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    raw, rows = frames_source(args.transitions)
    n = args.transitions
    if args.child:
        what = args.child[0]
        if what == "numpy":
            report(run_numpy(raw, rows, n, args.batches))
        elif what in PEERS:
            report(run_peer(what, raw, rows, n, args.batches, args.seconds))
        elif what == "build":
            report(build_store(raw, rows, n, int(args.child[1])))
        else:
            report(run_store(n, int(args.child[1]), args.batches))
        return 0
    common = [f"--transitions={n}", f"--batches={args.batches}", f"--seconds={args.seconds}"]
    for length in args.chunk_lens:
        if not (store_path(n, length) / "zarr.json").exists():
            built = child([__file__, "--child", "build", str(length), *common])
            print(f"built the store of {length}-frame chunks in {built['build_s']:.0f} s", flush=True)
    names = ["cpprb", *args.peers, "numpy", *(f"store-{length}" for length in args.chunk_lens)]
    rounds: list[dict[str, dict]] = []
    for r in range(args.rounds):
        results = {}
        for name in order(names, r):
            argv = ["--child", *(name.split("-") if name.startswith("store-") else [name])]
            results[name] = child([__file__, *argv, *common], cores=[args.core])
            extra = (f"  plan {results[name]['plan_us']:.0f} us + finish {results[name]['finish_us']:.0f} us"
                     if "plan_us" in results[name] else "")
            print(f"round {r + 1} {name:9s} {results[name]['batches_per_s']:8,.0f} batches/s  peak RSS "
                  f"{results[name]['peak_rss_mb']:7,.0f} MB{extra}", flush=True)
        rounds.append(results)
    print(f"\none core (taskset -c {args.core}), {n:,} transitions of 4-frame Breakout stacks, batches of {BATCH}, "
          f"medians of {args.rounds} rounds")
    print("| contender | batches/s | us a batch | / cpprb | peak RSS | RSS / cpprb | plan | finish (decode + gather) |")
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    rates = [{name: rs[name]["batches_per_s"] for name in names} for rs in rounds]
    for name in names:
        bps = median(rs[name]["batches_per_s"] for rs in rounds)
        vs = ratio(rates, name, "cpprb")
        rss = max(rs[name]["peak_rss_mb"] for rs in rounds)
        rss_ratio = rss / max(rs["cpprb"]["peak_rss_mb"] for rs in rounds)
        plan = median(rs[name].get("plan_us", float("nan")) for rs in rounds)
        finish = median(rs[name].get("finish_us", float("nan")) for rs in rounds)
        summary[name] = {"batches_per_s": bps, "vs_cpprb": vs, "peak_rss_mb": rss, "rss_vs_cpprb": rss_ratio,
                         "plan_us": plan, "finish_us": finish}
        split = f"{plan:.0f} us | {finish:.0f} us" if np.isfinite(plan) else " | "
        print(f"| {name} | {bps:,.0f} | {1e6 / bps:.0f} | {vs:.2f} | {rss:,.0f} MB | {rss_ratio:.3f} | {split} |")
    save(args.json, {"transitions": n, "core": args.core, "rounds": rounds, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
