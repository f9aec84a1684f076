"""A learning rule: what turns a model's output into actions, and a batch into a loss. The
learners (learner.py, one per Keras backend) compile a rule's ``loss`` into their gradient steps
and act through its ``values`` and ``pick``; the target network (a hard copy every ``target_every``
gradient steps, or Polyak's ``tau``: ``learnerbase.target_update``) and the store's batches are the
same for every rule. A rule is data (its ``get_config``, saved in ``agent.json``) plus pure
functions in ``keras.ops``, so it runs unchanged on TensorFlow, JAX and PyTorch.

``DoubleDQN`` is ``DQN``'s own rule (the default). Another rule is one module: a subclass with a
``name``, its model's ``output_shape``, ``values`` and ``loss`` (qrdqn.py, quantile regression;
sac.py, soft actor-critic on Box actions, which also sets ``discrete``, ``inputs``, ``pick``,
``noise_shape`` and ``defaults``), and its line in rules.py, which maps the names saved in
``agent.json`` back to the classes.

The loss sees the model three ways (``Nets``): ``online`` (the weights being learned), ``target``
(the target weights, no gradient) and ``fixed`` (the online weights with no gradient to them, while
gradients still flow through its inputs: an actor learns through a critic it does not change). The
loss's gradient is taken with respect to every trainable weight at once, so a rule of several
networks keeps each network's loss to its own weights with ``fixed`` and ``stop_gradient``.
"""

from __future__ import annotations

import abc
import dataclasses
import operator
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from keras import ops

from .actions import ActionSpec
from .config import TrainerError

Forward = Callable[[Any], Any]  # the model's inputs (stacks) -> the network's output


@dataclasses.dataclass(frozen=True)
class Nets:
    """The model as one batch's loss sees it (see the module's docstring), and the actions it learns."""

    online: Forward
    target: Forward
    fixed: Forward
    actions: ActionSpec


class Rule(abc.ABC):
    """How a Q-network's output is read and learned. Subclasses set ``name`` (what ``agent.json``
    records) and take their hyperparameters as keywords, returned by ``get_config``."""

    name: ClassVar[str]
    #: The actions it learns: a Discrete space's (True) or a Box's (False).
    discrete: ClassVar[bool] = True
    #: Whether the default optimizer clips the global gradient norm (``learnerbase.MAX_GRAD_NORM``).
    clips: ClassVar[bool] = True
    #: Whether acting takes uniform random moves until ``learning_starts`` (SB3's and cleanrl's SAC).
    warms_up: ClassVar[bool] = False

    @abc.abstractmethod
    def output_shape(self, actions: ActionSpec) -> tuple[int, ...] | list[tuple[int, ...]]:
        """The model's output for one stack (a list: one shape per output of a model of several)."""

    @abc.abstractmethod
    def output_help(self, actions: ActionSpec) -> str:
        """What the model's last layers must be, for an error message."""

    @abc.abstractmethod
    def values(self, outputs: Any) -> Any:
        """What acting reads from the model's outputs: Q-values ``(batch, n_actions)`` (``pick``
        takes their argmax), or a policy's parameters."""

    @abc.abstractmethod
    def loss(self, nets: Nets, batch: dict[str, Any]) -> tuple[Any, tuple[Any, Any]]:
        """The loss of one batch (``obs``, ``next_obs``, ``action``, ``reward``, ``discount``: the
        store's ``gamma**k``, 0 after a termination; ``weight``: prioritized replay's importance
        weights, else ones; ``noise``: standard normal draws of ``noise_shape`` per transition,
        for a rule that has one), given the model's forward passes; returns it and (the mean
        Q(s, a), a priority per transition: ``|td|`` or its kind)."""

    def inputs(self, stacks: Any, actions: ActionSpec) -> Any:
        """What the model takes to act on ``stacks`` (the stacks themselves, unless the model also
        takes actions)."""
        return stacks

    def pick(self, values: np.ndarray, actions: ActionSpec, rng: np.random.Generator | None) -> np.ndarray:
        """Actions from ``values`` (numpy): the greedy ones, or with ``rng`` the ones to explore with
        (a value rule explores epsilon-greedily instead: explore.py, and draws nothing here)."""
        return np.argmax(values, axis=1)

    def noise_shape(self, actions: ActionSpec) -> tuple[int, ...] | None:
        """The shape of the standard normal noise a transition's loss reads (``batch["noise"]``), or None."""
        return None

    def defaults(self) -> dict[str, Any]:
        """Hyperparameters this rule learns with unless they are given (``DQNConfig``'s names)."""
        return {}

    def check_actions(self, actions: ActionSpec, where: str) -> None:
        """Refuse actions this rule does not learn (``where`` names whose they are)."""
        if actions.discrete != self.discrete:
            kind = "a Discrete action space (one Q-value per action)" if self.discrete else "Box actions"
            other = "rule=SAC() for Box actions" if self.discrete else "DQN's rule or QRDQN for Discrete actions"
            raise TrainerError(f"{where} {actions.describe()}; {self.name.upper()} learns {kind}: use {other}")

    def get_config(self) -> dict[str, Any]:
        """The keywords that make this rule again (``agent.json``)."""
        return {}

    def check_run(self, config: Any) -> None:
        """Refuse hyperparameters (a ``DQNConfig``) this rule cannot learn with."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, Rule) and other.get_config() == self.get_config()

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.get_config().items()))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.get_config().items())})"


def whole_number(name: str, value: Any, *, least: int, most: int) -> int:
    """``value`` as an int in [least, most], else TrainerError naming ``name``."""
    try:
        number = operator.index(value)
    except TypeError:
        number = least - 1
    if isinstance(value, bool) or not least <= number <= most:
        raise TrainerError(f"{name} is {value!r}; it must be a whole number in [{least:,}, {most:,}]")
    return int(number)


def chosen(values: Any, actions: Any) -> Any:
    """Each row's entry at its action: ``values`` ``(batch, n_actions, ...)``, ``actions``
    ``(batch,)`` ints (a one-hot product, the same on every backend)."""
    one_hot = ops.one_hot(ops.cast(actions, "int32"), ops.shape(values)[1], dtype=values.dtype)
    while len(one_hot.shape) < len(values.shape):
        one_hot = ops.expand_dims(one_hot, -1)
    return ops.sum(values * one_hot, axis=1)


class DoubleDQN(Rule):
    """Double DQN (Hasselt et al. 2016) with a Huber loss: one Q-value per action; the online
    network picks the next action, the target network values it. With ``cql_alpha`` > 0 the loss
    adds conservative Q-learning's term (CQL(H) for discrete actions, Kumar et al. 2020):
    ``cql_alpha`` times the mean of ``logsumexp(Q(s, .)) - Q(s, a)``, which pushes down the values of
    actions the data never took, so that an offline learner does not bootstrap from their
    overestimates. ``DQN``'s default rule, its ``cql_alpha`` the agent's."""

    name = "dqn"

    def __init__(self, cql_alpha: float = 0.0) -> None:
        self.cql_alpha = float(cql_alpha)

    def output_shape(self, actions: ActionSpec) -> tuple[int, ...]:
        return (actions.n,)

    def output_help(self, actions: ActionSpec) -> str:
        return f"its last layer must give one Q-value per action (Dense({actions.n}))"

    def values(self, outputs: Any) -> Any:
        return outputs

    def loss(self, nets: Nets, batch: dict[str, Any]) -> tuple[Any, tuple[Any, Any]]:
        return td_loss(nets.online, nets.target, batch, cql_alpha=self.cql_alpha)

    def get_config(self) -> dict[str, Any]:
        return {"cql_alpha": self.cql_alpha}


def td_loss(online: Forward, target: Forward, batch: dict[str, Any], *,
            cql_alpha: float = 0.0) -> tuple[Any, tuple[Any, Any]]:
    """``DoubleDQN``'s loss of one batch: returns it and (the mean Q(s, a), ``|td|`` of each transition)."""
    q_all = online(batch["obs"])
    next_action = ops.expand_dims(ops.argmax(online(batch["next_obs"]), axis=1), 1)
    next_value = ops.take_along_axis(target(batch["next_obs"]), next_action, axis=1)[:, 0]
    bootstrap = ops.stop_gradient(batch["reward"] + batch["discount"] * next_value)
    action = ops.expand_dims(ops.cast(batch["action"], "int32"), 1)
    q = ops.take_along_axis(q_all, action, axis=1)[:, 0]
    abs_td = ops.abs(bootstrap - q)
    quadratic = ops.minimum(abs_td, 1.0)
    huber = 0.5 * ops.square(quadratic) + (abs_td - quadratic)
    loss = ops.mean(batch["weight"] * huber)
    if cql_alpha:
        loss = loss + cql_alpha * ops.mean(ops.logsumexp(q_all, axis=1) - q)
    return loss, (ops.mean(q), ops.stop_gradient(abs_td))
