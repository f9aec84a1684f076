"""The same store checks on every storage backend (a local path, and an s3:// URL on the test's
SeaweedFS server): exact transitions and stacks, n-step returns, prioritized draws, sequences, blocks,
reopening, following another writer with refresh(), compaction and bad input. Every value is checked
against tests/groundtruth.py (frames spell their stream and step), never against the store itself."""

from __future__ import annotations

import uuid
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import snapshot
from groundtruth import (
    ACTION_HIGH,
    ACTION_LOW,
    ACTION_SHAPE,
    EPISODE_MOVES,
    N_ACTIONS,
    SHAPE,
    box_action,
    check_action,
    check_batches,
    check_stack,
    frame,
    identity,
    moves,
    step,
)

from replaystore import InvalidTransitionError, Layout, ReplayStore, SampleError
from replaystore.cli.compact import compact_store
from replaystore.cli.verify import verify_store
from replaystore.storage import chunkcache

SPACES = (gym.spaces.Box(0, 255, SHAPE, np.uint8), gym.spaces.Discrete(N_ACTIONS))
BOX_ACTIONS = gym.spaces.Box(ACTION_LOW, ACTION_HIGH, ACTION_SHAPE, np.float32)
COUNTS = (40, 90, 25)  # moves written into each of 3 streams of 32 steps: streams 1 and 2 wrap


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "replay.zarr")
    request.getfixturevalue("s3_server")
    return f"s3://replay/conformance-{uuid.uuid4().hex[:12]}/replay.zarr"


def sibling(where: str, name: str) -> str:
    return where.replace("replay.zarr", name)


def contents(where: str) -> dict[str, object]:
    """Every file's hash (local), or every object's ETag and each stream's commit (s3: a writer's
    lease, taken and given back, rewrites its stream's state object): equal contents, unchanged store."""
    if "://" not in where:
        return dict(snapshot(Path(where)))
    from replaystore.storage.objects.bucket import Bucket

    out: dict[str, object] = {m["path"]: m["e_tag"] for m in Bucket(where).list(None)
                              if not m["path"].startswith("streams/")}
    with ReplayStore.open(where) as store:
        out["states"] = [(s.added, s.oldest, s.episodes, s.episode_in_progress) for s in store.stream_states()]
    return out


def write(where: str, counts: tuple[int, ...] = COUNTS, *, start: tuple[int, ...] | None = None,
          box: bool = False) -> None:
    """Stream ``k`` of the store at ``where`` takes ``counts[k]`` ground-truth moves (from position
    ``start[k]``), each stream by a handle of its own (``box``: the Box actions)."""
    for k, count in enumerate(counts):
        with ReplayStore.open(where, mode="a", streams=[k]) as store:
            for move in moves(k, count, start=0 if start is None else start[k], box=box):
                store.add(*move)


def create(where: str, *, box: bool = False) -> None:
    """The ground truth's 3 streams in a new store (``box``: of ``BOX_ACTIONS``)."""
    spaces = (SPACES[0], BOX_ACTIONS) if box else SPACES
    ReplayStore.create(where, 96, *spaces, 2, layout=Layout(shard_len=8, obs_chunk_len=2), num_streams=3).close()
    write(where, box=box)


def after(k: int, count: int) -> int:
    """The position after stream ``k``'s first ``count`` moves."""
    p = done = 0
    while done < count:
        done += not step(k, p).is_last
        p += 1
    return p


def test_transitions_stacks_n_step_returns_and_priorities(where: str) -> None:
    create(where)
    with ReplayStore.open(where) as store:
        assert store.num_streams == 3
        check_batches(store)
        check_batches(store, n_step=3)
        check_batches(store, n_step=2, prioritized=True)
    with ReplayStore.open(where, mode="a") as store:  # priorities are the store's: they outlive the handle
        batch = store.sample(64, rng=np.random.default_rng(1))
        favourite = batch.index[:3]
        store.update_priorities(batch.index, np.full(64, 1e-6))
        store.update_priorities(favourite, np.full(3, 1e6))
    with ReplayStore.open(where) as store:
        rng = np.random.default_rng(2)
        drawn = np.concatenate([store.sample(32, rng=rng, prioritized=True, alpha=1.0).index for _ in range(8)])
        assert np.isin(drawn, favourite).mean() > 0.95  # proportional: the rest share ~1e-10 of the mass
        check_batches(store, prioritized=True)


def test_sequences_are_whole_windows_of_one_episode(where: str) -> None:
    create(where)
    with ReplayStore.open(where) as store:
        for length in (1, 4, 10):
            seq = store.sample_sequences(24, length, rng=np.random.default_rng(length))
            assert seq.obs.shape == (24, length + 1, 2, *SHAPE) and seq.action.shape == (24, length)
            for i in range(24):
                k, first = check_stack(seq.obs[i, 0], 2)
                episode = step(k, first).episode
                for t in range(length + 1):
                    assert check_stack(seq.obs[i, t], 2) == (k, first + t)
                    assert step(k, first + t).episode == episode, "a window crossed an episode's end"
                for t in range(length):
                    s = step(k, first + t)
                    assert (seq.action[i, t], seq.reward[i, t]) == (s.action, pytest.approx(s.reward))
                    assert (seq.terminated[i, t], seq.truncated[i, t]) == (s.terminated, s.truncated)
        longest = max(EPISODE_MOVES)
        assert store.sample_sequences(8, longest, rng=np.random.default_rng(0)).obs.shape[1] == longest + 1
        with pytest.raises(SampleError, match=f"no episode in the store has {longest + 1} moves"):
            store.sample_sequences(8, longest + 1)


def test_episodes_read_whole(where: str) -> None:
    """Every live episode of every stream, read whole, is the ground truth's: its frames, moves and
    end; the oldest, partly overwritten in the wrapped streams, from its oldest live step; the
    newest in progress. Then a writer goes on: its buffered steps (not yet committed) are read too."""
    create(where)
    with ReplayStore.open(where) as store:
        for k, count in enumerate(COUNTS):
            ring, head = store.rings.streams[k], after(k, count)
            live = range(ring.lo, head + 1)  # the stream's live steps; the head holds the newest observation
            firsts = [p for p in live if p == ring.lo or step(k, p).ep_step == 0]
            for i, first in enumerate(firsts):
                ep = store.episode(i, stream=k)
                assert store.episode(i - len(firsts), stream=k).first_step == first  # negative: from the newest
                last = firsts[i + 1] - 1 if i + 1 < len(firsts) else head
                ks, ps = identity(ep.obs)
                assert ks.tolist() == [k] * (last - first + 1) and ps.tolist() == list(range(first, last + 1))
                np.testing.assert_array_equal(ep.obs, np.stack([frame(k, p) for p in range(first, last + 1)]))
                want = [step(k, p) for p in range(first, last)]
                assert ep.action.tolist() == [s.action for s in want]
                assert ep.reward.tolist() == [s.reward for s in want]
                assert ep.terminated.tolist() == [s.terminated for s in want]
                assert ep.truncated.tolist() == [s.truncated for s in want]
                assert ep.first_step == first and ep.from_start == (step(k, first).ep_step == 0)
                assert ep.ended == ("in progress" if not step(k, last).is_last else
                                    "terminated" if want and want[-1].terminated else "truncated" if want else "ended")
            assert not store.episode(0, stream=1).from_start  # stream 1 wrapped inside an episode
            newest = store.episode(stream=k)
            assert newest.index == len(firsts) - 1 and newest.ended == "in progress"
    with ReplayStore.open(where, mode="a", streams=[0]) as writer:  # steps in the shard the writer holds in RAM
        for move in moves(0, 3, start=after(0, COUNTS[0])):
            writer.add(*move)
        head = after(0, COUNTS[0] + 3)
        first = max(p for p in range(head + 1) if step(0, p).ep_step == 0)
        ep = writer.episode(-1)
        assert ep.first_step == first and len(ep) == head - first
        np.testing.assert_array_equal(ep.obs, np.stack([frame(0, p) for p in range(first, head + 1)]))
    with ReplayStore.open(where) as store, pytest.raises(SampleError, match="stream 0 holds"):
        store.episode(99)
    with ReplayStore.open(where) as store, pytest.raises(SampleError, match="has 3 streams"):
        store.episode(0, stream=3)


def test_every_episode_iterated_as_read_one_at_a_time(where: str) -> None:
    """``iter_episodes`` gives what ``episode`` gives for each index of each stream, in order; with
    ``whole`` only the episodes with both ends live; and an episode the writer overwrites before it
    is reached raises instead of coming back as other steps."""
    create(where)
    with ReplayStore.open(where) as store:
        want = [store.episode(i, stream=k) for k in range(3) for i in range(store.episode(-1, stream=k).index + 1)]
        got = list(store.iter_episodes())
        assert [(e.stream, e.index, e.first_step, e.ended) for e in got] == [
            (e.stream, e.index, e.first_step, e.ended) for e in want]
        for a, b in zip(got, want, strict=True):
            for name in ("obs", "action", "reward", "terminated", "truncated"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        whole = [(e.stream, e.index) for e in store.iter_episodes(whole=True)]
        assert whole == [(e.stream, e.index) for e in want if e.from_start and e.ended in ("terminated", "truncated")]
        assert whole and len(whole) < len(want)
        assert [e.index for e in store.iter_episodes(stream=2)] == [e.index for e in want if e.stream == 2]
        with pytest.raises(SampleError, match="has 3 streams"):
            store.iter_episodes(stream=3)
    with ReplayStore.open(where, mode="a", streams=[0]) as writer:
        episodes = writer.iter_episodes(stream=0)
        first = next(episodes)
        for move in moves(0, 40, start=after(0, COUNTS[0])):  # the ring (32 steps) turns over
            writer.add(*move)
        with pytest.raises(SampleError, match="no longer live"):
            next(episodes)
        assert first.stream == 0


def test_blocks_of_transitions_and_of_sequences(where: str) -> None:
    create(where)
    with ReplayStore.open(where) as store:
        with store.blocks(8, batches_per_block=3, seed=5, threads=2, n_step=2) as it:
            for _ in range(4):
                with next(it) as block:
                    for i in range(3):
                        for j in range(8):
                            k, p = check_stack(block["obs"][i, j], 2)
                            assert block["action"][i, j] == step(k, p).action
        with store.blocks(4, batches_per_block=2, seed=5, threads=1, sequence_length=5) as it:
            block = next(it)
            assert block["obs"].shape == (2, 4, 6, 2, *SHAPE)
            for i in range(2):
                for j in range(4):
                    k, p = check_stack(block["obs"][i, j, 0], 2)
                    assert [check_stack(block["obs"][i, j, t], 2) for t in range(6)] == [(k, p + t) for t in range(6)]


def test_reopened_and_refreshed_views_hold_every_committed_step(where: str) -> None:
    create(where)
    reader = ReplayStore.open(where)
    first = reader.sample(16, rng=np.random.default_rng(3))
    with ReplayStore.open(where) as again:  # a reopened store draws the same batch from the same generator
        np.testing.assert_array_equal(again.sample(16, rng=np.random.default_rng(3)).obs, first.obs)
    before = [s.added for s in reader.stream_states()]
    with ReplayStore.open(where, mode="a", streams=[1]) as writer:  # another handle goes on writing stream 1
        for move in moves(1, 30, start=after(1, COUNTS[1])):
            writer.add(*move)
    assert reader.refresh() == [1]
    assert [s.added for s in reader.stream_states()] == [before[0], after(1, COUNTS[1] + 30) + 1, before[2]]
    check_batches(reader, n_step=2)
    ring = reader.rings.streams[1]
    newest = ring.added - 2  # the newest move of stream 1 is sampleable now
    assert ring.valid[newest % ring.capacity] or ring.is_last[newest % ring.capacity]
    reader.close()


def test_compact_keeps_every_transition_exactly(where: str) -> None:
    create(where)
    dst = sibling(where, "compacted.zarr")
    report = compact_store(where, dst, num_streams=1, capacity=48)
    assert report.streams_after == 1 and verify_store(dst).ok
    with ReplayStore.open(dst) as store:
        assert len(store) == report.transitions_after > 0
        # 1-step: merging closes each stream's episode in progress as truncated, which the ground
        # truth's episodes go on past (n-step returns stop there)
        check_batches(store)


def test_bad_input_changes_nothing(where: str) -> None:
    create(where)
    before = contents(where)
    with ReplayStore.open(where, mode="a", streams=[0]) as store:
        head = after(0, COUNTS[0])
        good = next(moves(0, 1, start=head))
        for bad in ((np.zeros((2, 2), np.uint8), *good[1:]),  # wrong shape
                    (good[0], N_ACTIONS, *good[2:]),  # an action outside the space
                    (good[0], good[1], float("nan"), *good[3:]),  # a reward that is not finite
                    (frame(0, 999), *good[1:])):  # not the episode's next observation
            with pytest.raises(InvalidTransitionError):
                store.add(*bad)
    assert contents(where) == before
    with ReplayStore.open(where, mode="a") as store, pytest.raises(InvalidTransitionError):
        store.add_batch(*good)  # one row for three streams
    assert contents(where) == before


def test_box_actions_through_every_path(where: str) -> None:
    """A store of continuous (Box) actions, each an array of its own: sampled batches, sequences,
    episodes, blocks, a reopened and a refreshed view, a compacted copy and plain zarr all hold
    every action exactly; bad actions change nothing."""
    create(where, box=True)
    with ReplayStore.open(where) as store:
        assert store.action_space == BOX_ACTIONS
        check_batches(store)
        check_batches(store, n_step=3, prioritized=True)
        seq = store.sample_sequences(12, 4, rng=np.random.default_rng(4))
        assert seq.action.shape == (12, 4, *ACTION_SHAPE)
        for i in range(12):
            k, first = check_stack(seq.obs[i, 0], 2)
            for t in range(4):
                check_action(seq.action[i, t], k, first + t)
        for k in range(3):
            ep = store.episode(-2, stream=k)
            np.testing.assert_array_equal(ep.action, np.stack([box_action(k, ep.first_step + t) for t in range(len(ep))]))
        with store.blocks(8, batches_per_block=2, seed=5, threads=2) as it, next(it) as block:
            assert block["action"].shape == (2, 8, *ACTION_SHAPE)
            for i in range(2):
                for j in range(8):
                    check_action(block["action"][i, j], *check_stack(block["obs"][i, j], 2))
    if "://" not in where:  # any zarr v3 reader sees the actions: (slots, *shape) float32
        import zarr

        actions = zarr.open_group(where, mode="r")["action"]
        assert actions.shape == (96, *ACTION_SHAPE) and actions.dtype == np.float32
        p = after(0, COUNTS[0]) - 1  # stream 0's newest move (its slots are 0..31)
        np.testing.assert_array_equal(actions[p % 32], box_action(0, p))

    reader = ReplayStore.open(where)
    with ReplayStore.open(where, mode="a", streams=[1]) as writer:
        for move in moves(1, 20, start=after(1, COUNTS[1]), box=True):
            writer.add(*move)
    assert reader.refresh() == [1]
    check_batches(reader, n_step=2)
    reader.close()

    before = contents(where)
    with ReplayStore.open(where, mode="a", streams=[0]) as store:
        good = next(moves(0, 1, start=after(0, COUNTS[0]), box=True))
        for action, message in ((np.full(ACTION_SHAPE, 1.5, np.float32), "outside the action space's bounds"),
                                (np.full(ACTION_SHAPE, np.nan, np.float32), "not finite"),
                                (np.zeros(3, np.float32), "shape"),
                                (np.zeros(ACTION_SHAPE, complex), "dtype"),
                                (2, "shape")):
            with pytest.raises(InvalidTransitionError, match=message):
                store.add(good[0], action, *good[2:])
    assert contents(where) == before

    dst = sibling(where, "compacted.zarr")
    report = compact_store(where, dst, num_streams=1, capacity=48)
    assert verify_store(dst).ok and verify_store(where).ok
    with ReplayStore.open(dst) as store:
        assert store.action_space == BOX_ACTIONS and len(store) == report.transitions_after > 0
        check_batches(store)


def test_a_ring_too_long_for_a_lookup_slot_per_chunk(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``LIST_CHUNKS`` chunks the chunk cache is looked up through the dict of what it holds
    (storage/chunkcache.py): the same batches, cached or not."""
    monkeypatch.setattr(chunkcache, "LIST_CHUNKS", 0)
    create(where)
    for cache_bytes in (0, 1 << 20):
        with ReplayStore.open(where, cache_bytes=cache_bytes) as store:
            assert not store.reader.cache.slot_per_chunk
            check_batches(store)
            check_batches(store, n_step=3, prioritized=True)
