"""Decode processes: the prefetcher's GIL-free work (decoding chunks, gathering frames) run in child
processes that write straight into frame blocks shared with this one.

Why: with its work on two threads, the prefetcher kept two cores only ~1.6 busy beside a consumer.
Measured per batch on the 1M-frame benchmark store: the threads waited ~100-145 us for the GIL
(against ~55 us with no consumer), between ~275 us of decoding, ~90 us of gathering and ~55 us
of planning; an empty Python loop got ~0.75x the rate of two threads calling ``store.sample``. With
the decoding and gathering in two processes, tools/bench_sampling.py's Python loop got 0.93x, 0.97x
and 0.75x that rate in three runs, against 0.86x, 0.90x and 0.67x on threads in the same runs (the
lower pair when the machine ran fast); the consumer's process used ~160-190 us of CPU a batch
instead of ~590. What is left is CPU per batch (README, "tf.data, in detail").

How:

- The frame blocks live in one memfd (``os.memfd_create``) mapped shared by this process and every
  worker (``decodeworker.py``, started by path with ``python -P``, so it imports neither replaystore
  nor TensorFlow, and given the memfd as an inherited descriptor). Each block is its own numpy array
  over the mapping, so a block's reference count still says whether a consumer holds any of its
  batches, and the prefetcher recycles blocks as before. Pages are only backed once written.
- Planning stays here, under the store's lock (it reads the ring and the writer's RAM buffer, and
  copies the buffer's frames into the block). A planned block goes to an idle worker as one request
  on its stdin: the chunks' compressed bytes, where each gathered frame comes from and goes to
  (``decodeworker`` documents the format). The worker replies once the block is written.
- A batch whose chunks a worker cannot decode is finished here by the reader, which names the bad
  chunk (``ChunkChecksumError``) or, if it decodes after all, fills the batch. A worker that dies is
  dropped with a warning, and its blocks are decoded on the prefetcher's threads from then on.
- Workers exit at the end of their input: when ``close`` closes it, or when this process ends. They
  run in a process group of their own and ignore SIGINT, so a terminal's Ctrl-C reaches only this
  process (the trainer checkpoints on it, still sampling, before it closes the dataset).

Only where there is something to gain and everything needed: Linux's memfd, libzstd for ctypes, and
a zstd-coded store (``unavailable`` says why not, and the prefetcher then decodes on its threads).
"""

from __future__ import annotations

import logging
import mmap
import os
import queue
import subprocess
import sys
import weakref
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from replaystore.decoders import LIBZSTD
from replaystore.decodeworker import HEADER, OK

if TYPE_CHECKING:
    from replaystore.reader import FrameReader, Plan

log = logging.getLogger(__name__)

WORKER = Path(__file__).with_name("decodeworker.py")


def unavailable(reader: FrameReader) -> str | None:
    """Why decode processes cannot serve ``reader``'s store here, or None if they can."""
    if not hasattr(os, "memfd_create"):
        return "this system has no memfd (Linux only)"
    if not sys.executable:
        return "this Python cannot say where its interpreter is (sys.executable is empty)"
    if LIBZSTD is None:
        return "no libzstd shared library was found (e.g. Debian's libzstd1)"
    if not reader.decoder.joinable:
        return f"the store's frames are coded with {reader.decoder.spec.name}, not zstd"
    return None


class DecodeProcesses:
    """``processes`` decode workers and ``blocks`` shared frame blocks of ``block_nbytes`` each."""

    def __init__(self, reader: FrameReader, *, processes: int, blocks: int, block_nbytes: int) -> None:
        self.reader = reader
        size = blocks * block_nbytes
        fd = os.memfd_create("replaystore-prefetch", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
            # one array per block straight over the mapping: views of a block keep *it* as their base
            self._blocks = [np.frombuffer(mapping, np.uint8, count=block_nbytes, offset=i * block_nbytes)
                            for i in range(blocks)]
            self._base = self._blocks[0].ctypes.data
            self._procs: list[subprocess.Popen] = []
            for _ in range(processes):
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-P", str(WORKER), str(fd), str(size)], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, pass_fds=[fd], close_fds=True, process_group=0))
        except BaseException:
            _stop(getattr(self, "_procs", []))
            raise
        finally:
            os.close(fd)  # the mapping and the workers keep the memory
        self._idle: queue.SimpleQueue[subprocess.Popen | None] = queue.SimpleQueue()
        for proc in self._procs:
            self._idle.put(proc)
        self._alive = len(self._procs)
        self._finalizer = weakref.finalize(self, _stop, self._procs)
        self._frame_nbytes = int(np.prod(reader.shape, dtype=np.int64)) * reader.dtype.itemsize

    def take_blocks(self) -> list[np.ndarray]:
        """The shared blocks, handed over once: their owner's references must be the only ones left,
        so that a block's reference count says whether anyone still uses it."""
        blocks, self._blocks = self._blocks, []
        return blocks

    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [proc.pid for proc in self._procs]

    @property
    def alive(self) -> int:
        """Workers still running."""
        return self._alive

    def fill(self, plans: list[Plan], pair: tuple[np.ndarray, np.ndarray]) -> int:
        """Have a worker decode ``plans`` (one block's, planned into ``pair``, two arrays in one of
        ``blocks``). Returns how many of them are done: ``len(plans)``, or the first the caller must
        finish itself (the reader then names a bad chunk, or decodes it)."""
        head, blob = self._request(plans, pair)
        proc = self._idle.get() if self._alive else None
        if proc is None:
            self._idle.put(None)  # wake the next waiter too: no worker is left
            return 0
        try:
            proc.stdin.write(head)
            proc.stdin.write(blob)  # larger than the buffer: written straight through, not copied again
            proc.stdin.flush()
            reply = proc.stdout.read(8)
            if len(reply) < 8:
                raise BrokenPipeError
        except (BrokenPipeError, OSError, ValueError):
            self._drop(proc)
            return 0
        self._idle.put(proc)
        failed = int(np.frombuffer(reply, "<i8")[0])
        return len(plans) if failed == OK else failed

    def close(self) -> None:
        """Stop the workers (the blocks stay valid while anything refers to them)."""
        self._alive = 0
        self._idle.put(None)
        self._finalizer()

    def _request(self, plans: list[Plan], pair: tuple[np.ndarray, np.ndarray]) -> tuple[bytes, bytes]:
        """One block's request (decodeworker's format): everything but the payloads, and the payloads."""
        payloads = list(chain.from_iterable(plan.payloads for plan in plans))
        if None in payloads:
            lengths = np.array([-1 if p is None else len(p) for p in payloads], dtype="<i8")
            payloads = [p for p in payloads if p is not None]
        else:
            lengths = np.fromiter(map(len, payloads), dtype="<i8", count=len(payloads))
        blob = b"".join(payloads)
        chunk_len = self.reader.chunk_len
        source = np.concatenate([plan.which * chunk_len + plan.offset for plan in plans]).astype("<i8", copy=False)
        dest = np.concatenate([plan.rows for plan in plans]).astype("<i8", copy=False)
        per_batch = np.array([[len(plan.payloads) for plan in plans], [plan.rows.size for plan in plans],
                              [plan.as_one for plan in plans]], dtype="<i8")
        head = {"obs_at": pair[0].ctypes.data - self._base, "next_at": pair[1].ctypes.data - self._base,
                "k": len(plans), "rows": pair[0][0].size * pair[0].itemsize // self._frame_nbytes,
                "frame_nbytes": self._frame_nbytes, "chunk_nbytes": chunk_len * self._frame_nbytes,
                "chunks": lengths.size, "gathered": source.size, "blob_nbytes": len(blob)}
        header = np.array([head[name] for name in HEADER], dtype="<i8")
        return b"".join([header.tobytes(), per_batch.tobytes(), lengths.tobytes(), source.tobytes(),
                         dest.tobytes()]), blob

    def _drop(self, proc: subprocess.Popen) -> None:
        code = proc.poll()
        log.warning("replaystore decode process %d stopped (exit code %s); its blocks are decoded on the "
                    "prefetcher's threads from now on", proc.pid, code)
        _stop([proc])
        self._alive -= 1
        if self._alive <= 0:
            self._idle.put(None)


def _stop(procs: list[subprocess.Popen]) -> None:
    """End ``procs``: close their input (they exit at its end), then wait, then kill."""
    for proc in procs:
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
