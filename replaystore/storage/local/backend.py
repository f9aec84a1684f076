"""A store on a local (or shared) file system: format versions 1 and 2 (docs/format.md).

    replay.zarr/zarr.json                 the group: schema and layout (version 1: also the one commit)
    replay.zarr/<array>/zarr.json         each array's metadata (made by zarr)
    replay.zarr/<array>/c/<shard>[/0..]   its shards, written whole and renamed into place
    replay.zarr/streams/<k>/zarr.json     stream k's commit (version 2)
    replay.zarr/streams/<k>/writer.lock   stream k's writer lock (version 1: replay.zarr/writer.lock)

A store of one stream is written as version 1 (its commit in the root ``zarr.json``, its lock
beside it: the layout replaystore has always written, which every release reads), a store of
several as version 2; everything above this module sees streams either way. Writing a shard
renames a new file over the old one, and the directories renamed into are synced before the commit
that depends on them; a commit is the same kind of rename of the stream's ``zarr.json``. A writer
holds its stream's ``flock`` (lock.py), which the kernel releases when it dies.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from replaystore.errors import (
    CorruptStoreError,
    FormatVersionError,
    StoreExistsError,
    StoreNotFoundError,
    UnsafePathError,
)
from replaystore.format.extras import PREFIX
from replaystore.format.schema import (
    ATTR_KEY,
    LOCAL_FORMAT_VERSION,
    OBJECT_FORMAT_VERSION,
    ROOT_STATE_VERSION,
    STREAMS_DIR,
    Layout,
    Schema,
    State,
    array_names,
    from_attrs,
    group_doc,
    item_ndim,
    root_state,
    scalar_fields,
    slot_count,
    stream_doc,
    stream_state_from_doc,
    stream_stride,
    to_attrs,
    with_root_state,
)
from replaystore.format.shards import shard_key, store_arrays
from replaystore.format.validate import check_arrays, parse_group_doc
from replaystore.storage.backend import FRAMES, Backend
from replaystore.storage.local.durable import atomic_write, fsync_dir, fsync_dirs, remove_partials
from replaystore.storage.local.files import ShardFiles
from replaystore.storage.local.lock import LOCK_NAME, WriterLock
from replaystore.storage.local.renames import exchange, rename_new
from replaystore.storage.outside import check_not_in_store
from replaystore.storage.readfile import NotAFileError, read_file

EXTRAS_GROUP = PREFIX.rstrip("/")  # the extras' subgroup (format/extras.py)

log = logging.getLogger(__name__)


class LocalBackend(Backend):
    """The files of the store at ``root``."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        # A root that is a symbolic link is followed, once: every file the store writes, and a
        # compaction's swap, happen in the directory it points to, and the link itself stays.
        self.root = Path(os.path.realpath(root))
        self.where = str(root)
        self._walked = False  # the tree checked for links, before the first write (claim)
        self._doc: dict | None = None  # the root zarr.json as read (version 1 commits rewrite it)
        self._locks: dict[int, WriterLock] = {}
        self._synced: set[Path] = set()  # directories renamed into since the last commit
        self._frames: ShardFiles | None = None

    # ---------------------------------------------------------------------------------------------
    # The store

    def exists(self) -> bool:
        return self.root.exists()

    def create(self, schema: Schema, layout: Layout, *, overwrite: bool) -> None:
        lock = self._clear(overwrite=overwrite)
        try:
            version = ROOT_STATE_VERSION if schema.num_streams == 1 else LOCAL_FORMAT_VERSION
            self.schema, self.layout, self.format_version = schema, layout, version
            for name, raw in store_arrays(schema, layout).items():
                atomic_write(self.root / name / "zarr.json", raw)
            self._doc = group_doc({ATTR_KEY: to_attrs(schema, layout, version)})
            if version == ROOT_STATE_VERSION:
                self._doc = with_root_state(self._doc, State())
                self._locks[0], lock = lock, WriterLock(self.root)  # its writer lock is the root lock itself
            else:
                atomic_write(self.root / STREAMS_DIR / "zarr.json", json.dumps(group_doc({})).encode())
                for k in range(schema.num_streams):
                    atomic_write(self._stream_dir(k) / "zarr.json", json.dumps(stream_doc(k, State())).encode())
                    self._lock(k).acquire()
            # The group's zarr.json goes last: until it exists the directory is not a store, so a reader
            # never sees one half made.
            atomic_write(self.root / "zarr.json", json.dumps(self._doc, indent=2).encode())
        except BaseException:
            self.close()
            raise
        finally:
            lock.release()

    def _clear(self, *, overwrite: bool) -> WriterLock:
        """Make ``root`` an empty directory for a new store and hold its root lock: a path holding
        other files is refused, an existing store only without ``overwrite`` (its contents are
        removed under its streams' writer locks, so a live writer is never clobbered)."""
        root = self.root
        check_not_in_store(root.parent, what="a new store")  # (a store owns its directory: compact deletes strangers)
        lock = WriterLock(root)
        if root.exists() and not root.is_dir():
            raise StoreExistsError(f"{root} exists and is a file; choose another path for the store")
        if root.exists() and [p for p in root.iterdir() if p.name != LOCK_NAME]:
            if not _is_store(root):
                raise StoreExistsError(f"{root} holds files that are not a replay store; choose an empty or new path")
            if not overwrite:
                raise StoreExistsError(f"a replay store already exists at {root}; open it with ReplayStore.open("
                                       f"{str(root)!r}, mode='a') or pass overwrite=True to replace it")
            old = LocalBackend(root)
            try:
                old.read_metadata()
                for k in range(old.num_streams):
                    old.claim(k)
            except (CorruptStoreError, FormatVersionError):
                pass  # a damaged store: removed under its root lock alone
            except BaseException:
                old.close()
                raise
            if old.format_version == ROOT_STATE_VERSION and 0 in old._locks:
                lock = old._locks.pop(0)  # a version 1 store's writer lock is the root lock itself
            else:
                lock.acquire()
            try:
                for p in root.iterdir():
                    if p.name != LOCK_NAME:
                        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            except BaseException:
                lock.release()
                raise
            finally:
                old.close()
            return lock
        root.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        return lock

    def read_metadata(self, *, check_arrays: bool = True) -> tuple[Schema, Layout]:
        doc = self._read_root()
        schema, layout, version = from_attrs(doc.get("attributes"), path=self.where)
        if version == OBJECT_FORMAT_VERSION:
            raise FormatVersionError(f"{self.root} holds a store written for object storage (format version "
                                     f"{OBJECT_FORMAT_VERSION}); open it at its s3:// URL")
        self._doc, self.schema, self.layout, self.format_version = doc, schema, layout, version
        if check_arrays:
            self.check_arrays()
        return schema, layout

    def check_arrays(self) -> None:
        def read(name: str) -> bytes | None:
            try:
                return read_file(self.root / name / "zarr.json", what="an array's zarr.json")
            except OSError:  # (missing, or not a file: check_arrays says it is damaged)
                return None

        check_arrays(self.where, *self._known(), read)

    @property
    def num_streams(self) -> int:
        return self._known()[0].num_streams

    def stored_bytes(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for p in self.root.rglob("*"):
            if p.is_file() and p.name != LOCK_NAME:
                parts = p.relative_to(self.root).parts
                top = "/".join(parts[:2]) if parts[0] == EXTRAS_GROUP and len(parts) > 2 else parts[0]  # (each extra)
                sizes[top] = sizes.get(top, 0) + p.stat().st_size
        return sizes

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def staging(self) -> LocalBackend:
        """A temporary sibling directory (``.NAME.compact-PID``); what crashed compactions left beside
        this store (an unfinished copy, or a swapped-out original) is removed first."""
        for p in self.root.parent.glob(f".{self.root.name}.compact-*"):
            shutil.rmtree(p, ignore_errors=True)
        return LocalBackend(self.root.parent / f".{self.root.name}.compact-{os.getpid()}")

    def publish(self, staged: Backend, *, replace: bool) -> None:
        """A rename to a new path that never replaces what appeared there meanwhile
        (``renameat2(RENAME_NOREPLACE)``); in place (``replace``), ``renameat2(RENAME_EXCHANGE)`` on
        Linux (``renamex_np(RENAME_SWAP)`` on macOS) swaps the two directories in one atomic step, and
        the old one is then deleted."""
        assert isinstance(staged, LocalBackend)
        staged.close()
        if not replace:
            rename_new(staged.root, self.root)
            fsync_dir(self.root.parent)
            return
        exchange(staged.root, self.root)
        fsync_dir(self.root.parent)
        shutil.rmtree(staged.root, ignore_errors=True)  # now the old store

    def close(self) -> None:
        if self._frames is not None:
            self._frames.close()
        for k in list(self._locks):
            self.release(k)

    # ---------------------------------------------------------------------------------------------
    # Commits

    def read_state(self, k: int) -> State:
        if self.format_version == ROOT_STATE_VERSION:
            return root_state(self._read_root().get("attributes"), path=self.where)
        path = self._stream_dir(k) / "zarr.json"
        try:
            raw = read_file(path, what="a stream's commit")
        except FileNotFoundError:
            raise StoreNotFoundError(f"{path} is missing: stream {k}'s commit is gone; the store is damaged (run "
                                     "`replaystore verify`)") from None
        return stream_state_from_doc(parse_group_doc(raw, str(path.parent)), stream=k, path=str(path))

    def read_shards(self, wanted: list[tuple[str, int, int]]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for name, k, j in wanted:
            try:
                out.append(read_file(self._path(name, k, j), cap=self._shard_cap(name), what=f"a shard of {name}"))
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError, NotAFileError):  # (no shard file there)
                out.append(None)
        return out

    def _shard_cap(self, name: str) -> int:
        """The most bytes a shard file of ``name`` may hold: twice its rows uncompressed, and its index."""
        schema, layout = self._known()
        if name == "obs":
            shape, dtype = schema.observation.shape, schema.observation.dtype
        else:
            shape, dtype = scalar_fields(schema.action, schema.extras).get(name, ((), "float64"))
        return 2 * layout.shard_len * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize + 2**20

    def follow(self, k: int) -> list[int]:
        return []  # the files in place are the commit's (a reader keeps those it planned on open)

    # ---------------------------------------------------------------------------------------------
    # Writing

    def claim(self, k: int) -> State:
        if not self._walked:
            refuse_links(self.root, self.where)
            self._walked = True
        self._lock(k).acquire()
        if self.format_version == ROOT_STATE_VERSION:
            self._doc = self._read_root()  # (re-)read under the lock: the last writer may just have committed
        return self.read_state(k)

    def release(self, k: int) -> None:
        lock = self._locks.pop(k, None)
        if lock is not None:
            lock.release()

    def collect(self, k: int) -> int:
        removed = remove_partials(self.root, None if self.format_version == ROOT_STATE_VERSION else self._owned(k))
        if removed:
            log.info("removed %d temporary files left by an interrupted writer in %s", removed, self.root)
        return removed

    def write_shard(self, name: str, k: int, j: int, data: bytes) -> None:
        if name == FRAMES:  # reads planned on the file in place keep reading it (files.py)
            self.frames.before_replace(self.shard_of(k, j))
        atomic_write(self._path(name, k, j), data, dirs=self._synced)

    def commit(self, k: int, state: State) -> None:
        fsync_dirs(self._synced)
        self._synced.clear()
        if self.format_version == ROOT_STATE_VERSION:
            assert self._doc is not None
            self._doc = with_root_state(self._doc, state)
            atomic_write(self.root / "zarr.json", json.dumps(self._doc, indent=2).encode())  # syncs the root too
        else:
            atomic_write(self._stream_dir(k) / "zarr.json", json.dumps(stream_doc(k, state), indent=2).encode())

    # ---------------------------------------------------------------------------------------------

    @property
    def frames(self) -> ShardFiles:
        if self._frames is None:
            schema, layout = self._known()
            self._frames = ShardFiles(self.root, ndim=len(schema.observation.shape), capacity=slot_count(schema, layout),
                                      shard_len=layout.shard_len, chunk_len=layout.obs_chunk_len)
        return self._frames

    def _read_root(self) -> dict:
        path = self.root / "zarr.json"
        if not self.root.exists():
            raise StoreNotFoundError(f"{self.root} does not exist; create a store with "
                                     f"ReplayStore.create({str(self.root)!r}, ...)")
        try:
            raw = read_file(path, what="a store's zarr.json")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise StoreNotFoundError(f"{self.root} is not a replay store (no zarr.json); check the path or create "
                                     "one with ReplayStore.create") from None
        return parse_group_doc(raw, self.where)

    def _stream_dir(self, k: int) -> Path:
        return self.root / STREAMS_DIR / str(k)

    def _lock(self, k: int) -> WriterLock:
        lock = self._locks.get(k)
        if lock is None:
            lock = self._locks[k] = (WriterLock(self.root) if self.format_version == ROOT_STATE_VERSION
                                     else WriterLock(self._stream_dir(k), f"stream {k} of {self.root}"))
        return lock

    def _path(self, name: str, k: int, j: int) -> Path:
        schema, _ = self._known()
        return self.root / shard_key(name, self.shard_of(k, j), item_ndim(schema, name))

    def _owned(self, k: int) -> set[str]:
        """The keys stream ``k``'s writer writes (its commit, its shards of every array)."""
        schema, layout = self._known()
        per = stream_stride(schema, layout) // layout.shard_len
        keys = {f"{STREAMS_DIR}/{k}/zarr.json"}
        for j in range(per):
            shard = self.shard_of(k, j)
            keys.update(shard_key(name, shard, item_ndim(schema, name)) for name in array_names(schema))
        return keys


def refuse_links(root: Path, where: str) -> None:
    """``UnsafePathError`` if anything inside the store is a symbolic link: the writer writes,
    renames and deletes files there, and must never do it through a link to somewhere else."""
    for top, dirs, files in os.walk(root, followlinks=False):
        for name in (*dirs, *files):
            path = Path(top) / name
            if path.is_symlink() and name != LOCK_NAME:  # (the lock says so itself, opened O_NOFOLLOW)
                raise UnsafePathError(errno.ELOOP, f"{path} is a symbolic link (to {os.readlink(path)}) inside the store "
                                      f"{where}; a store written through links could write outside itself, so it is "
                                      "opened for writing only without them: replace the link with the file or "
                                      "directory itself, or open the store with mode='r' to read it")


def _is_store(path: Path) -> bool:
    try:
        doc = json.loads(read_file(path / "zarr.json", what="a store's zarr.json"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("node_type") == "group"
