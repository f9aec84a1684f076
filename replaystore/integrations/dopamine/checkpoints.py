"""Dopamine's replay checkpoints on disk, read without unpickling anything and with bounded RAM.

``OutOfGraphReplayBuffer.save(dir, N)`` writes, per checkpoint ``N``, one gzip file per member:
``$store$_<field>_ckpt.N.gz`` for the ring arrays (``observation`` ``(capacity, *shape)``,
``action`` int32, ``reward`` float32, ``terminal`` uint8, all ``(capacity,)``), and
``add_count_ckpt.N.gz`` and ``invalid_range_ckpt.N.gz`` for its counters. Each holds one ``.npy``
(``np.save(..., allow_pickle=False)``); members that are not arrays would be pickles, and none of
the six is. Row ``g`` ever added (``add_count`` counts them, the zero rows that pad each episode's
start included) sits in slot ``g % capacity``; ``invalid_range`` is ``[(c - n + i) % capacity for i
in range(k + n)]`` for the cursor ``c = add_count % capacity``, the stack size ``k`` and the update
horizon ``n``, which is how both are read back.

Every file is opened as the project opens files it parses (a regular file, never a FIFO), its
``.npy`` header parsed by numpy's header reader (a literal, never code; at most 10,000 bytes), its
dtype checked to hold numbers, and its data read in blocks of at most ``BLOCK_BYTES``: the 7 GB of
an Atari checkpoint's observations never sit in RAM at once. A file whose data ends early, runs on
past what its header declares, or fails gzip's CRC is refused in one line naming it.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from replaystore.errors import ConfigError, CorruptStoreError
from replaystore.sampling.memory import memory_limit
from replaystore.storage.readfile import NotAFileError, npy_header

#: The files of one checkpoint, by member name (``$store$_`` marks the ring's arrays).
MEMBERS = ("$store$_observation", "$store$_action", "$store$_reward", "$store$_terminal", "add_count",
           "invalid_range")
_NAME = re.compile(r"^(\$store\$_observation|\$store\$_action|\$store\$_reward|\$store\$_terminal|add_count|"
                   r"invalid_range)_ckpt\.(\d{1,9})\.gz$")
#: The most bytes read from a gzip stream at once (a block of observations).
BLOCK_BYTES = 32 * 2**20
#: The largest ring a checkpoint may declare (Dopamine's default is 1,000,000).
MAX_CAPACITY = 2**31 - 1
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint's counters and per-row scalars (its observations stay on disk: ``frames``)."""

    folder: Path
    number: int
    add_count: int
    capacity: int
    stack: int  # k: the frames in a state
    horizon: int  # n: the buffer's update horizon
    action: np.ndarray
    reward: np.ndarray
    terminal: np.ndarray
    frame_shape: tuple[int, ...]
    frame_dtype: np.dtype

    @property
    def oldest(self) -> int:
        """The oldest row it holds, counted from the run's first add."""
        return max(0, self.add_count - self.capacity)

    def path(self, member: str) -> Path:
        return self.folder / f"{member}_ckpt.{self.number}.gz"

    def __str__(self) -> str:
        return f"checkpoint {self.number} of {self.folder}"

    def frames(self, first: int, stop: int) -> Iterator[np.ndarray]:
        """The observations of rows ``first .. stop - 1`` (counted from the run's first add, inside
        ``oldest .. add_count``), oldest first, in blocks; the file is read once per wrap of the ring."""
        cap = self.capacity
        while first < stop:
            slot = first % cap
            count = min(stop - first, cap - slot)
            yield from _blocks(self.path("$store$_observation"), slot, count, self.frame_shape, self.frame_dtype)
            first += count


def find(folder: str | Path) -> tuple[Path, list[int]]:
    """The folder of a run's checkpoints (``folder``, or its ``replay_logs``) and their numbers,
    oldest first; a checkpoint missing one of its six files is refused by name."""
    where = Path(folder)
    if not where.is_dir():
        raise ConfigError(f"{where} is not a folder; pass the folder of a Dopamine run's replay checkpoints "
                          "(its replay_logs, with files such as $store$_observation_ckpt.0.gz)")
    if not any(_NAME.match(p.name) for p in where.iterdir()) and (where / "replay_logs").is_dir():
        where = where / "replay_logs"
    found: dict[int, set[str]] = {}
    for p in where.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.setdefault(int(m.group(2)), set()).add(m.group(1))
    if not found:
        raise ConfigError(f"{where} holds no Dopamine replay checkpoint (files such as $store$_observation_ckpt.0.gz "
                          "and add_count_ckpt.0.gz); pass the folder that holds them")
    for number, members in sorted(found.items()):
        missing = [m for m in MEMBERS if m not in members]
        if missing:
            names = ", ".join(f"{m}_ckpt.{number}.gz" for m in missing)
            raise ConfigError(f"checkpoint {number} in {where} lacks {names}; fetch the whole checkpoint, or move "
                              "its other files out of the folder")
    return where, sorted(found)


def added(folder: Path, number: int) -> int:
    """Checkpoint ``number``'s ``add_count``: the rows its buffer had ever added."""
    count = _whole(folder / f"add_count_ckpt.{number}.gz")
    if count.size != 1 or count.dtype.kind not in "iu" or int(count.reshape(())) < 0:
        raise CorruptStoreError(f"add_count_ckpt.{number}.gz in {folder} is {count!r}; it must be one count of rows "
                                "added")
    return int(count.reshape(()))


def load(folder: Path, number: int) -> Checkpoint:
    """Checkpoint ``number`` of ``folder``: its counters, scalars and the observations' declared shape."""
    obs_path = folder / f"$store$_observation_ckpt.{number}.gz"
    with _Opened(obs_path) as (_, obs_shape, obs_dtype):
        pass
    if len(obs_shape) < 1 or not 1 <= obs_shape[0] <= MAX_CAPACITY:
        raise CorruptStoreError(f"{obs_path} holds an array of shape {obs_shape}; Dopamine's observations are "
                                "(capacity, *frame shape)")
    cap = obs_shape[0]
    limit, what = memory_limit()
    if limit is not None and cap * 24 > limit // 4:  # (its scalars read whole, and the plan's rows: plan.py)
        raise ConfigError(f"{obs_path} declares a ring of {cap:,} rows; importing its scalars would take "
                          f"{cap * 24 / 2**20:,.0f} MB, more than a quarter of the memory this process may use "
                          f"({what}): import on a machine with more memory, or check the file")
    count = added(folder, number)
    invalid = _whole(folder / f"invalid_range_ckpt.{number}.gz")
    stack, horizon = _stack_and_horizon(invalid, count, cap, f"invalid_range_ckpt.{number}.gz in {folder}")
    arrays = {name: _whole(folder / f"$store$_{name}_ckpt.{number}.gz", cap) for name in ("action", "reward", "terminal")}
    for name, kinds in (("action", "iu"), ("reward", "f"), ("terminal", "iub")):
        if arrays[name].dtype.kind not in kinds:
            raise CorruptStoreError(f"$store$_{name}_ckpt.{number}.gz in {folder} holds {arrays[name].dtype} values; "
                                    "Dopamine's are numbers of another kind: it is not a Dopamine checkpoint")
    terminal = arrays["terminal"]
    written = terminal[:count]  # (a ring not yet full holds whatever np.empty left in the rest: never read)
    if ((written != 0) & (written != 1)).any():
        raise CorruptStoreError(f"$store$_terminal_ckpt.{number}.gz in {folder} holds values other than 0 and 1")
    return Checkpoint(folder=folder, number=number, add_count=count, capacity=cap, stack=stack, horizon=horizon,
                      action=arrays["action"], reward=arrays["reward"].astype(np.float32, copy=False),
                      terminal=terminal.astype(bool), frame_shape=tuple(obs_shape[1:]), frame_dtype=obs_dtype)


def _whole(path: Path, rows: int | None = None) -> np.ndarray:
    """The array in ``path``, read whole: ``rows`` values, or a counter (at most 64 MB)."""
    with _Opened(path) as (f, shape, dtype):
        if rows is not None and shape != (rows,):
            raise CorruptStoreError(f"{path} holds an array of shape {shape}; the checkpoint's ring holds {rows} "
                                    "rows, one value each: the checkpoint is damaged or mixes runs")
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if size > 64 * 2**20 and rows is None:
            raise CorruptStoreError(f"{path} declares {size:,} bytes; a counter is a few: it is not Dopamine's")
        data = _exactly(f, size, path)
        _at_end(f, path)
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _stack_and_horizon(invalid: np.ndarray, count: int, cap: int, what: str) -> tuple[int, int]:
    """k and n from ``invalid_range`` (after the first add; before it, it is k zeros)."""
    if invalid.ndim != 1 or invalid.dtype.kind not in "iuf" or not 2 <= invalid.size <= cap:
        raise CorruptStoreError(f"{what} has shape {invalid.shape} and dtype {invalid.dtype}; Dopamine's holds the "
                                "stack size plus the update horizon indices of the ring")
    if count == 0:
        return int(invalid.size), 1
    cursor = count % cap
    horizon = (cursor - int(invalid[0])) % cap
    stack = invalid.size - horizon
    expected = (cursor - horizon + np.arange(invalid.size)) % cap
    if stack < 1 or horizon < 1 or not np.array_equal(invalid.astype(np.int64), expected):
        raise CorruptStoreError(f"{what} does not match the checkpoint's add_count ({count:,} rows in a ring of "
                                f"{cap:,}): the checkpoint's files are from different saves")
    return stack, horizon


class _Opened:
    """A gzip'd ``.npy`` file, its header read: ``with _Opened(path) as (stream, shape, dtype)``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.raw: IO[bytes] | None = None
        self.gz: gzip.GzipFile | None = None

    def __enter__(self) -> tuple[gzip.GzipFile, tuple[int, ...], np.dtype]:
        fd = os.open(self.path, _FLAGS)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise NotAFileError(f"{self.path} is not a regular file (a FIFO, device or socket in its place); it "
                                "cannot be a Dopamine checkpoint file")
        os.set_blocking(fd, True)
        self.raw = os.fdopen(fd, "rb")
        self.gz = gzip.GzipFile(fileobj=self.raw, mode="rb")
        try:
            shape, fortran, dtype = npy_header(self.gz)
        except (ValueError, OSError, EOFError, zlib.error) as exc:
            self.__exit__()
            raise CorruptStoreError(f"{self.path} is not a gzip'd .npy array ({exc}); it is damaged or not "
                                    "Dopamine's: fetch it again") from None
        if dtype.hasobject or dtype.kind not in "biuf" or fortran:
            self.__exit__()
            raise CorruptStoreError(f"{self.path} holds {'Fortran-ordered ' if fortran else ''}{dtype} data; "
                                    "Dopamine's checkpoints hold numbers only (nothing is unpickled)")
        return self.gz, shape, dtype

    def __exit__(self, *exc: object) -> None:
        for f in (self.gz, self.raw):
            if f is not None:
                f.close()


def _exactly(f: gzip.GzipFile, size: int, path: Path) -> bytes:
    """``size`` bytes of ``f``, read in blocks (refused when the stream ends first)."""
    parts, left = [], size
    try:
        while left:
            part = f.read(min(left, BLOCK_BYTES))
            if not part:
                break
            parts.append(part)
            left -= len(part)
    except (OSError, EOFError, zlib.error) as exc:
        raise CorruptStoreError(f"{path} cannot be read whole ({exc}); it is damaged: fetch it again") from None
    if left:
        raise CorruptStoreError(f"{path} ends {left:,} bytes before the array its header declares; it is cut "
                                "short: fetch it again")
    return b"".join(parts)


def _at_end(f: gzip.GzipFile, path: Path) -> None:
    """Refuse data past the declared array (reading to the end also checks gzip's CRC)."""
    try:
        extra = f.read(1)
    except (OSError, EOFError, zlib.error) as exc:
        raise CorruptStoreError(f"{path} fails gzip's check at its end ({exc}); it is damaged: fetch it "
                                "again") from None
    if extra:
        raise CorruptStoreError(f"{path} holds more data than its array's header declares; it is not one .npy "
                                "array: fetch it again")


def _blocks(path: Path, slot: int, count: int, shape: tuple[int, ...], dtype: np.dtype) -> Iterator[np.ndarray]:
    """Rows ``slot .. slot + count - 1`` of the observations at ``path``, in blocks of at most
    ``BLOCK_BYTES``; the rows before ``slot`` are read and dropped."""
    row = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    per = max(1, BLOCK_BYTES // max(row, 1))
    with _Opened(path) as (f, declared, declared_dtype):
        if declared[1:] != shape or declared_dtype != dtype or declared[0] < slot + count:
            raise CorruptStoreError(f"{path} changed while it was imported (it declares {declared} {declared_dtype})")
        skip = slot
        while skip:
            n = min(skip, per)
            _exactly(f, n * row, path)
            skip -= n
        left = count
        while left:
            n = min(left, per)
            yield np.frombuffer(_exactly(f, n * row, path), dtype=dtype).reshape(n, *shape)
            left -= n
        if slot + count == declared[0]:
            _at_end(f, path)
