"""replaystore: a disk-backed, out-of-core experience replay store for deep RL (zarr v3 on disk)."""

from replaystore.errors import (
    BlockReleasedError,
    ChunkChecksumError,
    ConfigError,
    CorruptStoreError,
    FormatVersionError,
    InvalidTransitionError,
    ReadOnlyError,
    ReplayStoreError,
    SampleError,
    StoreClosedError,
    StoreExistsError,
    StoreLockedError,
    StoreNotFoundError,
    StoreWriteError,
    UnsafePathError,
)
from replaystore.format.schema import FORMAT_VERSION, CodecSpec, Layout
from replaystore.sampling.assemble import Batch
from replaystore.sampling.episodes import Episode
from replaystore.sampling.hindsight import HindsightBatch, HindsightSampler
from replaystore.sampling.sequences import SequenceBatch
from replaystore.store import ReplayStore

__all__ = [
    "FORMAT_VERSION",
    "Batch",
    "BlockReleasedError",
    "ChunkChecksumError",
    "CodecSpec",
    "ConfigError",
    "CorruptStoreError",
    "Episode",
    "FormatVersionError",
    "HindsightBatch",
    "HindsightSampler",
    "InvalidTransitionError",
    "Layout",
    "ReadOnlyError",
    "ReplayStore",
    "ReplayStoreError",
    "SampleError",
    "SequenceBatch",
    "StoreClosedError",
    "StoreExistsError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StoreWriteError",
    "UnsafePathError",
]
__version__ = "0.1.0"
