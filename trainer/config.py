"""DQN's hyperparameters, with cleanrl's names, and their checks: one dataclass that ``DQN`` takes as
keywords and ``replaystore-train`` fills from its flags. A value no run can use is refused with one
line naming it, its range and (where it helps) what to pass instead."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np


class TrainerError(Exception):
    """A bad argument, model or run directory; the command line prints ``error: <message>`` and exits 1."""


#: Gradient steps per compiled learner call when ``steps_per_call`` is 0, per Keras backend
#: (docs/benchmarks.md, "The learner").
DEFAULT_STEPS_PER_CALL = {"tensorflow": 8, "jax": 32, "torch": 8}
#: The most sampling threads (and decode processes) a run may start.
MAX_SAMPLE_THREADS = 64
#: The most gradient steps a compiled learner call may take (its block of batches is sampled ahead).
MAX_STEPS_PER_CALL = 4096
#: Where a hindsight goal comes from (replaystore.HindsightSampler's strategies).
HER_STRATEGIES = ("future", "final", "episode")
#: The hyperparameters a run takes from its observations when they are not given (left None): image
#: frames (2-D or 3-D) get cleanrl's dqn_atari.py settings, anything else (vectors, a Discrete, Dicts
#: and Tuples) the settings measured on classic control (docs/benchmarks.md, "The defaults").
PRESETS: dict[str, dict[str, int | float]] = {
    "images": {"batch_size": 32, "learning_starts": 80_000, "train_frequency": 4, "target_network_frequency": 1000,
               "learning_rate": 1e-4, "end_e": 0.01, "n_step": 1},
    "vectors": {"batch_size": 128, "learning_starts": 1_000, "train_frequency": 2, "target_network_frequency": 500,
                "learning_rate": 2.5e-4, "end_e": 0.02, "n_step": 3},
}
#: The default of a hyperparameter ``PRESETS`` gives: None until the agent sees the observations.
FROM_PRESET: Any = None


def image_frames(observation_space: Any) -> bool:
    """Whether a space's observations are image frames (2-D or 3-D; a Dict's or a Tuple's are not)."""
    shape = getattr(observation_space, "shape", None)  # (a Dict's is None)
    return shape is not None and len(shape) >= 2


def preset(images: bool, *, hindsight: bool = False) -> dict[str, int | float]:
    """The values ``PRESETS`` gives, for image frames or not; hindsight relabelling takes 1-step
    transitions (its relabelled reward is one move's)."""
    values = dict(PRESETS["images" if images else "vectors"])
    if hindsight:
        values["n_step"] = 1
    return values


def described(name: str) -> str:
    """A preset hyperparameter's defaults in words, for help texts."""
    return f"{PRESETS['images'][name]:_} for images, {PRESETS['vectors'][name]:_} for vectors"


@dataclasses.dataclass(frozen=True)
class Names:
    """How a message names a hyperparameter: as the API's keyword (``batch_size``, ``n_step=1``) or
    as the command line's flag (``--batch-size``, ``--n-step 1``)."""

    flags: bool = False

    def __call__(self, name: str) -> str:
        return "--" + name.replace("_", "-") if self.flags else name

    def given(self, name: str, value: Any) -> str:
        """``name`` set to ``value``, as its user would write it."""
        return f"{self(name)} {value}" if self.flags else f"{name}={value}"


KEYWORDS, FLAGS = Names(flags=False), Names(flags=True)


def hyperparameter(default: Any, help: str) -> Any:  # noqa: A002 - (argparse's word)
    """A hyperparameter's one declaration: its default, and its help, which the command line's flag shows."""
    return dataclasses.field(default=default, metadata={"help": help})


def help_of(name: str) -> Any:
    """A hyperparameter's declared metadata (its help), for a flag that gives it another default."""
    return next(f.metadata for f in dataclasses.fields(Hyperparameters) if f.name == name)


@dataclasses.dataclass
class Hyperparameters:
    """What DQN learns with, declared once: ``DQN(model, store, **these)`` takes them as keywords
    (``DQNConfig``) and ``replaystore-train`` as flags (``Args``, args.py, with their help from here).
    Those left None take ``PRESETS``' values when the agent first sees the observations."""

    gamma: float = hyperparameter(0.99, "discount factor")
    n_step: int = hyperparameter(FROM_PRESET, "n-step returns (sampled by the store)")
    batch_size: int = hyperparameter(FROM_PRESET, "transitions per gradient step")
    learning_starts: int = hyperparameter(FROM_PRESET, "steps of acting before learning")
    train_frequency: int = hyperparameter(FROM_PRESET, "env steps between gradient steps")
    target_network_frequency: int = hyperparameter(FROM_PRESET, "env steps between target updates")
    tau: float = hyperparameter(1.0, "target update rate (1.0 = hard copy)")
    learning_rate: float = hyperparameter(FROM_PRESET, "Adam's learning rate (when no optimizer is given)")
    start_e: float = hyperparameter(1.0, "epsilon at the start")
    end_e: float = hyperparameter(FROM_PRESET, "epsilon after the schedule")
    exploration_fraction: float = hyperparameter(0.10, "fraction of total_timesteps over which epsilon falls")
    prioritized: bool = hyperparameter(False, "prioritized replay (proportional)")
    alpha: float = hyperparameter(0.6, "priority exponent (with prioritized replay)")
    beta: float = hyperparameter(0.4, "importance-weight exponent (with prioritized replay)")
    replay_ratio: str | float = hyperparameter(
        "auto", "sampled per inserted transitions, held by running the learner on its own thread beside acting; "
                "auto: batch-size / train-frequency (8 for images, 64 for vectors with the defaults: the data reuse "
                "of lockstep DQN); 0: lockstep (acting stops for a gradient step every train-frequency env steps)")
    steps_per_call: int = hyperparameter(0, "gradient steps per compiled call, on one block of that many batches "
                                            "(default: the backend's, 8 on TensorFlow and PyTorch, 32 on JAX)")
    sample_threads: int = hyperparameter(2, "threads that sample batches ahead of the learner")
    clip_reward: bool = hyperparameter(False, "Atari: learn from sign(reward)")
    terminal_on_life_loss: bool = hyperparameter(False, "Atari: a lost life ends the episode for learning")
    seed: int = hyperparameter(1, "seeds the network, the environment and exploration")
    cql_alpha: float = hyperparameter(0.0, "conservative Q-learning's weight (1.0 is usual when learning offline); "
                                           "0: plain DQN")
    her_n_sampled_goal: int = hyperparameter(
        0, "a goal env's Dict observations (achieved_goal, desired_goal): hindsight experience replay, this many "
           "transitions relabelled with a goal the episode reached for each real one (4 is HER's usual), their "
           "rewards from the env's compute_reward; 0: no relabelling")
    her_strategy: str = hyperparameter("future", "with hindsight relabelling: where a relabelled goal comes from: "
                                                 "future (a later step of the episode), final or episode")


@dataclasses.dataclass
class DQNConfig(Hyperparameters):
    """The hyperparameters of one agent (``DQN(model, store, **these)``), checked. Those left None
    take ``PRESETS``' values when the agent first sees the observations (``fill``): cleanrl's
    dqn_atari.py settings for image frames, the classic-control ones for anything else."""

    def fill(self, images: bool) -> None:
        """Give the hyperparameters left None their preset's values (image frames or not), and check."""
        for name, value in preset(images, hindsight=bool(self.her_n_sampled_goal)).items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self.check()

    @property
    def filled(self) -> bool:
        """Whether every hyperparameter has its value (none left to the observations)."""
        return all(getattr(self, name) is not None for name in PRESETS["images"])

    def check(self, names: Names = KEYWORDS) -> None:
        """Refuse values no run can use, naming each as ``names`` says (the API's keywords, or the
        command line's flags) with its range (those left None are checked once ``fill`` gives them
        their values)."""
        for name in ("n_step", "batch_size", "train_frequency", "target_network_frequency", "sample_threads"):
            value = getattr(self, name)
            if value is None and name in PRESETS["images"]:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TrainerError(f"{names(name)} is {value!r}; it must be a positive integer")
        if self.steps_per_call > MAX_STEPS_PER_CALL:
            raise TrainerError(f"{names('steps_per_call')} is {self.steps_per_call}; it must be at most "
                               f"{MAX_STEPS_PER_CALL} (a block of that many batches is sampled ahead: 8 to 64 is usual)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise TrainerError(f"{names('seed')} is {self.seed!r}; it must be an integer from 0 to 2**32 - 1")
        if self.sample_threads > MAX_SAMPLE_THREADS:  # (each starts a thread and a decode process)
            raise TrainerError(f"{names('sample_threads')} is {self.sample_threads}; it must be at most "
                               f"{MAX_SAMPLE_THREADS} (a thread and a decode process each: one or two per core)")
        for name in ("learning_starts", "steps_per_call"):
            value = getattr(self, name)
            if value is None and name in PRESETS["images"]:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TrainerError(f"{names(name)} is {value!r}; it must be an integer >= 0")
        for name in ("gamma", "tau", "start_e", "end_e", "exploration_fraction", "alpha", "beta"):
            value = getattr(self, name)
            if value is None and name in PRESETS["images"]:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise TrainerError(f"{names(name)} is {value!r}; it must be a number in [0, 1]")
        if self.learning_rate is not None and (isinstance(self.learning_rate, bool)
                                               or not isinstance(self.learning_rate, int | float)
                                               or not self.learning_rate > 0):
            raise TrainerError(f"{names('learning_rate')} is {self.learning_rate!r}; it must be > 0")
        if (isinstance(self.cql_alpha, bool) or not isinstance(self.cql_alpha, int | float)
                or not 0.0 <= self.cql_alpha < math.inf):
            raise TrainerError(f"{names('cql_alpha')} is {self.cql_alpha!r}; it must be a finite number >= 0 (0: no "
                               "conservative term; 1.0 is CQL's usual weight for offline learning)")
        if self.replay_ratio != "auto" or self.filled:
            self.ratio(names)
        self.check_her(names)

    def check_her(self, names: Names = KEYWORDS) -> None:
        """Refuse hindsight settings no run can use (sampling/hindsight.py samples 1-step, uniformly)."""
        k, strategy = self.her_n_sampled_goal, self.her_strategy
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= 1000:
            raise TrainerError(f"{names('her_n_sampled_goal')} is {k!r}; it must be an integer from 0 (no hindsight "
                               "relabelling) to 1000 (4 is HER's usual k: 80% of each batch relabelled)")
        if strategy not in HER_STRATEGIES:
            raise TrainerError(f"{names('her_strategy')} is {strategy!r}; it must be one of {', '.join(HER_STRATEGIES)}")
        if k and self.n_step not in (1, None):
            raise TrainerError(f"{names('n_step')} is {self.n_step} with {names('her_n_sampled_goal')} {k}; hindsight "
                               "relabelling samples 1-step transitions (a relabelled reward is one move's): use "
                               f"{names.given('n_step', 1)}")
        if k and self.prioritized:
            raise TrainerError(f"prioritized replay with {names('her_n_sampled_goal')} {k}; hindsight relabelling "
                               "draws transitions uniformly: turn one of them off")

    def ratio(self, names: Names = KEYWORDS) -> float:
        """``replay_ratio`` as a number: ``auto`` is batch_size / train_frequency; 0 means lockstep."""
        value = self.replay_ratio
        if value == "auto":
            return self.batch_size / self.train_frequency
        try:
            ratio = float(value)
        except (TypeError, ValueError):
            ratio = float("nan")
        if not ratio >= 0 or math.isinf(ratio):
            raise TrainerError(f"{names('replay_ratio')} is {value!r}; give a number >= 0 (sampled per inserted "
                               "transition; 0 for lockstep) or 'auto'")
        return ratio

    def calls(self, backend: str) -> int:
        """Gradient steps per compiled learner call on ``backend``."""
        return self.steps_per_call or DEFAULT_STEPS_PER_CALL.get(backend, 8)

    def target_every(self) -> int:
        """Gradient steps between target updates."""
        return max(1, self.target_network_frequency // self.train_frequency)


def config_from(values: dict[str, Any]) -> DQNConfig:
    """A checked ``DQNConfig`` from keywords; an unknown keyword is refused, naming the known ones."""
    known = {f.name for f in dataclasses.fields(DQNConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TrainerError(f"unknown hyperparameter {unknown[0]!r}; DQN takes {', '.join(sorted(known))}")
    config = DQNConfig(**values)
    config.check()
    return config


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon at step ``t``: from ``start_e`` down to ``end_e`` over ``duration`` steps, then flat."""
    slope = (end_e - start_e) / max(duration, 1.0)
    return max(slope * t + start_e, end_e)


def epsilon_at(start_e: float, end_e: float, duration: float, t: int, *, warmup: int = 0) -> float:
    """Epsilon at env step ``t``: 1 (uniform random moves) before ``warmup`` steps (a rule that acts
    at random until learning starts: SAC, as SB3's), else ``linear_schedule``'s."""
    return 1.0 if t < warmup else linear_schedule(start_e, end_e, duration, t)


def check_count(name: str, value: Any, *, least: int) -> None:
    """Refuse ``value`` unless it is an integer >= ``least``, naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
        raise TrainerError(f"{name} is {value!r}; it must be an integer >= {least}")


def check_run_arguments(eval_env: Any, eval_frequency: Any, eval_episodes: Any, checkpoint_frequency: Any,
                        verbose: Any) -> None:
    """Refuse the arguments ``fit`` and ``fit_offline`` share when no run can use them."""
    for name, value in (("eval_frequency", eval_frequency), ("eval_episodes", eval_episodes),
                        ("checkpoint_frequency", checkpoint_frequency), ("verbose", verbose)):
        check_count(name, value, least=0)
    if eval_env is not None and eval_episodes < 1:
        raise TrainerError("eval_episodes is 0; evaluating eval_env needs at least one game (or pass no eval_env)")
