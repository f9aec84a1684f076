"""Acting in Ray actor processes: ``DQN.fit(env, ..., actors=N)`` and ``replaystore-train --actors N``.

What an actor needs is an ``ActorPlan``, plain data made by the process that learns: the store's
location, how to make its envs (the env's gymnasium ``EnvSpec``, wrappers included, or the command
line's env id), the Q-network as its saved ``.keras`` file (read back in safe mode, with the
caller's ``custom_objects``) and the learning rule, so any model the agent can save acts in the
actors, and the command line goes the same way.

Each of N Ray actors (``ActorProcess``) steps its envs into its own streams of the run's store
(actor ``a`` of E envs writes streams ``a*E .. a*E+E-1``, opened with ``ReplayStore.open(path,
mode="a", streams=...)``), acting epsilon-greedily with the newest weights it was sent (acting.py's
``VectorActing``, a learner of its own for the forward pass). The trainer's own process is the
learner: ``DQN.fit`` runs its one loop with an ``ActorSource`` as the source of env steps, which
follows the actors' commits with ``store.refresh()`` while the learner thread (feeding.py) samples
across every stream, held to the replay ratio as with acting in-process.

A small Ray actor, the ``Coordinator``, sits between the two sides:

- actors report the env steps they inserted and the episodes they finished every ``SYNC_STEPS``
  steps, and get back the run's total (for the epsilon schedule), newer weights if there are any, and
  whether they may go on: an actor waits while the total is past the limit the learner set, that is
  while the learner is more than its slack behind the replay ratio;
- the learner publishes its online weights (``ray.put``) every ``PUBLISH_SECONDS`` and the insert limit
  after every poll, and takes the reported steps and episodes (TensorBoard's episodic returns).

So the actors' policy is at most ``PUBLISH_SECONDS`` plus ``SYNC_STEPS`` env steps per actor older
than the learner's weights, and the ratio overshoots its slack by at most ``SYNC_STEPS`` per actor.

Actors commit their streams every ``COMMIT_SECONDS``, before they wait for the learner, and when
they stop; the learner samples what was committed. An actor that dies (its process killed, its environment raising) is replaced by a new one on
the same streams: reopening them closes the unfinished episode as truncated, and every transition
the dead actor committed stays. More than ``actor_restarts`` (3) deaths of one actor end the run
with an error. ``--ray-address`` joins an existing cluster; without it a local Ray is started and stopped.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .actorplan import ActorPlan
from .config import TrainerError, epsilon_at
from .stores import open_streams

SYNC_STEPS = 50
#: An actor commits its streams at least this often (the learner samples what was committed).
COMMIT_SECONDS = 2.0
PUBLISH_SECONDS = 1.0
#: The compressed-chunk cache of an actor's store handle (actors write; they sample nothing).
ACTOR_CACHE_BYTES = 8 * 2**20


class Coordinator:
    """Counts, weights and the insert limit shared by the learner and the actors (a Ray actor)."""

    def __init__(self, num_actors: int, inserted: int) -> None:
        self.base = inserted  # env steps inserted before this run started (a resumed run)
        self.inserted = [0] * num_actors
        self.limit = float("inf")
        self.weights: Any = None
        self.version = 0
        self.episodes: list[tuple[float, int]] = []
        self.stopping = False

    def total(self) -> int:
        return self.base + sum(self.inserted)

    def publish(self, box: list[Any] | None, limit: float) -> None:
        """New weights (``[ObjectRef]``; None keeps the last) and the insert limit."""
        if box is not None:
            self.weights, self.version = box[0], self.version + 1
        self.limit = limit

    def sync(self, actor: int, inserted: int, episodes: list[tuple[float, int]],
             version: int) -> tuple[int, int, list[Any] | None, bool, bool]:
        """An actor's report: returns (total, weights version, [newer weights] or None, may go on, stop)."""
        self.inserted[actor] += inserted
        self.episodes.extend(episodes)
        total = self.total()
        box = [self.weights] if version != self.version and self.weights is not None else None
        return total, self.version, box, total < self.limit, self.stopping

    def take(self) -> tuple[int, list[tuple[float, int]]]:
        """The learner's poll: the total inserted and the episodes finished since the last poll."""
        episodes, self.episodes = self.episodes, []
        return self.total(), episodes

    def stop(self) -> None:
        self.stopping = True


class ActorProcess:
    """One acting process: its envs writing its streams, with the learner's weights (a Ray actor)."""

    def __init__(self, plan: ActorPlan, index: int, coordinator: Any, incarnation: int) -> None:
        import importlib

        import gymnasium as gym
        import keras

        from .acting import VectorActing, exploring
        from .actions import ActionSpec
        from .envs import make_vector_env
        from .learner import make_learner
        from .models import Loading
        from .rules import rule_from_json
        from .stacks import StackSpec

        self.plan, self.index, self.coordinator = plan, index, coordinator
        for module in plan.imports:
            importlib.import_module(module)
        options = {"storage_options": plan.storage_options} if plan.storage_options else {}
        self.store = open_streams(plan.store, streams=plan.streams(index), cache_bytes=ACTOR_CACHE_BYTES,
                                  lease_wait=plan.lease_wait, options=options)
        self.store.end_episode()  # after a crash or a resume: the episode in progress ends as truncated
        keras.utils.set_random_seed(plan.seed + 1009 * (index + 1) + incarnation)
        with tempfile.TemporaryDirectory(prefix="replaystore-actor-") as tmp:
            (Path(tmp) / "model.keras").write_bytes(plan.model)
            model = Loading(plan.custom_objects, plan.safe_mode).load(Path(tmp) / "model.keras")
        stacks = StackSpec.of_space(self.store.observation_space, plan.frame_stack)
        self.learner = make_learner(model, keras.optimizers.Adam(), stacks=stacks, target_every=1, tau=1.0,
                                    rule=rule_from_json(plan.rule, "the actor plan"),
                                    actions=ActionSpec.of_space(self.store.action_space))  # it acts: weights come from the learner
        seed = plan.seed + 104_729 * (index + 1) + 7919 * incarnation
        self.rng = np.random.default_rng(seed)
        self.act = exploring(self.learner, self.rng)
        if plan.env_spec is not None:
            spec = plan.env_spec
            envs = gym.vector.SyncVectorEnv([lambda: gym.make(spec)] * plan.envs_per_actor)
        else:
            envs = make_vector_env(plan.env_id, plan.envs_per_actor, kwargs=plan.env_kwargs)
        self.acting = VectorActing(envs, self.store, seed=seed, owned=True, clip_reward=plan.clip_reward,
                                   terminal_on_life_loss=plan.terminal_on_life_loss)
        self.version = -1

    def run(self) -> int:
        """Act until the run's total reaches ``--total-timesteps`` or the learner stops; returns the
        env steps this actor took."""
        import ray

        plan = self.plan
        duration = plan.exploration_fraction * plan.total_timesteps
        taken = pending = uncommitted = 0
        committed = time.monotonic()
        episodes: list[tuple[float, int]] = []
        try:
            while True:
                total, version, box, go, stopping = ray.get(
                    self.coordinator.sync.remote(self.index, pending, episodes, self.version))
                pending, episodes = 0, []
                if box is not None:
                    self.learner.set_online_weights(ray.get(box[0]))
                    self.version = version
                if stopping or total >= plan.total_timesteps:
                    return taken
                if not go:  # the learner is behind: let it see everything this actor has, then wait
                    if uncommitted:
                        self.store.flush()
                        uncommitted, committed = 0, time.monotonic()
                    time.sleep(0.01)
                    continue
                for _ in range(SYNC_STEPS):
                    epsilon = epsilon_at(plan.start_e, plan.end_e, duration, total + pending,
                                         warmup=plan.learning_starts if plan.warmup else 0)
                    moved, ended = self.acting.step(self.act, epsilon, self.rng)
                    pending += moved
                    episodes.extend(ended)
                taken += pending
                uncommitted += pending
                if time.monotonic() - committed >= COMMIT_SECONDS:
                    self.store.flush()
                    uncommitted, committed = 0, time.monotonic()
        finally:
            self.store.flush()

    def close(self) -> None:
        self.acting.close()
        self.store.close()


class ActorSource:
    """``DQN.fit``'s source of env steps with actors (run.py's ``Source``): each ``step``
    waits briefly for news from the actors, refreshes the store to their commits, sends them the
    learner's weights (every ``PUBLISH_SECONDS``) and the insert limit, and returns the env steps
    they inserted and the games they finished. The actors hold themselves to the replay ratio
    (the limit), so the loop does not wait for the learner (``waits`` is False)."""

    waits = False

    def __init__(self, plan: ActorPlan, store: Any, learner: Any, inserted: int, say: Callable[[str], None]) -> None:
        self.plan, self.store = plan, store
        self.total = inserted
        self.learning: Any = None
        self.pool = ActorPool(plan, learner, inserted, say)

    def attach(self, learning: Any) -> None:
        self.learning = learning

    def step(self, act: Callable[[np.ndarray], np.ndarray], epsilon: float,
             rng: np.random.Generator) -> tuple[int, list[tuple[float, int]]]:
        plan, learning = self.plan, self.learning
        if not self.pool.running:
            raise TrainerError("every actor stopped before the run reached its total_timesteps")
        total, episodes = self.pool.poll(0.1)
        self.store.refresh()
        moved = max(0, total - self.total)
        self.total += moved
        limiter = learning.limiter if learning is not None else None
        if limiter is None:
            limit = float("inf")
        else:
            limit = plan.learning_starts + (limiter.learned + limiter.slack) * plan.batch_size / limiter.ratio
        if self.pool.weights_due and learning is not None:
            with learning.paused():
                self.pool.publish(limit, weights=True)
        else:
            self.pool.publish(limit)
        return moved, episodes

    def close(self) -> None:
        self.pool.close()
        self.store.refresh()


class ActorPool:
    """The learner's side: starts Ray, the coordinator and the actors, restarts actors that die,
    and relays counts, weights and the insert limit."""

    def __init__(self, plan: ActorPlan, learner: Any, inserted: int, say: Callable[[str], None]) -> None:
        import ray

        self.ray, self.plan, self.learner, self.say = ray, plan, learner, say
        self.started_ray = False
        # Ray's core worker installs its own SIGTERM handler in this process (it logs and exits);
        # the trainer's (checkpoint, then exit) are put back once Ray is up.
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        if not ray.is_initialized():
            env_vars = {"KERAS_BACKEND": os.environ.get("KERAS_BACKEND", "tensorflow"),
                        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
            if plan.ray_address:
                ray.init(address=plan.ray_address, runtime_env={"env_vars": env_vars}, logging_level=logging.WARNING)
            else:
                ray.init(num_cpus=max(plan.actors + 1, os.cpu_count() or 1), include_dashboard=False,
                         runtime_env={"env_vars": env_vars}, logging_level=logging.WARNING)
            self.started_ray = True
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
        self.coordinator: Any = ray.remote(num_cpus=0)(Coordinator).remote(plan.actors, inserted)
        self._actor_class = ray.remote(num_cpus=1)(ActorProcess)
        self.restarts = [0] * plan.actors
        self.actors: list[Any] = [None] * plan.actors
        self.runs: dict[Any, int] = {}
        self._weights: Any = None
        self._published = 0.0
        self.publish(limit=float("inf"), weights=True)
        for i in range(plan.actors):
            self._start(i)

    def _start(self, i: int) -> None:
        self.actors[i] = self._actor_class.remote(self.plan, i, self.coordinator, self.restarts[i])
        self.runs[self.actors[i].run.remote()] = i

    @property
    def weights_due(self) -> bool:
        """Whether ``PUBLISH_SECONDS`` have passed since the weights were last published."""
        return time.monotonic() - self._published >= PUBLISH_SECONDS

    def publish(self, limit: float, weights: bool = False) -> None:
        """The insert limit, and with ``weights`` the learner's current online weights."""
        box = None
        if weights:
            self._weights = self.ray.put(self.learner.online_weights())
            self._published = time.monotonic()
            box = [self._weights]
        self.coordinator.publish.remote(box, limit)

    def poll(self, timeout: float) -> tuple[int, list[tuple[float, int]]]:
        """Wait up to ``timeout`` for an actor to end; restart those that died. Returns the total
        inserted and the episodes finished since the last poll."""
        ray = self.ray
        ready, _ = ray.wait(list(self.runs), num_returns=1, timeout=timeout)
        for ref in ready:
            i = self.runs.pop(ref)
            try:
                ray.get(ref)
            except (ray.exceptions.RayError, Exception) as exc:  # noqa: BLE001 - any death of the actor
                self.restarts[i] += 1
                reason = _reason(exc)
                if self.restarts[i] > self.plan.actor_restarts:
                    raise TrainerError(f"actor {i} died {self.restarts[i]} times; the last: {reason}") from exc
                self.say(f"actor {i} (streams {self.plan.streams(i)}) died: {reason}; "
                         f"restarting it (restart {self.restarts[i]} of at most {self.plan.actor_restarts})")
                ray.kill(self.actors[i], no_restart=True)
                self._start(i)
        return ray.get(self.coordinator.take.remote())

    @property
    def running(self) -> bool:
        return bool(self.runs)

    def close(self, timeout: float = 60.0) -> None:
        """Tell the actors to stop, let them commit their streams, and stop Ray if this started it."""
        ray = self.ray
        try:
            ray.get(self.coordinator.stop.remote(), timeout=timeout)
            if self.runs:
                ray.wait(list(self.runs), num_returns=len(self.runs), timeout=timeout)
            for actor in self.actors:
                try:
                    ray.get(actor.close.remote(), timeout=timeout)
                except ray.exceptions.RayError:
                    pass
        finally:
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
            ray.kill(self.coordinator, no_restart=True)
            if self.started_ray:
                ray.shutdown()


def _reason(exc: BaseException) -> str:
    """The first sentence of why an actor died (Ray's messages run to paragraphs)."""
    text = " ".join(str(exc).split())
    cause = getattr(exc, "cause", None)
    if cause is not None and not isinstance(cause, type(exc)):  # the actor's own exception (RayTaskError)
        text = f"{type(cause).__name__}: {cause}"
    first = text.split(". ")[0]
    return (first[:200] + "...") if len(first) > 200 else first or type(exc).__name__
