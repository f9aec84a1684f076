"""What every learner shares: the ``Learner`` interface the run uses (a learning rule's loss,
rule.py, compiled into k gradient steps per call, and acting through the rule's Q-values), the
target network's update written once (``target_update``), and ``WeightsInModel``, the part of a learner whose online
weights are the model's own variables (TensorFlow's and PyTorch's). The learners per backend, and
``make_learner``, are learner.py's.
"""

from __future__ import annotations

import abc
from typing import Any

import keras
import numpy as np

from .actions import ActionSpec
from .config import TrainerError
from .rule import DoubleDQN, Forward, Nets, Rule, td_loss
from .stacks import one_of

__all__ = ["MAX_GRAD_NORM", "TRAIN_FIELDS", "Forward", "Learner", "WeightsInModel", "target_update", "td_loss"]

#: Fields of a block the gradient step reads (``index`` stays on the host, for the priorities).
TRAIN_FIELDS = ("obs", "next_obs", "action", "reward", "discount", "weight")
#: Clip the global gradient norm (cleanrl's practice keeps early updates sane), for the default optimizer.
MAX_GRAD_NORM = 10.0

def target_update(online: Any, target: Any, tau: float) -> Any:
    """A target weight's new value, written once for every backend: the online weight itself (a hard
    copy) at ``tau`` 1, else Polyak's ``tau * online + (1 - tau) * target``."""
    return online if tau >= 1.0 else tau * online + (1.0 - tau) * target


class Learner(abc.ABC):
    """A model's online and target weights, its optimizer's state, acting, and k-step training."""

    backend: str

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, *, target_every: int,
                 tau: float, rule: Rule | None = None, actions: ActionSpec | None = None, seed: int = 0) -> None:
        """``actions``: what the model acts in (the number of its Q-values when None); ``seed``
        seeds the noise a rule's loss reads (``Rule.noise_shape``), drawn per block from the
        gradient step count, so a resumed run draws what it would have drawn."""
        self.model, self.optimizer = model, optimizer
        self.target_every = max(1, int(target_every))
        self.tau = float(tau)
        self.rule = rule if rule is not None else DoubleDQN()
        # (a value rule's loss and argmax do not read the number of actions: one stands in when not given)
        self.actions = actions if actions is not None else ActionSpec(n=1)
        self.seed = int(seed)
        self.noise = self.rule.noise_shape(self.actions)
        optimizer.build(model.trainable_variables)

    def loss(self, online: Forward, target: Forward, fixed: Forward, batch: dict[str, Any]) -> tuple[Any, tuple[Any, Any]]:
        """The rule's loss of one batch (what each backend's compiled step differentiates)."""
        return self.rule.loss(Nets(online, target, fixed, self.actions), batch)

    def with_noise(self, block: dict[str, Any]) -> dict[str, Any]:
        """The block's fields the step reads, with the rule's noise (``(k, batch, *noise_shape)``
        float32, from the seed and the gradient step count) where it has some."""
        fields = {name: block[name] for name in TRAIN_FIELDS}
        if self.noise is not None:
            k, batch = (int(d) for d in tuple(block["reward"].shape)[:2])
            rng = np.random.default_rng((self.seed, self.train_steps))
            fields["noise"] = rng.standard_normal((k, batch, *self.noise), dtype=np.float32)
        return fields

    # Acting -------------------------------------------------------------------------------------

    @abc.abstractmethod
    def q_values(self, stacks: Any) -> np.ndarray:
        """Q-values of ``(n, frame_stack, *frame_shape)`` stacks (a dict of them for a Dict store), in
        one forward pass (the rule's ``values`` of the model's outputs: a policy's parameters for SAC)."""

    def act(self, stack: Any) -> Any:
        """The greedy action for one stack ``(frame_stack, *frame_shape)`` (or dict of them)."""
        return self.actions.one(self.act_batch(one_of(stack)))

    def act_batch(self, stacks: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        """The greedy actions for ``(n, frame_stack, *frame_shape)`` stacks (or a dict of them), in one
        forward pass; with ``rng``, the rule's exploring ones (a policy's samples: ``Rule.pick``)."""
        return self.rule.pick(self.q_values(stacks), self.actions, rng)

    # Learning -----------------------------------------------------------------------------------

    @abc.abstractmethod
    def train_block(self, block: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One gradient step per batch of ``block`` (``(k, batch, ...)`` arrays or tensors), in one
        compiled call; returns per step the loss and the mean Q(s, a), and ``|td|`` per transition
        ``(k, batch)``."""

    @property
    @abc.abstractmethod
    def train_steps(self) -> int:
        """Gradient steps taken (the optimizer's iteration counter, restored with the checkpoint)."""

    # Weights ------------------------------------------------------------------------------------

    @abc.abstractmethod
    def online_weights(self) -> list[np.ndarray]:
        """The online weights as plain arrays in the model's weight order (``model.get_weights()``)."""

    @abc.abstractmethod
    def set_online_weights(self, weights: list[np.ndarray]) -> None:
        """Act with these online weights (``online_weights`` of another learner: a Ray actor's)."""

    @abc.abstractmethod
    def sync_model(self) -> None:
        """Make the model's variables hold the online weights (for callbacks that read or save it)."""

    @abc.abstractmethod
    def pull_model(self) -> None:
        """Take the model's variables as the online weights (a callback set them:
        ``EarlyStopping(restore_best_weights=True)``)."""

    @abc.abstractmethod
    def state(self) -> dict[str, list[np.ndarray]]:
        """The checkpoint's arrays: ``online`` and ``target`` weights in model order, the ``optimizer``'s variables."""

    @abc.abstractmethod
    def load_state(self, state: dict[str, list[np.ndarray]]) -> None:
        """Take ``state()``'s arrays (of a learner on either backend)."""

    def check_state(self, state: dict[str, list[np.ndarray]]) -> None:
        """Refuse a checkpoint saved with another model or optimizer, saying which part differs."""
        weights, variables = self.model.weights, self.optimizer.variables
        if len(state["online"]) != len(weights) or len(state["optimizer"]) != len(variables):
            raise TrainerError(f"the checkpoint holds {len(state['online'])} weights and {len(state['optimizer'])} "
                               f"optimizer variables, the model and optimizer have {len(weights)} and "
                               f"{len(variables)}: it was saved with another model or optimizer")
        for var, value in zip(weights, state["online"], strict=True):
            if tuple(var.shape) != np.shape(value):
                raise TrainerError(f"the checkpoint's weight for {var.path} has shape {np.shape(value)}, the model's "
                                   f"{tuple(var.shape)}: it was saved with another model")


class WeightsInModel(Learner):
    """A learner whose online weights are the model's own variables, updated in place by the
    optimizer (TensorFlow, PyTorch); ``target`` and ``target_frozen`` hold the target network's
    copies of the trainable and non-trainable ones, in the backend's own tensors."""

    target: list[Any]
    target_frozen: list[Any]

    @abc.abstractmethod
    def _array(self, value: Any) -> np.ndarray:
        """A variable's value or a target copy as a numpy array of its own (not a view of the
        tensor, which later updates write in place)."""

    @abc.abstractmethod
    def _assign(self, copy: Any, value: np.ndarray) -> None:
        """Set a target copy to ``value``."""

    @property
    def train_steps(self) -> int:
        return int(self._array(self.optimizer.iterations.value))

    def online_weights(self) -> list[np.ndarray]:
        return [np.asarray(w) for w in self.model.get_weights()]

    def set_online_weights(self, weights: list[np.ndarray]) -> None:
        self.model.set_weights(weights)

    def sync_model(self) -> None:
        pass  # the model's variables are the online weights

    def pull_model(self) -> None:
        pass

    def state(self) -> dict[str, list[np.ndarray]]:
        by_var = {id(v): self._array(t) for v, t in zip(self.model.trainable_variables, self.target, strict=True)}
        by_var.update({id(v): self._array(t)
                        for v, t in zip(self.model.non_trainable_variables, self.target_frozen, strict=True)})
        return {"online": self.online_weights(), "target": [by_var[id(v)] for v in self.model.weights],
                "optimizer": [self._array(v.value) for v in self.optimizer.variables]}

    def load_state(self, state: dict[str, list[np.ndarray]]) -> None:
        self.check_state(state)
        self.model.set_weights(state["online"])
        target = {id(v): w for v, w in zip(self.model.weights, state["target"], strict=True)}
        for t, v in zip(self.target, self.model.trainable_variables, strict=True):
            self._assign(t, target[id(v)])
        for t, v in zip(self.target_frozen, self.model.non_trainable_variables, strict=True):
            self._assign(t, target[id(v)])
        for var, value in zip(self.optimizer.variables, state["optimizer"], strict=True):
            var.assign(value)
