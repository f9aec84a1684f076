"""Hostile and damaged input, built with real files: the store never writes, truncates or deletes
outside its own directory, whatever links it meets, and every refusal is a ``ReplayStoreError``
subclass in one line, with the store still holding every committed transition.

Each test keeps a sentinel file (or directory) outside the store and checks its bytes and mtime
afterwards."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import fill, make_store, snapshot

from replaystore import ReplayStore, StoreExistsError, UnsafePathError
from replaystore.cli import main as cli_main
from replaystore.cli.compact import compact_store


class Sentinel:
    """A file outside the store whose bytes and mtime must not change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"precious bytes the store must never touch\n" * 4)
        os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
        self.before = (path.read_bytes(), path.stat().st_mtime_ns)

    def unchanged(self) -> bool:
        return (self.path.read_bytes(), self.path.stat().st_mtime_ns) == self.before


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    path = tmp_path / "store" / "replay.zarr"
    path.parent.mkdir()
    store = make_store(path)
    fill(store, 40)
    store.close()
    return path


def _holds_everything(path: Path) -> None:
    """Every committed transition still readable (the fill wrote 40)."""
    with ReplayStore.open(path) as store:
        assert len(store) == 40
        store.sample(8, rng=np.random.default_rng(0))


def test_a_symlinked_writer_lock_is_refused_not_written_through(filled: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    sentinel = Sentinel(tmp_path / "elsewhere" / "important.txt")
    lock = filled / "writer.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(sentinel.path)
    before = snapshot(filled)
    with pytest.raises(UnsafePathError, match="writer.lock is a symbolic link .* remove the link"):
        ReplayStore.open(filled, mode="a")
    assert cli_main(["compact", str(filled), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "is a symbolic link" in err and err.count("\n") == 1
    assert sentinel.unchanged() and snapshot(filled) == before
    lock.unlink()
    _holds_everything(filled)


def test_a_dangling_symlink_lock_creates_nothing(filled: Path, tmp_path: Path) -> None:
    target = tmp_path / "created-by-the-store"
    lock = filled / "writer.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(target)
    with pytest.raises(UnsafePathError):
        ReplayStore.open(filled, mode="a")
    assert not target.exists()


def test_a_lock_that_is_not_a_regular_file_is_refused(filled: Path) -> None:
    lock = filled / "writer.lock"
    lock.unlink(missing_ok=True)
    os.mkfifo(lock)
    with pytest.raises(UnsafePathError, match="not a regular file"):
        ReplayStore.open(filled, mode="a")
    lock.unlink()
    _holds_everything(filled)


def test_a_symlinked_directory_inside_the_store_is_refused_for_writing(filled: Path, tmp_path: Path) -> None:
    """An array's directory moved elsewhere and linked back: writing would put shards there."""
    inside = next(p for p in filled.iterdir() if p.is_dir())
    outside = tmp_path / "elsewhere" / inside.name
    outside.parent.mkdir()
    inside.rename(outside)
    inside.symlink_to(outside)
    sentinel = Sentinel(outside / "sentinel")
    files = snapshot(outside)
    with pytest.raises(UnsafePathError, match="symbolic link .* inside the store"):
        ReplayStore.open(filled, mode="a")
    assert cli_main(["compact", str(filled), "--quiet"]) == 1
    assert sentinel.unchanged() and snapshot(outside) == files
    with ReplayStore.open(filled) as store:  # reading follows it
        assert len(store) == 40


def test_a_store_whose_root_is_a_link_is_followed_and_the_link_kept(filled: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.zarr"
    link.symlink_to(filled)
    store = ReplayStore.open(link, mode="a")
    store.end_episode()
    fill(store, 10, start=40)
    store.close()
    kept = compact_store(link, capacity=32).transitions_after  # (whole episodes, oldest cut)
    assert 0 < kept <= 32
    assert link.is_symlink() and os.readlink(link) == str(filled)
    assert not [p for p in [*tmp_path.iterdir(), *filled.parent.iterdir()] if ".compact-" in p.name]
    with ReplayStore.open(filled) as store:
        assert store.capacity == 32 and len(store) == kept


@pytest.mark.parametrize("where", ["inside", "deep inside"])
def test_compact_refuses_a_destination_inside_its_source(filled: Path, capsys: pytest.CaptureFixture[str],
                                                         where: str) -> None:
    dst = filled / "compacted.zarr" if where == "inside" else filled / "a" / "b" / "c.zarr"
    before = snapshot(filled)
    with pytest.raises(UnsafePathError, match="is inside .* choose a DST outside"):
        compact_store(filled, dst)
    assert cli_main(["compact", str(filled), str(dst), "--quiet"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert snapshot(filled) == before and not dst.exists()
    _holds_everything(filled)


def test_compact_refuses_a_destination_that_reaches_its_source_through_a_link(filled: Path, tmp_path: Path) -> None:
    link = tmp_path / "alias"
    link.symlink_to(filled)
    with pytest.raises(UnsafePathError):
        compact_store(filled, link / "new.zarr")
    with pytest.raises(StoreExistsError):  # the source itself, under another name
        compact_store(filled, link)
    _holds_everything(filled)
