"""The backends there are, and the one a path or URL names (backend.py has the interface)."""

from __future__ import annotations

from typing import Any

from replaystore.errors import ConfigError
from replaystore.storage.backend import Backend
from replaystore.storage.where import is_url, local_path

__all__ = ["LEASE_OPTIONS", "is_url", "local_path", "open_backend"]

#: storage_options that mean something for a store at a URL only, and are ignored for a local path
#: (so one command line serves both: ``replaystore-train --store PATH_OR_URL --lease-ttl ...``)
LEASE_OPTIONS = ("lease_ttl", "gc_grace")


def open_backend(path: Any, storage_options: dict[str, Any] | None = None) -> Backend:
    """The backend of a store at ``path``: a URL (``s3://bucket/prefix``) is on object storage, a
    plain path or a ``file://`` URL on a file system."""
    if is_url(path):
        from replaystore.storage.objects.backend import ObjectBackend  # obstore is imported only for a URL

        return ObjectBackend(path, storage_options)
    from replaystore.storage.local.backend import LocalBackend

    other = sorted(set(storage_options or ()) - set(LEASE_OPTIONS))
    if other:
        raise ConfigError(f"storage_options {other} were given for {path}, a local path; they configure a store at an "
                          "s3:// URL: drop them, or give a URL")
    return LocalBackend(local_path(path))
