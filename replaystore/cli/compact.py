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
3. Publish it (``Backend.publish``). Locally, to a new DST: one ``rename``; in place:
   ``renameat2(RENAME_EXCHANGE)`` on Linux (``renamex_np(RENAME_SWAP)`` on macOS) swaps the two
   directories in one atomic step, then the old one is deleted. A crash at any moment leaves either
   the old store or the new one at the path, never neither (tests/test_compact.py kills it at
   random moments); a leftover temporary directory is removed by the next compact. On object
   storage the copy is built at its new URL directly (a store there is never replaced in place).

A store of streams (docs/streams.md) is compacted stream by stream, under every stream's writer
lock. By default each stream ``k`` becomes stream ``k`` of the result, its episode in progress kept
for a writer to continue. ``num_streams=M`` (``--streams M``) merges them into ``M < N`` streams:
each source stream goes whole into one new stream, the fullest first into the emptiest, laid end to
end. Episodes stay whole: each source stream's episode in progress is closed as truncated, and a
source stream that does not come first in its new stream leaves out its oldest episode when the
ring had already overwritten that episode's beginning (a step's stack must not reach into the
episode before it). The report counts those steps (``steps_unjoined``). ``num_streams=M > N`` splits
them: the source streams' episodes, oldest first and stream after stream, are cut at the episode
boundaries nearest to equal shares into M runs of whole episodes, one per new stream (so a store
written by one env can take a vector env's M envs), after the oldest steps beyond the new capacity
are left out; episodes in progress are closed and oldest episodes that lost their beginning are
left out as in a merge.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from replaystore.cli.compactplan import Piece, assign, choose, cut_oldest, damaged_slots, split
from replaystore.cli.compactsource import Source
from replaystore.cli.verify import verify_store
from replaystore.errors import (
    ConfigError,
    CorruptStoreError,
    StoreExistsError,
    StoreWriteError,
    UnsafePathError,
)
from replaystore.format.schema import (
    CodecSpec,
    Layout,
    Schema,
    default_layout,
    scalar_fields,
    stream_stride,
)
from replaystore.format.validate import validate_layout
from replaystore.storage.backend import Backend
from replaystore.storage.choose import open_backend
from replaystore.storage.reader import FrameReader
from replaystore.store import ReplayStore

Progress = Callable[[str, int, int], None]


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
    capacity_after: int = 0  # the new store's capacity, all streams
    steps_unjoined: int = 0  # merging/splitting: steps of episodes that began before a stream's oldest live step


def compact_store(src: str | Path, dst: str | Path | None = None, *, capacity: int | None = None,
                  codec: CodecSpec | None = None, chunk_len: int | None = None, shard_len: int | None = None,
                  num_streams: int | None = None, drop_damaged: bool = False,
                  progress: Progress | None = None) -> CompactReport:
    """Rewrite the store at ``src`` into ``dst`` (or in place when ``dst`` is None); see the module doc.

    A store of streams keeps its streams (stream ``k`` becomes stream ``k``), or with
    ``num_streams`` fewer than it has, is merged into that many: each source stream goes whole into
    one new stream (the fullest first, each into the emptiest), episodes stay whole, and episodes in
    progress are closed as truncated (no writer can continue a merged stream's env). With
    ``num_streams`` more than it has, its episodes are split over that many streams, whole, in
    runs of about equal length.

    Example:
        >>> compact_store("runs/quickstart/replay.zarr", capacity=50_000).transitions_after  # doctest: +SKIP
        49998
    """
    source = Source(src)
    try:
        return _compact(source, src, dst, capacity=capacity, codec=codec, chunk_len=chunk_len, shard_len=shard_len,
                        num_streams=num_streams, drop_damaged=drop_damaged, progress=progress)
    finally:
        source.close()


def _place(backend: Backend) -> str:
    """Where a store is, as a prefix: its real directory (links followed) or its URL, with a slash."""
    return str(getattr(backend, "root", backend.where)).rstrip("/") + "/"


def _nested(a: Backend, b: Backend) -> bool:
    """One store's place inside the other's (not the same place: that is refused as existing)."""
    pa, pb = _place(a), _place(b)
    return pa != pb and (pa.startswith(pb) or pb.startswith(pa))


def _compact(source: Source, src: str | Path, dst: str | Path | None, *, capacity: int | None,
             codec: CodecSpec | None, chunk_len: int | None, shard_len: int | None, num_streams: int | None,
             drop_damaged: bool, progress: Progress | None) -> CompactReport:
    schema, layout = source.schema, source.layout
    target = source.backend if dst is None else open_backend(dst)
    if dst is not None and _nested(source.backend, target):
        inner, outer = (target, source.backend) if _place(target).startswith(_place(source.backend)) else (source.backend, target)
        raise UnsafePathError(errno.EINVAL, f"{inner.where} is inside {outer.where}: compact never writes a store inside "
                              "another or around it (compacting one of them later would delete the other); choose a "
                              f"DST outside {src}, or leave DST out to compact {src} in place")
    if dst is not None and target.exists():
        raise StoreExistsError(f"{target.where} already exists; choose a new DST, or leave DST out to compact {src} "
                               "in place")
    n_src = schema.num_streams
    n_new = n_src if num_streams is None else num_streams
    if isinstance(n_new, bool) or not isinstance(n_new, int) or n_new < 1:
        raise ConfigError(f"num_streams is {num_streams!r}; {src} holds {n_src} stream(s), and compact keeps them, "
                          "merges them into fewer or splits their episodes over more: pass an int >= 1")
    new_capacity = schema.capacity if capacity is None else capacity
    if isinstance(new_capacity, bool) or not isinstance(new_capacity, int):
        raise ConfigError(f"capacity is {capacity!r}; it must be an int >= {2 * n_new}")
    whose = "" if capacity is not None else f" ({src}'s)"
    if new_capacity < 2 * n_new:
        raise ConfigError(f"capacity {new_capacity:,}{whose} cannot hold {n_new:,} streams of at least 2 steps each: "
                          f"pass a capacity >= {2 * n_new:,}, or fewer streams")
    if new_capacity % n_new:
        low = new_capacity - new_capacity % n_new
        raise ConfigError(f"capacity {new_capacity:,}{whose} does not split evenly into {n_new} streams; pass a "
                          f"capacity of {low:,} or {low + n_new:,}")
    per_stream = new_capacity // n_new
    new_layout = _new_layout(schema, layout, per_stream, codec=codec, chunk_len=chunk_len, shard_len=shard_len)
    validate_layout(new_layout, per_stream)
    source.hold(in_place=dst is None)
    staged = target.staging()
    report = source.verify(None if progress is None else lambda d, t: progress("verify", d, t))
    fatal = [p for p in report.problems if p.array == "metadata"]
    if fatal:
        raise CorruptStoreError(f"{src} cannot be compacted: {fatal[0].message}")
    if report.problems and not drop_damaged:
        raise CorruptStoreError(
            f"{src} has {len(report.problems)} damaged chunk(s), first: {report.problems[0].message.split(';')[0]}; "
            "run `replaystore compact --drop-damaged` to drop the episodes they hold"
        )
    stride = stream_stride(schema, layout)
    bad = damaged_slots(report.problems, schema, stride, source.states)
    pieces: list[Piece] = []
    transitions_before = dropped_steps = 0
    for k in range(n_src):
        ring = source.ring(k)
        transitions_before += ring.n_valid
        keep, dropped = choose(ring, bad[k * stride : k * stride + schema.stream_capacity])
        pieces.append(Piece(k, ring, keep))
        dropped_steps += dropped
    cut = 0
    if n_new < n_src:
        targets, unjoined = assign(pieces, n_new)
    elif n_new > n_src:
        targets, unjoined, cut = split(pieces, n_new, per_stream)
    else:
        targets, unjoined = [[p] for p in pieces], 0
    for target_pieces in targets:
        cut += cut_oldest(target_pieces, per_stream)
    before = source.nbytes()
    if staged.exists():
        staged.destroy()  # this process's own leftover
    try:  # from here on, what is at ``staged`` is this run's unfinished copy
        new = ReplayStore.create(staged.where, new_capacity, schema.observation_space(), schema.action.to_space(),
                                 schema.frame_stack, layout=new_layout, cache_bytes=0, num_streams=n_new,
                                 frame_padding=schema.frame_padding,
                                 extras={e.name: (e.shape, e.dtype) for e in schema.extras})
        episodes = _build(new, source.reader(), stride, targets, progress)
        check = verify_store(staged.where)
        if not check.ok:
            raise CorruptStoreError(f"the compacted copy failed verification ({check.problems[0].message}); "
                                    f"{src} is unchanged")
    except StoreWriteError as exc:  # (its own advice, "call flush() again", is for a writer, not for compact)
        _discard(staged)
        full = exc.errno == errno.ENOSPC
        why = "disk full" if full else f"could not write ({os.strerror(exc.errno or errno.EIO)})"
        raise StoreWriteError(exc.errno, f"{why} while writing the compacted copy of {src} for {target.where}; "
                              f"nothing of the copy is kept and {src} is unchanged: "
                              f"{'free space there' if full else 'fix that'}"
                              f"{', or choose another DST' if dst is not None else ''}, then compact again") from None
    except BaseException:
        _discard(staged)
        raise
    target.publish(staged)
    with ReplayStore.open(target.where) as result:
        after_transitions = len(result)
        after_bytes = sum(result.backend.stored_bytes().values())
    return CompactReport(
        src=str(src), dst=target.where, transitions_before=transitions_before, transitions_after=after_transitions,
        steps_kept=sum(int(p.keep.size) for group in targets for p in group), episodes_kept=episodes, bytes_before=before,
        bytes_after=after_bytes, dropped=[p.where() for p in report.problems],
        steps_dropped=dropped_steps, steps_cut=cut, streams_before=n_src, streams_after=n_new,
        capacity_after=new_capacity, steps_unjoined=unjoined,
    )


def _discard(staged: Backend) -> None:
    """Remove an unfinished copy."""
    try:
        staged.destroy()
    except Exception as exc:  # noqa: BLE001 - the first error is the one to report
        print(f"warning: could not remove the unfinished copy at {staged.where} ({exc}); delete it", file=sys.stderr)


def _new_layout(schema: Schema, layout: Layout, capacity: int, *, codec: CodecSpec | None, chunk_len: int | None,
                shard_len: int | None) -> Layout:
    """The new store's layout for streams of ``capacity`` steps each."""
    base = layout
    if shard_len is None and capacity < layout.shard_len:
        base = replace(layout, shard_len=default_layout(schema.observation.frame_bytes, capacity).shard_len)
    new_shard = base.shard_len if shard_len is None else shard_len  # (0 is refused by validate_layout, not ignored)
    new_chunk = min(base.obs_chunk_len, new_shard) if chunk_len is None else chunk_len
    return Layout(shard_len=new_shard, obs_chunk_len=new_chunk, codec=codec or layout.codec)


def _build(new: ReplayStore, source: FrameReader, stride: int, targets: list[list[Piece]],
           progress: Progress | None) -> int:
    """Write the kept steps into ``new`` (just created, and closed here): new stream ``j`` gets
    ``targets[j]``, end to end; returns its episode count."""
    try:
        total = sum(int(p.keep.size) for group in targets for p in group)
        written = [0]
        for j, group in enumerate(targets):
            slots = np.concatenate([p.stream * stride + p.keep % p.ring.capacity for p in group]
                                   or [np.zeros(0, dtype=np.int64)])
            scalars = {name: np.concatenate([p.ring.fields[name][p.keep % p.ring.capacity] for p in group]
                                            or [np.zeros((0, *shape), dtype=dtype)])
                       for name, (shape, dtype) in scalar_fields(new.schema.action, new.schema.extras).items()}
            step = new.layout.shard_len

            def frame_blocks(slots: np.ndarray = slots) -> Iterator[np.ndarray]:
                for first in range(0, slots.size, step):
                    yield source.gather(slots[first : first + step])
                    written[0] += min(step, slots.size - first)
                    if progress is not None:
                        progress("write", written[0], total)

            new.load_steps(scalars, frame_blocks(), stream=j)
        new.flush()
        return new.episodes
    finally:
        new.close()
