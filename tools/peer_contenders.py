"""The contenders of tools/bench_peers.py, and the transitions they are filled with.

``frames_source`` writes the five Breakout recordings into one raw frames file; ``Transitions``
walks it in chunks and builds the zero-padded 4-stacks an env wrapper would hand a buffer; each
``Contender`` fills, reopens and samples one library's buffer the way its users do (bench_peers.py's
docstring says how each is filled).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from atari_frames import OUT, record

RECORDING = 100_000
FRAME = 84 * 84
STACK = 4
CHUNK = 4096
TORCHRL_BATCH = 16


# -------------------------------------------------------------------------------------------------
# The frames: five recordings, one raw file


def frames_source(transitions: int) -> tuple[Path, Path]:
    """The raw frames file and the rows file holding ``transitions`` (built once, then reused)."""
    n = -(-transitions // RECORDING)
    raw, rows = OUT / f"peers_breakout_{n}x{RECORDING}.u8", OUT / f"peers_breakout_{n}x{RECORDING}_rows.npz"
    if raw.exists() and rows.exists():
        return raw, rows
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("obs_index", "action", "reward", "terminated", "truncated")}
    base = 0
    with open(raw.with_suffix(".part"), "wb") as f:
        for seed in range(n):
            data = record(RECORDING, seed=seed)
            data["frames"].tofile(f)
            trunc = data["truncated"].copy()
            trunc[-1] |= not data["terminated"][-1]  # a recording's last step ends its episode
            for k, v in (("obs_index", data["obs_index"] + base), ("action", data["action"]), ("reward", data["reward"]),
                         ("terminated", data["terminated"]), ("truncated", trunc)):
                parts[k].append(v)
            base += len(data["frames"])
            del data
    np.savez(rows, **{k: np.concatenate(v) for k, v in parts.items()})
    raw.with_suffix(".part").rename(raw)
    return raw, rows


class Transitions:
    """Walks the recorded transitions in chunks, reading each chunk's frames into one reused buffer,
    and builds the zero-padded 4-stacks (channels first) an env wrapper would hand the buffer."""

    def __init__(self, raw: Path, rows: Path, transitions: int):
        with np.load(rows) as z:
            self.rows = {k: z[k][:transitions] for k in z.files}
        self.n = transitions
        self.file = open(raw, "rb", buffering=0)  # noqa: SIM115 (closed with the process)
        self.buf = np.empty((2 * CHUNK + 2, 84, 84), np.uint8)
        self.stack = np.zeros((STACK, 84, 84), np.uint8)
        self.next = np.zeros((STACK, 84, 84), np.uint8)

    def __iter__(self):
        """Yields (i, frame, next_frame); ``self.stack``/``self.next`` hold step i's stacks meanwhile."""
        r = self.rows
        idx, ended = r["obs_index"], r["terminated"] | r["truncated"]
        for c0 in range(0, self.n, CHUNK):
            c1 = min(c0 + CHUNK, self.n)
            lo, hi = int(idx[c0]), int(idx[c1 - 1]) + 2
            self.file.seek(lo * FRAME)
            self.file.readinto(memoryview(self.buf)[: hi - lo].cast("B"))
            for i in range(c0, c1):
                j = int(idx[i]) - lo
                if i == 0 or ended[i - 1]:
                    self.stack[:] = 0
                    self.stack[-1] = self.buf[j]
                else:
                    self.stack[:] = self.next
                self.next[:-1] = self.stack[1:]
                self.next[-1] = self.buf[j + 1]
                yield i, self.buf[j], self.buf[j + 1]


# -------------------------------------------------------------------------------------------------
# The contenders: fill, reopen, sample


class Contender(abc.ABC):
    """One buffer: ``create`` and ``add`` (returning the seconds spent inside the library), ``finish``
    (flush), ``reopen`` in another process (the buffers on disk), ``sample`` one batch of 32."""

    name = ""

    def __init__(self, where: Path, n: int):
        self.where, self.n = where, n

    def load(self) -> None:
        """Import the library (before the RSS baseline, so the buffer's RAM excludes the import's)."""

    @abc.abstractmethod
    def create(self) -> None: ...

    @abc.abstractmethod
    def add(self, t: Transitions, i: int, frame: np.ndarray, nxt: np.ndarray) -> float: ...

    def finish(self) -> None:
        """Flush what the buffer holds to where it keeps it."""

    def reopen(self) -> None:
        raise TypeError(f"{self.name} keeps its buffer in RAM: there is nothing on disk to reopen")

    @abc.abstractmethod
    def sample(self) -> object: ...

    #: whether ``sample_slices`` (windows of consecutive transitions) is measured
    slices = False

    def sample_slices(self) -> object:
        """One batch of ``SLICES`` windows of ``SLICE_LEN`` consecutive transitions (32 in all)."""
        raise TypeError(f"{self.name}: windows are not measured")


#: windows per batch, and their length: 32 transitions a batch
SLICES, SLICE_LEN = 4, 8


class TorchRL(Contender):
    name = "torchrl"

    def load(self):
        import tensordict  # noqa: F401
        import torchrl.data  # noqa: F401

    def create(self):
        import torch
        from tensordict import TensorDict

        self.reopen(fresh=True)
        b = TORCHRL_BATCH
        self.td = TensorDict({"pixels": torch.zeros(b, STACK, 84, 84, dtype=torch.uint8),
                              "action": torch.zeros(b, dtype=torch.int64),
                              "next": TensorDict({"pixels": torch.zeros(b, STACK, 84, 84, dtype=torch.uint8),
                                                  "reward": torch.zeros(b, 1), "done": torch.zeros(b, 1, dtype=torch.bool),
                                                  "terminated": torch.zeros(b, 1, dtype=torch.bool)}, [b])}, [b])
        self.np = {k: self.td.get(k).numpy() for k in ("pixels", "action", ("next", "pixels"), ("next", "reward"),
                                                        ("next", "done"), ("next", "terminated"))}
        self.k = 0

    def add(self, t, i, frame, nxt):
        v, r, k = self.np, t.rows, self.k
        v["pixels"][k] = t.stack
        v[("next", "pixels")][k] = t.next
        v["action"][k] = r["action"][i]
        v[("next", "reward")][k] = r["reward"][i]
        v[("next", "done")][k] = r["terminated"][i] or r["truncated"][i]
        v[("next", "terminated")][k] = r["terminated"][i]
        self.k += 1
        if self.k < TORCHRL_BATCH and i < self.n - 1:
            return 0.0
        start = time.perf_counter()
        self.rb.extend(self.td[: self.k])
        self.k = 0
        return time.perf_counter() - start

    def finish(self):
        self.storage.dumps(self.where)

    def reopen(self, fresh: bool = False):
        from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer

        self.storage = LazyMemmapStorage(self.n, scratch_dir=self.where, existsok=True)
        if not fresh:
            self.storage.loads(self.where)
        self.rb = TensorDictReplayBuffer(storage=self.storage, batch_size=32)

    def sample(self):
        return self.rb.sample()

    slices = True

    def sample_slices(self):
        """TorchRL's ``SliceSampler`` over the same storage, trajectories found from the done flags."""
        if getattr(self, "slice_rb", None) is None or self.slice_rb.storage is not self.storage:
            from torchrl.data import SliceSampler, TensorDictReplayBuffer

            self.slice_rb = TensorDictReplayBuffer(storage=self.storage, batch_size=SLICES * SLICE_LEN,
                                                   sampler=SliceSampler(num_slices=SLICES, end_key=("next", "done")))
        return self.slice_rb.sample()


class TorchRLCompressed(TorchRL):
    """TorchRL's in-RAM ``CompressedListStorage`` (each transition's TensorDict compressed), filled as
    ``torchrl`` is."""

    name = "torchrl-compressed"
    slices = False  # (SliceSampler reads storage[:]: every transition decompressed, each batch)

    def finish(self):
        pass

    def reopen(self, fresh: bool = False):
        if not fresh:
            raise TypeError("CompressedListStorage keeps its buffer in RAM: there is nothing on disk to reopen")
        from torchrl.data import CompressedListStorage, TensorDictReplayBuffer

        self.storage = CompressedListStorage(self.n)
        self.rb = TensorDictReplayBuffer(storage=self.storage, batch_size=32)


class TorchRLStore(TorchRL):
    """TorchRL's ``TensorDictReplayBuffer`` on ``ReplayStoreStorage`` (a replay store, each frame once),
    filled as ``torchrl`` is: TorchRL's own layer over the store's sampling."""

    name = "torchrl-replaystore"

    def load(self):
        super().load()
        import replaystore.integrations.torchrl.storage  # noqa: F401

    def finish(self):
        self.storage.close()

    def reopen(self, fresh: bool = False):
        from torchrl.data import TensorDictReplayBuffer

        from replaystore.integrations.torchrl import ReplayStoreStorage

        self.storage = ReplayStoreStorage(self.where / "rb.zarr", max_size=self.n, observation_key="pixels",
                                          streams=1, overwrite=fresh)
        self.rb = TensorDictReplayBuffer(storage=self.storage, batch_size=32)


class Cpprb(Contender):
    name = "cpprb"

    def load(self):
        import cpprb  # noqa: F401

    def create(self):
        import cpprb

        self.rb = cpprb.ReplayBuffer(self.n, env_dict={"obs": {"shape": (84, 84, STACK), "dtype": np.uint8},
                                                       "act": {"shape": 1, "dtype": np.int64}, "rew": {}, "done": {}},
                                     next_of="obs", stack_compress="obs")
        self.obs = np.zeros((84, 84, STACK), np.uint8)
        self.nxt = np.zeros((84, 84, STACK), np.uint8)

    def add(self, t, i, frame, nxt):
        r = t.rows
        self.obs[:] = t.stack.transpose(1, 2, 0)
        self.nxt[:] = t.next.transpose(1, 2, 0)
        start = time.perf_counter()
        self.rb.add(obs=self.obs, act=r["action"][i], rew=r["reward"][i], next_obs=self.nxt,
                    done=float(r["terminated"][i]))
        if r["terminated"][i] or r["truncated"][i]:
            self.rb.on_episode_end()
        return time.perf_counter() - start

    def sample(self):
        return self.rb.sample(32)


class SB3(Contender):
    name = "sb3"

    def load(self):
        import stable_baselines3.common.buffers  # noqa: F401

    def buffer(self, spaces: tuple) -> object:
        from stable_baselines3.common.buffers import ReplayBuffer

        return ReplayBuffer(self.n, *spaces, device="cpu", n_envs=1, optimize_memory_usage=True,
                            handle_timeout_termination=False)

    def create(self):
        import gymnasium as gym

        self.rb = self.buffer((gym.spaces.Box(0, 255, (84, 84, STACK), np.uint8), gym.spaces.Discrete(4)))
        self.obs = np.zeros((1, 84, 84, STACK), np.uint8)
        self.nxt = np.zeros((1, 84, 84, STACK), np.uint8)
        self.act, self.rew, self.done = np.zeros((1, 1), np.int64), np.zeros(1, np.float32), np.zeros(1, np.float32)

    def add(self, t, i, frame, nxt):
        r = t.rows
        self.obs[0] = t.stack.transpose(1, 2, 0)
        self.nxt[0] = t.next.transpose(1, 2, 0)
        self.act[0, 0], self.rew[0], self.done[0] = r["action"][i], r["reward"][i], r["terminated"][i] or r["truncated"][i]
        start = time.perf_counter()
        self.rb.add(self.obs, self.nxt, self.act, self.rew, self.done, [{}])
        return time.perf_counter() - start

    def sample(self):
        return self.rb.sample(32)


class SB3Zstd(SB3):
    """sb3-extra-buffers' ``CompressedReplayBuffer`` (SB3's buffer with each observation a zstd-
    compressed bytes object: ``pip install sb3-extra-buffers zstd``), filled as ``sb3`` is."""

    name = "sb3-zstd"

    def load(self):
        import sb3_extra_buffers.compressed  # noqa: F401

    def buffer(self, spaces: tuple) -> object:
        from sb3_extra_buffers.compressed import CompressedReplayBuffer

        return CompressedReplayBuffer(self.n, *spaces, device="cpu", n_envs=1, optimize_memory_usage=True,
                                      handle_timeout_termination=False, compression_method="zstd")


class Store(Contender):
    """replaystore; ``sample`` is ``store.sample(32)``, ``block`` takes one block of 8 batches from
    ``store.blocks`` (started by ``start_feed``)."""

    name = "replaystore"
    per_block = 8

    def load(self):
        import replaystore  # noqa: F401

    def create(self):
        import gymnasium as gym

        from replaystore import ReplayStore

        self.store = ReplayStore.create(self.where, self.n, gym.spaces.Box(0, 255, (84, 84), np.uint8),
                                        gym.spaces.Discrete(4), frame_stack=STACK, frame_padding="zero", overwrite=True)

    def add(self, t, i, frame, nxt):
        r = t.rows
        start = time.perf_counter()
        self.store.add(frame, int(r["action"][i]), float(r["reward"][i]), nxt, bool(r["terminated"][i]),
                       bool(r["truncated"][i]))
        return time.perf_counter() - start

    def finish(self):
        self.store.close()

    def reopen(self):
        from replaystore import ReplayStore

        self.store = ReplayStore.open(self.where)

    def sample(self):
        return self.store.sample(32)

    slices = True

    def sample_slices(self):
        """The store's own windows: ``sample_sequences``."""
        return self.store.sample_sequences(SLICES, SLICE_LEN)

    def blocks_rate(self, batches: int, warmup: int = 0) -> float:
        with self.store.blocks(32, batches_per_block=self.per_block, seed=0) as feed:
            return rate(lambda: next(feed).release(), batches, self.per_block, warmup=warmup)


MAKERS: dict[str, type[Contender]] = {"torchrl": TorchRL, "torchrl-compressed": TorchRLCompressed,
                                      "torchrl-replaystore": TorchRLStore, "cpprb": Cpprb, "sb3": SB3,
                                      "sb3-zstd": SB3Zstd, "replaystore": Store}


def rate(take: Callable[[], object], batches: int, per_call: int = 1, *, warmup: int = 0) -> float:
    """Batches per second over ``batches`` batches taken ``per_call`` at a time, after ``warmup`` calls."""
    for _ in range(warmup):
        take()
    calls = -(-batches // per_call)
    start = time.perf_counter()
    for _ in range(calls):
        take()
    return calls * per_call / (time.perf_counter() - start)
