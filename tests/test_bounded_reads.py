"""Reads that always end and are bounded (replaystore/storage/readfile.py): a FIFO where a shard
or a ``zarr.json`` should be is refused at once (verify reports it; it used to hang), a
``zarr.json`` linked to ``/dev/zero`` or a sparse 2 GB one is refused before it is read, and a
checkpoint of compressed zeros that declares gigabytes is refused before it is inflated. Each case
in a child process with a timeout (a hang fails the test, it does not hang the suite) and with the
store left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import snapshot
from hostile import filled_store

from replaystore.errors import CorruptStoreError
from replaystore.storage.readfile import METADATA_CAP, NotAFileError, npz_arrays, read_file


def _cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replaystore.cli", *argv], capture_output=True, text=True,
                          check=False, timeout=timeout)


def test_a_fifo_in_place_of_a_shard_is_reported_by_verify(tmp_path: Path) -> None:
    store = filled_store(tmp_path)
    shard = next(p for p in sorted((store / "obs" / "c").rglob("*")) if p.is_file())
    shard.unlink()
    os.mkfifo(shard)
    before = snapshot(store)
    done = _cli("verify", str(store))
    assert done.returncode == 2 and "DAMAGED obs shard 0" in done.stdout, done.stdout + done.stderr  # (2: damage found)
    assert snapshot(store) == before


def test_a_fifo_zarr_json_is_one_line(tmp_path: Path) -> None:
    store = filled_store(tmp_path)
    (store / "zarr.json").unlink()
    os.mkfifo(store / "zarr.json")
    for verb in ("inspect", "verify"):
        done = _cli(verb, str(store))
        assert done.returncode == 1 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("kind", ["dev-zero", "sparse-2gb"])
def test_a_huge_zarr_json_is_refused_unread(tmp_path: Path, kind: str) -> None:
    store = filled_store(tmp_path)
    meta = store / "zarr.json"
    meta.unlink()
    if kind == "dev-zero":
        meta.symlink_to("/dev/zero")
    else:
        with open(meta, "wb") as f:
            f.truncate(2 * 2**30)
    done = _cli("inspect", str(store))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "not a regular file" in done.stderr or "more than a store's zarr.json can be" in done.stderr


def test_read_file_bounds(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_file(path, cap=100) == b"x" * 100
    with pytest.raises(CorruptStoreError, match="100 bytes, more than"):
        read_file(path, cap=99)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(NotAFileError):
        read_file(tmp_path / "fifo")
    with pytest.raises(IsADirectoryError):
        read_file(tmp_path)
    assert METADATA_CAP >= 2**20


def test_a_checkpoint_of_compressed_zeros_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    """2 MB on disk that declares 1 GB: refused from the declared shape, with no allocation."""
    from replaystore.trainer import TrainerError, checkpoint

    run = tmp_path / "run"
    run.mkdir()
    with zipfile.ZipFile(run / checkpoint.BEST, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("online/0000.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (2**28,)})
            block = bytes(2**20)
            for _ in range(2**10):
                f.write(block)
        with archive.open("info.npy", "w") as f:
            np.lib.format.write_array(f, np.frombuffer(json.dumps({"mean_return": 1.0}).encode(), np.uint8))
    assert (run / checkpoint.BEST).stat().st_size < 4 * 2**20
    with pytest.raises(TrainerError, match="declares 1,073,741,8.. bytes of arrays"):
        checkpoint.load_best(run)
    with pytest.raises(CorruptStoreError):
        list(npz_arrays(run / checkpoint.BEST, budget=2**20))
