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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from replaystore.cli.compactplan import Piece, assign, choose, close_newest, cut_oldest, damaged_slots, split
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
        return _compact([source], [str(src)], dst, capacity=capacity, codec=codec, chunk_len=chunk_len,
                        shard_len=shard_len, num_streams=num_streams, drop_damaged=drop_damaged, progress=progress)
    finally:
        source.close()


def merge_stores(srcs: Sequence[str | Path], dst: str | Path, *, capacity: int | None = None,
                 codec: CodecSpec | None = None, chunk_len: int | None = None, shard_len: int | None = None,
                 num_streams: int | None = None, drop_damaged: bool = False,
                 progress: Progress | None = None) -> CompactReport:
    """One new store at ``dst`` holding the live steps of every store in ``srcs`` (``replaystore
    merge``): stores of one kind (the same observation and action spaces, frame stack and padding,
    and extras), each read under its writer locks and verified as ``compact`` does. Every source
    stream becomes a stream of the new store, in the order given (``num_streams``: that many
    instead, merged or split as ``compact`` does), its episode in progress closed as truncated. The
    capacity, unless given, is what keeps every live step: the most steps a new stream gets, times
    the streams; a smaller one keeps each new stream's newest steps. The layout and codec are the
    first source's unless given."""
    names = [str(s) for s in srcs]
    if len(names) < 2:
        raise ConfigError(f"merge takes two or more stores and got {len(names)}; to rewrite one store use "
                          "replaystore compact")
    sources: list[Source] = []
    try:
        for name in names:
            sources.append(Source(name))
        places = [_place(s.backend) for s in sources]
        for i, place in enumerate(places):
            if place in places[:i]:
                raise ConfigError(f"{names[i]} is the same store as {names[places.index(place)]}; name each store once")
        _same_kind(sources, names)
        return _compact(sources, names, dst, capacity=capacity, codec=codec, chunk_len=chunk_len, shard_len=shard_len,
                        num_streams=num_streams, drop_damaged=drop_damaged, progress=progress)
    finally:
        for source in sources:
            source.close()


def _same_kind(sources: list[Source], names: list[str]) -> None:
    """``ConfigError`` naming the first way a source's steps differ in kind from the first's."""
    first = sources[0].schema
    for source, name in zip(sources[1:], names[1:]):
        schema = source.schema
        for what, mine, theirs in (
                ("observations", schema.observation_space(), first.observation_space()),
                ("actions", schema.action.to_space(), first.action.to_space()),
                ("frame_stack", schema.frame_stack, first.frame_stack),
                ("frame padding", schema.frame_padding, first.frame_padding),
                ("extras", [(e.name, e.shape, e.dtype) for e in schema.extras],
                 [(e.name, e.shape, e.dtype) for e in first.extras])):
            if mine != theirs:
                raise ConfigError(f"{name} holds {what} {_shown(mine)}, but {names[0]} holds {_shown(theirs)}; merge "
                                  "stores of one kind (the same spaces, frame stack and extras)")


def _shown(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(f"{n} {np.dtype(d).name}{tuple(sh)}" for n, sh, d in value) + "]" if value else "none"
    return str(value)


def _place(backend: Backend) -> str:
    """Where a store is, as a prefix: its real directory (links followed) or its URL, with a slash."""
    return str(getattr(backend, "root", backend.where)).rstrip("/") + "/"


def _nested(a: Backend, b: Backend) -> bool:
    """One store's place inside the other's (not the same place: that is refused as existing)."""
    pa, pb = _place(a), _place(b)
    return pa != pb and (pa.startswith(pb) or pb.startswith(pa))


def _compact(sources: list[Source], names: list[str], dst: str | Path | None, *, capacity: int | None,
             codec: CodecSpec | None, chunk_len: int | None, shard_len: int | None, num_streams: int | None,
             drop_damaged: bool, progress: Progress | None) -> CompactReport:
    source, src = sources[0], names[0]  # (a merge's first store gives the kind of steps and the layout)
    merging = len(sources) > 1
    verb = "merge" if merging else "compact"
    schema, layout = source.schema, source.layout
    target = source.backend if dst is None else open_backend(dst)
    for each, name in zip(sources, names):
        if dst is not None and _nested(each.backend, target):
            inner, outer = (target, each.backend) if _place(target).startswith(_place(each.backend)) else (each.backend, target)
            raise UnsafePathError(errno.EINVAL, f"{inner.where} is inside {outer.where}: {verb} never writes a store "
                                  "inside another or around it (compacting one of them later would delete the other); "
                                  f"choose a DST outside {name}" + ("" if merging else f", or leave DST out to compact "
                                                                     f"{src} in place"))
    if dst is not None and target.exists():
        raise StoreExistsError(f"{target.where} already exists; choose a new DST"
                               + ("" if merging else f", or leave DST out to compact {src} in place"))
    n_src = sum(s.schema.num_streams for s in sources)
    held = f"{src} holds {n_src} stream(s)" if not merging else f"the stores hold {n_src} streams together"
    n_new = n_src if num_streams is None else num_streams
    if isinstance(n_new, bool) or not isinstance(n_new, int) or n_new < 1:
        raise ConfigError(f"num_streams is {num_streams!r}; {held}, and {verb} keeps them, merges them into fewer or "
                          "splits their episodes over more: pass an int >= 1")
    together = sum(s.schema.capacity for s in sources)  # (a merge's, until its streams' steps are known)
    new_capacity = (schema.capacity if not merging else -(-together // n_new) * n_new) if capacity is None else capacity
    if isinstance(new_capacity, bool) or not isinstance(new_capacity, int):
        raise ConfigError(f"capacity is {capacity!r}; it must be an int >= {2 * n_new}")
    whose = "" if capacity is not None else (f" ({src}'s)" if not merging else " (the stores' together)")
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
    for each in sources:
        each.hold(in_place=dst is None)
    staged = target.staging()
    pieces: list[Piece] = []
    problems: list[str] = []
    transitions_before = dropped_steps = 0
    for i, (each, name) in enumerate(zip(sources, names)):
        report = each.verify(None if progress is None else lambda d, t: progress("verify", d, t))
        fatal = [p for p in report.problems if p.array == "metadata"]
        if fatal:
            raise CorruptStoreError(f"{name} cannot be {verb}d: {fatal[0].message}")
        if report.problems and not drop_damaged:
            raise CorruptStoreError(
                f"{name} has {len(report.problems)} damaged chunk(s), first: {report.problems[0].message.split(';')[0]}; "
                f"run `replaystore {verb} --drop-damaged` to drop the episodes they hold"
            )
        problems += [(f"{name}: " if merging else "") + p.where() for p in report.problems]
        stride = stream_stride(each.schema, each.layout)
        bad = damaged_slots(report.problems, each.schema, stride, each.states)
        for k in range(each.schema.num_streams):
            ring = each.ring(k)
            transitions_before += ring.n_valid
            keep, dropped = choose(ring, bad[k * stride : k * stride + each.schema.stream_capacity])
            pieces.append(Piece(len(pieces), ring, keep, source=i, offset=k * stride))
            dropped_steps += dropped
    cut = 0
    fitted = merging and capacity is None  # (a merge's default capacity: what its new streams' steps need)
    if n_new < n_src:
        targets, unjoined = assign(pieces, n_new)
    elif n_new > n_src:
        targets, unjoined, cut = split(pieces, n_new, sum(int(p.keep.size) for p in pieces) if fitted else per_stream)
    else:
        for piece in pieces if merging else ():  # (no writer goes on in a merged store)
            close_newest(piece)
        targets, unjoined = [[p] for p in pieces], 0
    if fitted:
        per_stream = max(2, *(sum(int(p.keep.size) for p in group) for group in targets))
        new_capacity = per_stream * n_new
        new_layout = _new_layout(schema, layout, per_stream, codec=codec, chunk_len=chunk_len, shard_len=shard_len)
        validate_layout(new_layout, per_stream)
    for target_pieces in targets:
        cut += cut_oldest(target_pieces, per_stream)
    before = sum(each.nbytes() for each in sources)
    if staged.exists():
        staged.destroy()  # this process's own leftover
    what = f"the compacted copy of {src}" if not merging else f"the merged store of {', '.join(names)}"
    try:  # from here on, what is at ``staged`` is this run's unfinished copy
        new = ReplayStore.create(staged.where, new_capacity, schema.observation_space(), schema.action.to_space(),
                                 schema.frame_stack, layout=new_layout, cache_bytes=0, num_streams=n_new,
                                 frame_padding=schema.frame_padding,
                                 extras={e.name: (e.shape, e.dtype) for e in schema.extras})
        episodes = _build(new, [each.reader() for each in sources], targets, progress)
        check = verify_store(staged.where)
        if not check.ok:
            raise CorruptStoreError(f"{what} failed verification ({check.problems[0].message}); "
                                    f"{' and '.join(names)} {'is' if not merging else 'are'} unchanged")
    except StoreWriteError as exc:  # (its own advice, "call flush() again", is for a writer, not for compact)
        _discard(staged)
        full = exc.errno == errno.ENOSPC
        why = "disk full" if full else f"could not write ({os.strerror(exc.errno or errno.EIO)})"
        raise StoreWriteError(exc.errno, f"{why} while writing {what} for {target.where}; "
                              f"nothing of it is kept and {' and '.join(names)} {'is' if not merging else 'are'} "
                              f"unchanged: {'free space there' if full else 'fix that'}"
                              f"{', or choose another DST' if dst is not None else ''}, then "
                              f"{verb} again") from None
    except BaseException:
        _discard(staged)
        raise
    target.publish(staged, replace=dst is None)  # (a new DST: never over a store made there meanwhile)
    with ReplayStore.open(target.where) as result:
        after_transitions = len(result)
        after_bytes = sum(result.backend.stored_bytes().values())
    return CompactReport(
        src=", ".join(names), dst=target.where, transitions_before=transitions_before,
        transitions_after=after_transitions, steps_kept=sum(int(p.keep.size) for group in targets for p in group),
        episodes_kept=episodes, bytes_before=before, bytes_after=after_bytes, dropped=problems,
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


def _build(new: ReplayStore, readers: list[FrameReader], targets: list[list[Piece]], progress: Progress | None) -> int:
    """Write the kept steps into ``new`` (just created, and closed here): new stream ``j`` gets
    ``targets[j]``, end to end, each piece's frames read from ``readers[piece.source]``; returns the
    new store's episode count."""
    try:
        total = sum(int(p.keep.size) for group in targets for p in group)
        written = [0]
        step = new.layout.shard_len
        for j, group in enumerate(targets):
            scalars = {name: np.concatenate([p.ring.fields[name][p.keep % p.ring.capacity] for p in group]
                                            or [np.zeros((0, *shape), dtype=dtype)])
                       for name, (shape, dtype) in scalar_fields(new.schema.action, new.schema.extras).items()}

            def frame_blocks(group: list[Piece] = group) -> Iterator[np.ndarray]:
                for piece in group:
                    slots = piece.offset + piece.keep % piece.ring.capacity
                    for first in range(0, slots.size, step):
                        yield readers[piece.source].gather(slots[first : first + step])
                        written[0] += min(step, slots.size - first)
                        if progress is not None:
                            progress("write", written[0], total)

            new.load_steps(scalars, frame_blocks(), stream=j)
        new.flush()
        return new.episodes
    finally:
        new.close()
