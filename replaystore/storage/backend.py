"""Where a store's bytes live: the one interface between a store and its storage.

A store is a zarr v3 group: metadata (the root ``zarr.json`` and each array's), per stream a commit
(its ``State``) and its shards of every array, and per stream at most one writer. Everything above
this module (the writers, the reader, the samplers, the facade, the CLI) reaches those bytes
through a ``Backend`` and the ``FrameShards`` it hands the reader, and never asks which kind it
has. There are two, chosen once from the path or URL (choose.py's ``open_backend``):

- ``storage/local``: files. A shard is written to a temporary name and renamed over the old one, a
  commit is such a rename of the stream's ``zarr.json``, a writer's claim is an ``flock``.
  Frames are read with ``pread`` through descriptors kept open (zarr's own store layer costs ~1 ms
  a chunk, docs/benchmarks.md).
- ``storage/objects``: S3-compatible object storage through obstore. A shard is a new object under
  a generation key, a commit is a compare-and-swap of the stream's state object, a claim is a
  lease; frames are read with ranged GETs.

Streams are the general case: stream ``k``'s shard ``j`` of an array is the array's shard
``k * shards_per_stream + j`` (a store of one stream has ``k = 0`` only).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from replaystore.format.schema import Layout, Schema, State, stream_stride
from replaystore.format.shards import CRC_BYTES, INDEX_ENTRY_BYTES, check_chunk
from replaystore.storage.chunkread import ChunkRead

#: a shard read whole: its chunk bytes, and each chunk's ``(offset, nbytes)`` in them
Whole = tuple[memoryview, list[tuple[int, int]]]
FRAMES = "obs"


#: The most bytes of shard indexes a store's frame shards keep once read (local/deferred.py).
KNOWN_INDEX_BYTES = 64 * 2**20


class FrameShards(ABC):
    """The frame array's shards as the read path sees them: each chunk's verified compressed bytes,
    from the commits the store reads. A read has two steps, so that no disk or network read happens
    under the store's lock: ``locate`` (under the lock) finds a chunk's bytes and keeps them readable
    as they are (a file stays open, an object is immutable), ``read`` (no lock) fetches and checks
    them; ``release`` gives up reads that will not be made."""

    def __init__(self, *, ndim: int, capacity: int, shard_len: int, chunk_len: int) -> None:
        self.ndim = ndim  # dimensions of one frame
        self.capacity = capacity  # slots of the array (every stream's)
        self.shard_len = shard_len
        self.chunk_len = chunk_len
        self.chunks_per_shard = shard_len // chunk_len
        self.tail = self.chunks_per_shard * INDEX_ENTRY_BYTES + CRC_BYTES  # a shard's index, at its end

    #: on the first chunk the cache misses, read every shard of the view into the cache if it fits
    #: (where a request's latency is most of its cost: object storage, storage/warm.py)
    warm_on_first_miss = False

    @property
    def open_files(self) -> int:
        """File descriptors held now."""
        return 0

    @abstractmethod
    def locate(self, cids: list[int], generations: list[int]) -> list[ChunkRead | None]:
        """Where each of global chunks ``cids`` is (None for a chunk never written), readable as it is
        now until ``read`` or ``release``. ``generations`` are the shards' (storage/chunkcache.py)."""

    @abstractmethod
    def read(self, reads: list[ChunkRead]) -> None:
        """Fetch and verify each of ``reads`` into ``r.payload`` (no lock of the store needed)."""

    @abstractmethod
    def release(self, reads: list[ChunkRead]) -> None:
        """Mark ``reads`` done without reading them (a plan that failed or was given up)."""

    @abstractmethod
    def wholes(self, shards: list[int]) -> Iterable[Whole | None]:
        """Each of ``shards`` read whole, or None where it was never written, in order (a local
        store's read one at a time as they are consumed, so one shard's bytes are in RAM at once).
        Offsets may point past the chunk bytes of a damaged shard: callers check them."""

    @abstractmethod
    def file_bytes(self, shard: int) -> int:
        """The stored size of ``shard`` (0 where unknown or never written)."""

    @abstractmethod
    def stored_bytes(self) -> int:
        """The bytes of every frame shard of the view."""

    @abstractmethod
    def keep(self) -> bool:
        """Hold on to the shards of the view as they are now, so that reads keep seeing this commit
        however far writers in other processes move on; False where the store is too big to."""

    @abstractmethod
    def forget(self, shard: int) -> None:
        """Let go of what is known of ``shard`` (it was rewritten); the next read finds it anew."""

    @abstractmethod
    def close(self) -> None:
        """Let go of everything (reads in flight finish first)."""

    def check(self, raw: bytes | memoryview, cid: int) -> bytes:
        """``raw`` (a chunk's stored bytes, checksum included) verified, as the chunk's payload;
        ``ChunkChecksumError`` names the chunk otherwise."""
        shard, chunk = divmod(cid, self.chunks_per_shard)
        return bytes(check_chunk(raw, name=FRAMES, shard=shard, chunk=chunk, first_step=cid * self.chunk_len,
                                 steps=self.chunk_len))


class Backend(ABC):
    """A store's storage: its metadata, its streams' commits and shards, its writers' claims."""

    #: the path or URL, as messages name the store
    where: str
    #: a reader's view stays whole while writers go on (objects are immutable); where it does not
    #: (files are replaced), a process that must see one unchanging store claims every stream
    views_are_snapshots = False

    def __init__(self) -> None:
        self.schema: Schema | None = None
        self.layout: Layout | None = None
        self.format_version = 0

    # ---------------------------------------------------------------------------------------------
    # The store

    @abstractmethod
    def exists(self) -> bool:
        """Whether anything is stored here (a store or not)."""

    @abstractmethod
    def create(self, schema: Schema, layout: Layout, *, overwrite: bool) -> None:
        """Make a new, empty store here and claim every stream of it for writing. Refuses a place
        holding anything, or a store unless ``overwrite`` (which is then removed under its
        writers' claims, so a live writer is never clobbered)."""

    @abstractmethod
    def read_metadata(self, *, check_arrays: bool = True) -> tuple[Schema, Layout]:
        """The store's schema and layout (with ``check_arrays``, checked against its arrays' metadata)."""

    @abstractmethod
    def check_arrays(self) -> None:
        """Check that each array's metadata describes the schema and layout read (``CorruptStoreError``)."""

    @abstractmethod
    def stored_bytes(self) -> dict[str, int]:
        """Bytes stored per array (and ``streams``, ``zarr.json``), for the commits read."""

    @abstractmethod
    def destroy(self) -> None:
        """Remove everything stored here (an unfinished copy that ``compact`` gives up)."""

    @abstractmethod
    def staging(self) -> Backend:
        """Where to build a store that ``publish`` then puts here (``compact``): beside this place, or
        this place itself where nothing is stored yet and storage has no atomic rename. Refuses
        (``ConfigError``) to replace a store here when that cannot be done atomically."""

    @abstractmethod
    def publish(self, staged: Backend, *, replace: bool) -> None:
        """Put the store built at ``staged`` (from ``staging``) here, atomically: a crash leaves the
        old store here or the new one, never neither. Without ``replace`` (a new DST) a store that
        appeared here meanwhile is never replaced: ``StoreExistsError``, and ``staged`` is removed."""

    def close(self) -> None:
        """Release every claim this backend holds and let go of its frame shards."""

    # ---------------------------------------------------------------------------------------------
    # Commits

    @abstractmethod
    def read_state(self, k: int) -> State:
        """Stream ``k``'s latest commit (a stream this backend claimed: its own last commit)."""

    @abstractmethod
    def read_shards(self, wanted: list[tuple[str, int, int]]) -> list[bytes | None]:
        """For each ``(array, stream k, shard j of the stream)``: the shard's bytes as of stream ``k``'s
        commit last read (or made) here, None where it was never written; all fetched at once."""

    @abstractmethod
    def follow(self, k: int) -> list[int]:
        """Point the frame shards at stream ``k``'s commit last read; returns the global frame shards
        whose stored bytes that changed (the reader forgets what it cached of them)."""

    # ---------------------------------------------------------------------------------------------
    # Writing

    @abstractmethod
    def claim(self, k: int) -> State:
        """Become stream ``k``'s one writer (``StoreLockedError`` names the one there is); returns its
        commit, read under the claim."""

    @abstractmethod
    def release(self, k: int) -> None:
        """Stop being stream ``k``'s writer."""

    def keep_claims(self) -> None:
        """Keep the claims alive while the writer is idle (leases expire; locks do not)."""

    @abstractmethod
    def collect(self, k: int) -> int:
        """Remove what earlier writers of stream ``k`` left that no commit names (a killed writer's
        temporary files or objects); returns how many. Call with the claim held."""

    @abstractmethod
    def write_shard(self, name: str, k: int, j: int, data: bytes) -> None:
        """Write shard ``j`` of stream ``k`` of array ``name`` whole; a commit makes it part of the store."""

    @abstractmethod
    def commit(self, k: int, state: State) -> None:
        """Make ``state`` stream ``k``'s commit, atomically, after every shard written before it."""

    # ---------------------------------------------------------------------------------------------

    @property
    @abstractmethod
    def frames(self) -> FrameShards:
        """The frame array's shards, for the reader."""

    def shard_of(self, k: int, j: int) -> int:
        """The array's shard number of stream ``k``'s shard ``j``."""
        schema, layout = self._known()
        return k * stream_stride(schema, layout) // layout.shard_len + j

    def _known(self) -> tuple[Schema, Layout]:
        if self.schema is None or self.layout is None:
            raise RuntimeError(f"{self.where}: read_metadata() or create() comes first")
        return self.schema, self.layout
