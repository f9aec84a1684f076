"""Dict observation spaces (format/dictobs.py): a store of a goal-conditioned env's dicts gives back,
through every way of reading it, the dicts that gymnasium's own ``FrameStackObservation`` showed the
agent; bad dicts are refused before anything changes; the packing keeps every dtype exact."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from conftest import snapshot
from goal_env import Reach, follows, goal_space
from hypothesis import given, settings
from hypothesis import strategies as st

from replaystore import ConfigError, CorruptStoreError, InvalidTransitionError, Layout, ReplayStore
from replaystore.format.dictobs import DictSpec, dict_from_space

LAYOUT = Layout(shard_len=32, obs_chunk_len=4)


def test_packing_keeps_every_dtype_and_aligns_each_entry() -> None:
    spec = dict_from_space(goal_space())
    assert spec.stored.dtype == "uint8" and spec.stored.shape[0] % 8 == 0  # mixed dtypes: the frame's bytes
    for entry in spec.entries:
        assert entry.offset % entry.dtype.itemsize == 0
    rng = np.random.default_rng(0)
    value = {"observation": rng.uniform(-1, 1, (5, 2)).astype(np.float32), "achieved_goal": np.full((5, 2), -0.0, np.float32),
             "desired_goal": np.array([[np.inf, -np.inf]] * 5, np.float32), "steps": np.arange(5)[:, None] * 2**40,
             "seen": rng.integers(0, 256, (5, 3, 3), dtype=np.uint8)}
    frames = spec.pack(value, name="obs", path="p", lead=(5,))
    assert frames.shape == (5, *spec.stored.shape)
    back = spec.unpack(frames)
    assert list(back) == list(spec.keys)
    for key, array in value.items():
        assert back[key].dtype == array.dtype and back[key].tobytes() == array.tobytes()  # -0.0, inf, 2**42 exact
        assert back[key].base is not None  # a view of the frames, not a copy


DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "float16", "int32", "float32", "int64", "uint64", "float64"]
#: entries that are not Boxes, and the dtype each is kept and given back in
OTHERS = {"Discrete": "int64", "MultiBinary": "int8", "MultiDiscrete": "int32"}


def _entry(kind: str, shape: list[int]) -> gym.Space:
    if kind == "Discrete":
        return gym.spaces.Discrete(5, start=-2)
    if kind == "MultiBinary":
        return gym.spaces.MultiBinary(shape or [1])
    if kind == "MultiDiscrete":
        nvec = np.arange(2, 2 + int(np.prod(shape or [1]))).reshape(shape or [1])
        return gym.spaces.MultiDiscrete(nvec, dtype=np.int32, start=-nvec // 2)
    return gym.spaces.Box(0, 1, tuple(shape), np.dtype(kind))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DTYPES + list(OTHERS)), st.lists(st.integers(1, 4), max_size=3)),
                min_size=1, max_size=6),
       st.integers(0, 2**32 - 1), st.integers(1, 3))
def test_any_dict_of_entries_packs_and_unpacks_bit_for_bit(entries, seed: int, rows: int) -> None:
    space = gym.spaces.Dict([(f"k{i}", _entry(kind, shape)) for i, (kind, shape) in enumerate(entries)])
    spec = dict_from_space(space)
    rng = np.random.default_rng(seed)
    value = {}
    for key, sub in space.spaces.items():
        if isinstance(sub, gym.spaces.Discrete):
            value[key] = rng.integers(-2, 3, rows)
            continue
        if isinstance(sub, gym.spaces.MultiBinary):
            value[key] = rng.integers(0, 2, (rows, *sub.shape)).astype(np.int8)
            continue
        if isinstance(sub, gym.spaces.MultiDiscrete):
            value[key] = (sub.start + rng.integers(0, sub.nvec, (rows, *sub.shape))).astype(np.int32)
            continue
        raw = rng.integers(0, 256, (rows, *sub.shape, sub.dtype.itemsize), dtype=np.uint8)
        array = raw.view(sub.dtype).reshape(rows, *sub.shape)
        if sub.dtype.kind == "f":
            array[np.isnan(array)] = 0
        value[key] = array.astype(bool) if sub.dtype == bool else array
    frames = spec.pack(value, name="obs", path="p", lead=(rows,))
    sizes = [np.dtype(OTHERS.get(kind, kind)).itemsize for kind, _ in entries]
    widest = max(sizes)
    assert frames.nbytes // rows % widest == 0 and frames.nbytes // rows < sum(
        size * int(np.prod(v.shape[1:])) for size, v in zip(sizes, value.values())) + widest * len(entries)
    back = spec.unpack(frames)
    for key, array in value.items():
        assert back[key].dtype == array.dtype and back[key].tobytes() == array.tobytes()
        assert back[key].ctypes.data % array.dtype.itemsize == 0  # aligned: tensors take it as it is
    assert DictSpec(spec.spaces) == spec and spec.to_space() == space
    assert all(space[k].contains(back[k][0]) for k in space.spaces if not isinstance(space[k], gym.spaces.Box))


def test_one_dtype_is_stored_as_that_dtype() -> None:
    space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (3,), np.float64), "b": gym.spaces.Box(-2, 2, (2, 2), np.float64)})
    spec = dict_from_space(space)
    assert (spec.stored.shape, spec.stored.dtype) == ((7,), "float64")
    assert spec.stored.to_space().low.tolist() == [-1] * 3 + [-2] * 4
    assert DictSpec(spec.spaces).to_space() == space


def _run(path: Path | str, *, frame_stack: int, steps: int, capacity: int) -> tuple[ReplayStore, dict[int, tuple]]:
    """Reach and ``FrameStackObservation(Reach)`` in step; the store's expected transition per ring slot."""
    env, stacked = Reach(limit=12), gym.wrappers.FrameStackObservation(Reach(limit=12), frame_stack)
    store = ReplayStore.create(path, capacity, env.observation_space, env.action_space, frame_stack, layout=LAYOUT)
    rng = np.random.default_rng(1)
    expected: dict[int, tuple] = {}
    obs, _ = env.reset(seed=4)
    sobs, _ = stacked.reset(seed=4)
    for _ in range(steps):
        action = rng.uniform(-1, 1, 2).astype(np.float32)
        nxt, reward, term, trunc, _ = env.step(action)
        snxt, *_ = stacked.step(action)
        before = store.added
        store.add(obs, action, reward, nxt, term, trunc)
        for p in range(before, store.added):
            expected.pop(p % capacity, None)
        expected[(store.added - 2) % capacity] = (sobs, action, snxt, term)
        if term or trunc:
            (obs, _), (sobs, _) = env.reset(), stacked.reset()
        else:
            obs, sobs = nxt, snxt
    return store, expected


@pytest.mark.parametrize("frame_stack", [1, 3], ids=["whole", "stacked"])
def test_samples_are_what_frame_stack_observation_showed(tmp_path: Path, frame_stack: int) -> None:
    store, expected = _run(tmp_path / "r.zarr", frame_stack=frame_stack, steps=300, capacity=128)
    assert store.added > 2 * 128  # the ring wrapped
    store.flush()
    for reader in (store, ReplayStore.open(tmp_path / "r.zarr")):
        assert reader.observation_space == Reach().observation_space
        batch = reader.sample(64, rng=np.random.default_rng(0))
        assert set(batch.obs) == set(goal_space().spaces)
        for i, slot in enumerate(batch.index.tolist()):
            sobs, action, snxt, term = expected[slot]
            for key in sobs:
                want = sobs[key] if frame_stack > 1 else sobs[key][None]  # (k, *shape)
                nwant = snxt[key] if frame_stack > 1 else snxt[key][None]
                np.testing.assert_array_equal(batch.obs[key][i], want.reshape(batch.obs[key][i].shape), err_msg=key)
                np.testing.assert_array_equal(batch.next_obs[key][i], nwant.reshape(batch.obs[key][i].shape))
            np.testing.assert_array_equal(batch.action[i], action)
            assert bool(batch.terminated[i]) == term


def test_a_dict_store_on_object_storage(s3_url: str) -> None:
    store, expected = _run(s3_url, frame_stack=2, steps=100, capacity=128)
    store.close()
    reader = ReplayStore.open(s3_url)
    assert reader.observation_space == goal_space()
    batch = reader.sample(32, rng=np.random.default_rng(0))
    for i, slot in enumerate(batch.index.tolist()):
        np.testing.assert_array_equal(batch.next_obs["seen"][i], expected[slot][2]["seen"])


def test_every_reader_gives_dicts(tmp_path: Path) -> None:
    store, _ = _run(tmp_path / "r.zarr", frame_stack=2, steps=200, capacity=128)
    batch = store.sample(16, rng=np.random.default_rng(2), n_step=3)
    for i in range(16):  # a one-step batch's neighbour checks the env's dynamics on the stack's newest frames
        assert batch.obs["steps"][i, -1, 0] < batch.next_obs["steps"][i, -1, 0] or batch.discount[i] == 0
    one = store.sample(32, rng=np.random.default_rng(3))
    newest = {k: v[:, -1] for k, v in one.obs.items()}
    after = {k: v[:, -1] for k, v in one.next_obs.items()}
    assert all(follows(newest, one.action, after, i) for i in range(32))
    seq = store.sample_sequences(4, 5, rng=np.random.default_rng(0))
    assert seq.obs["seen"].shape == (4, 6, 2, 3, 3) and seq.obs["steps"].dtype == np.int64
    assert np.all(np.diff(seq.obs["steps"][:, :, -1, 0], axis=1) == 1)
    episode = store.episode(-2)
    assert episode.obs["observation"].shape == (len(episode) + 1, 2)
    assert episode.obs["steps"][:, 0].tolist() == list(range(episode.obs["steps"][0, 0], episode.obs["steps"][0, 0] + len(episode) + 1))
    episodes = list(store.iter_episodes(whole=True))
    assert episodes and all(e.obs["seen"].shape == (len(e) + 1, 3, 3) for e in episodes)
    firsts = []
    for processes in (False, True):
        with store.blocks(8, batches_per_block=3, seed=5, processes=processes) as blocks:
            block = next(blocks)
            assert block["obs"]["desired_goal"].shape == (3, 8, 2, 2) and "'seen': uint8[3, 8, 2, 3, 3]" in repr(block)
            firsts.append({k: v.copy() for k, v in block["obs"].items()})
    for key in firsts[0]:  # the decode processes give what the threads gave
        np.testing.assert_array_equal(firsts[1][key], firsts[0][key])


def test_as_dataset_and_jax_blocks_give_nested_dicts(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    store, _ = _run(tmp_path / "r.zarr", frame_stack=2, steps=150, capacity=128)
    ds = store.as_dataset(8, seed=0, batches_per_call=2)
    spec = ds.element_spec
    assert (spec["obs"]["seen"].shape, spec["obs"]["seen"].dtype) == ((8, 2, 3, 3), tf.uint8)
    assert spec["next_obs"]["steps"].dtype == tf.int64
    for batch in ds.take(3):  # the fast iterator
        obs = {k: v.numpy()[:, -1] for k, v in batch["obs"].items()}
        nxt = {k: v.numpy()[:, -1] for k, v in batch["next_obs"].items()}
        assert all(follows(obs, batch["action"].numpy(), nxt, i) for i in range(8))

    @tf.function
    def first_goal(d):  # inside a graph: the stock iterator
        return next(iter(d))["obs"]["desired_goal"]
    assert first_goal(ds).shape == (8, 2, 2)
    ds.prefetcher.close()
    pytest.importorskip("jax")
    with store.jax_blocks(8, batches_per_block=2, seed=0) as blocks:
        block = next(blocks)
        assert block["next_obs"]["observation"].shape == (2, 8, 2, 2) and block["index"].shape == (2, 8)


def test_vector_env_rows_are_dicts(tmp_path: Path) -> None:
    envs = gym.vector.SyncVectorEnv([lambda: Reach(limit=7) for _ in range(3)])
    store = ReplayStore.create(tmp_path / "r.zarr", 96, envs.single_observation_space, envs.single_action_space,
                               num_streams=3, layout=Layout(shard_len=16, obs_chunk_len=4))
    obs, _ = envs.reset(seed=0)
    for _ in range(40):
        actions = envs.action_space.sample()
        nxt, reward, term, trunc, info = envs.step(actions)
        store.add_batch(obs, actions, reward, nxt, term, trunc)
        obs = nxt
    batch = store.sample(64, rng=np.random.default_rng(0))
    newest = {k: v[:, -1] for k, v in batch.obs.items()}
    after = {k: v[:, -1] for k, v in batch.next_obs.items()}
    assert all(follows(newest, batch.action, after, i) for i in range(64))  # no reset row was stored as a move


@pytest.mark.parametrize(("change", "message"), [
    (lambda o: {k: v for k, v in o.items() if k != "steps"}, r"missing \['steps'\]"),
    (lambda o: {**o, "extra": np.zeros(2)}, r"unknown \['extra'\]"),
    (lambda o: {**o, "observation": np.zeros(3, np.float32)}, r"obs\['observation'\] has shape \((1, )?3,?\)"),
    (lambda o: {**o, "steps": np.array([1.5])}, r"obs\['steps'\] has dtype float64, but .* stores int64"),
    (lambda o: {**o, "desired_goal": np.array([np.nan, 0], np.float32)}, r"obs\['desired_goal'\] holds NaN"),
    (lambda o: o["observation"], "is a ndarray, but .* stores Dict observations"),
], ids=["missing", "extra", "shape", "dtype", "nan", "not-a-dict"])
def test_a_bad_dict_is_refused_and_nothing_changes(tmp_path: Path, change, message: str) -> None:
    env = Reach()
    store = ReplayStore.create(tmp_path / "r.zarr", 64, env.observation_space, env.action_space, layout=LAYOUT)
    obs, _ = env.reset(seed=0)
    nxt, *_ = env.step(env.action_space.sample())
    store.add(obs, np.zeros(2, np.float32), 0.0, nxt, False, False)
    store.flush()
    before, added = snapshot(tmp_path / "r.zarr"), store.added
    with pytest.raises(InvalidTransitionError, match=message):
        store.add(nxt, np.zeros(2, np.float32), 0.0, change(nxt), False, False)
    with pytest.raises(InvalidTransitionError, match=message):
        store.add_batch({k: v[None] for k, v in nxt.items()} if isinstance(change(nxt), dict) else change(nxt)[None],
                        np.zeros((1, 2), np.float32), [0.0], _rows(change(nxt)), [False], [False])
    assert store.added == added and snapshot(tmp_path / "r.zarr") == before
    store.add(nxt, np.zeros(2, np.float32), 0.0, nxt, False, True)  # the store goes on as it was


def _rows(value):
    return {k: np.asarray(v)[None] for k, v in value.items()} if isinstance(value, dict) else np.asarray(value)[None]


@pytest.mark.parametrize(("space", "message"), [
    (gym.spaces.Dict({"a": gym.spaces.Dict({"b": gym.spaces.Text(3)})}), r"observation_space\['a/b'\] is Text"),
    (gym.spaces.Dict({"a": gym.spaces.Sequence(gym.spaces.Discrete(2))}), r"observation_space\['a'\] is Sequence"),
    (gym.spaces.Dict({}), "has 0 entries"),
    (gym.spaces.Dict([(1, gym.spaces.Box(0, 1, (2,)))]), "the key 1"),
], ids=["text", "sequence", "empty", "int-key"])
def test_a_space_a_store_cannot_hold_is_refused(tmp_path: Path, space: gym.Space, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ReplayStore.create(tmp_path / "r.zarr", 64, space, gym.spaces.Discrete(2))
    assert not (tmp_path / "r.zarr").exists()


def test_the_attributes_name_the_dict_and_damage_is_named(tmp_path: Path) -> None:
    env = Reach()
    ReplayStore.create(tmp_path / "r.zarr", 64, env.observation_space, env.action_space, layout=LAYOUT).close()
    doc_path = tmp_path / "r.zarr" / "zarr.json"
    doc = json.loads(doc_path.read_text())
    space = doc["attributes"]["replaystore"]["schema"]["observation_space"]
    assert space["type"] == "Dict" and [k for k, _ in space["spaces"]] == list(env.observation_space.spaces)
    assert json.loads((tmp_path / "r.zarr" / "obs" / "zarr.json").read_text())["data_type"] == "uint8"
    for damage, message in [(lambda s: s["spaces"].append(s["spaces"][0]), "names a key twice"),
                            (lambda s: s["spaces"].__setitem__(0, ["a"]), r"spaces\[0\] is \['a'\]"),
                            (lambda s: s.__setitem__("spaces", []), "holds 0 entries")]:
        bad = json.loads(json.dumps(doc))
        damage(bad["attributes"]["replaystore"]["schema"]["observation_space"])
        doc_path.write_text(json.dumps(bad))
        with pytest.raises(CorruptStoreError, match=message):
            ReplayStore.open(tmp_path / "r.zarr")


def test_the_command_line_reads_and_compacts_a_dict_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from replaystore.cli import main

    store, expected = _run(tmp_path / "r.zarr", frame_stack=2, steps=200, capacity=128)
    store.close()
    path = str(tmp_path / "r.zarr")
    assert main(["inspect", path]) == 0
    text = capsys.readouterr().out
    assert "observations      Dict(achieved_goal: float32(2,), desired_goal: float32(2,), observation: float32(2,), " \
           "seen: uint8(3, 3), steps: int64(1,)), each step kept as one frame of 48 uint8, frame_stack 2" in text
    assert main(["inspect", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    obs = info["schema"]["observation_space"]
    assert obs["type"] == "Dict" and obs["spaces"]["seen"]["shape"] == [3, 3] and obs["stored_as"]["dtype"] == "uint8"
    assert main(["verify", path, "--quiet"]) == 0
    pytest.importorskip("matplotlib")
    assert main(["inspect", path, "--plot", str(tmp_path / "p.png")]) == 0 and (tmp_path / "p.png").stat().st_size
    assert main(["episodes", path, "--save", "-2", str(tmp_path / "e.npz")]) == 0
    saved = np.load(tmp_path / "e.npz")
    episode = ReplayStore.open(path).episode(-2)
    for key, values in episode.obs.items():
        np.testing.assert_array_equal(saved[f"obs.{key}"], values)
    capsys.readouterr()
    # a .gif shows an image entry: the one there is ("seen", (3, 3) uint8), or the one --key names
    assert main(["episodes", path, "--save", "-2", str(tmp_path / "e.gif"), "--key", "observation"]) == 1
    assert "--key 'observation' is not an image entry: pass --key with one of ['seen']" in capsys.readouterr().err
    assert not (tmp_path / "e.gif").exists()
    from PIL import Image, ImageSequence

    for args in ([], ["--key", "seen"]):
        assert main(["episodes", path, "--save", "-2", str(tmp_path / "e.gif"), *args]) == 0
        with Image.open(tmp_path / "e.gif") as gif:
            frames = [np.asarray(f.convert("L")) for f in ImageSequence.Iterator(gif)]
        # (Pillow merges equal consecutive frames into one shown longer)
        assert frames[0].shape == (3, 3) and 1 <= len(frames) <= len(episode.obs["seen"])
        assert np.array_equal(frames[0], episode.obs["seen"][0])  # uint8 frames as they are
    assert main(["compact", path, str(tmp_path / "c.zarr"), "--streams", "2"]) == 0
    with ReplayStore.open(tmp_path / "c.zarr") as compacted:
        assert compacted.observation_space == goal_space() and compacted.num_streams == 2
        batch = compacted.sample(32, rng=np.random.default_rng(0))
        newest = {k: v[:, -1] for k, v in batch.obs.items()}
        after = {k: v[:, -1] for k, v in batch.next_obs.items()}
        assert all(follows(newest, batch.action, after, i) for i in range(32))


def test_frames_packed_once_are_taken_as_they_are() -> None:
    """``Packed`` (the SB3 buffer packs a dict to check its stacks): the same spec's frames of the right
    shape pass through ``pack`` untouched; anything else is checked as a dict would be, and refused."""
    from replaystore.format.dictobs import Packed

    spec = dict_from_space(goal_space())
    env = Reach()
    obs, _ = env.reset(seed=0)
    frames = spec.pack({k: v[None] for k, v in obs.items()}, name="obs", path="p", lead=(1,))
    assert spec.pack(Packed(spec, frames), name="obs", path="p", lead=(1,)) is frames
    with pytest.raises(InvalidTransitionError, match="obs is a Packed, but p stores Dict observations"):
        spec.pack(Packed(spec, frames), name="obs", path="p", lead=(2,))
    other = dict_from_space(gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (48,), np.uint8)}))
    with pytest.raises(InvalidTransitionError, match="obs is a Packed"):
        spec.pack(Packed(other, frames), name="obs", path="p", lead=(1,))


def test_a_float_entry_of_minus_zero_continues_its_episode(tmp_path: Path) -> None:
    """A mixed-dtype Dict is stored as bytes; an observation whose float entry is -0.0 where the
    previous next_obs had 0.0 is the same observation and continues the episode (it was refused as
    "does not continue the episode" when the frames were compared byte for byte)."""
    store = ReplayStore.create(tmp_path / "z.zarr", 100, goal_space(), Reach().action_space, 1)
    env = Reach()
    obs, _ = env.reset(seed=0)
    nxt, reward, _, _, _ = env.step(np.zeros(2, np.float32))
    nxt["achieved_goal"][0] = 0.0
    store.add(obs, np.zeros(2, np.float32), reward, nxt, False, False)
    again = {**nxt, "achieved_goal": nxt["achieved_goal"].copy()}
    again["achieved_goal"][0] = -0.0
    assert again["achieved_goal"].tobytes() != nxt["achieved_goal"].tobytes()
    store.add(again, np.zeros(2, np.float32), reward, nxt, False, False)
    assert len(store) == 2
    with pytest.raises(InvalidTransitionError, match="does not continue the episode"):
        store.add(obs, np.zeros(2, np.float32), reward, nxt, False, False)  # (another observation: refused)
