"""``replaystore verify``: read every chunk of every array, check its crc32c and that it decodes,
and check the metadata against the data (array shapes, the ep_step sequence, live shards present).

Each problem names the array, shard and chunk, the slots it covers and the live steps (positions)
those slots hold, so a user knows which transitions are affected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from replaystore.errors import ChunkChecksumError, CorruptStoreError, ReplayStoreError
from replaystore.format.schema import Layout, Schema, State, scalar_fields, stream_stride
from replaystore.format.shards import (
    CRC_BYTES,
    EMPTY,
    INDEX_ENTRY_BYTES,
    check_chunk,
    check_index_layout,
    decode_chunk,
    numcodecs_codec,
    parse_index,
)
from replaystore.storage.backend import Backend
from replaystore.storage.choose import open_backend


@dataclass
class Problem:
    """One damaged chunk (or shard, or piece of metadata)."""

    array: str
    shard: int | None
    chunk: int | None
    slots: tuple[int, int] | None  # first, last slot covered
    live_steps: tuple[int, int] | None  # first, last live position in those slots
    message: str
    stream: int = 0  # the stream the slots and positions belong to

    def where(self) -> str:
        """``obs shard 1 chunk 2 slots 24..27; holds live steps 88..91``"""
        out = self.array + (f" shard {self.shard}" if self.shard is not None else "")
        out += f" chunk {self.chunk}" if self.chunk is not None else ""
        out += f" slots {self.slots[0]}..{self.slots[1]}" if self.slots else ""
        live = self.live_steps
        return out + (f"; holds live steps {live[0]}..{live[1]}" if live else "; holds no live steps")


@dataclass
class Report:
    chunks_checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    states: list[State] | None = None  # each stream's commit, as checked

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_store(path: str | Path | Backend, *, progress: Callable[[int, int], None] | None = None) -> Report:
    """Check every chunk of the store at ``path`` (every stream of it; ``path`` may be a backend whose
    metadata is read); ``progress(done, total)`` is called per shard. The report's ``states`` are the
    commits checked."""
    report = Report()
    backend = path if isinstance(path, Backend) else open_backend(path)
    schema, layout = backend.read_metadata(check_arrays=False)
    try:
        backend.check_arrays()
        states = [backend.read_state(k) for k in range(schema.num_streams)]
    except ReplayStoreError as exc:
        report.problems.append(Problem("metadata", None, None, None, None, str(exc)))
        return report
    report.states = states

    def load(name: str, shard: int, k: int, local: int, ndim: int) -> bytes | None:
        return backend.read_shards([(name, k, local)])[0]

    return _verify(report, schema, layout, states, load, progress)


def _verify(report: Report, schema: Schema, layout: Layout, states: list[State],
            load: Callable[[str, int, int, int, int], bytes | None],
            progress: Callable[[int, int], None] | None) -> Report:
    """Check every chunk ``load(array, shard, stream, stream's shard, item ndim)`` gives."""
    capacity = schema.stream_capacity  # each stream's ring
    stride = stream_stride(schema, layout)
    per_stream = -(-capacity // layout.shard_len)  # shards a stream uses
    live = [(st.live_start(capacity), st.added) for st in states]
    codec = numcodecs_codec(layout.codec)
    arrays = {"obs": (schema.observation.shape, schema.observation.dtype, layout.obs_chunk_len)}
    arrays.update({name: (shape, dtype, layout.shard_len) for name, (shape, dtype) in scalar_fields(schema.action, schema.extras).items()})
    total, done = schema.num_streams * per_stream * len(arrays), 0
    ep_step = np.zeros(schema.num_streams * stride, dtype=np.int64)

    def live_range(first_slot: int, last_slot: int) -> tuple[int, int] | None:
        """The live positions (of the slots' stream) held by store slots ``first_slot..last_slot``."""
        k = first_slot // stride
        lo, added = live[k]
        positions = np.arange(lo, added, dtype=np.int64)
        slots = k * stride + positions % capacity
        hit = positions[(slots >= first_slot) & (slots <= last_slot)]
        return (int(hit.min()), int(hit.max())) if hit.size else None

    for name, (shape, dtype, chunk_len) in arrays.items():
        per_shard = layout.shard_len // chunk_len
        out = np.empty((chunk_len, *shape), dtype=dtype)
        for k in range(schema.num_streams):
            for local in range(per_stream):
                shard = k * stride // layout.shard_len + local
                done += 1
                if progress is not None:
                    progress(done, total)
                first = k * stride + local * layout.shard_len
                end = k * stride + capacity  # the stream's slots end here
                rows = min(layout.shard_len, end - first)
                slot_range = (first, first + rows - 1)
                try:
                    got = load(name, shard, k, local, len(shape))
                except CorruptStoreError as exc:  # named by the commit, but gone
                    report.problems.append(Problem(name, shard, None, slot_range, live_range(*slot_range), str(exc), k))
                    continue
                if got is None:
                    held = live_range(*slot_range)
                    if held is not None:
                        report.problems.append(Problem(name, shard, None, slot_range, held,
                                                       f"shard {shard} of '{name}' is missing but holds live steps "
                                                       f"{held[0]}..{held[1]}" + _of_stream(schema, k), k))
                    continue
                raw = memoryview(got)
                tail = per_shard * INDEX_ENTRY_BYTES + CRC_BYTES
                try:
                    index = parse_index(raw[max(0, len(raw) - tail):], per_shard, name=name, shard=shard)
                    check_index_layout(index, len(raw) - tail, name=name, shard=shard)
                except ChunkChecksumError as exc:
                    report.problems.append(Problem(name, shard, None, slot_range, live_range(*slot_range), str(exc), k))
                    continue
                for c in range(per_shard):
                    c_first = first + c * chunk_len
                    if c_first >= end:
                        break
                    c_range = (c_first, min(c_first + chunk_len, end) - 1)
                    off, nbytes = index[c]
                    report.chunks_checked += 1
                    try:
                        if off == EMPTY:
                            out[...] = 0
                        elif int(off) + int(nbytes) > len(raw) - tail:
                            raise ChunkChecksumError(f"chunk {c} of shard {shard} of '{name}' points past its shard's data",
                                                     array=name, shard=shard, chunk=c)
                        else:
                            payload = check_chunk(raw[int(off) : int(off) + int(nbytes)], name=name, shard=shard,
                                                  chunk=c, first_step=c_first, steps=chunk_len)
                            decode_chunk(payload, codec, out, name=name, shard=shard, chunk=c)
                    except ChunkChecksumError as exc:
                        report.problems.append(Problem(name, shard, c, c_range, live_range(*c_range), str(exc), k))
                        continue
                    if name == "ep_step":
                        ep_step[c_first : c_range[1] + 1] = out[: c_range[1] + 1 - c_first]
    for k, (lo, added) in enumerate(live):
        _check_ep_steps(report, ep_step[k * stride : k * stride + capacity], lo, added, capacity, k,
                        _of_stream(schema, k))
    return report


def _of_stream(schema: Schema, k: int) -> str:
    return f" (stream {k})" if schema.num_streams > 1 else ""


def _check_ep_steps(report: Report, ep_step: np.ndarray, lo: int, added: int, capacity: int, stream: int = 0,
                    where: str = "") -> None:
    if any(p.array == "ep_step" and p.stream == stream for p in report.problems):
        return
    positions = np.arange(lo, added, dtype=np.int64)
    ep = ep_step[positions % capacity]
    bad = np.flatnonzero((ep[1:] != 0) & (ep[1:] != ep[:-1] + 1))
    if ep.size and ep.min() < 0:
        bad = np.append(bad, 0)
    if bad.size:
        p = int(positions[bad[0] + 1]) if bad[0] + 1 < positions.size else int(positions[0])
        report.problems.append(Problem("ep_step", None, None, None, (p, p),
            f"ep_step breaks its sequence at step {p}{where}: the episode structure disagrees with the committed state",
            stream))
