"""QR-DQN (Dabney et al. 2017, "Distributional Reinforcement Learning with Quantile Regression"):
the Q-network gives ``n_quantiles`` quantiles of the return per action, ``(batch, n_actions,
n_quantiles)``, at the midpoints ``(2i + 1) / (2 n_quantiles)``; an action's Q-value is their mean.

    model = keras.Sequential([keras.Input((1, 4)), keras.layers.Flatten(),
                              keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(2 * 25), keras.layers.Reshape((2, 25))])
    agent = DQN(model, "runs/qr/replay.zarr", rule=QRDQN(n_quantiles=25))

The loss of one transition is the quantile Huber loss (kappa 1) between its action's quantiles and
the target quantiles ``reward + discount * theta'(s', a*)``, where the target network both picks
``a*`` (the greedy action of its quantiles' means) and values it, as the paper and sb3-contrib's
QR-DQN do: each quantile i is pulled toward every target quantile j with the weight
``|tau_i - 1{delta_ij < 0}|``, summed over i and averaged over j. Prioritized replay weights it by
the batch's importance weights; a transition's priority is its mean ``|delta_ij|``.
"""

from __future__ import annotations

from typing import Any

from keras import ops

from .actions import ActionSpec
from .config import TrainerError
from .rule import Nets, Rule, chosen, whole_number

#: The most quantiles a head may have (the paper's 200 and Dopamine's are well inside).
MAX_QUANTILES = 1024


class QRDQN(Rule):
    """Quantile-regression DQN with ``n_quantiles`` quantiles per action (200 in the paper;
    rl-baselines3-zoo uses 10 for CartPole-v1 and 25 for Acrobot-v1)."""

    name = "qr-dqn"

    def __init__(self, n_quantiles: int = 200) -> None:
        self.n_quantiles = whole_number("n_quantiles", n_quantiles, least=1, most=MAX_QUANTILES)

    def output_shape(self, actions: ActionSpec) -> tuple[int, ...]:
        return (actions.n, self.n_quantiles)

    def output_help(self, actions: ActionSpec) -> str:
        n, n_actions = self.n_quantiles, actions.n
        return (f"QR-DQN's model gives {n} quantiles per action, shape ({n_actions}, {n}) per stack "
                f"(Dense({n_actions * n}) then Reshape(({n_actions}, {n})))")

    def values(self, outputs: Any) -> Any:
        return ops.mean(outputs, axis=-1)

    def loss(self, nets: Nets, batch: dict[str, Any]) -> tuple[Any, tuple[Any, Any]]:
        quantiles = chosen(nets.online(batch["obs"]), batch["action"])  # (batch, n)
        following = nets.target(batch["next_obs"])  # (batch, n_actions, n)
        greedy = ops.argmax(ops.mean(following, axis=-1), axis=1)
        next_quantiles = chosen(following, greedy)
        targets = ops.stop_gradient(ops.expand_dims(batch["reward"], 1)
                                    + ops.expand_dims(batch["discount"], 1) * next_quantiles)
        delta = ops.expand_dims(targets, 1) - ops.expand_dims(quantiles, 2)  # (batch, i: online, j: target)
        size = ops.abs(delta)
        huber = ops.where(size > 1.0, size - 0.5, 0.5 * ops.square(delta))
        n = self.n_quantiles
        midpoints = ops.reshape((ops.arange(n, dtype="float32") + 0.5) / n, (1, n, 1))
        below = ops.stop_gradient(ops.cast(delta < 0, huber.dtype))
        per_transition = ops.mean(ops.sum(ops.abs(midpoints - below) * huber, axis=1), axis=1)
        loss = ops.mean(batch["weight"] * per_transition)
        return loss, (ops.mean(quantiles), ops.stop_gradient(ops.mean(size, axis=(1, 2))))

    def get_config(self) -> dict[str, Any]:
        return {"n_quantiles": self.n_quantiles}

    def check_run(self, config: Any) -> None:
        if config.cql_alpha:
            raise TrainerError(f"cql_alpha is {config.cql_alpha!r}, but conservative Q-learning's term is DQN's "
                               "rule's, not QR-DQN's; leave cql_alpha at 0 with rule=QRDQN(...)")
