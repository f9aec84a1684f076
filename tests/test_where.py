"""One way to say where a store is (replaystore/storage/where.py): URLs and paths, and the same
store however it is spelled: ``s3://b/./a.zarr`` is ``s3://b/a.zarr``; a link, ``..`` and
``file://`` name their directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from replaystore.storage.where import is_url, local_path, normal_url, normalized


@pytest.mark.parametrize(("url", "normal"), [
    ("s3://b/a.zarr", "s3://b/a.zarr"), ("s3://b/./a.zarr", "s3://b/a.zarr"), ("s3://b//a.zarr/", "s3://b/a.zarr"),
    ("s3://b/x/../a.zarr", "s3://b/a.zarr"), ("s3://b/../../a.zarr", "s3://b/a.zarr"), ("s3://b", "s3://b"),
])
def test_a_url_has_one_spelling(url: str, normal: str) -> None:
    assert is_url(url) and normal_url(url) == normal and normalized(url) == normal


def test_a_local_store_is_its_real_directory(tmp_path: Path) -> None:
    (tmp_path / "a.zarr").mkdir()
    (tmp_path / "link.zarr").symlink_to(tmp_path / "a.zarr")
    spellings = [tmp_path / "a.zarr", str(tmp_path / "link.zarr"), f"file://{tmp_path}/a.zarr",
                 str(tmp_path / "x" / ".." / "a.zarr")]
    assert {normalized(s) for s in spellings} == {str((tmp_path / "a.zarr").resolve())}
    assert not any(is_url(s) for s in spellings)
    assert local_path(f"file://{tmp_path}/a.zarr") == tmp_path / "a.zarr"


def test_no_module_asks_whether_a_path_is_a_url_by_itself() -> None:
    """``"://" in path`` lives in where.py only (it disagreed with it on file:// where it was copied)."""
    root = Path(__file__).resolve().parent.parent
    offenders = [str(p.relative_to(root)) for folder in ("replaystore", "trainer") for p in (root / folder).rglob("*.py")
                 if '"://" in' in p.read_text() or '"://" not in' in p.read_text()]
    assert offenders == ["replaystore/storage/where.py"]
