"""``ReplayStoreStorage`` (integrations/torchrl): TorchRL's collectors, replay buffers, samplers,
loss and checkpoints on a real store, against ``LazyMemmapStorage`` given the same transitions.
And ``store.torch_blocks``, the torch feed for everyone else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")

from tensordict import TensorDict  # noqa: E402
from torchrl.collectors import Collector  # noqa: E402
from torchrl.data import HERReplayBuffer, LazyMemmapStorage, TensorDictReplayBuffer  # noqa: E402
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, SliceSampler  # noqa: E402
from torchrl.envs import (  # noqa: E402
    CatFrames,
    Compose,
    GymEnv,
    GymWrapper,
    SerialEnv,
    StepCounter,
    TransformedEnv,
    UnsqueezeTransform,
)

from replaystore import ReplayStore  # noqa: E402
from replaystore.errors import ConfigError, InvalidTransitionError  # noqa: E402
from replaystore.integrations.torchrl import ReplayStoreStorage  # noqa: E402


def cartpole_batches(envs: int = 3, frames: int = 600, per_batch: int = 60, seed: int = 0) -> list[Any]:
    torch.manual_seed(seed)
    env = SerialEnv(envs, lambda: GymEnv("CartPole-v1"))
    env.set_seed(seed)
    collector = Collector(env, None, frames_per_batch=per_batch, total_frames=frames)
    batches = [data.reshape(-1).clone() for data in collector]
    collector.shutdown()
    return batches


def pong_batches(envs: int = 2, frames: int = 384, per_batch: int = 128) -> list[Any]:
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)

    def make() -> Any:
        env = gym.wrappers.AtariPreprocessing(gym.make("ALE/Pong-v5", frameskip=1), frame_skip=4)
        return TransformedEnv(GymWrapper(env), Compose(UnsqueezeTransform(-3, in_keys=["observation"]),
                                                       CatFrames(N=4, dim=-3, in_keys=["observation"]), StepCounter()))

    torch.manual_seed(0)
    env = SerialEnv(envs, make)
    env.set_seed(1)
    collector = Collector(env, None, frames_per_batch=per_batch, total_frames=frames)
    batches = [data.reshape(-1).clone() for data in collector]
    collector.shutdown()
    return batches


def assert_same(a: Any, b: Any) -> None:
    """Every leaf of ``a`` in ``b`` with the same dtype, shape and bits, and no other leaf."""
    keys_a = sorted(a.keys(True, True), key=str)
    assert keys_a == sorted(b.keys(True, True), key=str)
    for key in keys_a:
        x, y = a[key], b[key]
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), key


def seed(n: int) -> None:
    """TorchRL's samplers draw from torch's generator, its PrioritizedSampler from numpy's."""
    torch.manual_seed(n)
    np.random.seed(n)


@pytest.fixture(scope="module")
def cartpole() -> list[Any]:
    return cartpole_batches()


def both(tmp_path: Path, max_size: int, *, sampler: Any = None, **rb: Any) -> tuple[Any, Any]:
    """A replay buffer on LazyMemmapStorage and one on ReplayStoreStorage, each with its own
    ``sampler()`` when given."""
    def made() -> dict[str, Any]:
        return {**rb, **({"sampler": sampler()} if sampler is not None else {})}

    memmap = TensorDictReplayBuffer(storage=LazyMemmapStorage(max_size, scratch_dir=tmp_path / "memmap"), **made())
    ours = TensorDictReplayBuffer(storage=ReplayStoreStorage(tmp_path / "rb.zarr", max_size=max_size), **made())
    return memmap, ours


def fill(batches: list[Any], *buffers: Any) -> None:
    """Each batch into each buffer (a copy each: TensorDictReplayBuffer writes ``index`` into it)."""
    for data in batches:
        for rb in buffers:
            rb.extend(data.clone())


def sampled_alike(a: Any, b: Any, n: int) -> tuple[Any, Any]:
    """A batch from each buffer with the same seeds, asserted the same."""
    seed(n)
    x = a.sample()
    seed(n)
    y = b.sample()
    assert_same(x, y)
    return x, y


def test_a_collectors_transitions_come_back_as_lazy_memmap_gives_them(tmp_path: Path, cartpole: list[Any]) -> None:
    memmap, ours = both(tmp_path, 250, batch_size=16)
    for data in cartpole:  # 600 transitions of 3 envs into 250 places: the buffer wraps
        assert torch.equal(memmap.extend(data.clone()), ours.extend(data.clone()))
    assert len(memmap) == len(ours) == 250
    assert_same(memmap[:], ours[:])
    for _ in range(3):  # the same draws from both (TorchRL's RandomSampler)
        sampled_alike(memmap, ours, 7)
    store = ours.storage.store
    assert store.schema.num_streams == 3  # one stream per env, counted in the first batch
    assert {e.name for e in store.schema.extras} >= {"td.next.reward", "td.collector.traj_ids", "rb.index"}


@pytest.fixture(scope="module")
def pong() -> list[Any]:
    return pong_batches()


def test_catframes_stacks_are_stored_a_frame_a_step_and_rebuilt_exactly(tmp_path: Path, pong: list[Any]) -> None:
    memmap, ours = both(tmp_path, 300, batch_size=8)
    fill(pong, memmap, ours)
    assert_same(memmap[:], ours[:])
    store = ours.storage.store
    assert store.frame_stack == 4 and store.schema.observation.shape == (1, 84, 84)
    assert store.schema.num_streams == 2
    memmap_bytes = sum(p.stat().st_size for p in (tmp_path / "memmap").rglob("*") if p.is_file())
    store_bytes = sum(p.stat().st_size for p in (tmp_path / "rb.zarr").rglob("*") if p.is_file())
    assert store_bytes * 5 < memmap_bytes


def test_prioritized_sampling_and_rb_dumps_loads(tmp_path: Path, cartpole: list[Any]) -> None:
    """TorchRL's PrioritizedSampler keeps the priorities (in its own sum tree; rb.dumps saves them);
    the storage's part of the checkpoint is the store itself."""
    def prioritized() -> Any:
        return PrioritizedSampler(250, alpha=0.7, beta=0.5)

    memmap, ours = both(tmp_path, 250, sampler=prioritized, batch_size=16)
    fill(cartpole, memmap, ours)
    for step in range(3):
        a, b = sampled_alike(memmap, ours, step)
        priority = a["next", "observation"].abs().sum(-1) + 0.1
        memmap.update_priority(a["index"], priority)
        ours.update_priority(b["index"], priority)
    ours.dumps(tmp_path / "checkpoint")
    assert (tmp_path / "checkpoint" / "storage" / "replaystore.json").stat().st_size < 1000
    ours.storage.close()
    again = TensorDictReplayBuffer(storage=ReplayStoreStorage(tmp_path / "rb.zarr", max_size=250),
                                   sampler=prioritized(), batch_size=16)
    again.loads(tmp_path / "checkpoint")
    sampled_alike(memmap, again, 11)
    assert_same(memmap[:], again[:])


@pytest.mark.parametrize("where", [{"traj_key": ("collector", "traj_ids")}, {"end_key": ("next", "done")}])
def test_slice_sampler_windows_equal_lazy_memmaps(tmp_path: Path, cartpole: list[Any], where: dict[str, Any]) -> None:
    """SliceSampler finds the trajectories from the collector's ids or the done flags (from
    ``storage[:]``, whose leaves are read when used: lazy.py)."""
    memmap, ours = both(tmp_path, 250, sampler=lambda: SliceSampler(slice_len=8, **where), batch_size=32)
    fill(cartpole, memmap, ours)
    for step in range(3):
        sampled_alike(memmap, ours, step)


def test_a_read_by_a_slice_reads_only_the_rows_a_leaf_is_indexed_by(tmp_path: Path, cartpole: list[Any]) -> None:
    """``storage[a:b]`` gives Columns: indexing one along its first axis reads those rows; anything
    else reads the whole column once; every result equals the eager read's."""
    memmap, ours = both(tmp_path, 250)
    fill(cartpole, memmap, ours)
    lazy, eager = ours.storage[:], memmap.storage[:]
    mask = torch.arange(250) % 3 == 0
    for key in eager.keys(True, True):
        column, values = lazy[key], eager[key]
        assert type(column).__name__ == "Column" and column.shape == values.shape and column.dtype == values.dtype
        for item in (slice(3, 9), 7, -1, torch.tensor([5, 1, 5]), torch.tensor([[0, 2], [4, 6]]), [8, 9], mask,
                     (slice(None, 4), ...)):
            assert torch.equal(column[item], values[item]), (key, item)
        assert column.whole is None  # (rows only, so far)
        assert torch.equal(column.squeeze(), values.squeeze()) and column.whole is not None
    lazy = ours.storage[10:20]
    assert lazy["observation"].shape[0] == 10 and torch.equal(lazy["observation"].clone(), eager["observation"][10:20])
    assert torch.equal(torch.stack([lazy["action"], lazy["action"]]), torch.stack([eager["action"][10:20]] * 2))
    assert np.array_equal(ours.storage[:]["observation"].numpy(), eager["observation"].numpy())
    assert_same(ours.storage[:][torch.tensor([4, 2])], eager[torch.tensor([4, 2])])


def test_slice_sampler_reads_the_frames_of_its_windows_only(tmp_path: Path, pong: list[Any]) -> None:
    """SliceSampler reads ``storage[:]`` for every batch to find the trajectories: the frames stay in
    the store, and only the rows of the windows it draws are read through it."""
    memmap, ours = both(tmp_path, 300, sampler=lambda: SliceSampler(slice_len=4, end_key=("next", "done")),
                        batch_size=16)
    fill(pong, memmap, ours)
    records, rows = ours.storage.records, []
    read = records.read

    def counted(index: Any) -> Any:
        rows.append(int(np.size(index)))
        return read(index)

    records.read = counted
    for step in range(3):
        sampled_alike(memmap, ours, step)
    assert rows == [16, 16, 16]  # (one read of each batch's 4 windows of 4; none of the whole storage)


def goal_episodes(lengths: list[int]) -> Any:
    """Goal-conditioned transitions of one env (HER's keys), one episode after another."""
    g = torch.Generator().manual_seed(0)
    parts = []
    for t in lengths:
        obs = torch.randn(t + 1, 4, generator=g)
        goal, achieved = torch.randn(3, generator=g).expand(t + 1, 3), obs[:, :3] * 2
        done = torch.zeros(t, 1, dtype=torch.bool)
        done[-1] = True
        parts.append(TensorDict({"observation": obs[:-1], "desired_goal": goal[:-1].clone(), "achieved_goal": achieved[:-1],
                                 "action": torch.randn(t, 2, generator=g),
                                 "next": {"observation": obs[1:], "desired_goal": goal[1:].clone(),
                                          "achieved_goal": achieved[1:], "reward": torch.zeros(t, 1), "done": done,
                                          "terminated": done.clone()}}, [t]))
    return torch.cat(parts)


def test_her_replay_buffer_relabels_as_over_lazy_memmap(tmp_path: Path) -> None:
    """TorchRL's HERReplayBuffer finds the episodes from ``storage[:]`` and relabels goals from
    ``get``: the same batches as over LazyMemmapStorage, relabelled ones among them."""
    def reward_fn(td: Any) -> Any:
        return ((td["achieved_goal"] - td["desired_goal"]).norm(dim=-1, keepdim=True) < 0.5).float()

    memmap = HERReplayBuffer(reward_fn=reward_fn, storage=LazyMemmapStorage(100, scratch_dir=tmp_path / "mm"),
                             batch_size=16)
    ours = HERReplayBuffer(reward_fn=reward_fn, storage=ReplayStoreStorage(tmp_path / "rb.zarr", max_size=100),
                           batch_size=16)
    data = goal_episodes([7, 12, 5, 9])
    fill([data], memmap, ours)
    for step in range(4):
        _, batch = sampled_alike(memmap, ours, step)
    assert (batch["desired_goal"] != data["desired_goal"][batch["index"]]).any()  # (some were relabelled)


def test_reopening_the_store_resumes_and_loads_goes_back_to_dumps(tmp_path: Path, cartpole: list[Any]) -> None:
    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage(tmp_path / "rb.zarr", max_size=250), batch_size=8)
    for data in cartpole[:5]:
        rb.extend(data.clone())
    at_dumps, cursor = rb[:].clone(), rb.writer._cursor
    rb.dumps(tmp_path / "checkpoint")
    rb.extend(cartpole[5].clone())  # (written after the checkpoint, before a crash)
    later = rb[:].clone()
    rb.storage.close()

    reopened = ReplayStoreStorage(tmp_path / "rb.zarr", max_size=250)  # the store alone: all it holds
    assert len(reopened) == 250
    assert_same(later, reopened[:])
    reopened.close()

    again = TensorDictReplayBuffer(storage=ReplayStoreStorage(tmp_path / "rb.zarr", max_size=250), batch_size=8)
    again.loads(tmp_path / "checkpoint")  # TorchRL's indices and writer as they were at dumps
    assert len(again) == 250 and again.writer._cursor == cursor
    assert_same(at_dumps, again[:])
    for data in cartpole[6:]:  # writing goes on from the checkpoint's cursor
        again.extend(data.clone())
    moved_on = again[:].clone()
    with pytest.raises(ConfigError, match="moved on since this checkpoint"):
        again.loads(tmp_path / "checkpoint")  # 240 more transitions: the store overwrote some it indexed
    assert_same(moved_on, again[:])


def test_torchrl_dqn_loss_takes_the_sampled_batches(tmp_path: Path, cartpole: list[Any]) -> None:
    from torchrl.modules import MLP, QValueActor
    from torchrl.objectives import DQNLoss

    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage(tmp_path / "rb.zarr", max_size=500), batch_size=32)
    for data in cartpole:
        rb.extend(data)
    actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[32]), in_keys=["observation"],
                        spec=GymEnv("CartPole-v1").action_spec)
    loss = DQNLoss(actor, action_space="one-hot", delay_value=True)
    out = loss(rb.sample())
    assert torch.isfinite(out["loss"]) and out["loss"].requires_grad


def test_bad_input_is_refused_in_one_line_and_leaves_the_store_as_it_was(tmp_path: Path, cartpole: list[Any]) -> None:
    """(Through ``storage.set``: TorchRL's writer moves its cursor before it calls the storage,
    whichever storage refuses.)"""
    path = tmp_path / "rb.zarr"
    storage = ReplayStoreStorage(path, max_size=100)
    with pytest.raises(ConfigError, match="observation_key"):
        storage.set(torch.arange(60), cartpole[0].exclude("observation"))
    with pytest.raises(ConfigError, match="cannot be kept"):
        storage.set(torch.arange(60), cartpole[0].clone().set("a key", torch.zeros(60)))
    assert not path.exists()
    rb = TensorDictReplayBuffer(storage=storage, batch_size=4)
    rb.extend(cartpole[0].clone())
    before, added = rb[:].clone(), storage.store.added
    with pytest.raises(ConfigError, match="keys differ"):
        storage.set(torch.arange(60, 100), cartpole[1][:40].exclude(("collector", "traj_ids")))
    with pytest.raises(ConfigError, match="one batch dimension"):
        storage.set(torch.arange(2), cartpole[1][:6].reshape(2, 3))
    with pytest.raises(ConfigError, match="not a ReplayStoreStorage checkpoint"):
        storage.loads(tmp_path)
    from torchrl.data.replay_buffers.checkpointers import FlatStorageCheckpointer

    with pytest.raises(ConfigError, match="its own checkpointer"):
        storage.checkpointer = FlatStorageCheckpointer()
    assert_same(before, rb[:])
    assert storage.store.added == added
    with pytest.raises(ConfigError, match="max_size"):
        ReplayStoreStorage(path, max_size=0)


def test_a_stack_that_neither_continues_nor_starts_an_episode_is_refused(tmp_path: Path) -> None:
    k, frame = 4, 3
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (12, 1, frame), dtype=np.uint8)
    # one episode's reset-padded stacks (FrameStackObservation's, CatFrames' padding="same")
    stacks = np.stack([np.concatenate([frames[max(0, i - j)] for j in range(k - 1, -1, -1)]) for i in range(11)])

    def batch(rows: slice) -> Any:
        n = len(range(*rows.indices(10)))
        return TensorDict({"observation": torch.from_numpy(stacks[rows]),
                           "action": torch.zeros(n, dtype=torch.int64),
                           "next": {"observation": torch.from_numpy(stacks[1:][rows]),
                                    "reward": torch.ones(n, 1), "done": torch.zeros(n, 1, dtype=torch.bool)}},
                          batch_size=[n])
    storage = ReplayStoreStorage(tmp_path / "rb.zarr", max_size=50, streams=1)
    rb = TensorDictReplayBuffer(storage=storage, batch_size=4)
    rb.extend(batch(slice(0, 4)))
    assert storage.store.frame_stack == 4
    with pytest.raises(InvalidTransitionError, match="streams="):
        storage.set(torch.arange(4, 7), batch(slice(6, 9)))  # a jump into the episode: not rebuilt from frames
    assert len(storage) == 4 and len(storage.store) == 4
    rb.extend(batch(slice(4, 10)))  # the episode going on is fine
    assert torch.equal(rb[:]["observation"], torch.from_numpy(stacks[:10]))


# -------------------------------------------------------------------------------------------------
# store.torch_blocks

def small_store(tmp_path: Path) -> ReplayStore:
    import gymnasium as gym

    store = ReplayStore.create(tmp_path / "s.zarr", 1000, gym.spaces.Box(0, 255, (4,), np.uint8), gym.spaces.Discrete(3), 2)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 255, 4, dtype=np.uint8)
    for i in range(300):
        nxt = rng.integers(0, 255, 4, dtype=np.uint8)
        store.add(obs, i % 3, float(i), nxt, i % 50 == 49, False)
        obs = rng.integers(0, 255, 4, dtype=np.uint8) if i % 50 == 49 else nxt
    return store


def test_torch_blocks_equal_the_numpy_blocks(tmp_path: Path) -> None:
    store = small_store(tmp_path)
    with store.blocks(8, batches_per_block=4, seed=3, threads=1) as numpy_blocks, \
            store.torch_blocks(8, batches_per_block=4, seed=3, threads=1) as torch_blocks:
        for _ in range(3):
            with next(numpy_blocks) as a:
                b = next(torch_blocks)
                assert set(a) == set(b)
                for name in a:
                    value = b[name]
                    if name == "index":
                        assert isinstance(value, np.ndarray) and np.array_equal(value, a[name])
                    else:
                        assert isinstance(value, torch.Tensor) and np.array_equal(value.numpy(), a[name]), name
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA"):
            store.torch_blocks(8, pin_memory=True)


def test_torch_blocks_import_no_tensorflow(tmp_path: Path) -> None:
    small_store(tmp_path).close()
    code = ("import sys; from replaystore import ReplayStore\n"
            f"with ReplayStore.open({str(tmp_path / 's.zarr')!r}).torch_blocks(8, seed=0) as it: next(it)\n"
            "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
