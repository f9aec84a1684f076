"""Stores of several episode streams: add_batch from real vector envs in each autoreset mode, sampling
across streams, per-stream writers in other processes, refresh, and bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from scipy import stats

from replaystore import InvalidTransitionError, Layout, ReplayStore
from replaystore.cli.main import main as cli_main
from replaystore.cli.verify import verify_store
from replaystore.errors import ConfigError
from replaystore.sampling.assemble import prepare
from replaystore.storage.rings import SHIFT

FRAME_STACK = 4


def make_atari(max_steps: int = 400) -> gym.Env:
    import ale_py  # noqa: F401 - registers the ALE ids

    env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0, max_episode_steps=max_steps)
    return gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=42, terminal_on_life_loss=True, noop_max=10)


def record_single(make, seed: int, actions: np.random.Generator, steps: int, k: int):
    """Run one env wrapped in FrameStackObservation(padding_type="reset"); per transition: position
    in its stream, stacked obs, action, reward, stacked next_obs, terminated, truncated."""
    env = gym.wrappers.FrameStackObservation(make(), k, padding_type="reset")
    obs, _ = env.reset(seed=seed)
    out, position = [], 0
    for _ in range(steps):
        a = int(actions.integers(env.action_space.n))
        nxt, r, term, trunc, _ = env.step(a)
        out.append((position, obs, a, float(r), nxt, term, trunc))
        position += 1
        if term or trunc:
            position += 1  # the episode's last step holds only its observation
            obs, _ = env.reset()
        else:
            obs = nxt
    return out


def run_vector(store: ReplayStore, envs, seed: int, rngs: list[np.random.Generator], steps: int) -> None:
    """Drive ``envs`` (next-step autoreset) writing every step with the pattern users write."""
    n = envs.num_envs
    obs, _ = envs.reset(seed=seed)
    taken = [0] * n
    was_done = np.zeros(n, dtype=bool)
    while min(taken) < steps:
        actions = np.array([0 if was_done[i] else int(rngs[i].integers(envs.single_action_space.n))
                            for i in range(n)])
        nxt, r, term, trunc, info = envs.step(actions)
        store.add_batch(obs, actions, r, nxt, term, trunc, autoreset_mode=envs.metadata["autoreset_mode"])
        for i in range(n):
            taken[i] += 0 if was_done[i] else 1
        was_done = term | trunc
        obs = nxt


def stream_transitions(store: ReplayStore, k: int, positions: list[int]):
    g = (np.int64(k) << SHIFT) | np.asarray(positions, dtype=np.int64)
    return prepare(store.rings, store.reader, g).finish(store.reader)


def test_vector_env_streams_equal_single_envs_on_atari(tmp_path: Path) -> None:
    """N single envs with FrameStackObservation, seeded as the N-env vector env: every transition of
    the N-stream store is theirs, stacks bit-identical, terminations and truncations included."""
    n, steps, seed = 3, 260, 7
    expected = [record_single(lambda: make_atari(), seed + i, np.random.default_rng(100 + i), steps, FRAME_STACK)
                for i in range(n)]
    envs = gym.vector.SyncVectorEnv([make_atari for _ in range(n)])
    store = ReplayStore.create(tmp_path / "s.zarr", 1536, envs.single_observation_space, envs.single_action_space,
                               FRAME_STACK, num_streams=n, layout=Layout(shard_len=64, obs_chunk_len=8))
    run_vector(store, envs, seed, [np.random.default_rng(100 + i) for i in range(n)], steps)
    envs.close()
    flags = [(sum(t[5] for t in e), sum(t[6] for t in e)) for e in expected]
    assert all(term > 0 for term, _ in flags) and any(trunc > 0 for _, trunc in flags), flags
    for i in range(n):
        want = expected[i]
        got = stream_transitions(store, i, [t[0] for t in want])
        np.testing.assert_array_equal(got.obs, np.stack([t[1] for t in want]))
        np.testing.assert_array_equal(got.next_obs, np.stack([t[4] for t in want]))
        np.testing.assert_array_equal(got.action, [t[2] for t in want])
        np.testing.assert_array_equal(got.reward, np.float32([t[3] for t in want]))
        np.testing.assert_array_equal(got.terminated, [t[5] for t in want])
        np.testing.assert_array_equal(got.truncated, [t[6] for t in want])
        assert store.rings.streams[i].n_valid >= len(want)  # the vector env ran until every env took `steps`
    # the public path: sampled transitions are among them, whole
    store.flush()
    reader = ReplayStore.open(tmp_path / "s.zarr")
    batch = reader.sample(64, rng=np.random.default_rng(0))
    stride = reader.rings.stride
    for j, slot in enumerate(batch.index.tolist()):
        k, p = divmod(slot, stride)
        match = next(t for t in expected[k] if t[0] == p)
        np.testing.assert_array_equal(batch.obs[j], match[1])
        np.testing.assert_array_equal(batch.next_obs[j], match[4])
    assert verify_store(tmp_path / "s.zarr").ok


def test_ale_vector_env_next_step_autoreset(tmp_path: Path) -> None:
    """ale-py's C++ AtariVectorEnv (next-step autoreset): every stream's episodes are exactly the
    frames the env returned, the reset steps were not stored as transitions."""
    from ale_py.vector_env import AtariVectorEnv

    n = 2
    envs = AtariVectorEnv("breakout", num_envs=n, stack_num=1, img_height=42, img_width=42, episodic_life=True,
                          max_num_frames_per_episode=600)
    space = gym.spaces.Box(0, 255, (42, 42), np.uint8)
    store = ReplayStore.create(tmp_path / "a.zarr", 2048, space, gym.spaces.Discrete(4), FRAME_STACK, num_streams=n,
                               layout=Layout(shard_len=64, obs_chunk_len=8))
    obs, _ = envs.reset(seed=3)
    rng = np.random.default_rng(0)
    moves: list[list[tuple]] = [[] for _ in range(n)]
    was_done = np.zeros(n, dtype=bool)
    for _ in range(400):
        actions = rng.integers(0, 4, size=n)
        nxt, r, term, trunc, _ = envs.step(actions)
        store.add_batch(obs[:, 0], actions, r, nxt[:, 0], term, trunc, autoreset_mode=envs.metadata["autoreset_mode"])
        for i in range(n):
            if not was_done[i]:
                moves[i].append((obs[i, 0].copy(), int(actions[i]), float(r[i]), nxt[i, 0].copy(), bool(term[i]),
                                 bool(trunc[i])))
        was_done = term | trunc
        obs = nxt
    envs.close()
    assert sum(m[4] or m[5] for ms in moves for m in ms) >= 2, "no episode ended"
    for i in range(n):
        positions, p = [], 0
        for m in moves[i]:
            positions.append(p)
            p += 2 if (m[4] or m[5]) else 1
        got = stream_transitions(store, i, positions)
        np.testing.assert_array_equal(got.obs[:, -1], np.stack([m[0] for m in moves[i]]))
        np.testing.assert_array_equal(got.next_obs[:, -1], np.stack([m[3] for m in moves[i]]))
        np.testing.assert_array_equal(got.action, [m[1] for m in moves[i]])
        assert store.rings.streams[i].n_valid == len(moves[i])


def cartpole_envs(n: int, mode: gym.vector.AutoresetMode) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=15) for _ in range(n)],
                                    autoreset_mode=mode)


def single_cartpole_episodes(n: int, seed: int, actions: np.ndarray) -> list[list[tuple]]:
    """Per env, the transitions (obs, a, r, next_obs, term, trunc) of single envs seeded seed + i."""
    out = []
    for i in range(n):
        env = gym.make("CartPole-v1", max_episode_steps=15)
        obs, _ = env.reset(seed=seed + i)
        moves = []
        for a in actions[:, i]:
            nxt, r, term, trunc, _ = env.step(int(a))
            moves.append((obs, int(a), float(r), nxt, term, trunc))
            obs = env.reset()[0] if term or trunc else nxt
        out.append(moves)
    return out


def check_streams_hold(store: ReplayStore, expected: list[list[tuple]]) -> None:
    for i, moves in enumerate(expected):
        positions, p = [], 0
        for m in moves:
            positions.append(p)
            p += 2 if (m[4] or m[5]) else 1
        got = stream_transitions(store, i, positions)
        np.testing.assert_array_equal(got.obs[:, -1], np.float32([m[0] for m in moves]))
        np.testing.assert_array_equal(got.next_obs[:, -1], np.float32([m[3] for m in moves]))
        np.testing.assert_array_equal(got.terminated, [m[4] for m in moves])
        np.testing.assert_array_equal(got.truncated, [m[5] for m in moves])
        assert store.rings.streams[i].n_valid == len(moves)


@pytest.mark.parametrize("mode", ["same_step", "disabled"])
def test_other_autoreset_modes(tmp_path: Path, mode: str) -> None:
    n, seed, steps = 3, 11, 60
    rng = np.random.default_rng(5)
    actions = rng.integers(0, 2, size=(steps, n))
    expected = single_cartpole_episodes(n, seed, actions)
    envs = cartpole_envs(n, gym.vector.AutoresetMode.SAME_STEP if mode == "same_step" else gym.vector.AutoresetMode.DISABLED)
    store = ReplayStore.create(tmp_path / "c.zarr", 600, envs.single_observation_space, envs.single_action_space,
                               2, num_streams=n, layout=Layout(shard_len=32, obs_chunk_len=8))
    obs, _ = envs.reset(seed=seed)
    for t in range(steps):
        nxt, r, term, trunc, info = envs.step(actions[t])
        store.add_batch(obs, actions[t], r, nxt, term, trunc, info, autoreset_mode=envs.metadata["autoreset_mode"])
        done = term | trunc
        if mode == "disabled" and done.any():
            obs, _ = envs.reset(options={"reset_mask": done})
            obs = np.where(done[:, None], obs, nxt)
        else:
            obs = nxt
    check_streams_hold(store, expected)


def test_next_step_mode_catches_a_manual_reset(tmp_path: Path) -> None:
    """Resetting ended envs by hand while add_batch expects next-step autoreset is refused, naming the row."""
    store = ReplayStore.create(tmp_path / "m.zarr", 64, gym.spaces.Box(-1, 1, (2,), np.float32),
                               gym.spaces.Discrete(2), num_streams=2, layout=Layout(shard_len=8, obs_chunk_len=4))
    o = np.zeros((2, 2), np.float32)
    store.add_batch(o, [0, 0], [1, 1], o + 1, [True, False], [False, False])
    with pytest.raises(InvalidTransitionError, match=r"row 0 \(stream 0\).*same_step"):
        store.add_batch(o + 5, [0, 0], [0, 0], o + 6, [False, False], [False, False])
    assert store.added == 4


def small_store(path: Path, n: int = 3, capacity: int = 96, **kw) -> ReplayStore:
    return ReplayStore.create(path, capacity, gym.spaces.Box(0, 255, (3,), np.uint8), gym.spaces.Discrete(3), 2,
                              num_streams=n, layout=Layout(shard_len=8, obs_chunk_len=4), **kw)


def frames(t: int, n: int) -> np.ndarray:
    return np.stack([np.full(3, (7 * t + i) % 256, np.uint8) for i in range(n)])


def test_bad_rows_reject_the_whole_call(tmp_path: Path) -> None:
    store = small_store(tmp_path / "b.zarr")
    store.add_batch(frames(0, 3), [0, 1, 2], [0, 0, 0], frames(1, 3), [False] * 3, [False] * 3)
    before = ({k: v.copy() for k, v in store.rings.fields.items()}, store.added, len(store))
    cases = [
        (dict(obs=frames(1, 2)), r"obs has shape \(2, 3\).*\(3, 3\)"),
        (dict(reward=[0.0, np.nan, 0.0]), r"reward\[1\] is nan"),
        (dict(action=[0, 5, 1]), r"action\[1\] is 5, outside"),
        (dict(action=[0.5, 1.0, 1.0]), "action has dtype float64"),
        (dict(obs=frames(1, 3).astype(np.float32)), "obs has dtype float32"),
        (dict(obs=frames(9, 3)), r"obs\[0\] does not continue the episode in progress .*\(stream 0\)"),
        (dict(terminated=[True, False]), r"terminated has shape \(2,\)"),
    ]
    for change, match in cases:
        args = dict(obs=frames(1, 3), action=[0, 1, 2], reward=[0.0, 1.0, 0.0], next_obs=frames(2, 3),
                    terminated=[False] * 3, truncated=[False] * 3) | change
        with pytest.raises(InvalidTransitionError, match=match):
            store.add_batch(**args)
        after = ({k: v.copy() for k, v in store.rings.fields.items()}, store.added, len(store))
        assert after[1:] == before[1:]
        for name in before[0]:
            np.testing.assert_array_equal(after[0][name], before[0][name])
    with pytest.raises(ConfigError, match="add_batch"):
        store.add(frames(1, 1)[0], 0, 0.0, frames(2, 1)[0], False, False)


def test_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not split evenly into 4 streams; use a multiple of 4 such as 96 or 100"):
        small_store(tmp_path / "x.zarr", n=4, capacity=98)
    small_store(tmp_path / "y.zarr").close()
    with pytest.raises(ConfigError, match="has streams 0..2"):
        ReplayStore.open(tmp_path / "y.zarr", mode="a", streams=[3])
    with pytest.raises(ConfigError, match="mode='a'"):
        ReplayStore.open(tmp_path / "y.zarr", streams=[0])


def test_uniform_across_unequally_filled_streams(tmp_path: Path) -> None:
    """A chi-square test: every sampleable transition equally likely whatever its stream's fill."""
    store = small_store(tmp_path / "u.zarr", n=3, capacity=3 * 64)
    store.close()
    for k, moves in enumerate([40, 12, 3]):
        with ReplayStore.open(tmp_path / "u.zarr", mode="a", streams=[k]) as w:
            for t in range(moves):
                w.add(frames(t, 1)[0], t % 3, 1.0, frames(t + 1, 1)[0], False, False)
    reader = ReplayStore.open(tmp_path / "u.zarr")
    assert [r.n_valid for r in reader.rings.streams] == [40, 12, 3] and len(reader) == 55
    counts: dict[int, int] = {}
    rng = np.random.default_rng(0)
    for _ in range(250):
        for slot in reader.sample(50, rng=rng).index.tolist():
            counts[slot] = counts.get(slot, 0) + 1
    assert len(counts) == 55
    observed = np.array(list(counts.values()))
    assert stats.chisquare(observed).pvalue > 1e-3
    by_stream = np.bincount(np.array(list(counts)) // reader.rings.stride, weights=observed)
    np.testing.assert_allclose(by_stream / observed.sum(), np.array([40, 12, 3]) / 55, atol=0.02)


def test_prioritized_and_n_step_across_streams(tmp_path: Path) -> None:
    store = small_store(tmp_path / "p.zarr")
    for t in range(20):
        done = [t % 6 == 5, t % 7 == 6, False]
        store.add_batch(frames(t, 3), [0, 1, 2], [1.0, 2.0, 3.0], frames(t + 1, 3), done, [False] * 3)
    batch = store.sample(32, rng=np.random.default_rng(1), n_step=3, prioritized=True)
    stride = store.rings.stride
    streams = batch.index // stride
    # n-step sums stay in their stream: rewards are 1, 2, 3 per stream
    for j in range(32):
        per = float(streams[j] + 1)
        assert batch.reward[j] in {np.float32(per), np.float32(per * (1 + 0.99)), np.float32(per * (1 + 0.99 + 0.99**2))}
    store.update_priorities(batch.index, np.where(streams == 2, 100.0, 0.001))
    again = store.sample(50, rng=np.random.default_rng(2), prioritized=True, alpha=1.0)
    assert np.mean(again.index // stride == 2) > 0.9


def test_inspect_shows_streams(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = small_store(tmp_path / "i.zarr")
    for t in range(10):
        store.add_batch(frames(t, 3), [0, 1, 2], [0, 0, 0], frames(t + 1, 3), [False] * 3, [False] * 3)
    store.close()
    assert cli_main(["inspect", str(tmp_path / "i.zarr"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format_version"] == 2 and info["schema"]["num_streams"] == 3
    assert [s["transitions"] for s in info["streams"]] == [10, 10, 10] and info["transitions"] == 30
    assert cli_main(["inspect", str(tmp_path / "i.zarr")]) == 0
    assert "stream  transitions" in capsys.readouterr().out
    assert cli_main(["verify", str(tmp_path / "i.zarr")]) == 0
    # plain zarr sees the arrays and each stream's commit as a group
    import zarr

    group = zarr.open_group(str(tmp_path / "i.zarr"), mode="r")
    assert group["obs"].shape[0] == 3 * store.rings.stride
    assert group["streams"]["1"].attrs["replaystore_stream"]["state"]["added"] == 11
    assert os.path.exists(tmp_path / "i.zarr" / "streams" / "1" / "writer.lock")


def test_refresh_sees_an_episode_closed_by_end_episode(tmp_path: Path) -> None:
    """end_episode commits the same steps with the episode closed: a reader's refresh must load it
    (it moved no head, so it is easy to miss)."""
    path = tmp_path / "e.zarr"
    writer = small_store(path, n=2)
    for t in range(3):
        writer.add_batch(frames(t, 2), [0, 1], [1.0, 2.0], frames(t + 1, 2), [False] * 2, [False] * 2)
    writer.flush()
    reader = ReplayStore.open(path)
    writer.end_episode()
    writer.flush()
    assert sorted(reader.refresh()) == [0, 1]
    for k in range(2):
        ring = reader.rings.streams[k]
        assert ring.is_last[(ring.added - 1) % ring.capacity] and ring.truncated[(ring.added - 2) % ring.capacity]
    batch = reader.sample(6, rng=np.random.default_rng(0))  # all of them
    last = batch.index % reader.rings.stride == 2
    assert last.any() and batch.truncated[last].all() and not batch.truncated[~last].any()
    reader.close()
    writer.close()
