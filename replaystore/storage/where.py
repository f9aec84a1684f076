"""Where a store is, said one way: ``is_url`` (object storage, ``s3://bucket/prefix``), ``local_path``
(a plain path or a ``file://`` URL as a ``Path``) and ``normalized`` (the one string two spellings
of the same store share: a URL with ``.`` and empty segments collapsed, a path with its links
resolved). Every place that asks "is this a URL?" or "is this the same store?" asks here."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Any

FILE = "file://"


def is_url(path: Any) -> bool:
    """Whether ``path`` names a store on object storage (``s3://bucket/prefix``); ``file://`` URLs and
    plain paths are local."""
    return isinstance(path, str) and "://" in path and not path.startswith(FILE)


def local_path(path: Any) -> Path:
    """A local store's path: a ``file://`` URL's path, or the path as given."""
    text = os.fspath(path) if not isinstance(path, str) else path
    return Path(text[len(FILE):] if isinstance(text, str) and text.startswith(FILE) else text)


def normal_url(url: str) -> str:
    """``url`` with its key's ``.`` and empty segments collapsed and no trailing slash
    (``s3://b/./a.zarr/`` and ``s3://b//a.zarr`` are ``s3://b/a.zarr``); ``..`` steps back a segment,
    never above the bucket."""
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    parts: list[str] = []
    for part in key.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return f"{scheme}://{bucket}" + ("/" + posixpath.join(*parts) if parts else "")


def normalized(path: Any) -> str:
    """The one string of a store's location: ``normal_url`` of a URL, the real path (links resolved)
    of a local one."""
    return normal_url(path) if is_url(path) else os.path.realpath(local_path(path))
