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

A store of streams (docs/streams.md) is compacted stream by stream, under every stream's writer
lock. By default each stream ``k`` becomes stream ``k`` of the result, its episode in progress kept
for a writer to continue. ``num_streams=M`` (``--streams M``) merges them into ``M < N`` streams:
each source stream goes whole into one new stream, the fullest first into the emptiest, laid end to
end. Episodes stay whole: each source stream's episode in progress is closed as truncated, and a
source stream that does not come first in its new stream leaves out its oldest episode when the
ring had already overwritten that episode's beginning (a step's stack must not reach into the
episode before it). The report counts those steps (``steps_unjoined``).
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
    SCALAR_FIELDS,
    CodecSpec,
    Layout,
    Schema,
    State,
    default_layout,
    from_attrs,
    stream_stride,
)
from replaystore.format.shards import (
    decode_shard,
    fsync_dir,
    numcodecs_codec,
    shard_key,
)
from replaystore.format.validate import read_group_doc, validate_layout
from replaystore.storage.commits import read_stream_state
from replaystore.storage.lock import WriterLock
from replaystore.storage.reader import FrameReader
from replaystore.storage.ring import Ring
from replaystore.storage.writer import stream_dir
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
    streams_before: int = 1
    streams_after: int = 1
    steps_unjoined: int = 0  # merging: steps of episodes that began before a stream's oldest live step


@dataclass
class _Piece:
    """One source stream's kept steps: its ring, its number and the positions kept, oldest first."""

    stream: int
    ring: Ring
    keep: np.ndarray


def compact_store(src: str | Path, dst: str | Path | None = None, *, capacity: int | None = None,
                  codec: CodecSpec | None = None, chunk_len: int | None = None, shard_len: int | None = None,
                  num_streams: int | None = None, drop_damaged: bool = False,
                  progress: Progress | None = None) -> CompactReport:
    """Rewrite the store at ``src`` into ``dst`` (or in place when ``dst`` is None); see the module doc.

    A store of streams keeps its streams (stream ``k`` becomes stream ``k``), or with
    ``num_streams`` fewer than it has, is merged into that many: each source stream goes whole into
    one new stream (the fullest first, each into the emptiest), episodes stay whole, and episodes in
    progress are closed as truncated (no writer can continue a merged stream's env).

    Example:
        >>> compact_store("runs/quickstart/replay.zarr", capacity=50_000).transitions_after  # doctest: +SKIP
        49998
    """
    from replaystore.storage.objects import is_url

    for where in (src, dst):
        if is_url(where):
            raise ConfigError(f"compact works on stores on a local disk, and {where} is a URL; to compact a store on "
                              "object storage, read it with ReplayStore.open and load_steps() into a new store")
    root = Path(src)
    doc = read_group_doc(root)
    schema, layout, state = from_attrs(doc.get("attributes"), path=str(root))
    target = root if dst is None else Path(dst)
    if dst is not None and target.exists():
        raise StoreExistsError(f"{target} already exists; choose a new DST, or leave DST out to compact {root} in place")
    n_src = schema.num_streams
    n_new = n_src if num_streams is None else num_streams
    if isinstance(n_new, bool) or not isinstance(n_new, int) or not 1 <= n_new <= n_src:
        raise ConfigError(f"num_streams is {num_streams!r}; {root} holds {n_src} stream(s), and compact keeps them "
                          f"or merges them into fewer: pass an int from 1 to {n_src}")
    new_capacity = schema.capacity if capacity is None else capacity
    if isinstance(new_capacity, bool) or not isinstance(new_capacity, int) or new_capacity < 2 * n_new:
        raise ConfigError(f"capacity is {capacity!r}; it must be an int >= {2 * n_new}")
    if new_capacity % n_new:
        low = new_capacity - new_capacity % n_new
        raise ConfigError(f"capacity {new_capacity:,} does not split evenly into {n_new} streams; use {low:,} or "
                          f"{low + n_new:,}")
    per_stream = new_capacity // n_new
    new_layout = _new_layout(schema, layout, per_stream, codec=codec, chunk_len=chunk_len, shard_len=shard_len)
    validate_layout(new_layout, per_stream)
    locks = [WriterLock(root)] if n_src == 1 else [WriterLock(stream_dir(root, k), f"stream {k} of {root}")
                                                   for k in range(n_src)]
    held: list[WriterLock] = []
    try:
        for lock in locks:
            lock.acquire()
            held.append(lock)
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
        states = [state] if n_src == 1 else [read_stream_state(root, k) for k in range(n_src)]
        stride = stream_stride(schema, layout)
        bad = _damaged_slots(report.problems, schema, stride, states)
        pieces: list[_Piece] = []
        transitions_before = dropped_steps = 0
        for k, st in enumerate(states):
            ring = _load_scalars(root, schema, layout, st, k * stride // layout.shard_len)
            ring.rebuild_valid()
            transitions_before += ring.n_valid
            keep, dropped = _choose(ring, bad[k * stride : k * stride + schema.stream_capacity])
            pieces.append(_Piece(k, ring, keep))
            dropped_steps += dropped
        targets, unjoined = _assign(pieces, n_new) if n_new < n_src else ([[p] for p in pieces], 0)
        cut = 0
        for target_pieces in targets:
            cut += _cut_oldest(target_pieces, per_stream)
        tmp = target.parent / f".{target.name}.compact-{os.getpid()}"
        before = sum(disk_bytes(root).values())
        episodes = _build(tmp, root, schema, layout, new_capacity, new_layout, stride, targets, progress)
        check = verify_store(tmp)
        if not check.ok:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CorruptStoreError(f"the compacted copy failed verification ({check.problems[0].message}); "
                                    f"{root} is unchanged")
        _publish(tmp, target, in_place=dst is None)
        with ReplayStore.open(target) as result:
            after_transitions = len(result)
    finally:
        for lock in reversed(held):
            lock.release()
    return CompactReport(
        src=str(root), dst=str(target), transitions_before=transitions_before, transitions_after=after_transitions,
        steps_kept=sum(int(p.keep.size) for p in pieces), episodes_kept=episodes, bytes_before=before,
        bytes_after=sum(disk_bytes(target).values()), dropped=[p.where() for p in report.problems],
        steps_dropped=dropped_steps, steps_cut=cut, streams_before=n_src, streams_after=n_new,
        steps_unjoined=unjoined,
    )


def _new_layout(schema: Schema, layout: Layout, capacity: int, *, codec: CodecSpec | None, chunk_len: int | None,
                shard_len: int | None) -> Layout:
    """The new store's layout for streams of ``capacity`` steps each."""
    base = layout
    if shard_len is None and capacity < layout.shard_len:
        base = replace(layout, shard_len=default_layout(schema.observation.frame_bytes, capacity).shard_len)
    new_shard = shard_len or base.shard_len
    new_chunk = chunk_len or min(base.obs_chunk_len, new_shard)
    return Layout(shard_len=new_shard, obs_chunk_len=new_chunk, codec=codec or layout.codec)


def _load_scalars(root: Path, schema: Schema, layout: Layout, state: State, base_shard: int) -> Ring:
    """One stream's scalar arrays (its shard ``j`` is the arrays' ``base_shard + j``), with damaged
    shards left as zeros (verify has named their slots)."""
    capacity = schema.stream_capacity
    ring = Ring(capacity, schema.frame_stack, layout.shard_len)
    ring.added, ring.oldest = state.added, state.oldest
    codec = numcodecs_codec(layout.codec)
    n_shards = -(-capacity // layout.shard_len)
    for name, values in ring.fields.items():
        out = np.zeros(layout.shard_len, dtype=values.dtype)
        for shard in range(n_shards):
            start = shard * layout.shard_len
            rows = min(layout.shard_len, capacity - start)
            try:
                decode_shard((root / shard_key(name, base_shard + shard, 0)).read_bytes(), chunk_len=layout.shard_len,
                             n_chunks=1, codec=codec, out=out, name=name, shard=base_shard + shard)
            except (FileNotFoundError, ChunkChecksumError):
                out[:] = 0
            values[start : start + rows] = out[:rows]
    return ring


def _damaged_slots(problems: list[Problem], schema: Schema, stride: int, states: list[State]) -> np.ndarray:
    """The store's slots (all streams) that verify found damaged."""
    bad = np.zeros(schema.num_streams * stride, dtype=bool)
    capacity = schema.stream_capacity
    for p in problems:
        if p.slots is not None:
            bad[p.slots[0] : p.slots[1] + 1] = True
        elif p.live_steps is not None:  # an ep_step break: the step where the structure breaks
            bad[p.stream * stride + np.arange(p.live_steps[0], p.live_steps[1] + 1) % capacity] = True
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


def _assign(pieces: list[_Piece], n_new: int) -> tuple[list[list[_Piece]], int]:
    """Merge: each source stream into one of ``n_new`` new streams, the fullest first into the
    emptiest, laid end to end in source order. Every piece's episode in progress is closed as
    truncated, and a piece that does not start its new stream loses its oldest episode if that
    began before its stream's oldest live step (its first frames are gone, so its steps cannot
    follow another episode's). Returns the pieces per new stream and the steps so left out."""
    unjoined = 0
    for piece in pieces:
        _close_newest(piece)
    order = sorted(pieces, key=lambda p: (-p.keep.size, p.stream))
    targets: list[list[_Piece]] = [[] for _ in range(n_new)]
    sizes = [0] * n_new
    for piece in order:
        j = min(range(n_new), key=lambda t: (sizes[t], t))
        targets[j].append(piece)
        sizes[j] += int(piece.keep.size)
    for group in targets:
        group.sort(key=lambda p: p.stream)
        for piece in group[1:]:
            ring, keep = piece.ring, piece.keep
            if keep.size and ring.ep_step[keep[0] % ring.capacity] != 0:
                first_start = np.flatnonzero(ring.ep_step[keep % ring.capacity] == 0)
                n = int(first_start[0]) if first_start.size else int(keep.size)
                piece.keep = keep[n:]
                unjoined += n
    return targets, unjoined


def _close_newest(piece: _Piece) -> None:
    """Close ``piece``'s newest episode as truncated if it is in progress (drop it if it has no move)."""
    ring, keep = piece.ring, piece.keep
    if not keep.size:
        return
    cap = ring.capacity
    last = int(keep[-1])
    if ring.is_last[last % cap]:
        return
    if ring.ep_step[last % cap] == 0 or keep.size < 2:  # one step, no move yet
        piece.keep = keep[:-1]
        return
    ring.is_last[last % cap] = True
    ring.truncated[(last - 1) % cap] = True


def _cut_oldest(pieces: list[_Piece], capacity: int) -> int:
    """Leave out the oldest steps of a new stream's pieces beyond ``capacity``; returns how many."""
    excess = sum(int(p.keep.size) for p in pieces) - capacity
    cut = max(0, excess)
    for piece in pieces:
        if excess <= 0:
            break
        n = min(excess, int(piece.keep.size))
        piece.keep = piece.keep[n:]
        excess -= n
    return cut


def _build(tmp: Path, src_root: Path, schema: Schema, layout: Layout, capacity: int, new_layout: Layout, stride: int,
           targets: list[list[_Piece]], progress: Progress | None) -> int:
    """Write the kept steps into a new store at ``tmp`` (new stream ``j`` gets ``targets[j]``, end
    to end); returns its episode count."""
    if tmp.exists():
        shutil.rmtree(tmp)
    new = ReplayStore.create(tmp, capacity, schema.observation.to_space(), schema.action.to_space(), schema.frame_stack,
                             layout=new_layout, cache_bytes=0, num_streams=len(targets))
    try:
        # Source frames are read by the store's slot (stream k's position p is slot k*stride + p % capacity).
        source = FrameReader(src_root, schema, layout, cache_bytes=0)
        total = sum(int(p.keep.size) for group in targets for p in group)
        written = [0]
        try:
            for j, group in enumerate(targets):
                slots = np.concatenate([p.stream * stride + p.keep % p.ring.capacity for p in group]
                                       or [np.zeros(0, dtype=np.int64)])
                scalars = {name: np.concatenate([p.ring.fields[name][p.keep % p.ring.capacity] for p in group]
                                                or [np.zeros(0, dtype=dtype)])
                           for name, dtype in SCALAR_FIELDS.items()}
                step = new_layout.shard_len

                def frame_blocks(slots: np.ndarray = slots) -> Iterator[np.ndarray]:
                    for first in range(0, slots.size, step):
                        yield source.gather(slots[first : first + step])
                        written[0] += min(step, slots.size - first)
                        if progress is not None:
                            progress("write", written[0], total)

                new.load_steps(scalars, frame_blocks(), stream=j)
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
