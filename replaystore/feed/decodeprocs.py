"""Decode processes: the prefetcher's GIL-free work (decoding chunks, gathering frames) run in child
processes that write straight into frame blocks shared with this one.

Why: planning a block needs the store's state and the GIL, but decoding chunks and gathering frames
(most of a block's work) needs neither. On threads, that work waits for the GIL beside a consumer
that also holds it (a training loop, the tf.data bridge); in a process of its own it does not, and
the consumer's process spends far less CPU a batch (figures in docs/benchmarks.md).

How:

- The frame blocks live in one memfd (``os.memfd_create``) mapped shared by this process and every
  worker (``decodeworker.py``, started by path with ``python -P``, so it imports neither replaystore
  nor TensorFlow, and given the memfd as an inherited descriptor). The prefetcher hands the blocks
  out and takes them back through a ``MemoryPool`` (storage/pool.py), as it does private memory.
  Pages are only backed once written.
- Planning stays here, under the store's lock (it reads the ring and the shard a writer is
  filling, and copies the frames of its raw chunk into the block). A planned block goes to the least loaded worker as
  one request on its stdin: the chunks' compressed bytes, where each gathered frame comes from and
  goes to (``decodeworker`` documents the format). The worker replies once the block is written;
  a thread per worker reads its replies and wakes the thread that sent each request.
- A worker holds up to ``QUEUED`` requests: the next one waits in its pipe (widened to hold a whole
  request) while it fills a block, so a worker never idles waiting for a thread here, which would
  first need the GIL, to hand it the next block.
- A batch whose chunks a worker cannot decode is finished here by the reader, which names the bad
  chunk (``ChunkChecksumError``) or, if it decodes after all, fills the batch.
- Requests and replies are framed: a request carries a magic number, a sequence number and its
  length, and the worker checks that its parts add up and stay inside the shared memory before it
  writes anything; a reply carries the sequence number it answers. A worker that dies, answers out
  of turn, sends garbage, or does not answer within ``REPLY_TIMEOUT`` seconds is killed and dropped
  with a warning; its blocks are decoded on the prefetcher's threads from then on, with the same
  result. A request that fails halfway through being written kills its worker too (it could not
  tell where the next request starts).
- Workers exit at the end of their input: when ``close`` closes it, or when this process ends. They
  run in a process group of their own and ignore SIGINT, so a terminal's Ctrl-C reaches only this
  process (the trainer checkpoints on it, still sampling, before it closes the dataset).

Only where there is something to gain and everything needed: Linux's memfd, libzstd for ctypes, and
a zstd-coded store (``unavailable`` says why not, and the prefetcher then decodes on its threads).
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import signal
import subprocess
import sys
import threading
import weakref
from itertools import chain
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from replaystore.feed.decodeworker import FRAME, HEADER, MAGIC, OK
from replaystore.storage.decoders import LIBZSTD

if TYPE_CHECKING:
    from replaystore.storage.plan import Plan
    from replaystore.storage.reader import FrameReader

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


#: Requests a worker holds at once: while it fills one block the next already waits in its pipe, so
#: it does not sit idle until a thread of this process (which needs the GIL) hands it more work.
QUEUED = 2
#: Bytes a worker's input pipe holds (Linux's default is 64 KiB; a 32-batch Atari request is ~0.9
#: MB), so that a request is written in one go rather than in step with the worker's reads.
PIPE_NBYTES = 1 << 20
#: Seconds a request may wait for its reply before the worker is taken for hung and killed (a block
#: takes milliseconds; this only has to exceed the longest stall of a very busy machine).
REPLY_TIMEOUT = 60.0
#: Seconds ``close`` waits for the workers to exit at the end of their input before killing them.
CLOSE_TIMEOUT = 5.0


class DecodeProcesses:
    """``processes`` decode workers and ``blocks`` shared frame blocks of ``block_nbytes`` each."""

    def __init__(self, reader: FrameReader, *, processes: int, blocks: int, block_nbytes: int) -> None:
        self.reader = reader
        size = blocks * block_nbytes
        fd = os.memfd_create("replaystore-prefetch", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
            whole = memoryview(mapping)
            self.memory = [whole[i * block_nbytes : (i + 1) * block_nbytes] for i in range(blocks)]
            self._base = np.frombuffer(mapping, np.uint8, count=1).ctypes.data
            self._procs: list[subprocess.Popen] = []
            for _ in range(processes):
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-P", str(WORKER), str(fd), str(size)], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, pass_fds=[fd], close_fds=True, process_group=0))
                _widen(self._procs[-1].stdin)
        except BaseException:
            _stop(getattr(self, "_procs", []))
            raise
        finally:
            os.close(fd)  # the mapping and the workers keep the memory
        self._workers = _Workers(self._procs)  # what the reply threads share: never this object itself
        self._finalizer = weakref.finalize(self, self._workers.stop)
        self._frame_nbytes = int(np.prod(reader.shape, dtype=np.int64)) * reader.dtype.itemsize

    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [proc.pid for proc in self._procs]

    @property
    def alive(self) -> int:
        """Workers still running: one that ended is counted out once its end is handled (its requests
        failed over to the threads, the process reaped, the warning logged)."""
        return self._workers.alive

    def fill(self, plans: list[Plan], frames: list[np.ndarray]) -> int:
        """Have a worker decode ``plans`` (one block's, planned into ``frames``, arrays in one of the
        ``memory`` pieces, each ``(len(plans), ...)``). Returns how many of them are done:
        ``len(plans)``, or the first the caller must finish itself (the reader then names a bad
        chunk, or decodes it), or 0 if no worker is left."""
        head, blob = self._request(plans, frames)
        worker = self._workers.take()
        if worker is None:
            return 0
        reply = _Reply()
        try:
            with worker.writing:  # requests go in, and replies come back, in the order of ``pending``
                if worker.dead:
                    reply.set(None)
                else:
                    worker.seq += 1
                    reply.seq = worker.seq
                    worker.pending.append(reply)
                    frame = np.array([MAGIC, worker.seq, len(head) + len(blob)], dtype="<i8").tobytes()
                    try:
                        worker.stdin.write(frame + head)
                        worker.stdin.write(blob)  # larger than the buffer: written straight through
                        worker.stdin.flush()
                    except BaseException:
                        # part of a request may be in the pipe: the worker cannot find the next one
                        self._workers.kill(worker, "a request to it could not be written whole")
                        raise
        except (BrokenPipeError, OSError, ValueError):
            pass  # the worker is gone: its reply thread sees the end of its output and answers ``reply``
        failed = reply.wait(REPLY_TIMEOUT)
        if failed is _Reply.LATE:
            self._workers.kill(worker, f"it did not answer within {REPLY_TIMEOUT:.0f} s")
            failed = reply.wait(CLOSE_TIMEOUT)
        self._workers.done(worker)
        if failed is None or failed is _Reply.LATE:
            return 0
        return len(plans) if failed == OK else failed

    def close(self) -> None:
        """Stop the workers (the blocks stay valid while anything refers to them)."""
        self._finalizer()

    def _request(self, plans: list[Plan], frames: list[np.ndarray]) -> tuple[bytes, bytes]:
        """One block's request (decodeworker's format): everything but the payloads, and the payloads."""
        every = list(chain.from_iterable(plan.payloads for plan in plans))
        payloads = [p for p in every if p is not None]
        if len(payloads) < len(every):
            lengths = np.array([-1 if p is None else len(p) for p in every], dtype="<i8")
        else:
            lengths = np.fromiter(map(len, payloads), dtype="<i8", count=len(payloads))
        blob = b"".join(payloads)
        chunk_len = self.reader.chunk_len
        source = np.concatenate([plan.which * chunk_len + plan.offset for plan in plans]).astype("<i8", copy=False)
        dest = np.concatenate([plan.rows for plan in plans]).astype("<i8", copy=False)
        per_batch = np.array([[len(plan.payloads) for plan in plans], [plan.rows.size for plan in plans],
                              [plan.as_one for plan in plans]], dtype="<i8")
        offsets = np.array([[array[i].ctypes.data - self._base for array in frames] for i in range(len(plans))],
                           dtype="<i8")
        head = {"k": len(plans), "parts": len(frames),
                "rows": frames[0][0].size * frames[0].itemsize // self._frame_nbytes,
                "frame_nbytes": self._frame_nbytes, "chunk_nbytes": chunk_len * self._frame_nbytes,
                "chunks": lengths.size, "gathered": source.size, "blob_nbytes": len(blob)}
        assert FRAME == 3  # MAGIC, sequence number, length: written by ``fill``
        header = np.array([head[name] for name in HEADER], dtype="<i8")
        return b"".join([header.tobytes(), per_batch.tobytes(), offsets.tobytes(), lengths.tobytes(),
                         source.tobytes(), dest.tobytes()]), blob


class _Worker:
    """One decode process and its requests in flight (``load`` of them, answered in ``pending`` order)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdin is not None and proc.stdout is not None  # (made with stdin and stdout pipes)
        self.proc = proc
        self.stdin: IO[bytes] = proc.stdin
        self.stdout: IO[bytes] = proc.stdout
        self.pending: collections.deque[_Reply] = collections.deque()
        self.writing = threading.Lock()  # held while a request is written and its reply queued
        self.load = 0
        self.dead = False
        self.seq = 0  # the last request's sequence number
        self.killed = False


class _Workers:
    """The workers, which one takes the next request, and their reply threads: one per worker, which
    hands each reply to the request it answers and, at the end of the worker's output, fails what is
    still pending (the prefetcher's threads then decode those blocks)."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs
        self.workers = [_Worker(proc) for proc in procs]
        self.free = threading.Condition()  # guards ``load``, ``dead``, ``alive`` and ``stopping``
        self.alive = len(procs)
        self.stopping = False
        for worker in self.workers:
            threading.Thread(target=self.collect, args=(worker,), name="replaystore-decode-replies",
                             daemon=True).start()

    def take(self) -> _Worker | None:
        """The least loaded live worker with room for another request (waiting for one), or None."""
        with self.free:
            while not self.stopping:
                live = [worker for worker in self.workers if not worker.dead]
                if not live:
                    break
                worker = min(live, key=lambda w: w.load)
                if worker.load < QUEUED:
                    worker.load += 1
                    return worker
                self.free.wait()
            return None

    def done(self, worker: _Worker) -> None:
        with self.free:
            worker.load -= 1
            self.free.notify()

    def collect(self, worker: _Worker) -> None:
        stdout = worker.stdout
        why = None
        try:
            while len(raw := stdout.read(16)) == 16:
                seq, value = np.frombuffer(raw, "<i8").tolist()
                # only this thread takes from ``pending`` (senders append under ``writing``)
                expected = worker.pending[0].seq if worker.pending else None
                if seq != expected or not (value == OK or 0 <= value < 1 << 31):
                    why = f"it answered request {seq} with {value} when request {expected} was due"
                    break
                worker.pending.popleft().set(value)
        except (OSError, ValueError):  # a broken pipe
            pass
        finally:
            stdout.close()
            with worker.writing:
                worker.dead = True  # takes no new request (``send`` answers those None at once)
            with self.free:
                self.free.notify_all()  # ``take`` passes over it from now on
                expected = self.stopping
            # told (and the process reaped) before the requests it holds fail over to the threads, so
            # the warning comes before any block it held is delivered, and a close after that cannot hide it
            if why is not None:
                self.kill(worker, why)
            elif not expected:
                _stop([worker.proc])
                log.warning("replaystore decode process %d stopped (exit code %s); its blocks are decoded on "
                            "the prefetcher's threads from now on", worker.proc.pid, worker.proc.returncode)
            with worker.writing:
                while worker.pending:
                    worker.pending.popleft().set(None)
            with self.free:
                self.alive -= 1

    def kill(self, worker: _Worker, why: str) -> None:
        """Kill a worker that cannot be trusted any more; its reply thread then fails what it had."""
        if worker.killed:
            return
        worker.killed = True
        if not self.stopping:  # closing: a request cut off by the closed pipe is no fault of the worker
            log.warning("replaystore decode process %d killed: %s; its blocks are decoded on the prefetcher's "
                        "threads from now on", worker.proc.pid, why)
        _kill(worker.proc)

    def stop(self) -> None:
        with self.free:
            self.stopping = True
            self.free.notify_all()
        _stop(self.procs)


class _Reply:
    """A worker's answer to one request, waited for by the thread that sent it."""

    LATE = object()  # what ``wait`` returns when no answer came in time

    def __init__(self) -> None:
        self._ready = threading.Lock()
        self._ready.acquire()
        self.value: int | None = None
        self.seq = 0
        self._taken = False

    def set(self, value: int | None) -> None:
        self.value = value
        self._ready.release()

    def wait(self, timeout: float) -> Any:
        """The answer (None: the worker is gone), or ``LATE`` after ``timeout`` seconds."""
        if self._taken:
            return self.value
        if not self._ready.acquire(timeout=timeout):
            return self.LATE
        self._taken = True
        return self.value


def _widen(pipe: Any) -> None:
    """Let ``pipe`` hold a whole request where the system allows it (Linux's ``F_SETPIPE_SZ``)."""
    try:
        import fcntl

        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_NBYTES)
    except (ImportError, AttributeError, OSError):
        pass  # older kernels, or a lower /proc/sys/fs/pipe-max-size: the default works, only slower


def _stop(procs: list[subprocess.Popen]) -> None:
    """End ``procs``: close their input (they exit at its end), then wait, then kill. Their output
    is left to the reply threads, which read it to its end."""
    for proc in procs:
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except (OSError, ValueError):
            pass
    for proc in procs:
        try:
            proc.wait(timeout=CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL a worker's process group (it leads its own), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        try:
            proc.kill()
        except OSError:
            pass
    try:
        proc.wait(timeout=CLOSE_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
