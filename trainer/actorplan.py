"""What a Ray actor process needs to act for an agent (actors.py runs them), as plain data made
by the process that learns: an ``ActorPlan``. ``plan_for`` makes one from an agent, for
``DQN.fit(env, ..., actors=N)`` (the env's gymnasium ``EnvSpec``) and for ``replaystore-train
--actors N`` (its env id and flags) alike; ``check_actors`` refuses what actors cannot act with."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from .config import TrainerError

#: The most actor processes a run may start.
MAX_ACTORS = 256


@dataclasses.dataclass
class ActorPlan:
    """Everything an actor process needs, as data (Ray sends it to each): where the store is, how
    to make the envs, the Q-network's ``.keras`` bytes, the rule, and the acting schedule."""

    store: str  # a local path (absolute) or a URL
    storage_options: dict[str, Any] | None
    envs_per_actor: int
    actors: int
    model: bytes  # the Q-network's .keras file, read back with custom_objects and safe_mode
    rule: dict[str, Any] | None  # rules.rule_to_json's (None: double DQN)
    frame_stack: int
    total_timesteps: int
    start_e: float
    end_e: float
    exploration_fraction: float
    clip_reward: bool
    terminal_on_life_loss: bool
    seed: int
    learning_starts: int
    batch_size: int
    warmup: bool = False  # uniform random moves until learning_starts (the rule's warms_up)
    env_spec: Any = None  # gymnasium's EnvSpec of the env passed to fit (gym.make(spec) makes its copies)
    env_id: str = ""  # else the command line's id and keywords (envs.make_vector_env)
    env_kwargs: dict[str, Any] | None = None
    custom_objects: dict[str, Any] | None = None
    safe_mode: bool = True
    imports: tuple[str, ...] = ()  # modules the caller named to import first (--model's, registering its layers)
    actor_restarts: int = 3
    ray_address: str = ""
    lease_wait: float = 0.0  # seconds to wait for a dead writer's lease on its streams (a store at a URL)

    def streams(self, index: int) -> list[int]:
        """The streams actor ``index`` writes."""
        return list(range(index * self.envs_per_actor, (index + 1) * self.envs_per_actor))


def saved_model(model: Any) -> bytes:
    """The model's ``.keras`` file, as bytes (what the actors load)."""
    with tempfile.TemporaryDirectory(prefix="replaystore-actor-model-") as tmp:
        path = Path(tmp) / "model.keras"
        model.save(path)
        return path.read_bytes()


def check_actors(actors: Any, env: Any, source: Any, config: Any) -> None:
    """Refuse ``fit(..., actors=N)`` where actors cannot act for the agent, saying what to pass."""
    if isinstance(actors, bool) or not isinstance(actors, int) or not 0 <= actors <= MAX_ACTORS:
        raise TrainerError(f"actors is {actors!r}; it must be an integer from 0 (act in this process) to {MAX_ACTORS}")
    if not actors:
        return
    if source is not None:
        raise TrainerError("pass actors or source, not both")
    if hasattr(env, "num_envs") or getattr(env, "spec", None) is None:
        raise TrainerError("with actors, pass one env made by gymnasium.make (wrappers too): each actor makes its own "
                           "copy with gymnasium.make(env.spec); this env has no spec" if not hasattr(env, "num_envs")
                           else "with actors, pass one env made by gymnasium.make, not a vector env: each actor "
                           "makes its own copy of it with gymnasium.make(env.spec)")
    if config.replay_ratio != "auto" and config.ratio() <= 0:
        raise TrainerError("actors act beside the learner, held to the replay ratio: give replay_ratio 'auto' or a "
                           "number > 0, not 0 (lockstep)")


def plan_for(agent: Any, actors: int, envs_per_actor: int, total_timesteps: int, **how: Any) -> ActorPlan:
    """The plan of ``agent``'s actors: its store, its model as saved, its rule and hyperparameters;
    ``how`` names the envs (``env_spec``, or ``env_id`` and ``env_kwargs``) and the command line's
    own settings (``imports``, ``actor_restarts``, ``ray_address``, ``lease_wait``, ``storage_options``)."""
    from .models import check_reloads_once
    from .rule import DoubleDQN
    from .rules import rule_to_json
    from .stores import place

    check_reloads_once(agent)  # (the actors load the model as saved: one that does not load back is refused here)
    config, learner = agent.config, agent.built()
    learner.sync_model()  # (on JAX the model's variables take the learner's weights)
    how.setdefault("storage_options", agent.replay.storage_options)
    return ActorPlan(store=place(agent.location), envs_per_actor=envs_per_actor, actors=actors,
                     model=saved_model(agent.model), rule=None if isinstance(agent.rule, DoubleDQN) else rule_to_json(agent.rule),
                     frame_stack=agent.stacks.frame_stack, total_timesteps=total_timesteps, start_e=config.start_e,
                     end_e=config.end_e, exploration_fraction=config.exploration_fraction,
                     clip_reward=config.clip_reward, terminal_on_life_loss=config.terminal_on_life_loss,
                     seed=config.seed, learning_starts=config.learning_starts, batch_size=config.batch_size,
                     warmup=agent.rule.warms_up,
                     custom_objects=agent.loading.custom_objects, safe_mode=agent.loading.safe_mode, **how)
