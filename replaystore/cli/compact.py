"""``replaystore compact``: rewrite a store oldest-first with only its live steps, optionally with a
new codec, chunk/shard size or smaller capacity (keeping the newest steps).

How it works, and why it is safe:

1. Take the source's writer lock for the whole run (no writer may append meanwhile), then ``verify``
   it: every chunk is read and checked. Damaged chunks stop the run unless ``drop_damaged``; then
   every episode that touches a damaged slot is dropped whole, and an episode cut short by a drop is
   closed as truncated (like ``ReplayStore.end_episode``).
2. Build the new store in a temporary sibling directory (``.NAME.compact-PID``): scalars are copied
   by slot, frames are read a new shard at a time and written as whole shards. Positions are
   renumbered from 0 but each step keeps its ``ep_step``, so every stack, n-step return and priority
   is what it was: sampling the result is equivalent. The new store is verified before it is used.
3. Publish it. To a new DST: one ``rename``. In place: ``renameat2(RENAME_EXCHANGE)`` on Linux
   (``renamex_np(RENAME_SWAP)`` on macOS) swaps the two directories in one atomic step, then the old one is deleted. A crash at any moment leaves either
   the old store or the new one at the path, never neither (tests/test_compact.py kills it at
   random moments); a leftover temporary directory is removed by the next compact.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from replaystore.cli.summary import disk_bytes
from replaystore.cli.verify import Problem, verify_store
from replaystore.errors import (
    ChunkChecksumError,
    ConfigError,
    CorruptStoreError,
    StoreExistsError,
)
from replaystore.format.schema import (
    CodecSpec,
    Layout,
    Schema,
    default_layout,
    from_attrs,
)
from replaystore.format.shards import (
    decode_shard,
    fsync_dir,
    numcodecs_codec,
    shard_key,
)
from replaystore.format.validate import read_group_doc, validate_layout
from replaystore.storage.lock import WriterLock
from replaystore.storage.reader import FrameReader
from replaystore.storage.ring import Ring
from replaystore.store import ReplayStore

Progress = Callable[[str, int, int], None]
RENAME_EXCHANGE = 2
RENAME_SWAP = 2  # macOS's renamex_np flag
AT_FDCWD = -100


@dataclass
class CompactReport:
    src: str
    dst: str
    transitions_before: int
    transitions_after: int
    steps_kept: int
    episodes_kept: int
    bytes_before: int
    bytes_after: int
    dropped: list[str] = field(default_factory=list)  # one line per damaged chunk dropped
    steps_dropped: int = 0  # live steps dropped with the episodes that touched damage
    steps_cut: int = 0  # oldest steps left out to fit a smaller capacity


def compact_store(src: str | Path, dst: str | Path | None = None, *, capacity: int | None = None,
                  codec: CodecSpec | None = None, chunk_len: int | None = None, shard_len: int | None = None,
                  drop_damaged: bool = False, progress: Progress | None = None) -> CompactReport:
    """Rewrite the store at ``src`` into ``dst`` (or in place when ``dst`` is None); see the module doc.

    Example:
        >>> compact_store("runs/quickstart/replay.zarr", capacity=50_000).transitions_after  # doctest: +SKIP
        49998
    """
    root = Path(src)
    doc = read_group_doc(root)
    schema, layout, state = from_attrs(doc.get("attributes"), path=str(root))
    target = root if dst is None else Path(dst)
    if dst is not None and target.exists():
        raise StoreExistsError(f"{target} already exists; choose a new DST, or leave DST out to compact {root} in place")
    if schema.num_streams > 1:
        raise ConfigError(f"{root} holds {schema.num_streams} episode streams, and compact rewrites one-stream stores "
                          "only in this release; verify it with `replaystore verify`")
    new_capacity = schema.capacity if capacity is None else capacity
    if isinstance(new_capacity, bool) or not isinstance(new_capacity, int) or new_capacity < 2:
        raise ConfigError(f"capacity is {capacity!r}; it must be an int >= 2")
    new_layout = _new_layout(schema, layout, new_capacity, codec=codec, chunk_len=chunk_len, shard_len=shard_len)
    validate_layout(new_layout, new_capacity)
    lock = WriterLock(root)
    lock.acquire()
    try:
        _remove_leftovers(target)
        report = verify_store(root, progress=None if progress is None else lambda d, t: progress("verify", d, t))
        fatal = [p for p in report.problems if p.array == "metadata"]
        if fatal:
            raise CorruptStoreError(f"{root} cannot be compacted: {fatal[0].message}")
        if report.problems and not drop_damaged:
            raise CorruptStoreError(
                f"{root} has {len(report.problems)} damaged chunk(s), first: {report.problems[0].message.split(';')[0]}; "
                "run `replaystore compact --drop-damaged` to drop the episodes they hold"
            )
        ring = _load_scalars(root, schema, layout, state.added, state.oldest)
        ring.rebuild_valid()
        transitions_before = ring.n_valid
        keep, dropped_steps = _choose(ring, _damaged_slots(report.problems, schema.capacity, ring))
        cut = max(0, keep.size - new_capacity)
        keep = keep[cut:]
        tmp = target.parent / f".{target.name}.compact-{os.getpid()}"
        before = sum(disk_bytes(root).values())
        episodes = _build(tmp, root, schema, layout, new_capacity, new_layout, ring, keep, progress)
        check = verify_store(tmp)
        if not check.ok:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CorruptStoreError(f"the compacted copy failed verification ({check.problems[0].message}); "
                                    f"{root} is unchanged")
        _publish(tmp, target, in_place=dst is None)
        with ReplayStore.open(target) as result:
            after_transitions = len(result)
    finally:
        lock.release()
    return CompactReport(
        src=str(root), dst=str(target), transitions_before=transitions_before, transitions_after=after_transitions,
        steps_kept=int(keep.size), episodes_kept=episodes, bytes_before=before, bytes_after=sum(disk_bytes(target).values()),
        dropped=[p.where() for p in report.problems], steps_dropped=dropped_steps, steps_cut=cut,
    )


def _new_layout(schema: Schema, layout: Layout, capacity: int, *, codec: CodecSpec | None, chunk_len: int | None,
                shard_len: int | None) -> Layout:
    base = layout
    if shard_len is None and capacity < layout.shard_len:
        base = replace(layout, shard_len=default_layout(schema.observation.frame_bytes, capacity).shard_len)
    new_shard = shard_len or base.shard_len
    new_chunk = chunk_len or min(base.obs_chunk_len, new_shard)
    return Layout(shard_len=new_shard, obs_chunk_len=new_chunk, codec=codec or layout.codec)


def _load_scalars(root: Path, schema: Schema, layout: Layout, added: int, oldest: int) -> Ring:
    """The scalar arrays, with damaged shards left as zeros (verify has named their slots)."""
    ring = Ring(schema.capacity, schema.frame_stack, layout.shard_len)
    ring.added, ring.oldest = added, oldest
    codec = numcodecs_codec(layout.codec)
    n_shards = -(-schema.capacity // layout.shard_len)
    for name, values in ring.fields.items():
        out = np.zeros(layout.shard_len, dtype=values.dtype)
        for shard in range(n_shards):
            start = shard * layout.shard_len
            rows = min(layout.shard_len, schema.capacity - start)
            try:
                decode_shard((root / shard_key(name, shard, 0)).read_bytes(), chunk_len=layout.shard_len, n_chunks=1,
                             codec=codec, out=out, name=name, shard=shard)
            except (FileNotFoundError, ChunkChecksumError):
                out[:] = 0
            values[start : start + rows] = out[:rows]
    return ring


def _damaged_slots(problems: list[Problem], capacity: int, ring: Ring) -> np.ndarray:
    bad = np.zeros(capacity, dtype=bool)
    for p in problems:
        if p.slots is not None:
            bad[p.slots[0] : p.slots[1] + 1] = True
        elif p.live_steps is not None:  # an ep_step break: the step where the structure breaks
            bad[np.arange(p.live_steps[0], p.live_steps[1] + 1) % capacity] = True
    return bad


def _choose(ring: Ring, bad_slots: np.ndarray) -> tuple[np.ndarray, int]:
    """Live positions to keep, oldest first, and how many live steps were dropped.

    Episodes are split where ``ep_step`` is 0. An episode with a damaged step is dropped whole; a kept
    episode left without its end (the next one was dropped, or damage faked a boundary) is closed as
    truncated in ``ring`` itself, and one left with a single step (no move) is dropped too.
    """
    positions = np.arange(ring.lo, ring.added, dtype=np.int64)
    if positions.size == 0:
        return positions, 0
    cap = ring.capacity
    slots = positions % cap
    starts = ring.ep_step[slots] == 0
    starts[0] = True
    episode = np.cumsum(starts) - 1
    dropped = np.zeros(int(episode[-1]) + 1, dtype=bool)
    dropped[episode[bad_slots[slots]]] = True
    ends = np.r_[starts[1:], True]  # the last step of each episode, in order
    end_pos, end_ep = positions[ends], episode[ends]
    unended = ~ring.is_last[end_pos % cap] & ~dropped[end_ep]
    unended[-1] = False  # the newest episode may still be in progress: a writer can continue it
    lone = unended & (np.bincount(episode)[end_ep] < 2)
    dropped[end_ep[lone]] = True
    close = end_pos[unended & ~lone]
    ring.is_last[close % cap] = True
    ring.truncated[(close - 1) % cap] = True
    keep = ~dropped[episode]
    return positions[keep], int(np.count_nonzero(~keep))


def _build(tmp: Path, src_root: Path, schema: Schema, layout: Layout, capacity: int, new_layout: Layout, ring: Ring,
           keep: np.ndarray, progress: Progress | None) -> int:
    """Write the kept steps into a new store at ``tmp``; returns its episode count."""
    if tmp.exists():
        shutil.rmtree(tmp)
    new = ReplayStore.create(tmp, capacity, schema.observation.to_space(), schema.action.to_space(), schema.frame_stack,
                             layout=new_layout, cache_bytes=0)
    try:
        n = int(keep.size)
        source = FrameReader(src_root, schema, layout, cache_bytes=0)
        try:
            step = new_layout.shard_len

            def frame_blocks() -> Iterator[np.ndarray]:
                for first in range(0, n, step):
                    yield source.gather(keep[first : first + step])
                    if progress is not None:
                        progress("write", min(first + step, n), n)

            new.load_steps({name: values[keep % ring.capacity] for name, values in ring.fields.items()},
                           frame_blocks())
        finally:
            source.close()
        new.flush()
        return new.episodes
    finally:
        new.close()


def _publish(tmp: Path, target: Path, *, in_place: bool) -> None:
    if not in_place:
        os.rename(tmp, target)
        fsync_dir(target.parent)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if sys.platform == "darwin":  # macOS: renamex_np(RENAME_SWAP) swaps two paths atomically
        fn = getattr(libc, "renamex_np", None)
        rc = -1 if fn is None else fn(os.fsencode(tmp), os.fsencode(target), RENAME_SWAP)
    else:  # Linux: renameat2(RENAME_EXCHANGE)
        fn = getattr(libc, "renameat2", None)
        rc = -1 if fn is None else fn(AT_FDCWD, os.fsencode(tmp), AT_FDCWD, os.fsencode(target), RENAME_EXCHANGE)
    if rc != 0:
        err = errno.ENOSYS if fn is None else ctypes.get_errno()
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(err, f"cannot swap {target} for its compacted copy atomically on this filesystem "
                           f"({os.strerror(err)}); compact to a new DST instead: replaystore compact {target} NEW_PATH")
    fsync_dir(target.parent)
    shutil.rmtree(tmp, ignore_errors=True)  # now the old store


def _remove_leftovers(target: Path) -> None:
    """Temporary directories of compactions that crashed (an unfinished copy, or a swapped-out original)."""
    for p in target.parent.glob(f".{target.name}.compact-*"):
        shutil.rmtree(p, ignore_errors=True)
