"""Faults a store must survive in the field: the disk filling up inside ``add``, lock errors, and
samplers with a tiny cache reading chunks outside the lock while the writer wraps the ring; the
memory estimate and budget, and platforms without ``fcntl`` or ``os.pread``. Descriptors are
test_descriptors.py."""

from __future__ import annotations

import errno
import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import OBS_SHAPE, add_one, assert_same_ram, fill, make_store, ram_state, snapshot

from replaystore import Layout, ReplayStore, StoreWriteError
from replaystore.cli.verify import verify_store
from replaystore.errors import LockUnavailableError
from replaystore.storage.local import lock as lock_module


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fill_disk(where: Path) -> Path:
    """Take every byte left on the filesystem at ``where`` with one file; returns it."""
    ballast = where / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"x" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return ballast


def add_until_a_write_fails(store: ReplayStore, start: int, episode_len: int) -> int:
    """Add transitions from ``start`` on, on a full disk, until one has to write a shard and cannot;
    check that it left RAM and disk exactly as they were, and return it."""
    for i in range(start, start + 4 * store.layout.shard_len):
        before, disk = ram_state(store), snapshot(store.path)
        try:
            add_one(store, i, episode_len)
        except StoreWriteError as exc:
            assert exc.errno == errno.ENOSPC and "disk full" in str(exc)
            assert_same_ram(ram_state(store), before)
            assert snapshot(store.path) == disk, "a failed add changed the files of the last commit"
            with pytest.raises(StoreWriteError):  # still full: the same add fails the same way
                add_one(store, i, episode_len)
            assert_same_ram(ram_state(store), before)
            return i
    pytest.fail("no add ever had to write")


@pytest.mark.parametrize("capacity, steps_before", [(64, 20), (32, 40)], ids=["filling", "wrapping"])
def test_disk_full_inside_add_leaves_the_store_as_it_was(tiny_disk: Path, capacity: int, steps_before: int) -> None:
    """An add whose automatic commit hits ENOSPC (on a ring still filling, and on one overwriting its
    oldest steps) changes nothing; once there is space the same add succeeds, and a reopened store
    holds everything."""
    path = tiny_disk / "r.zarr"
    store = make_store(path, capacity=capacity, shard_len=16, chunk_len=4)
    fill(store, steps_before, episode_len=7)
    store.flush()
    ballast = fill_disk(tiny_disk)
    failed = add_until_a_write_fails(store, steps_before, 7)
    ballast.unlink()
    for i in range(failed, failed + 31):  # space again: the same add now succeeds, and the next ones
        add_one(store, i, 7)
    expected = store.sample(16, rng=np.random.default_rng(0))
    store.close()
    assert verify_store(path).ok
    again = ReplayStore.open(path)
    assert again.added == store.added
    got = again.sample(16, rng=np.random.default_rng(0))
    for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name), err_msg=name)
    again.close()


@pytest.mark.parametrize("err", [errno.ENOLCK, errno.EOPNOTSUPP, errno.EIO], ids=["ENOLCK", "EOPNOTSUPP", "EIO"])
def test_lock_errors_are_named_and_leak_nothing(tmp_path: Path, err: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """flock failing for a reason other than another writer (NFS without lockd says ENOLCK)."""
    path = tmp_path / "r.zarr"
    store = make_store(path)
    fill(store, 20)
    store.close()
    disk = snapshot(path)

    def flock(fd: int, op: int) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(lock_module.fcntl, "flock", flock)
    start = open_fds()
    with pytest.raises(LockUnavailableError) as exc:
        ReplayStore.open(path, mode="a")
    assert exc.value.errno == err and "mode='r'" in str(exc.value)
    if err != errno.EIO:
        assert "does not support file locks" in str(exc.value)
    assert open_fds() == start and snapshot(path) == disk
    ReplayStore.open(path).close()  # reading needs no lock


def test_a_read_only_directory_cannot_be_locked_but_can_be_read(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes to read-only directories anyway")
    path = tmp_path / "r.zarr"
    store = make_store(path)
    fill(store, 20)
    store.close()
    (path / "writer.lock").unlink()
    path.chmod(0o555)
    try:
        with pytest.raises(LockUnavailableError, match="must be writable"):
            ReplayStore.open(path, mode="a")
        ReplayStore.open(path).close()
    finally:
        path.chmod(0o755)


FRAME = 8  # bytes of the frame that carry its position


def frame_of(position: int) -> np.ndarray:
    """A frame that says which step it is: its first 8 bytes are the position."""
    out = np.full(OBS_SHAPE, position % 253, dtype=np.uint8)
    out.flat[:FRAME] = np.frombuffer(np.int64(position).tobytes(), np.uint8)
    return out


def test_samplers_with_a_tiny_cache_while_the_writer_wraps_see_the_ground_truth(tmp_path: Path) -> None:
    """Two threads sample with a 1 KB cache (nearly every chunk read from disk, outside the lock)
    while this thread adds and wraps a 128-step ring 20 times. Every sampled transition must be the
    one written at its position: frames, stack padding, move and next frames, all derived from the
    position the newest frame names (not from the store's own output)."""
    episode = 9  # moves per episode: an episode is 10 steps, step p is ep_step p % 10
    path = tmp_path / "r.zarr"
    store = ReplayStore.create(path, 128, *_spaces(), frame_stack=3, cache_bytes=64,
                               layout=Layout(shard_len=16, obs_chunk_len=4))

    def add(p: int) -> None:  # adds the move from step p (a new episode adds its first step too)
        store.add(frame_of(p), p % 5, float(p % 7), frame_of(p + 1), (p + 1) % (episode + 1) == episode, False)

    p = 0
    while store.added < 40:
        add(p)
        p += 2 if (p + 1) % (episode + 1) == episode else 1
    errors: list[str] = []
    checked = [0]
    stop = threading.Event()

    def sample() -> None:
        rng = np.random.default_rng(threading.get_ident() % 1000)
        while not stop.is_set():
            batch = store.sample(8, rng=rng)
            for i in range(8):
                at = int(np.frombuffer(batch.obs[i, -1].tobytes()[:FRAME], np.int64)[0])
                ep = at % (episode + 1)
                want = [frame_of(at - min(m, ep)) for m in (2, 1, 0)]
                want_next = [frame_of(at + 1 - min(m, ep + 1)) for m in (2, 1, 0)]
                if not (np.array_equal(batch.obs[i], np.stack(want)) and np.array_equal(batch.next_obs[i], np.stack(want_next))
                        and batch.action[i] == at % 5 and batch.reward[i] == float(at % 7)
                        and bool(batch.terminated[i]) == ((at + 1) % (episode + 1) == episode)):
                    errors.append(f"transition at step {at} (slot {batch.index[i]}) is not what was written")
            checked[0] += 8

    threads = [threading.Thread(target=sample) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        while store.added < 20 * 128 and not errors:
            add(p)
            p += 2 if (p + 1) % (episode + 1) == episode else 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    assert checked[0] > 500
    assert store.cache_hit_rate < 0.5, "the cache was meant to miss"
    store.close()


def _spaces():
    import gymnasium as gym

    return gym.spaces.Box(0, 255, OBS_SHAPE, np.uint8), gym.spaces.Discrete(5)


def test_the_memory_estimate_counts_prefetchers_and_the_budget_refuses_one_that_does_not_fit(tmp_path: Path) -> None:
    from replaystore import ConfigError
    from replaystore.feed.prefetch import Prefetcher

    path = tmp_path / "r.zarr"
    store = make_store(path, capacity=256, shard_len=32, chunk_len=4)
    fill(store, 250)
    store.close()
    plain = ReplayStore.open(path)
    base = plain.memory_estimate()
    assert {"sampling_buffers", "shard_indexes", "chunk_cache"} <= base.keys()
    p = Prefetcher(plain, plain.sampler(), 8, batches_per_block=4, threads=1, depth=2, seed=0, processes=False)
    with_prefetcher = plain.memory_estimate()
    assert with_prefetcher["prefetch_blocks"] == p.memory["prefetch_blocks"] > 0
    p.close()
    del p
    gc.collect()
    assert "prefetch_blocks" not in plain.memory_estimate()
    plain.close()

    budget = sum(base.values()) + 4096
    tight = ReplayStore.open(path, memory_budget=budget, cache_bytes=base["chunk_cache"])  # (as plain's)
    with pytest.raises(ConfigError, match="prefetch blocks.*lower batches_per_call"):
        Prefetcher(tight, tight.sampler(), 8, batches_per_block=512, threads=1, depth=2, seed=0, processes=False)
    assert "prefetch_blocks" not in tight.memory_estimate()
    tight.close()


def test_the_default_cache_fits_a_small_budget(tmp_path: Path) -> None:
    """Without cache_bytes, a store under a memory budget below 1 GB gets a quarter of it as its
    chunk cache (256 MB alone refused a 200 MB budget at open); an explicit one is checked as given."""
    import gymnasium as gym

    from replaystore.errors import ConfigError

    path = tmp_path / "atari.zarr"
    ReplayStore.create(path, 100_000, gym.spaces.Box(0, 255, (84, 84), np.uint8), gym.spaces.Discrete(4), 4).close()
    with ReplayStore.open(path) as roomy:
        assert roomy.memory_estimate()["chunk_cache"] == 256 << 20  # this machine: more than 1 GB
    with ReplayStore.open(path, memory_budget=200 << 20) as small:
        assert small.memory_estimate()["chunk_cache"] == 50 << 20
        assert sum(small.memory_estimate().values()) <= 200 << 20
    with pytest.raises(ConfigError, match="lower cache_bytes"):
        ReplayStore.open(path, memory_budget=200 << 20, cache_bytes=256 << 20)


def test_a_containers_memory_limit_is_read(tmp_path: Path) -> None:
    from replaystore.sampling.memory import cgroup_limit

    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    v2.write_text("max\n")
    v1.write_text(f"{2**63 - 4096}\n")  # cgroup v1's "no limit"
    assert cgroup_limit((str(v2), str(v1))) is None
    v2.write_text("1073741824\n")
    assert cgroup_limit((str(v2), str(v1))) == 2**30
    assert cgroup_limit((str(tmp_path / "missing"),)) is None


def test_the_limit_of_a_cgroup_below_the_mount_is_found(tmp_path: Path) -> None:
    """A Slurm job or systemd unit (or a container without its own cgroup namespace) has its limit
    on a cgroup below the hierarchy's root: found from /proc/self/cgroup and mountinfo, the lowest
    of the process's cgroup and those above it."""
    from replaystore.sampling.memory import cgroup_limit, cgroup_limit_files

    proc, v1, v2 = tmp_path / "proc", tmp_path / "cg v1" / "memory", tmp_path / "cg2"
    proc.mkdir()
    job = v1 / "slurm" / "job_7" / "step_0"
    user = v2 / "user.slice" / "run.scope"
    job.mkdir(parents=True)
    user.mkdir(parents=True)
    (proc / "cgroup").write_text("5:cpu,cpuacct:/slurm/job_7/step_0\n4:memory:/slurm/job_7/step_0\n0::/user.slice/run.scope\n")
    (proc / "mountinfo").write_text(
        f"30 25 0:26 / {str(v1).replace(' ', chr(92) + '040')} rw,nosuid - cgroup cgroup rw,memory\n"
        f"31 25 0:27 / {tmp_path}/cg1cpu rw - cgroup cgroup rw,cpu,cpuacct\n"
        f"32 25 0:28 / {v2} rw shared:9 - cgroup2 cgroup2 rw\n"
        f"33 25 0:29 / {tmp_path}/tmp rw - tmpfs tmpfs rw\n")
    files = cgroup_limit_files(proc)
    assert files == [str(job / "memory.limit_in_bytes"), str(job.parent / "memory.limit_in_bytes"),
                     str(v1 / "slurm" / "memory.limit_in_bytes"), str(v1 / "memory.limit_in_bytes"),
                     str(user / "memory.max"), str(v2 / "user.slice" / "memory.max"), str(v2 / "memory.max")]
    (job / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")
    (job.parent / "memory.limit_in_bytes").write_text(f"{3 * 2**30}\n")  # the job's limit, one level up
    (user / "memory.max").write_text("max\n")
    assert cgroup_limit(files) == 3 * 2**30
    (v2 / "user.slice" / "memory.max").write_text(f"{2**30}\n")
    assert cgroup_limit(files) == 2**30  # the lowest applies
    (proc / "mountinfo").write_text("garbage\n")
    assert cgroup_limit_files(proc) == [] and cgroup_limit_files(tmp_path / "none") == []


def test_a_gif_too_big_for_the_cgroups_memory_is_refused(tmp_path: Path) -> None:
    """Real: the CLI run in a new memory cgroup of 600 MB refuses to make a .gif of an episode whose
    frames and images would take more than half of it, names the limit and writes nothing; a part of
    the episode (--moves) is saved in the same cgroup; in 250 MB, less than the default chunk cache,
    inspect and episodes still read the store."""
    import gymnasium as gym

    from replaystore.sampling.memory import cgroup_limit_files

    mine = [f for f in cgroup_limit_files() if f.endswith("memory.limit_in_bytes")]
    if os.geteuid() != 0 or not mine:
        pytest.skip("needs root and cgroup v1's memory hierarchy to make a cgroup")
    group = Path(mine[0]).parent / f"replaystore-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here ({exc})")
    try:
        (group / "memory.limit_in_bytes").write_text(str(600 << 20))
        shape, n = (84, 84, 3), 5_500  # 21,168 bytes a frame: 5,501 frames x 3 is 333 MB, over 300 MB
        path = tmp_path / "big.zarr"
        with ReplayStore.create(path, 6_000, gym.spaces.Box(0, 255, shape, np.uint8), gym.spaces.Discrete(2)) as store:
            for i in range(n):
                store.add(np.full(shape, i % 250, np.uint8), 0, 0.0, np.full(shape, (i + 1) % 250, np.uint8),
                          i == n - 1, False)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            command = f'echo $$ > "{group}/cgroup.procs" && exec "$0" -m replaystore.cli "$@"'
            return subprocess.run(["sh", "-c", command, sys.executable, *args], capture_output=True, text=True,
                                  timeout=120)

        out = tmp_path / "ep.gif"
        refused = cli("episodes", str(path), "--save", "0", str(out))
        assert refused.returncode == 1, refused.stderr
        assert "cgroup (its container's or job's) limits it to 600 MB" in refused.stderr
        assert "--moves A:B" in refused.stderr and not out.exists()
        done = cli("episodes", str(path), "--save", "0", str(out), "--moves", "0:500")
        assert done.returncode == 0, done.stderr
        assert out.stat().st_size > 0
        # In 250 MB the commands that read a store open it without a chunk cache (256 MB by default,
        # which refused the store at open) and work.
        (group / "memory.limit_in_bytes").write_text(str(250 << 20))
        for args in (["inspect", str(path)], ["episodes", str(path)],
                     ["episodes", str(path), "--save", "0", str(tmp_path / "part.gif"), "--moves", "0:100"]):
            ran = cli(*args)
            assert ran.returncode == 0, (args, ran.stderr)
    finally:
        group.rmdir()


def test_without_fcntl_and_pread_the_store_reads_and_refuses_to_write_clearly(tmp_path: Path) -> None:
    """A platform without POSIX locks or ``os.pread`` (Windows): importing works, reading works,
    and opening for writing says why not, at that call."""
    import sys

    path = tmp_path / "r.zarr"
    store = make_store(path)
    fill(store, 40)
    expected = store.sample(8, rng=np.random.default_rng(0)).obs
    store.close()
    np.save(tmp_path / "expected.npy", expected)
    code = f"""
import sys, os
sys.modules["fcntl"] = None  # import fcntl raises ImportError
del os.pread
import numpy as np
import replaystore, replaystore.cli, replaystore.feed.prefetch
from replaystore import ReplayStore
from replaystore.errors import LockUnavailableError
with ReplayStore.open({str(path)!r}) as s:
    assert np.array_equal(s.sample(8, rng=np.random.default_rng(0)).obs, np.load({str(tmp_path / 'expected.npy')!r}))
try:
    ReplayStore.open({str(path)!r}, mode="a")
except LockUnavailableError as exc:
    assert "no fcntl" in str(exc), exc
    print("refused")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"
