"""Peers side by side on the same real Atari frames: TorchRL's LazyMemmapStorage and
CompressedListStorage, TorchRL's buffer on ReplayStoreStorage, cpprb, SB3's ReplayBuffer and
replaystore, each holding 500k transitions of 4-stacked 84x84 Breakout frames.

    python tools/bench_peers.py [--transitions 500000] [--rounds 2] [--json tools/out/peers.json]

The frames are five 100k-step random-policy recordings of Breakout (seeds 0-4, atari_frames.py),
played one after the other (each recording's last step ends an episode), written once to a raw file
under tools/out/ that every contender reads in chunks outside its timed calls. Each contender is
filled the way its users fill it, from the same transitions, in its own process:

- ``torchrl``: ``TensorDictReplayBuffer(LazyMemmapStorage)`` as TorchRL's Atari DQN fills it: a
  tensordict per transition with ``pixels`` (4, 84, 84) and ``("next", "pixels")``, both stacked, so
  56 KB per transition (~28 GB for 500k, more than this machine's RAM); ``extend`` per 16
  transitions (a collector's batch); the memmap files in a scratch directory on the local disk.
- ``torchrl-compressed``: the same, on TorchRL's ``CompressedListStorage`` (in RAM, each transition's
  tensordict compressed on ``extend``).
- ``torchrl-replaystore``: the same, on ``ReplayStoreStorage`` (integrations/torchrl): TorchRL's
  buffer and sampler over a replay store that keeps each frame once; the gap to ``replaystore``'s
  ``sample(32)`` is TorchRL's own layer (its sampler, the TensorDicts).
- ``cpprb``: ``ReplayBuffer`` with ``next_of="obs"`` and ``stack_compress="obs"`` (channels-last
  stacks, as its docs show for Atari), ``add`` per step, ``on_episode_end`` after each episode; in RAM.
- ``sb3``: ``ReplayBuffer(optimize_memory_usage=True)`` with channels-last stacks (VecFrameStack's),
  ``add`` per step; in RAM, one 28 KB stack per transition (14 GB for 500k: it fits here).
- ``replaystore``: ``ReplayStore.create(..., frame_stack=4, frame_padding="zero")``, ``add`` per
  step, each 84x84 frame stored once; read with ``sample(32)`` and with ``blocks(32)`` (the
  background feed, 8 batches per block, its default 2 threads).

Stacks are built (zero padding after a reset, as SB3's VecFrameStack) outside the timed calls: that
is the env wrapper's work, not the buffer's. Measured per contender:

- write rate: transitions / (seconds inside add/extend + the final flush + ``os.sync()``);
- bytes on disk (allocated blocks), and the RAM the buffer holds: the growth of the process's
  anonymous RSS from before the buffer was made to the end of the fill;
- batches of 32 per second, warm: in the filling process, after 100 warm-up batches (for TorchRL the
  page cache then holds whatever of its 28 GB the kernel kept);
- windows, batches per second, warm: 4 windows of 8 consecutive transitions (32), after 5 warm-up
  batches: TorchRL's ``SliceSampler(num_slices=4, end_key=("next", "done"))`` over each TorchRL
  storage but ``CompressedListStorage`` (where it decompresses the whole buffer for every batch), the
  store's own ``sample_sequences(4, 8)`` (``--slice-batches``; 0 leaves them out);
- batches of 32 per second, cold: a fresh process drops the buffer's files from the page cache
  (``POSIX_FADV_DONTNEED`` on each, checked with ``fincore``), opens the buffer again and times its
  first ``--cold-batches`` batches (disk-backed contenders only);
- peak RSS of each process (VmHWM, tools/harness.py), its RSS before the buffer existed, and
  RssAnon/RssFile at the end (a memory map's resident pages count as file RSS: reclaimable, but counted).

Each batch is materialised: obs and next obs stacks, action, reward, done, as the library returns
them (numpy arrays or torch tensors). Rounds alternate the order of the contenders. The VM's
read-ahead (``/sys/block/<dev>/queue/read_ahead_kb`` of the disk under ``--dir``) is printed
beside the figures: a memory-mapped read that misses the page cache faults in up to that much
around it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from atari_frames import OUT  # noqa: E402
from harness import child as run_child  # noqa: E402
from harness import memory, order, report, save  # noqa: E402
from peer_contenders import MAKERS, Store, Transitions, frames_source, rate  # noqa: E402

CONTENDERS = tuple(MAKERS)
ON_DISK = ("torchrl", "torchrl-replaystore", "replaystore")


# -------------------------------------------------------------------------------------------------
# Measuring, in the child


def disk_bytes(where: Path) -> int:
    if where.is_file():
        return where.stat().st_blocks * 512
    return sum(p.stat().st_blocks * 512 for p in where.rglob("*") if p.is_file())


def drop_cache(where: Path) -> dict[str, int]:
    """fsync and POSIX_FADV_DONTNEED every file under ``where``; the resident bytes before and after."""
    files = [p for p in where.rglob("*") if p.is_file()]

    def resident() -> int:
        total = 0
        for k in range(0, len(files), 200):
            out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, files[k:k + 200])],
                                 capture_output=True, text=True, check=True).stdout
            total += sum(int(x) for x in out.split())
        return total

    before = resident()
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return {"resident_before": before, "resident_after": resident()}


def finish_memory(out: dict) -> dict:
    out.update({f"end_{k}_mb": v for k, v in memory().items() if k != "VmHWM"})
    return out


def fill(name: str, where: Path, raw: Path, rows: Path, n: int, batches: int, slice_batches: int) -> dict:
    """Fill a fresh buffer, then time warm batches in the same process."""
    t = Transitions(raw, rows, n)
    c = MAKERS[name](where, n)
    c.load()
    base = memory()
    c.create()
    in_add = 0.0
    for i, frame, nxt in t:
        in_add += c.add(t, i, frame, nxt)
    start = time.perf_counter()
    c.finish()
    os.sync()
    write_s = in_add + time.perf_counter() - start
    out = {"name": name, "transitions": n, "write_per_s": n / write_s, "write_s": write_s,
           "disk_bytes": disk_bytes(where), "rss_before_mb": base["VmRSS"]}
    out["anon_grown_bytes"] = int((memory()["RssAnon"] - base["RssAnon"]) * 2**20)
    if name in ON_DISK:
        c.reopen()
    out["warm_per_s"] = rate(c.sample, batches, warmup=100)
    if c.slices and slice_batches:
        out["slices_warm_per_s"] = rate(c.sample_slices, slice_batches, warmup=5)
    if isinstance(c, Store):
        out["blocks_warm_per_s"] = c.blocks_rate(batches, warmup=100 // c.per_block)
    return finish_memory(out)


def cold(name: str, where: Path, n: int, batches: int) -> dict:
    """In a fresh process: drop the buffer's files from the page cache, reopen, time the first batches."""
    c = MAKERS[name](where, n)
    c.load()
    base = memory()
    out: dict = {"name": name, "drop": drop_cache(where), "rss_before_mb": base["VmRSS"]}
    c.reopen()
    out["cold_per_s"] = rate(c.sample, batches)
    if isinstance(c, Store):
        c.store.close()
        out["drop_blocks"] = drop_cache(where)
        c.reopen()
        out["blocks_cold_per_s"] = c.blocks_rate(batches)
    return finish_memory(out)


# -------------------------------------------------------------------------------------------------
# The parent


def read_ahead(where: Path) -> str:
    dev = os.stat(where).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for q in (node / "queue" / "read_ahead_kb", node / ".." / "queue" / "read_ahead_kb"):
        if q.exists():
            return f"{q.resolve().parent.parent.name}: read_ahead_kb={q.read_text().strip()}"
    return f"device {os.major(dev)}:{os.minor(dev)}: read-ahead unknown"


def child(args: list[str]) -> dict:
    return run_child([__file__, *args])


def table(results: list[dict]) -> str:
    """A markdown table: rates per round (``a / b``), sizes and peaks at their largest."""

    def each(rs: list[dict], key: str) -> str:
        xs = [r[key] for r in rs if r.get(key) is not None]
        return " / ".join(f"{x:,.0f}" for x in xs) if xs else "n/a"

    def gb(x: float) -> str:
        return f"{x / 1e9:.2f} GB"

    rows = ["| contender | writes/s | on disk | RAM it holds | batches/s warm | batches/s cold | windows: batches/s warm "
            "| peak RSS: fill, cold |", "|---|---|---|---|---|---|---|---|"]
    for name in CONTENDERS:
        rs = [r for r in results if r["name"] == name]
        if not rs:
            continue
        peak = gb(max(r["peak_rss_mb"] for r in rs) * 2**20)
        if name in ON_DISK:
            peak += ", " + gb(max(r["cold_peak_rss_mb"] for r in rs) * 2**20)
        rows.append(f"| {name} | {each(rs, 'write_per_s')} | {gb(max(r['disk_bytes'] for r in rs))} | "
                    f"{gb(max(r['anon_grown_bytes'] for r in rs))} | {each(rs, 'warm_per_s')} | "
                    f"{each(rs, 'cold_per_s')} | {each(rs, 'slices_warm_per_s')} | {peak} |")
        if name == "replaystore":
            rows.append(f"| replaystore `blocks` | | | | {each(rs, 'blocks_warm_per_s')} | "
                        f"{each(rs, 'blocks_cold_per_s')} | | |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", type=int, default=2000, help="batches timed warm")
    ap.add_argument("--slice-batches", type=int, default=100,
                    help="batches of 4 windows of 8 timed warm (TorchRL's SliceSampler; the store's sample_sequences)")
    ap.add_argument("--cold-batches", type=int, default=200, help="batches timed after dropping the page cache")
    ap.add_argument("--only", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    ap.add_argument("--dir", type=Path, default=OUT, help="where the buffers are written (a local disk)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        what, name, where = args.child[0], args.child[1], Path(args.child[2])
        if what == "fill":
            res = fill(name, where, Path(args.child[3]), Path(args.child[4]), args.transitions, args.batches,
                       args.slice_batches)
        else:
            res = cold(name, where, args.transitions, args.cold_batches)
        report(res)
        return
    raw, rows = frames_source(args.transitions)
    args.dir.mkdir(parents=True, exist_ok=True)
    ra = read_ahead(args.dir)
    print(f"{args.transitions:,} transitions of Breakout, {args.rounds} round(s); buffers under {args.dir} ({ra})",
          flush=True)
    results = []
    for rnd in range(args.rounds):
        for name in order(args.only, rnd):
            where = Path(tempfile.mkdtemp(prefix=f"peers-{name}-", dir=args.dir))
            try:
                common = [f"--transitions={args.transitions}", f"--batches={args.batches}",
                          f"--slice-batches={args.slice_batches}",
                          f"--cold-batches={args.cold_batches}"]
                res = child(["--child", "fill", name, str(where), str(raw), str(rows), *common])
                if name in ON_DISK:
                    c = child(["--child", "cold", name, str(where), *common])
                    res.update({k: v for k, v in c.items() if k.endswith("_per_s") or k.startswith("drop")})
                    res["cold_peak_rss_mb"] = c["peak_rss_mb"]
            finally:
                shutil.rmtree(where, ignore_errors=True)
            res["round"] = rnd
            results.append(res)
            print(json.dumps(res), flush=True)
    print()
    print(table(results))
    print(f"\nread-ahead: {ra}")
    save(args.json, {"transitions": args.transitions, "read_ahead": ra, "results": results})


if __name__ == "__main__":
    main()
