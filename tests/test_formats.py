"""Every on-disk format version written so far still opens: the committed stores under tests/data/
(written by older replaystores, see tests/data/make_stores.py) are opened, verified, sampled and
checked frame by frame against tests/groundtruth.py, and a copy of each takes more steps."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from groundtruth import EXTRAS, check_batches, check_stack, frame, move_extras, moves, step

from replaystore import FormatVersionError, ReplayStore
from replaystore.cli import main as cli

DATA = Path(__file__).resolve().parent / "data"
#: store -> (format version, moves written into each stream)
STORES = {"v1.zarr": (1, (100,)), "v2.zarr": (2, (20, 45, 9))}


@pytest.mark.parametrize("name", list(STORES))
def test_old_local_stores_open_verify_and_sample(name: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / name
    shutil.copytree(DATA / name, path)
    version, counts = STORES[name]
    assert cli(["verify", str(path)]) == 0
    assert cli(["inspect", "--json", str(path)]) == 0
    assert f'"format_version": {version}' in capsys.readouterr().out
    with ReplayStore.open(path) as store:
        assert store.num_streams == len(counts)
        check_batches(store)
        check_batches(store, n_step=3, prioritized=True)
        if version == 1:
            np.testing.assert_array_equal(store.priorities(np.array([3, 10, 40])), [5.0, 0.25, 2.0])
    # a copy takes more steps where each stream left off (continuing the episode in progress), and
    # reopens with them
    for k, count in enumerate(counts):
        with ReplayStore.open(path, mode="a", streams=None if len(counts) == 1 else [k]) as store:
            for move in moves(k, 30, start=_after(k, count)):
                store.add(*move)
    assert cli(["verify", str(path)]) == 0
    with ReplayStore.open(path) as store:
        check_batches(store, n_step=2)


def test_a_store_with_extras_opens_verifies_and_samples(tmp_path: Path) -> None:
    """tests/data/v2-extras.zarr (written when extras came): its extras come back with each move, and a
    copy takes more moves with theirs."""
    path = tmp_path / "x.zarr"
    shutil.copytree(DATA / "v2-extras.zarr", path)
    assert cli(["verify", str(path)]) == 0

    def check(store: ReplayStore) -> None:
        rng = np.random.default_rng(3)
        for _ in range(4):
            batch = store.sample(16, rng=rng)
            for i in range(16):
                k, p = check_stack(batch.obs[i], store.frame_stack)
                want = move_extras(k, p)
                assert (batch.extras["pos"][i], batch.extras["stream"][i]) == (want["pos"], want["stream"])
                np.testing.assert_array_equal(batch.extras["half"][i], np.float32(want["half"]))

    with ReplayStore.open(path) as store:
        assert [e.name for e in store.schema.extras] == list(EXTRAS)
        check_batches(store)
        check(store)
    for k, count in enumerate((20, 45)):
        with ReplayStore.open(path, mode="a", streams=[k]) as store:
            p = _after(k, count)
            for move in moves(k, 30, start=p):
                while step(k, p).is_last:
                    p += 1
                store.add(*move, extras=move_extras(k, p))
                p += 1
    assert cli(["verify", str(path)]) == 0
    with ReplayStore.open(path) as store:
        check(store)


def _after(k: int, count: int) -> int:
    """The position after the first ``count`` moves of stream ``k`` (the next move starts there, or
    just after, where that position is an episode's last)."""
    p, done = 0, 0
    while done < count:
        if not step(k, p).is_last:
            done += 1
        p += 1
    return p


def test_a_store_for_object_storage_on_local_disk_is_refused(tmp_path: Path) -> None:
    shutil.copytree(DATA / "v3-objects", tmp_path / "v3")
    with pytest.raises(FormatVersionError, match="object storage"):
        ReplayStore.open(tmp_path / "v3")


def test_an_old_object_store_opens_verifies_and_samples(s3_server, s3_url: str,
                                                        capsys: pytest.CaptureFixture) -> None:
    import obstore
    from obstore.store import from_url

    root = DATA / "v3-objects"
    bucket = from_url(s3_url, client_options={"allow_http": True})
    for f in root.rglob("*"):
        if f.is_file():
            obstore.put(bucket, str(f.relative_to(root)), f.read_bytes())
    assert cli(["verify", s3_url]) == 0
    capsys.readouterr()
    with ReplayStore.open(s3_url) as store:
        assert store.num_streams == 3
        check_batches(store)
        check_batches(store, n_step=3, prioritized=True)
        assert frame(1, 0).shape == store.observation_space.shape
