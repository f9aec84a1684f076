"""A learning rule: what turns a Q-network's output into actions, and a batch into a loss. The
learners (learner.py, one per Keras backend) compile a rule's ``loss`` into their gradient steps
and act through its ``values``; the target network (a hard copy every ``target_every`` gradient
steps, or Polyak's ``tau``: ``learnerbase.target_update``) and the store's batches are the same
for every rule. A rule is data (its ``get_config``, saved in ``agent.json``) plus pure functions in
``keras.ops``, so it runs unchanged on TensorFlow, JAX and PyTorch.

``DoubleDQN`` is ``DQN``'s own rule (the default). Another rule is one module: a subclass with a
``name``, its model's ``output_shape``, ``values`` and ``loss`` (qrdqn.py, quantile regression), and
its line in rules.py, which maps the names saved in ``agent.json`` back to the classes.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable
from typing import Any, ClassVar

from keras import ops

from .config import TrainerError

Forward = Callable[[Any], Any]  # stacks -> the network's output


class Rule(abc.ABC):
    """How a Q-network's output is read and learned. Subclasses set ``name`` (what ``agent.json``
    records) and take their hyperparameters as keywords, returned by ``get_config``."""

    name: ClassVar[str]

    @abc.abstractmethod
    def output_shape(self, n_actions: int) -> tuple[int, ...]:
        """The model's output for one stack."""

    @abc.abstractmethod
    def output_help(self, n_actions: int) -> str:
        """What the model's last layers must be, for an error message."""

    @abc.abstractmethod
    def values(self, outputs: Any) -> Any:
        """Q-values ``(batch, n_actions)`` from the model's outputs (acting picks their argmax)."""

    @abc.abstractmethod
    def loss(self, online: Forward, target: Forward, batch: dict[str, Any]) -> tuple[Any, tuple[Any, Any]]:
        """The loss of one batch (``obs``, ``next_obs``, ``action``, ``reward``, ``discount``: the
        store's ``gamma**k``, 0 after a termination; ``weight``: prioritized replay's importance
        weights, else ones), given the online and the target network's forward passes; returns it
        and (the mean Q(s, a), a priority per transition: ``|td|`` or its kind)."""

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

    def output_shape(self, n_actions: int) -> tuple[int, ...]:
        return (n_actions,)

    def output_help(self, n_actions: int) -> str:
        return f"its last layer must give one Q-value per action (Dense({n_actions}))"

    def values(self, outputs: Any) -> Any:
        return outputs

    def loss(self, online: Forward, target: Forward, batch: dict[str, Any]) -> tuple[Any, tuple[Any, Any]]:
        return td_loss(online, target, batch, cql_alpha=self.cql_alpha)

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
