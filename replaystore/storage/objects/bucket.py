"""A store's objects on S3-compatible storage, through obstore: the few operations the object-store
format needs (docs/format.md, "Object storage"), with every failure turned into a replaystore error
that names the URL and says what to do.

    whole objects      ``get``, ``get_many`` (concurrent), ``put`` (overwrite), ``put_new``
                       (create-only: refuses an existing key), ``swap`` (compare-and-swap on the
                       ETag: the commit), ``delete``, ``list``
    chunks             ``get_ranges_many``: the byte ranges of several objects, all in flight at once

Endpoint and credentials come from the usual AWS environment variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ...) or from ``storage_options``
(obstore's S3 config keys: ``endpoint``, ``access_key_id``, ``secret_access_key``, ``region``, ...).
An ``http://`` endpoint is allowed (a local server). Concurrent requests run on one event loop in a
daemon thread, shared by every store of the process.
"""

from __future__ import annotations

import asyncio
import builtins
import datetime as _dt
import errno
import os
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from replaystore.errors import ConfigError, CorruptStoreError, StoreNotFoundError, StoreReadError, StoreWriteError
from replaystore.storage.readfile import METADATA_CAP
from replaystore.storage.where import normal_url

T = TypeVar("T")

SCHEMES = ("s3://",)
#: storage_options keys replaystore reads itself (the rest go to obstore)
OWN_OPTIONS = ("lease_ttl", "gc_grace")


class Bucket:
    """The objects under one URL prefix (``s3://bucket/prefix/replay.zarr``); keys are relative to it."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        if not url.startswith(SCHEMES):
            raise ConfigError(f"{url!r} is not a URL replaystore can store to; use s3://bucket/prefix (S3 or an "
                              "S3-compatible server: set AWS_ENDPOINT_URL), file:///path or a plain path")
        try:
            from obstore.store import from_url
        except ImportError as exc:
            raise ConfigError(f"a store at {url} needs obstore: pip install 'replaystore[s3]'") from exc
        self.url = normal_url(url)  # (s3://b/./a.zarr is s3://b/a.zarr: one store, one name)
        options = dict(storage_options or {})
        for key in OWN_OPTIONS:
            options.pop(key, None)
        endpoint = options.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        client: dict[str, Any] = {"connect_timeout": _dt.timedelta(seconds=5), "timeout": _dt.timedelta(seconds=60)}
        if endpoint and str(endpoint).startswith("http://"):
            client["allow_http"] = True
        retry: dict[str, Any] = {"max_retries": 3, "retry_timeout": _dt.timedelta(seconds=20),
                 "backoff": {"init_backoff": _dt.timedelta(milliseconds=100), "max_backoff": _dt.timedelta(seconds=2),
                             "base": 2}}
        try:
            self.store: Any = from_url(self.url, client_options=client, retry_config=retry, **options)  # type: ignore[call-overload]
        except Exception as exc:  # noqa: BLE001 - obstore raises its own config errors
            raise ConfigError(f"cannot use {url}: {_short(exc)}; check the URL and storage_options") from exc

    def __str__(self) -> str:
        return self.url

    def where(self, key: str) -> str:
        return f"{self.url}/{key}"

    # ---------------------------------------------------------------------------------------------
    # Whole objects

    def get(self, key: str, *, cap: int = METADATA_CAP) -> tuple[bytes, dict[str, Any]] | None:
        """The object's bytes and metadata (``e_tag``, ``last_modified``, ``size``), or None if absent;
        ``CorruptStoreError`` for an object larger than ``cap`` (a metadata object: refused unread)."""
        import obstore

        try:
            result = obstore.get(self.store, key)
            size = int(result.meta.get("size") or 0)
            if size > cap:
                raise CorruptStoreError(f"{self.where(key)} is {size:,} bytes, more than a metadata object can be "
                                        f"({cap:,}); it is damaged or not a replay store's: put back a copy")
            return bytes(result.bytes()), dict(result.meta)
        except FileNotFoundError:
            return None
        except CorruptStoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self.read_error(key, exc) from exc

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Each of ``keys``' bytes (None where absent), fetched concurrently."""
        import obstore

        async def one(key: str) -> bytes | None:
            try:
                return bytes(await (await obstore.get_async(self.store, key)).bytes_async())
            except FileNotFoundError:
                return None

        return self._run_all([one(k) for k in keys], keys)

    def get_ranges_many(self, requests: Sequence[tuple[str, list[int], list[int]]]) -> list[list[bytes]]:
        """For each ``(key, starts, ends)``, the bytes of those ranges; every request in flight at once.
        A missing object raises ``FileNotFoundError`` (the caller names what it was)."""
        import obstore

        async def one(key: str, starts: list[int], ends: list[int]) -> list[bytes]:
            return [bytes(b) for b in await obstore.get_ranges_async(self.store, key, starts=starts, ends=ends)]

        return self._run_all([one(*r) for r in requests], [r[0] for r in requests], missing_ok=False)

    def put(self, key: str, data: bytes) -> str:
        """Write (or replace) an object; returns its ETag."""
        return self._put(key, data, None)

    def put_new(self, key: str, data: bytes) -> str:
        """Write an object that must not exist yet (``FileExistsError`` if it does)."""
        return self._put(key, data, "create")

    def swap(self, key: str, data: bytes, e_tag: str | None) -> str:
        """Replace ``key`` only if it still has ``e_tag`` (create it only if absent, for None): the
        commit. Raises ``obstore.exceptions.PreconditionError`` / ``FileExistsError`` when another
        writer got there first."""
        return self._put(key, data, {"e_tag": e_tag} if e_tag is not None else "create")

    def _put(self, key: str, data: bytes, mode: Any) -> str:
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            result = obstore.put(self.store, key, data, mode=mode, use_multipart=False)
        except AlreadyExistsError as exc:
            raise FileExistsError(errno.EEXIST, f"{self.where(key)} exists already") from exc
        except PreconditionError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise StoreWriteError(errno.EIO, f"could not write {self.where(key)} ({_short(exc)}); the store is "
                                  "still at its last commit: call flush() again once the server answers") from exc
        return str(result.get("e_tag") or "")

    def delete(self, keys: Sequence[str]) -> None:
        import obstore

        if keys:
            try:
                obstore.delete(self.store, list(keys))
            except FileNotFoundError:
                pass
            except Exception as exc:  # noqa: BLE001
                raise StoreWriteError(errno.EIO, f"could not delete {len(keys)} objects under {self.url} "
                                      f"({_short(exc)})") from exc

    def list(self, prefix: str | None) -> builtins.list[dict[str, Any]]:
        """Every object under ``prefix`` (its ``path`` relative to this bucket's prefix)."""
        import obstore

        try:
            out: list[dict[str, Any]] = []
            for page in obstore.list(self.store, prefix, chunk_size=1000):
                out.extend(dict(meta) for meta in page)
            return out
        except Exception as exc:  # noqa: BLE001
            raise self.read_error(prefix or "", exc) from exc

    def exists(self) -> bool:
        """Whether anything is stored under this URL."""
        import obstore

        try:
            return bool(next(iter(obstore.list(self.store, None, chunk_size=1)), []))
        except Exception as exc:  # noqa: BLE001
            raise self.read_error("", exc) from exc

    # ---------------------------------------------------------------------------------------------

    def read_error(self, key: str, exc: BaseException) -> OSError:
        if isinstance(exc, FileNotFoundError):
            return StoreNotFoundError(errno.ENOENT, f"{self.where(key)} does not exist")
        return StoreReadError(errno.EIO, f"could not read {self.where(key)} ({_short(exc)}); check that the server "
                              "answers (AWS_ENDPOINT_URL) and the credentials, then try again")

    def _run_all(self, coros: builtins.list[Coroutine[Any, Any, T]], keys: Sequence[str],
                 missing_ok: bool = True) -> builtins.list[T]:
        async def gather() -> builtins.list[Any]:
            return await asyncio.gather(*coros, return_exceptions=True)

        results = run(gather())
        for key, result in zip(keys, results):
            if isinstance(result, BaseException):
                if isinstance(result, FileNotFoundError) and not missing_ok:
                    raise FileNotFoundError(errno.ENOENT, self.where(key))
                raise self.read_error(key, result) from result
        return results


def _short(exc: BaseException) -> str:
    """obstore's messages carry whole XML bodies: the first line, at most 300 characters."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300]


# -------------------------------------------------------------------------------------------------
# One event loop for the process's concurrent requests

_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0
_loop_lock = threading.Lock()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the shared loop and wait for it (from any thread but the loop's own)."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid() or not _loop.is_running():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=serve, name="replaystore-objects", daemon=True).start()
            ready.wait()
            _loop, _loop_pid = loop, os.getpid()
    return asyncio.run_coroutine_threadsafe(coro, _loop).result()
