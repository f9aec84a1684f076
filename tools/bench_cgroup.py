"""Out of core for real: sampling inside a memory limit that counts the page cache, on a store
several times larger than the limit, beside the same store without a limit.

A laptop that trains on a replay store shares its RAM with the learner, the env and the page cache,
and the page cache cannot hold a store several times larger than what is left. A cgroup with a
memory limit is that laptop: the sampling process and every page of the store it reads count
against the limit (cgroup v2 ``memory.max``, or v1's ``memory.limit_in_bytes`` where the memory
controller is mounted as v1; this tool makes a child cgroup of its own, as root, and removes it).

For each condition, in one run, alternating which goes first:

- **limited**: the child process joins the cgroup before it starts Python;
- **unlimited**: the same child without it (the machine's page cache may hold the whole store).

Each child opens the store (``cache_bytes``: the store's default for the limit, a quarter of it),
then samples batches of 32 four-frame stacks with ``store.sample`` for ``--seconds`` **cold** (the
store's pages dropped from the page cache just before, ``posix_fadvise(DONTNEED)``) and again for
``--seconds`` **warm** (right after, with whatever the cache and the page cache kept). It reports
batches/s and its peak RSS (VmHWM); the limited one also the cgroup's peak usage and how often it
hit the limit. Prints the table and the ratios limited / unlimited, and writes
tools/out/bench_cgroup.json.

The store is tools/bench_ram.py's (real Breakout frames tiled, built there with ``load_steps``).

    python tools/bench_cgroup.py [--steps 64000000] [--limit-mb 1024] [--seconds 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from atari_frames import OUT, record  # noqa: E402
from bench_ram import build  # noqa: E402
from harness import child, median, order, save  # noqa: E402

CHILD = r"""
import os, sys, time
import numpy as np
from harness import memory, report
from replaystore import ReplayStore
path, seconds = sys.argv[1], float(sys.argv[2])
limit = int(sys.argv[3]) if len(sys.argv) > 3 else None

def drop(root):
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

drop(path)
store = ReplayStore.open(path, cache_bytes=None if limit is None else limit // 4)
rng = np.random.default_rng(0)
out = {"cache_bytes": store.reader.cache.cache_bytes if store.reader.cache is not None else 0}
for phase in ("cold", "warm"):
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        store.sample(32, rng=rng)
        n += 1
    out[phase] = n / (time.perf_counter() - t0)
report({**out, **memory()})
"""


def store_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class MemoryCgroup:
    """A child memory cgroup of this process's own, limited to ``limit`` bytes (page cache included)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.dir, self.v2 = _new_cgroup_dir()
        self.dir.mkdir()
        if self.v2:
            (self.dir / "memory.max").write_text(str(limit))
            if (self.dir / "memory.swap.max").exists():
                (self.dir / "memory.swap.max").write_text("0")
        else:
            (self.dir / "memory.limit_in_bytes").write_text(str(limit))

    def join(self) -> Callable[[], None]:
        """A ``preexec`` for ``harness.child``: the child joins the cgroup before it starts Python."""
        procs = str(self.dir / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        return enter

    def stats(self) -> dict[str, int]:
        """The cgroup's peak usage and the times it hit its limit (since it was made)."""
        if self.v2:
            peak = self.dir / "memory.peak"
            events = dict(line.split() for line in (self.dir / "memory.events").read_text().splitlines())
            return {"peak_bytes": int(peak.read_text()) if peak.exists() else -1, "hit_limit": int(events.get("max", 0))}
        return {"peak_bytes": int((self.dir / "memory.max_usage_in_bytes").read_text()),
                "hit_limit": int((self.dir / "memory.failcnt").read_text())}

    def reset(self) -> None:
        if not self.v2:
            (self.dir / "memory.max_usage_in_bytes").write_text("0")
            (self.dir / "memory.failcnt").write_text("0")

    def remove(self) -> None:
        self.dir.rmdir()


def _new_cgroup_dir() -> tuple[Path, bool]:
    """Where to make a child memory cgroup of this process's, and whether it is cgroup v2."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v2_root = Path("/sys/fs/cgroup")
    if (v2_root / "cgroup.controllers").exists() and "memory" in (v2_root / "cgroup.controllers").read_text():
        here = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
        return v2_root / here.lstrip("/") / f"bench_cgroup_{os.getpid()}", True
    here = next(line.split(":", 2)[2] for line in lines if ":memory:" in line)
    return Path("/sys/fs/cgroup/memory") / here.lstrip("/") / f"bench_cgroup_{os.getpid()}", False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=64_000_000)
    ap.add_argument("--limit-mb", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    path = OUT / f"bench_ram_{args.steps}.zarr"
    if not (path / "zarr.json").exists():
        print(f"building {path} ...", flush=True)
        build(path, args.steps, record(100_000))
    size = store_bytes(path)
    limit = args.limit_mb << 20
    print(f"store {path.name}: {size / 2**30:.2f} GB on disk, {size / limit:.1f} x the limit of {args.limit_mb} MB",
          flush=True)
    group = MemoryCgroup(limit)
    rounds = []
    try:
        for r in range(args.rounds):
            got = {}
            for name in order(["limited", "unlimited"], r):
                if name == "limited":
                    group.reset()
                    got[name] = child([str(path), str(args.seconds), str(limit)], code=CHILD, preexec=group.join())
                    got[name].update(group.stats())
                else:
                    got[name] = child([str(path), str(args.seconds), str(limit)], code=CHILD)
                g = got[name]
                extra = (f", cgroup peak {g['peak_bytes'] / 2**20:.0f} MB, hit the limit {g['hit_limit']} times"
                         if name == "limited" else "")
                print(f"round {r} {name:9s} cold {g['cold']:7.1f}  warm {g['warm']:7.1f} batches/s  "
                      f"peak RSS {g['VmHWM']:.0f} MB{extra}", flush=True)
            rounds.append(got)
    finally:
        group.remove()
    summary = {phase: {"limited": median(r["limited"][phase] for r in rounds),
                       "unlimited": median(r["unlimited"][phase] for r in rounds),
                       "ratio": median(r["limited"][phase] / r["unlimited"][phase] for r in rounds)}
               for phase in ("cold", "warm")}
    print()
    for phase, s in summary.items():
        print(f"{phase}: limited {s['limited']:.1f}, unlimited {s['unlimited']:.1f} batches/s; "
              f"limited / unlimited {s['ratio']:.2f}")
    save(OUT / "bench_cgroup.json", {"args": vars(args), "store_bytes": size, "rounds": rounds, "summary": summary})


if __name__ == "__main__":
    main()
