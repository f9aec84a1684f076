"""SAC (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications"): continuous control of
a ``Box`` action space, with twin critics, Polyak-averaged targets and the entropy weight learned
toward ``-action size`` (SB3's ``ent_coef="auto"``).

    model = sac_mlp((1, 3), 1)                  # or sac_model(actor, critic) of your own networks
    agent = DQN(model, "runs/pendulum/replay.zarr", rule=SAC(), learning_rate=1e-3)
    agent.fit(gymnasium.make("Pendulum-v1"), total_timesteps=20_000)

The model is one Keras model, so it saves, loads, checkpoints and goes to actors as any other: it
takes ``{"obs": stacks, "action": actions in [-1, 1]}`` and gives ``[policy, q1, q2, log_alpha]``:
the actor's mean and log standard deviation per action value ``(batch, 2, size)``, each critic's
Q(s, a) ``(batch, 1)``, and the entropy weight's log (``EntropyWeight``, one trainable weight).
Acting feeds zeros as the action and reads the policy: a sample ``tanh(mean + std * noise)``
while training, ``tanh(mean)`` when greedy (evaluation, ``agent.act``), scaled onto the Box's
bounds; the store keeps each action as the env took it, and the loss maps it back to [-1, 1].

One gradient step differentiates the sum of SAC's three losses with respect to every weight; each
loss reaches its own weights only (the rest through ``stop_gradient`` or the ``fixed`` pass):

- the critics: ``0.5 * (q1 - y)**2 + 0.5 * (q2 - y)**2`` (weighted by prioritized replay's
  importance weights), ``y = reward + discount * (min(q1', q2')(s', a') - alpha * log pi(a'|s'))``
  from the target critics, ``a'`` sampled from the actor (no gradient);
- the actor: ``alpha * log pi(a|s) - min(q1, q2)(s, a)``, ``a`` reparameterized, through the
  critics with their weights fixed;
- the entropy weight: ``-log_alpha * (log pi(a|s) - size)``.

With Adam, whose update is per weight, this is each network's own Adam at the same rate. The three
updates are simultaneous (SB3 steps the entropy weight, then the critics, then the actor). The
noise is data: ``batch["noise"]``, two standard normal draws per action value and transition, drawn
by the learner from the run's seed and the gradient step count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
from keras import layers, ops

from .actions import ActionSpec
from .config import TrainerError
from .rule import Nets, Rule

#: SB3's bounds on the policy's log standard deviation.
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
#: Keeps log(1 - tanh(u)**2) finite where tanh(u) rounds to +-1 (SB3's epsilon).
SQUASH_EPSILON = 1e-6


@keras.saving.register_keras_serializable(package="replaystore")
class EntropyWeight(layers.Layer):
    """The log of SAC's entropy weight, one trainable weight (``initial`` the weight itself, 1.0 as
    SB3's ``"auto"``), given once per row of its input, ``(batch, 1)``."""

    def __init__(self, initial: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.initial = float(initial)
        if not self.initial > 0:
            raise ValueError(f"initial is {initial!r}; the entropy weight must be > 0")

    def build(self, input_shape: Any) -> None:
        self.log_alpha = self.add_weight(shape=(), initializer=keras.initializers.Constant(math.log(self.initial)),
                                         name="log_alpha")

    def call(self, rows: Any) -> Any:
        return ops.zeros_like(ops.cast(rows[:, :1], "float32")) + self.log_alpha

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (input_shape[0], 1)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "initial": self.initial}


def sac_actor(stack_shape: Sequence[int], size: int, *, hidden_sizes: Sequence[int] = (256, 256),
              dtype: Any = "float32", name: str = "actor") -> keras.Model:
    """An actor of ``hidden_sizes`` ReLU layers over the flattened stack, giving a mean and a log
    standard deviation per action value, ``(batch, 2, size)`` (SB3's MlpPolicy is 256, 256)."""
    stack = keras.Input(shape=tuple(stack_shape), dtype=np.dtype(dtype).name, name="stack")
    x = layers.Flatten()(layers.Rescaling(1.0)(stack))  # (Rescaling casts to float32)
    for width in hidden_sizes:
        x = layers.Dense(int(width), activation="relu")(x)
    return keras.Model(stack, layers.Reshape((2, int(size)))(layers.Dense(2 * int(size))(x)), name=name)


def sac_critic(stack_shape: Sequence[int], size: int, *, hidden_sizes: Sequence[int] = (256, 256),
               dtype: Any = "float32", name: str = "critic") -> keras.Model:
    """A critic: ``[stacks, actions (batch, size) in [-1, 1]]`` to Q(s, a) ``(batch, 1)``, through
    ``hidden_sizes`` ReLU layers over the flattened stack beside the action."""
    stack = keras.Input(shape=tuple(stack_shape), dtype=np.dtype(dtype).name, name="stack")
    action = keras.Input(shape=(int(size),), name="action")
    x = layers.Concatenate()([layers.Flatten()(layers.Rescaling(1.0)(stack)), action])
    for width in hidden_sizes:
        x = layers.Dense(int(width), activation="relu")(x)
    return keras.Model([stack, action], layers.Dense(1)(x), name=name)


def sac_model(actor: keras.Model, critic: keras.Model, twin: keras.Model | None = None, *,
              initial_alpha: float = 1.0, name: str = "sac") -> keras.Model:
    """SAC's one model from an ``actor`` (stacks to ``(batch, 2, size)``) and a ``critic``
    (``[stacks, actions]`` to ``(batch, 1)``): its twin is ``twin``, or a copy of ``critic``'s
    layers with weights of their own (``keras.models.clone_model``)."""
    for what, part in (("actor", actor), ("critic", critic), ("twin", twin)):
        if part is not None and not isinstance(part, keras.Model):
            raise TrainerError(f"the {what} is a {type(part).__name__}, not a keras.Model")
    if len(actor.inputs) != 1:
        raise TrainerError("sac_model's actor takes one stack input (SAC here learns from one array of stacks)")
    given = actor.inputs[0]
    size = int(np.prod(actor.output_shape[2:])) if len(actor.output_shape) > 2 else 0
    if size < 1 or tuple(actor.output_shape[1:2]) != (2,):
        raise TrainerError(f"the actor gives {actor.output_shape[1:]} per stack; SAC's actor gives a mean and a log "
                           "standard deviation per action value, shape (2, size) (Dense(2 * size), Reshape((2, size)))")
    if twin is None:
        twin = keras.models.clone_model(critic)
        twin.name = f"{critic.name}_twin"
    stack = keras.Input(shape=tuple(given.shape[1:]), dtype=given.dtype, name="obs")
    action = keras.Input(shape=(size,), name="action")
    outputs = [actor(stack), critic([stack, action]), twin([stack, action]),
               EntropyWeight(initial_alpha, name="entropy_weight")(action)]
    return keras.Model({"obs": stack, "action": action}, outputs, name=name)


def sac_mlp(stack_shape: Sequence[int], size: int, *, hidden_sizes: Sequence[int] = (256, 256),
            dtype: Any = "float32", name: str = "sac") -> keras.Model:
    """``sac_model`` of ``sac_actor`` and two ``sac_critic``s, for stacks of vectors (Pendulum's
    ``(1, 3)``) and Box actions of ``size`` values."""
    return sac_model(sac_actor(stack_shape, size, hidden_sizes=hidden_sizes, dtype=dtype),
                     sac_critic(stack_shape, size, hidden_sizes=hidden_sizes, dtype=dtype),
                     sac_critic(stack_shape, size, hidden_sizes=hidden_sizes, dtype=dtype, name="critic_twin"),
                     name=name)


def squashed(policy: Any, noise: Any) -> tuple[Any, Any]:
    """A reparameterized action in [-1, 1] ``tanh(mean + std * noise)`` and its log-probability,
    from the actor's ``(batch, 2, size)`` output and standard normal ``noise`` ``(batch, size)``."""
    mean, log_std = policy[:, 0], ops.clip(policy[:, 1], LOG_STD_MIN, LOG_STD_MAX)
    action = ops.tanh(mean + ops.exp(log_std) * noise)
    gaussian = -0.5 * ops.square(noise) - log_std - 0.5 * math.log(2.0 * math.pi)
    return action, ops.sum(gaussian - ops.log(1.0 - ops.square(action) + SQUASH_EPSILON), axis=1)


class SAC(Rule):
    """Soft actor-critic for ``Box`` actions (the model: ``sac_model`` or ``sac_mlp``); its
    hyperparameters are the agent's (``defaults``: SB3's, learning_rate 3e-4, batch_size 256, tau
    0.005, learning from step 100, a gradient step per env step, uniform random moves until then and
    none after)."""

    name = "sac"
    discrete = False
    clips = False  # (SB3's SAC does not clip its gradients)
    warms_up = True  # (uniform random moves until learning_starts, as SB3's)

    def output_shape(self, actions: ActionSpec) -> list[tuple[int, ...]]:
        return [(2, actions.size), (1,), (1,), (1,)]

    def output_help(self, actions: ActionSpec) -> str:
        return (f"SAC's model takes {{'obs': stacks, 'action': (batch, {actions.size})}} and gives [policy (2, "
                f"{actions.size}), q1 (1,), q2 (1,), log_alpha (1,)] per stack: build it with "
                "replaystore.trainer.sac_model(actor, critic) or sac_mlp")

    def inputs(self, stacks: Any, actions: ActionSpec) -> Any:
        stacks = ops.convert_to_tensor(stacks)  # (Keras refuses a call of numpy arrays beside tensors)
        return {"obs": stacks, "action": ops.zeros((ops.shape(stacks)[0], actions.size), "float32")}

    def values(self, outputs: Any) -> Any:
        return outputs[0]

    def pick(self, values: np.ndarray, actions: ActionSpec, rng: np.random.Generator | None) -> np.ndarray:
        mean = values[:, 0]
        if rng is None:
            return actions.scaled(np.tanh(mean))
        std = np.exp(np.clip(values[:, 1], LOG_STD_MIN, LOG_STD_MAX))
        return actions.scaled(np.tanh(mean + std * rng.standard_normal(mean.shape, dtype=np.float32)))

    def noise_shape(self, actions: ActionSpec) -> tuple[int, ...]:
        return (2, actions.size)

    def defaults(self) -> dict[str, Any]:
        return {"learning_rate": 3e-4, "batch_size": 256, "learning_starts": 100, "train_frequency": 1,
                "target_network_frequency": 1, "tau": 0.005, "n_step": 1, "start_e": 0.0, "end_e": 0.0}

    def check_run(self, config: Any) -> None:
        if config.cql_alpha:
            raise TrainerError(f"cql_alpha is {config.cql_alpha!r}, but conservative Q-learning's term is DQN's "
                               "rule's, not SAC's; leave cql_alpha at 0 with rule=SAC()")
        if config.her_n_sampled_goal:
            raise TrainerError("SAC here learns from one array of stacks; hindsight relabelling (her_n_sampled_goal) "
                               "needs a goal env's Dict observations: leave it at 0 with rule=SAC()")

    def loss(self, nets: Nets, batch: dict[str, Any]) -> tuple[Any, tuple[Any, Any]]:
        actions, noise = nets.actions, batch["noise"]
        obs, next_obs = batch["obs"], batch["next_obs"]
        taken = actions.unit(batch["action"])
        policy, q1, q2, log_alpha = nets.online({"obs": obs, "action": taken})
        log_alpha = log_alpha[0, 0]
        alpha = ops.exp(ops.stop_gradient(log_alpha))
        following = nets.fixed({"obs": next_obs, "action": ops.zeros_like(taken)})[0]
        next_action, next_log_prob = squashed(following, noise[:, 1])
        _, q1_next, q2_next, _ = nets.target({"obs": next_obs, "action": ops.stop_gradient(next_action)})
        soft = ops.minimum(q1_next, q2_next)[:, 0] - alpha * next_log_prob
        y = ops.stop_gradient(batch["reward"] + batch["discount"] * soft)
        td1, td2 = q1[:, 0] - y, q2[:, 0] - y
        critics = 0.5 * ops.mean(batch["weight"] * (ops.square(td1) + ops.square(td2)))
        action, log_prob = squashed(policy, noise[:, 0])
        _, q1_pi, q2_pi, _ = nets.fixed({"obs": obs, "action": action})
        actor = ops.mean(alpha * log_prob - ops.minimum(q1_pi, q2_pi)[:, 0])
        entropy = -log_alpha * ops.mean(ops.stop_gradient(log_prob - actions.size))
        return critics + actor + entropy, (ops.mean(q1), ops.stop_gradient(ops.abs(td1)))
