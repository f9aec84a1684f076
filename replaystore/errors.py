"""Errors raised by replaystore.

Every error is a ``ReplayStoreError`` and, where a caller would naturally catch a builtin, also that
builtin (``StoreNotFoundError`` is a ``FileNotFoundError``), so both ``except ReplayStoreError`` and
``except FileNotFoundError`` work. Messages say what failed, the value, the limit and the fix.
"""

from __future__ import annotations


class ReplayStoreError(Exception):
    """Base class of every error replaystore raises on purpose."""


class StoreNotFoundError(ReplayStoreError, FileNotFoundError):
    """The path does not exist or holds no replay store."""


class StoreExistsError(ReplayStoreError, FileExistsError):
    """``create`` found a store (or other files) at the path and ``overwrite`` was not given."""


class StoreLockedError(ReplayStoreError, BlockingIOError):
    """Another live process holds the store open for writing."""


class FormatVersionError(ReplayStoreError, ValueError):
    """The store was written by a newer (or unknown) format version."""


class CorruptStoreError(ReplayStoreError, ValueError):
    """Metadata or chunk bytes on disk are damaged or inconsistent."""


class ChunkChecksumError(CorruptStoreError):
    """A chunk's (or shard index's) crc32c does not match its bytes."""

    def __init__(self, message: str, *, array: str, shard: int, chunk: int | None) -> None:
        super().__init__(message)
        self.array = array
        self.shard = shard
        self.chunk = chunk


class InvalidTransitionError(ReplayStoreError, ValueError):
    """``add`` was given data that does not fit the store's schema or episode."""


class SampleError(ReplayStoreError, ValueError):
    """``sample`` was asked for something the store cannot provide."""


class ReadOnlyError(ReplayStoreError, PermissionError):
    """A write was attempted on a store opened with ``mode="r"``."""


class BlockReleasedError(ReplayStoreError, RuntimeError):
    """A block of batches (``store.blocks``) was used after ``release()``."""


class StoreClosedError(ReplayStoreError, ValueError):
    """The store was used after ``close()``."""


class StoreWriteError(ReplayStoreError, OSError):
    """Writing to disk failed (disk full, permissions); the store still opens at its last commit."""


class ConfigError(ReplayStoreError, ValueError):
    """A creation or open argument is out of range (capacity, layout, budget)."""


class TooManyOpenFilesError(ReplayStoreError, OSError):
    """The process ran out of file descriptors (EMFILE) opening a store's files."""


class LockUnavailableError(ReplayStoreError, OSError):
    """The writer lock could not be taken for a reason other than another writer holding it (the
    filesystem does not support locks, the lock file cannot be created, or the platform lacks
    ``fcntl``)."""


class UnsafePathError(ReplayStoreError, PermissionError):
    """A path would make the store write, truncate or delete outside its own directory: a symbolic
    link (or a non-regular file) where the store keeps its own files, or a compaction whose
    destination and source are nested. Nothing was written."""


class StoreReadError(ReplayStoreError, OSError):
    """Reading a store on object storage failed: the server does not answer, or refused the request."""


class LeaseLostError(StoreLockedError):
    """A writer on object storage lost its stream's lease (another writer took it over after it
    expired); what it had not committed is not in the store."""


class StaleViewError(ReplayStoreError, FileNotFoundError):
    """A reader of a store on object storage needs a shard object that a writer has since replaced
    and collected: its view is older than the collection grace period; ``refresh()`` it."""
