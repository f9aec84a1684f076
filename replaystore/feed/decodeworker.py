"""The decode worker process: decodes planned chunks and gathers frames into shared block memory.

Started by ``decodeprocs.DecodeProcesses`` as ``python -P decodeworker.py FD NBYTES`` (by path, so
it imports only the standard library and numpy: not replaystore, zarr or TensorFlow). ``FD`` is a
memfd holding the prefetcher's frame blocks, inherited from the parent and mapped shared, so what
this process writes there the parent sees without a copy.

Why a process: the prefetcher's worker threads wait for the GIL beside a consumer; here the half of
a block's work that needs no store state (decoding and gathering, most of it) runs under another
interpreter's lock (decodeprocs.py says more).

Protocol, on stdin / stdout, all integers int64 little-endian. A request is one block, framed:
``MAGIC``, its sequence number, and the byte length of what follows, then

- ``HEADER`` fields: ``k`` batches, ``parts`` per batch (a batch's frames may go to several arrays:
  ``obs[i]`` and ``next_obs[i]`` for transitions), ``rows`` frames per part, ``frame_nbytes``,
  ``chunk_nbytes``, the total number of chunks, of gathered rows, and blob bytes;
- per batch: its chunk count, its gathered-row count, whether its payloads may be decoded joined;
- per batch and part: the part's byte offset in the memfd;
- per chunk: its payload's byte length, or -1 for an empty chunk (fill value: zeros);
- per gathered row: its frame in the batch's decoded chunks (``chunk * chunk_len + offset``), then
  its destination row among the batch's parts laid end to end;
- the payloads, back to back.

The reply is two int64: the request's sequence number, then -1 when every batch was written, else
the index of the first batch whose chunks did not decode (the parent decodes that batch itself to
name the bad chunk). A frame that does not start with ``MAGIC``, or whose parts do not add up to
its length or point outside the shared memory, is never acted on: the process exits with status
``DESYNC`` (the parent then decodes on its threads). End of input ends the process. It runs in a process group of its own, so Ctrl-C in a terminal does not reach
it, and it ignores SIGINT anyway: the parent decides when it stops.
"""

from __future__ import annotations

import signal

if __name__ == "__main__":  # first thing, before the imports: the parent decides when this stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)

import mmap
import sys
from typing import Any

import numpy as np

HEADER = ("k", "parts", "rows", "frame_nbytes", "chunk_nbytes", "chunks", "gathered", "blob_nbytes")
OK = -1
MAGIC = 0x31515245444F4352  # b"RCODERQ1", little-endian
FRAME = 3  # int64s before a request's body: MAGIC, sequence number, body bytes
DESYNC = 4  # exit status: a request that cannot be trusted


class BadRequest(Exception):
    """A request whose framing or sizes are inconsistent: nothing of it is written."""


def load_libzstd() -> Any:
    """storage/libzstd.py's ``load_libzstd``, loaded by its path (this process imports nothing of
    replaystore, whose package would import zarr and more)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "storage" / "libzstd.py"
    spec = importlib.util.spec_from_file_location("replaystore_libzstd", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load_libzstd()


class BlockDecoder:
    """Fills blocks in ``memory`` (the mapped memfd) as requests describe them."""

    def __init__(self, memory: np.ndarray, lib: Any) -> None:
        self.memory = memory
        self.lib = lib
        self.dctx = lib.ZSTD_createDCtx()
        self.area = np.empty(0, np.uint8)  # decoded chunks of one batch, reused (fresh memory is costly)
        self.scratch = np.empty(0, np.uint8)

    def fill(self, head: dict[str, int], arrays: list[np.ndarray], blob: bytes | memoryview) -> int:
        """Decode and gather every batch of one request; ``OK`` or the first batch that failed."""
        chunk_counts, row_counts, joined, offsets, lengths, source, dest = arrays
        n_parts, rows, frame, chunk = head["parts"], head["rows"], head["frame_nbytes"], head["chunk_nbytes"]
        part = rows * frame
        view = memoryview(blob)
        c0 = r0 = b0 = 0
        for i in range(head["k"]):
            n, m = int(chunk_counts[i]), int(row_counts[i])
            mine = lengths[c0 : c0 + n]
            nbytes = int(mine[mine > 0].sum())
            if not self._decode(view[b0 : b0 + nbytes], mine, chunk, bool(joined[i])):
                return i
            frames = self.area[: n * chunk].reshape(-1, frame)
            parts = [self.memory[at : at + part].reshape(rows, frame)
                     for at in offsets[i * n_parts : (i + 1) * n_parts].tolist()]
            src, dst = source[r0 : r0 + m], dest[r0 : r0 + m]
            if m == n_parts * rows:  # every row from chunks, in order: gather straight into place
                for p, out in enumerate(parts):
                    np.take(frames, src[p * rows : (p + 1) * rows], axis=0, out=out, mode="clip")
            elif m:
                scratch = self._scratch(m * frame).reshape(m, frame)
                np.take(frames, src, axis=0, out=scratch, mode="clip")
                which = dst // rows
                for p, out in enumerate(parts):
                    mask = which == p
                    out[dst[mask] - p * rows] = scratch[mask]
            c0, r0, b0 = c0 + n, r0 + m, b0 + nbytes
        return OK

    def _decode(self, payloads: memoryview, lengths: np.ndarray, chunk: int, joined: bool) -> bool:
        """Decode one batch's chunks into ``self.area``: joined payloads by one call, else one by one."""
        want = lengths.size * chunk
        if self.area.size < want:
            self.area = np.empty(max(want, 2 * self.area.size), np.uint8)
        base = self.area.ctypes.data
        decompress = self.lib.ZSTD_decompressDCtx
        if joined and payloads.nbytes:
            data = payloads.tobytes()
            return decompress(self.dctx, base, want, data, len(data)) == want
        at = 0
        for j, length in enumerate(lengths.tolist()):
            if length < 0:
                self.area[j * chunk : (j + 1) * chunk] = 0
                continue
            data = payloads[at : at + length].tobytes()
            at += length
            if decompress(self.dctx, base + j * chunk, chunk, data, length) != chunk:
                return False
        return True

    def _scratch(self, nbytes: int) -> np.ndarray:
        if self.scratch.size < nbytes:
            self.scratch = np.empty(max(nbytes, 2 * self.scratch.size), np.uint8)
        return self.scratch[:nbytes]


def read_request(stream: Any, memory_nbytes: int) -> tuple[int, dict[str, int], list[np.ndarray], memoryview] | None:
    """One request from ``stream`` (its sequence number, header, arrays and payloads), or None at the
    end of input. Raises ``BadRequest`` for a frame that cannot be trusted."""
    frame = stream.read(8 * FRAME)
    if len(frame) < 8 * FRAME:
        return None
    magic, seq, length = np.frombuffer(frame, "<i8").tolist()
    if magic != MAGIC or not 8 * len(HEADER) <= length <= 1 << 40:
        raise BadRequest(f"frame {magic:#x} of {length} bytes")
    body = stream.read(length)
    if len(body) < length:
        return None
    head = dict(zip(HEADER, np.frombuffer(body[: 8 * len(HEADER)], "<i8").tolist(), strict=True))
    k, chunks, gathered = head["k"], head["chunks"], head["gathered"]
    sizes = [k, k, k, k * head["parts"], chunks, gathered, gathered]
    if min(sizes) < 0 or min(head.values()) < 0 or 8 * (len(HEADER) + sum(sizes)) + head["blob_nbytes"] != length:
        raise BadRequest("sizes that do not add up to the frame")
    flat = np.frombuffer(body, "<i8", count=len(HEADER) + sum(sizes))[len(HEADER):]
    arrays, at = [], 0
    for size in sizes:
        arrays.append(flat[at : at + size])
        at += size
    chunk_counts, row_counts, _, offsets, lengths, _, dest = arrays
    part = head["rows"] * head["frame_nbytes"]
    if (int(chunk_counts.sum()) != chunks or int(row_counts.sum()) != gathered
            or int(lengths[lengths > 0].sum()) != head["blob_nbytes"]
            or (offsets.size and (int(offsets.min()) < 0 or int(offsets.max()) + part > memory_nbytes))
            or (dest.size and (int(dest.min()) < 0 or int(dest.max()) >= head["parts"] * head["rows"]))):
        raise BadRequest("a request that points outside its block")
    return seq, head, arrays, memoryview(body)[8 * (len(HEADER) + sum(sizes)):]


def main(argv: list[str]) -> int:
    fd, nbytes = int(argv[1]), int(argv[2])
    lib = load_libzstd()
    if lib is None:
        return 3
    memory = np.frombuffer(mmap.mmap(fd, nbytes), np.uint8)
    decoder = BlockDecoder(memory, lib)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    try:
        while (request := read_request(stdin, nbytes)) is not None:
            seq, head, arrays, blob = request
            stdout.write(np.array([seq, decoder.fill(head, arrays, blob)], dtype="<i8").tobytes())
            stdout.flush()
    except BadRequest as exc:
        sys.stderr.write(f"replaystore decode process: {exc}; stopping\n")
        return DESYNC
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
