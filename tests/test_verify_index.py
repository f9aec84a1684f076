"""verify checks a shard index's structure, not only each chunk's checksum: entries inside the
shard's data, in order, not overlapping (an index with a valid crc32c that points two chunks at one
place used to pass when the bytes there were a valid chunk)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import fill, make_store

from replaystore.cli.verify import verify_store
from replaystore.errors import ChunkChecksumError
from replaystore.format.shards import CRC_BYTES, EMPTY, INDEX_ENTRY_BYTES, check_index_layout, crc32c, shard_key


def _rewrite_index(path: Path, per_shard: int, change) -> None:
    raw = bytearray(path.read_bytes())
    tail = per_shard * INDEX_ENTRY_BYTES + CRC_BYTES
    index = np.frombuffer(bytes(raw[-tail:-CRC_BYTES]), dtype="<u8").reshape(per_shard, 2).copy()
    change(index)
    body = index.astype("<u8").tobytes()
    raw[-tail:] = body + crc32c(body)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("case", ["overlap", "past-the-data", "too-short"])
def test_a_well_checksummed_index_that_lies_is_reported(tmp_path: Path, case: str) -> None:
    store = make_store(tmp_path / "s.zarr", capacity=64, shard_len=16, chunk_len=4)
    fill(store, 30)
    store.close()
    shard = tmp_path / "s.zarr" / shard_key("obs", 0, 2)

    def change(index: np.ndarray) -> None:
        if case == "overlap":
            index[1] = index[0]  # (chunk 1 points at chunk 0's bytes: a valid chunk, the wrong one)
        elif case == "past-the-data":
            index[2, 0] = 10**6
        else:
            index[3, 1] = 2

    _rewrite_index(shard, 4, change)
    report = verify_store(tmp_path / "s.zarr")
    assert not report.ok
    assert any("damaged index" in p.message or "points past" in p.message for p in report.problems), report.problems


def test_check_index_layout() -> None:
    good = np.array([[0, 10], [10, 8], [EMPTY, EMPTY], [18, 5]], dtype=np.uint64)
    check_index_layout(good, 23, name="obs", shard=0)
    with pytest.raises(ChunkChecksumError, match="inside the chunk before it"):
        check_index_layout(np.array([[0, 10], [5, 8]], dtype=np.uint64), 23, name="obs", shard=0)
    with pytest.raises(ChunkChecksumError, match="points past"):
        check_index_layout(np.array([[0, 10], [10, 20]], dtype=np.uint64), 23, name="obs", shard=0)
