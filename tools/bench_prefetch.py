"""The prefetcher's gain over one sampling thread when the chunk cache misses: ``store.sample(32)`` on
the calling thread against ``store.blocks(32, threads=2)`` (the prefetcher's engine, blocks of 8
batches), on bench_per_core.py's 500k-step Breakout store opened with a ``--cache-mb`` cache (1 MB:
nearly every chunk a batch needs is read from its shard file, through the page cache).

Each contender runs in its own process, ``--seconds`` after 100 untimed batches, in ``--rounds``
rounds of alternating order; prints batches/s per round, their medians and the gain (blocks /
sample, the median of the per-round ratios). Run it under two versions with tools/ab.py:

    python tools/bench_prefetch.py [--cache-mb 1] [--rounds 4] [--seconds 8] [--json tools/out/bench_prefetch.json]
    python tools/ab.py --old 8d40b14 --json tools/out/bench_prefetch.json --rounds 2 -- \\
        python tools/bench_prefetch.py --json tools/out/bench_prefetch.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_per_core import store_path  # noqa: E402
from harness import child, median, order, ratio, report, save  # noqa: E402

NAMES = ("sample", "blocks")


def run(name: str, path: Path, cache_mb: float, seconds: float) -> dict:
    import numpy as np

    from replaystore import ReplayStore

    store = ReplayStore.open(path, cache_bytes=int(cache_mb * 2**20))
    rng = np.random.default_rng(0)
    if name == "sample":
        def take() -> int:
            store.sample(32, rng=rng)
            return 1
    else:
        it = store.blocks(32, batches_per_block=8, threads=2, seed=0)

        def take() -> int:
            block = next(it)
            getattr(block, "release", lambda: None)()  # (older versions hand out plain dicts)
            return 8
    taken = 0
    while taken < 100:
        taken += take()
    start, taken = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        taken += take()
    out = {"batches_per_s": taken / (time.perf_counter() - start)}
    if name == "blocks":
        it.close()
    store.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, default=500_000, help="which of bench_per_core.py's stores")
    ap.add_argument("--chunk-len", type=int, default=8)
    ap.add_argument("--cache-mb", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", choices=NAMES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    path = store_path(args.transitions, args.chunk_len)
    if args.child:
        report(run(args.child, path, args.cache_mb, args.seconds))
        return 0
    if not (path / "zarr.json").exists():
        sys.exit(f"{path} is missing: build it with python tools/bench_per_core.py --chunk-lens {args.chunk_len}")
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        got = {}
        for name in order(NAMES, r):
            got[name] = child([__file__, "--child", name, f"--transitions={args.transitions}",
                               f"--chunk-len={args.chunk_len}", f"--cache-mb={args.cache_mb}",
                               f"--seconds={args.seconds}"])["batches_per_s"]
        rounds.append(got)
        print(f"round {r + 1}: sample {got['sample']:,.0f}, blocks {got['blocks']:,.0f} batches/s "
              f"({got['blocks'] / got['sample']:.2f}x)", flush=True)
    summary = {name: median(rs[name] for rs in rounds) for name in NAMES}
    summary["gain"] = ratio(rounds, "blocks", "sample")
    print(f"medians: sample {summary['sample']:,.0f}, blocks {summary['blocks']:,.0f} batches/s; "
          f"gain {summary['gain']:.2f}x ({args.cache_mb:g} MB cache)")
    save(args.json, {"cache_mb": args.cache_mb, "rounds": rounds, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
