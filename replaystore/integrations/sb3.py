"""A replay store as Stable-Baselines3's replay buffer: ``ReplayStoreBuffer``.

For SB3's off-policy algorithms on a Box observation space, or a Dict of Box, Discrete, MultiBinary
and MultiDiscrete entries (``MultiInputPolicy``:
``sample`` then returns ``DictReplayBufferSamples``, each step's dict stored whole): DQN and QR-DQN
(Discrete actions), SAC, TD3, DDPG and TQC (Box actions)::

    from replaystore.integrations.sb3 import ReplayStoreBuffer
    model = DQN("CnnPolicy", env, buffer_size=1_000_000,
                replay_buffer_class=ReplayStoreBuffer, replay_buffer_kwargs={"path": "runs/replay.zarr"})

SB3 stores Box actions as its policies emit them, squashed to ``[-1, 1]`` (``policy.scale_action``),
so the store of a Box action space is made with ``Box(-1, 1)`` of its shape (``buffer_action_space``)
and refuses an action outside it.

and for a cleanrl-style script, in place of SB3's ``ReplayBuffer``::

    rb = ReplayStoreBuffer(buffer_size, envs.single_observation_space, envs.single_action_space, device,
                           n_envs=envs.num_envs, handle_timeout_termination=False, path="runs/replay.zarr")

Each env of the vector env is one stream of the store. ``add(obs, next_obs, action, reward, done,
infos)`` takes what SB3 passes: ``done`` with ``infos[i]["TimeLimit.truncated"]`` becomes
``terminated``/``truncated`` (with ``handle_timeout_termination=False`` every ``done`` is terminal,
as in SB3). Frame stacks made by ``VecFrameStack`` or ``FrameStackObservation`` are stored one frame
per step and rebuilt exactly at sample time (integrations/stacking.py; the layout is detected from
the first observations or taken from ``frame_stack``/``stack_axis``/``padding``). ``sample``
returns SB3's ``ReplayBufferSamples`` of torch tensors on ``device``, normalized by a
``VecNormalize`` passed as ``env`` as SB3 does; with ``n_steps > 1`` the rewards are n-step returns
and ``discounts`` holds ``gamma ** m`` as in SB3's ``NStepReplayBuffer``.

A buffer whose ``path`` already holds a store continues it (``DQN.load`` re-creates the buffer with
the saved ``replay_buffer_kwargs``): every committed transition is sampled again, and the episodes
that were in progress end there (truncated). ``save_replay_buffer``/``load_replay_buffer`` pickle
the path only, after a flush that commits everything added so far.

This module imports neither torch nor SB3 until ``ReplayStoreBuffer`` is first used
(``pip install 'replaystore[sb3]'``).
"""

from __future__ import annotations

import logging
from typing import Any

from replaystore.errors import ConfigError
from replaystore.integrations.sb3side import StoreSide, buffer_action_space
from replaystore.sampling.hindsight import HindsightSampler
from replaystore.store import ReplayStore

log = logging.getLogger(__name__)

__all__ = ["ReplayStoreBuffer", "ReplayStoreHerBuffer", "StoreSide", "buffer_action_space"]  # noqa: F822 (module __getattr__)


_CLASSES: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name == "ReplayStoreBuffer":
        return buffer_class()
    if name == "ReplayStoreHerBuffer":
        return her_buffer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def buffer_class() -> Any:
    """``ReplayStoreBuffer``, a subclass of SB3's ``ReplayBuffer`` (defined on first use: it needs SB3)."""
    if "buffer" not in _CLASSES:
        _triton_before_tensorflow()
        try:
            import torch
            from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
            from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples
        except ImportError as exc:
            raise ImportError("ReplayStoreBuffer needs Stable-Baselines3 and torch: pip install 'replaystore[sb3]'") from exc
        _CLASSES["buffer"] = _define(torch, BaseBuffer, ReplayBuffer, ReplayBufferSamples, DictReplayBufferSamples)
    return _CLASSES["buffer"]


def her_buffer_class() -> Any:
    """``ReplayStoreHerBuffer``, a subclass of ``ReplayStoreBuffer`` and of SB3's ``HerReplayBuffer``
    (defined on first use)."""
    if "her" not in _CLASSES:
        base = buffer_class()
        from stable_baselines3.her.her_replay_buffer import HerReplayBuffer

        _CLASSES["her"] = _define_her(base, HerReplayBuffer)
    return _CLASSES["her"]


def _triton_before_tensorflow() -> None:
    """Keep torch's triton and TensorFlow from both loading LLVM. Each bundles its own, and when
    TensorFlow is loaded first, loading triton later (torch does it lazily, e.g. in SB3's first Adam)
    aborts the process with "LLVM ERROR: inconsistency in registered CommandLine options". So: if
    TensorFlow is not loaded yet, load triton now (the other order works); if it is (SB3 itself loads
    it through tensorboard where it is installed), make ``import triton`` fail for this process, which
    torch takes as "no triton": on a CPU nothing needs it; on a GPU ``torch.compile`` then says triton
    is missing instead of the process aborting."""
    import importlib.util
    import sys
    import warnings

    if "triton" in sys.modules or importlib.util.find_spec("triton") is None:
        return
    if "tensorflow" in sys.modules:
        sys.modules["triton"] = None  # type: ignore[assignment]  # import triton -> ImportError
        warnings.warn("TensorFlow was imported before torch loaded triton, and loading triton now would abort the "
                      "process (both bundle LLVM), so triton is switched off in this process: torch runs without "
                      "it (torch.compile's GPU kernels need it). To keep triton, import "
                      "replaystore.integrations.sb3 (or torch._dynamo) before tensorflow and stable_baselines3",
                      RuntimeWarning, stacklevel=3)
        return
    try:
        import torch._dynamo  # noqa: F401  (loads triton)
    except ImportError:
        pass


def _define(torch: Any, base_buffer: Any, replay_buffer: Any, samples: Any, dict_samples: Any) -> Any:
    class ReplayStoreBuffer(replay_buffer):
        """SB3's ``ReplayBuffer`` interface over a replay store on disk (module docstring)."""

        def __init__(self, buffer_size: int, observation_space: Any, action_space: Any, device: Any = "auto",
                     n_envs: int = 1, optimize_memory_usage: bool = False, handle_timeout_termination: bool = True,
                     *, path: Any = None, **kwargs: Any) -> None:
            # BaseBuffer, not ReplayBuffer: nothing of the transitions is held in RAM
            base_buffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
            self.buffer_size = max(buffer_size // n_envs, 1)
            self.optimize_memory_usage = optimize_memory_usage  # every frame is stored once anyway
            self.handle_timeout_termination = handle_timeout_termination
            self.side = StoreSide(buffer_size, observation_space, action_space, n_envs, path=path,
                                  handle_timeout_termination=handle_timeout_termination, **kwargs,
                                  **self._side_options())

        def _side_options(self) -> dict[str, Any]:
            """More options of the ``StoreSide`` (a subclass's), not pickled with the buffer."""
            return {}

        @property
        def path(self) -> Any:
            return self.side.path

        @property
        def store(self) -> ReplayStore | None:
            """The replay store (None until the first ``add`` of a new one)."""
            return self.side.store

        def add(self, obs: Any, next_obs: Any, action: Any, reward: Any, done: Any, infos: Any) -> None:
            self.side.add(obs, next_obs, action, reward, done, infos)
            pos = int(self.__dict__["pos"]) + 1
            if pos == self.buffer_size:
                self.full, pos = True, 0
            self.pos = pos

        def sample(self, batch_size: int, env: Any = None) -> Any:
            data = self.side.sample(batch_size, env)
            device = self.device

            def tensor(value: Any) -> Any:
                if isinstance(value, dict):  # a Dict observation space's
                    return {key: torch.as_tensor(v, device=device) for key, v in value.items()}
                return None if value is None else torch.as_tensor(value, device=device)

            fields = {k: tensor(v) for k, v in data.items()}
            return (dict_samples if self.side.dict_spec is not None else samples)(**fields)

        def size(self) -> int:
            """Sampleable transitions in the store."""
            return len(self.side)

        def reset(self) -> None:
            raise ConfigError(f"a replay store is not emptied in place; make a new buffer with another path, or "
                              f"overwrite=True, to start again ({self.side.path} is unchanged)")

        def flush(self) -> None:
            """Commit everything added so far (it survives a crash from here on)."""
            self.side.flush()

        def close(self) -> None:
            """Flush and release the store (its writer claim, its files)."""
            self.side.close()

        def __getstate__(self) -> dict[str, Any]:
            # save_replay_buffer pickles the buffer: the transitions stay in the store, so the pickle
            # holds where it is and how it is read; flushing first commits everything added so far
            self.side.flush()
            log.warning("ReplayStoreBuffer saved as its path: the %d transitions stay in the store at %s "
                        "(flushed now); load_replay_buffer reopens it", len(self.side), self.side.path)
            state = dict(self.__dict__)
            side = self.side
            state["side"] = {"buffer_size": side.buffer_size, "observation_space": side.observation_space,
                             "action_space": side.action_space, "n_envs": side.n_envs, "path": side.path,
                             **side.options, "n_steps": side.n_steps, "gamma": side.gamma,
                             "handle_timeout_termination": side.handle_timeout_termination,
                             "layout": side.layout_arg, "cache_bytes": side.cache_bytes,
                             "storage_options": side.storage_options, "info_keys": side.info_keys}
            return state

        def __setstate__(self, state: dict[str, Any]) -> None:
            config = dict(state["side"])
            self.__dict__.update({k: v for k, v in state.items() if k != "side"})
            args = [config.pop(k) for k in ("buffer_size", "observation_space", "action_space", "n_envs")]
            # the buffer it replaces may still hold the store's claim in this process: open on first use
            self._pending = (args, config)
            self.__dict__.pop("side", None)

        def __getattr__(self, name: str) -> Any:
            if name == "side" and "_pending" in self.__dict__:
                args, config = self.__dict__.pop("_pending")
                side = self.__dict__["side"] = StoreSide(*args, **{**config, **self._side_options()})
                return side
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    ReplayStoreBuffer.__module__ = __name__
    ReplayStoreBuffer.__qualname__ = "ReplayStoreBuffer"
    return ReplayStoreBuffer


def _define_her(store_buffer: Any, her_buffer: Any) -> Any:
    from stable_baselines3.her.goal_selection_strategy import GoalSelectionStrategy

    class ReplayStoreHerBuffer(store_buffer, her_buffer):
        """SB3's ``HerReplayBuffer`` interface over a replay store on disk: ``ReplayStoreBuffer``
        whose batches are drawn by a ``HindsightSampler`` (sampling/hindsight.py), the env's
        ``compute_reward`` giving the relabelled rewards. SB3 passes ``env`` (it checks for a
        ``HerReplayBuffer`` subclass); ``n_sampled_goal`` and ``goal_selection_strategy`` as in SB3.
        ``compute_reward`` gets each transition's kept infos (``info_keys``, as the store's extras),
        else empty dicts; ``copy_info_dict=True`` needs ``info_keys``: the keys it reads."""

        def __init__(self, buffer_size: int, observation_space: Any, action_space: Any, env: Any, device: Any = "auto",
                     n_envs: int = 1, optimize_memory_usage: bool = False, handle_timeout_termination: bool = True,
                     n_sampled_goal: int = 4, goal_selection_strategy: Any = "future", copy_info_dict: bool = False,
                     *, path: Any = None, **kwargs: Any) -> None:
            if copy_info_dict and not kwargs.get("info_keys"):
                raise ConfigError("copy_info_dict=True: the replay store keeps only the info keys it is told, so "
                                  "compute_reward would get empty info dicts; pass info_keys=[...] (the keys the env's "
                                  "compute_reward reads) in replay_buffer_kwargs, or use copy_info_dict=False")
            strategy = goal_selection_strategy
            if isinstance(strategy, GoalSelectionStrategy):
                strategy = strategy.name.lower()
            if not isinstance(strategy, str) or strategy.lower() not in ("future", "final", "episode"):
                raise ConfigError(f"goal_selection_strategy is {goal_selection_strategy!r}; it must be 'future', "
                                  "'final' or 'episode'")
            self.env = env
            self.copy_info_dict = bool(copy_info_dict)
            self.goal_selection_strategy = GoalSelectionStrategy[strategy.upper()]
            self.n_sampled_goal = n_sampled_goal
            super().__init__(buffer_size, observation_space, action_space, device, n_envs, optimize_memory_usage,
                             handle_timeout_termination, path=path, **kwargs)  # (checks n_sampled_goal)
            self.her_ratio = 1 - (1.0 / (n_sampled_goal + 1))

        def _side_options(self) -> dict[str, Any]:
            strategy = self.goal_selection_strategy.name.lower()
            return {"hindsight": HindsightSampler(self._compute_reward, strategy=strategy,
                                                  n_sampled_goal=self.n_sampled_goal)}

        def _compute_reward(self, achieved: Any, desired: Any, infos: Any) -> Any:
            """The env's ``compute_reward`` (of its first env, as SB3 calls it, with the goals shaped as
            SB3's buffers shape them)."""
            if self.env is None:
                raise ConfigError("this buffer has no env to compute relabelled rewards with: pass env= when making "
                                  "it, or env= to the model's load (load_replay_buffer then calls set_env)")
            if achieved.ndim == 1:  # goals that are Discrete entries: SB3's buffers give them as (batch, 1)
                achieved, desired = achieved[:, None], desired[:, None]
            return self.env.env_method("compute_reward", achieved, desired, infos, indices=[0])[0]

        def truncate_last_trajectory(self) -> None:
            """Nothing to do: a store continued by a new buffer ended its episodes in progress when it
            was opened (truncated), so they are sampled as finished episodes."""

        def __getstate__(self) -> dict[str, Any]:
            state = super().__getstate__()
            state["env"] = None  # (not pickled: load_replay_buffer calls set_env)
            return state

    ReplayStoreHerBuffer.__module__ = __name__
    ReplayStoreHerBuffer.__qualname__ = "ReplayStoreHerBuffer"
    return ReplayStoreHerBuffer
