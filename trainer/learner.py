"""The learner: the double-DQN loss written once in ``keras.ops``, and a block's gradient steps
compiled as one call on the backend Keras runs on.

The loss (Hasselt et al. 2016, with a Huber loss): the online network picks the next action, the
target network values it, and the store's ``discount`` (``gamma**k`` for the ``k`` steps of an
n-step return, 0 after a termination) scales the bootstrap; prioritized replay weights it by the
batch's importance weights, and each step returns ``|td|`` for ``store.update_priorities``. With
``cql_alpha`` > 0 it adds conservative Q-learning's term, for learning offline (offline.py).

There is one model. The target network is the same model run on another set of weights through
Keras' stateless API (``Model.stateless_call``), so any Keras model works (Sequential, functional,
subclassed) and nothing is cloned. A ``Learner`` (the interface the run uses) is made for the
backend by ``make_learner``:

- **TensorFlow**: the model's own variables are the online weights, updated by
  ``optimizer.apply_gradients`` (Keras' TensorFlow optimizers have no stateless apply); the block's
  steps are one ``tf.function`` over a ``tf.while_loop``, gradients by ``tf.GradientTape``.
- **JAX**: the online and target weights and the optimizer's variables are arrays held by the
  learner, updated by ``optimizer.stateless_apply``; the block's steps are one ``jax.jit`` over a
  ``lax.scan``, gradients by ``jax.value_and_grad``. ``sync_model`` copies them into the model's
  variables for callbacks that read or save the model.
- **PyTorch**: as on TensorFlow, the model's own variables are the online weights, updated by the
  optimizer's ``apply``; nothing is compiled: the block's steps are a loop of eager steps,
  gradients by ``torch.autograd.grad``.

The target weights are updated inside the compiled call every ``target_every`` gradient steps
(counted by the optimizer's iteration counter, so a resumed run keeps the rhythm), with ``tau``.
``state()`` / ``load_state()`` use plain arrays in the model's weight order and the optimizer's
variable order, the same on every backend, so a run saved on one resumes on another.
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from .config import TrainerError
from .stacks import StackSpec, one_of, tree_map

#: Fields of a block the gradient step reads (``index`` stays on the host, for the priorities).
TRAIN_FIELDS = ("obs", "next_obs", "action", "reward", "discount", "weight")
#: Clip the global gradient norm (cleanrl's practice keeps early updates sane), for the default optimizer.
MAX_GRAD_NORM = 10.0

Forward = Callable[[Any], Any]  # stacks -> Q-values


def td_loss(online: Forward, target: Forward, batch: dict[str, Any], *,
            cql_alpha: float = 0.0) -> tuple[Any, tuple[Any, Any]]:
    """The double-DQN Huber loss of one batch, given the online and the target network's forward
    passes; returns it and (the mean Q(s, a), ``|td|`` of each transition).

    With ``cql_alpha`` > 0 the loss adds conservative Q-learning's term (CQL(H) for discrete
    actions, Kumar et al. 2020): ``cql_alpha`` times the mean of ``logsumexp(Q(s, .)) - Q(s, a)``,
    which pushes down the values of actions the data never took, so that an offline learner does not
    bootstrap from their overestimates."""
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


def make_learner(model: keras.Model, optimizer: keras.optimizers.Optimizer, *, stacks: StackSpec | None = None,
                 stack_shape: Sequence[int] | None = None, dtype: Any = None, target_every: int, tau: float,
                 cql_alpha: float = 0.0) -> Learner:
    """The learner for the backend Keras runs on (``KERAS_BACKEND``: tensorflow, jax or torch), for the model's
    input ``stacks`` (or one array of stacks shaped ``stack_shape`` of ``dtype``)."""
    if stacks is None:
        if stack_shape is None or dtype is None:
            raise TypeError("make_learner needs stacks=StackSpec(...) or stack_shape= and dtype=")
        stacks = StackSpec.single(tuple(stack_shape), dtype)
    backend = keras.backend.backend()
    kinds: dict[str, type[Learner]] = {"tensorflow": TensorFlowLearner, "jax": JaxLearner, "torch": TorchLearner}
    if backend in kinds:
        return kinds[backend](model, optimizer, stacks=stacks, target_every=target_every, tau=tau,  # type: ignore[call-arg]
                              cql_alpha=cql_alpha)
    raise TrainerError(f"Keras runs on {backend!r}; the DQN learner runs on 'tensorflow', 'jax' or 'torch' (set "
                       "KERAS_BACKEND before keras is imported)")


class Learner(abc.ABC):
    """A model's online and target weights, its optimizer's state, acting, and k-step training."""

    backend: str

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, *, target_every: int,
                 tau: float, cql_alpha: float = 0.0) -> None:
        self.model, self.optimizer = model, optimizer
        self.target_every = max(1, int(target_every))
        self.tau = float(tau)
        self.cql_alpha = float(cql_alpha)
        optimizer.build(model.trainable_variables)

    # Acting -------------------------------------------------------------------------------------

    @abc.abstractmethod
    def q_values(self, stacks: Any) -> np.ndarray:
        """Q-values of ``(n, frame_stack, *frame_shape)`` stacks (a dict of them for a Dict store), in
        one forward pass."""

    def act(self, stack: Any) -> int:
        """The greedy action for one stack ``(frame_stack, *frame_shape)`` (or dict of them)."""
        return int(np.argmax(self.q_values(one_of(stack))[0]))

    def act_batch(self, stacks: Any) -> np.ndarray:
        """The greedy actions for ``(n, frame_stack, *frame_shape)`` stacks (or a dict of them), in one
        forward pass."""
        return np.argmax(self.q_values(stacks), axis=1)

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


class _WeightsInModel(Learner):
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
        by_path = {v.path: self._array(t) for v, t in zip(self.model.trainable_variables, self.target, strict=True)}
        by_path.update({v.path: self._array(t)
                        for v, t in zip(self.model.non_trainable_variables, self.target_frozen, strict=True)})
        return {"online": self.online_weights(), "target": [by_path[v.path] for v in self.model.weights],
                "optimizer": [self._array(v.value) for v in self.optimizer.variables]}

    def load_state(self, state: dict[str, list[np.ndarray]]) -> None:
        self.check_state(state)
        self.model.set_weights(state["online"])
        target = {v.path: w for v, w in zip(self.model.weights, state["target"], strict=True)}
        for t, v in zip(self.target, self.model.trainable_variables, strict=True):
            self._assign(t, target[v.path])
        for t, v in zip(self.target_frozen, self.model.non_trainable_variables, strict=True):
            self._assign(t, target[v.path])
        for var, value in zip(self.optimizer.variables, state["optimizer"], strict=True):
            var.assign(value)


class TensorFlowLearner(_WeightsInModel):
    """The model's variables are the online weights; the target's are ``tf.Variable`` copies."""

    backend = "tensorflow"

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, *, stacks: StackSpec,
                 target_every: int, tau: float, cql_alpha: float = 0.0) -> None:
        import tensorflow as tf

        super().__init__(model, optimizer, target_every=target_every, tau=tau, cql_alpha=cql_alpha)
        self.variables = list(model.trainable_variables)
        self.target = [tf.Variable(v.value, trainable=False) for v in model.trainable_variables]
        self.target_frozen = [tf.Variable(v.value, trainable=False) for v in model.non_trainable_variables]
        self._q = tf.function(lambda x: model(x), input_signature=[stacks.tf_signature()])
        self._train = tf.function(self._train_block, reduce_retracing=True)

    def q_values(self, stacks: Any) -> np.ndarray:
        return np.asarray(self._q(stacks))

    def train_block(self, block: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        loss, q_mean, abs_td = self._train({name: block[name] for name in TRAIN_FIELDS})
        return loss.numpy(), q_mean.numpy(), abs_td.numpy()

    def _train_block(self, block: dict[str, Any]) -> tuple[Any, Any, Any]:
        import tensorflow as tf

        model, optimizer = self.model, self.optimizer

        def target(stacks: Any) -> Any:
            return model.stateless_call(self.target, self.target_frozen, stacks)[0]

        k = tf.shape(block["action"])[0]
        losses, q_means, abs_tds = (tf.TensorArray(tf.float32, size=k) for _ in range(3))
        for i in tf.range(k):  # autograph: a tf.while_loop
            batch = {name: tf.nest.map_structure(lambda v: v[i], value) for name, value in block.items()}
            with tf.GradientTape() as tape:
                loss, (q_mean, abs_td) = td_loss(model, target, batch, cql_alpha=self.cql_alpha)
            optimizer.apply_gradients(zip(tape.gradient(loss, self.variables), self.variables, strict=True))
            if optimizer.iterations % self.target_every == 0:
                for t, o in zip(self.target, self.variables, strict=True):
                    t.assign(o.value if self.tau >= 1.0 else self.tau * o.value + (1.0 - self.tau) * t)
            losses = losses.write(i, tf.cast(loss, tf.float32))
            q_means = q_means.write(i, tf.cast(q_mean, tf.float32))
            abs_tds = abs_tds.write(i, tf.cast(abs_td, tf.float32))
        return losses.stack(), q_means.stack(), abs_tds.stack()

    def _array(self, value: Any) -> np.ndarray:
        return np.asarray(value.numpy())

    def _assign(self, copy: Any, value: np.ndarray) -> None:
        copy.assign(value)


class TorchLearner(_WeightsInModel):
    """The model's variables (``torch.nn.Parameter``s) are the online weights; the target's are
    detached tensor copies on the same device. Keras' PyTorch backend compiles nothing: a block's
    steps are a Python loop of eager steps (gradients by ``torch.autograd.grad``, the optimizer's
    ``apply`` under ``torch.no_grad``), so ``steps_per_call`` only sets the size of the blocks the
    store hands over (``store.blocks``)."""

    backend = "torch"

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, *, stacks: StackSpec,
                 target_every: int, tau: float, cql_alpha: float = 0.0) -> None:
        super().__init__(model, optimizer, target_every=target_every, tau=tau, cql_alpha=cql_alpha)
        self.variables = list(model.trainable_variables)
        self.target = [v.value.detach().clone() for v in model.trainable_variables]
        self.target_frozen = [v.value.detach().clone() for v in model.non_trainable_variables]
        weights = model.weights
        self.device = weights[0].value.device if weights else None

    def _tensors(self, tree: Any) -> Any:
        """numpy arrays (a block's, which are read-only: shared, never written) as tensors on the model's device."""
        import torch

        def tensor(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return value.to(self.device)
            with warnings.catch_warnings():  # ("the given NumPy array is not writable": nothing writes it)
                warnings.simplefilter("ignore", UserWarning)
                return torch.as_tensor(np.asarray(value), device=self.device)

        return tree_map(tensor, tree)

    def q_values(self, stacks: Any) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.model(self._tensors(stacks)).cpu().numpy()

    def train_block(self, block: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        import torch

        fields = {name: self._tensors(block[name]) for name in TRAIN_FIELDS}
        model, optimizer, variables = self.model, self.optimizer, self.variables
        parameters = [v.value for v in variables]

        def target(stacks: Any) -> Any:
            with torch.no_grad():
                return model.stateless_call(self.target, self.target_frozen, stacks)[0]

        out: list[tuple[Any, Any, Any]] = []
        for i in range(int(fields["action"].shape[0])):
            batch = {name: tree_map(lambda v: v[i], value) for name, value in fields.items()}
            loss, (q_mean, abs_td) = td_loss(model, target, batch, cql_alpha=self.cql_alpha)
            grads = torch.autograd.grad(loss, parameters)
            with torch.no_grad():
                optimizer.apply(list(grads), variables)
                if self.train_steps % self.target_every == 0:
                    for t, o in zip(self.target, parameters, strict=True):
                        t.copy_(o if self.tau >= 1.0 else self.tau * o + (1.0 - self.tau) * t)
            out.append((loss.detach(), q_mean.detach(), abs_td.detach()))
        loss, q_mean, abs_td = (torch.stack(part).float().cpu().numpy() for part in zip(*out, strict=True))
        return loss, q_mean, abs_td

    def _array(self, value: Any) -> np.ndarray:
        return np.array(value.detach().cpu().numpy())  # (on the CPU, numpy() would share the tensor's memory)

    def _assign(self, copy: Any, value: np.ndarray) -> None:
        import torch

        with torch.no_grad():
            copy.copy_(torch.as_tensor(np.asarray(value), device=copy.device))


class JaxLearner(Learner):
    """The online and target weights and the optimizer's variables are arrays held here."""

    backend = "jax"

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, *, stacks: StackSpec,
                 target_every: int, tau: float, cql_alpha: float = 0.0) -> None:
        import jax

        super().__init__(model, optimizer, target_every=target_every, tau=tau, cql_alpha=cql_alpha)
        self._iteration = [v.path for v in optimizer.variables].index(optimizer.iterations.path)
        self._from_model()
        self.target_params = [ops.copy(p) for p in self.params]
        self.target_frozen = [ops.copy(p) for p in self.frozen]
        self._q = jax.jit(lambda params, stacks: model.stateless_call(params, self.frozen, stacks)[0])
        # The target weights and the optimizer's variables are updated in place on a GPU; the online
        # weights are not, since an acting thread may be reading them. The CPU backend cannot reuse them.
        donate = (1, 2) if jax.default_backend() != "cpu" else ()
        self._train = jax.jit(self._train_block, donate_argnums=donate)

    def _from_model(self) -> None:
        self.params = [v.value for v in self.model.trainable_variables]
        self.frozen = [v.value for v in self.model.non_trainable_variables]
        self.opt_vars = [v.value for v in self.optimizer.variables]

    def q_values(self, stacks: Any) -> np.ndarray:
        return np.asarray(self._q(self.params, stacks))

    def train_block(self, block: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        fields = {name: block[name] for name in TRAIN_FIELDS}
        self.params, self.target_params, self.opt_vars, (loss, q_mean, abs_td) = self._train(
            self.params, self.target_params, self.opt_vars, fields)
        return np.asarray(loss), np.asarray(q_mean), np.asarray(abs_td)

    def _train_block(self, params: list[Any], target_params: list[Any], opt_vars: list[Any],
                     block: dict[str, Any]) -> tuple[Any, ...]:
        import jax

        model, frozen, target_frozen = self.model, self.frozen, self.target_frozen

        def loss(params: list[Any], target_params: list[Any], batch: dict[str, Any]) -> tuple[Any, Any]:
            return td_loss(lambda x: model.stateless_call(params, frozen, x)[0],
                           lambda x: model.stateless_call(target_params, target_frozen, x)[0], batch,
                           cql_alpha=self.cql_alpha)

        grad = jax.value_and_grad(loss, has_aux=True)
        tau = self.tau

        def step(carry: tuple[Any, ...], batch: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            params, target_params, opt_vars = carry
            (value, (q_mean, abs_td)), grads = grad(params, target_params, batch)
            params, opt_vars = self.optimizer.stateless_apply(opt_vars, grads, params)
            due = opt_vars[self._iteration] % self.target_every == 0
            target_params = [ops.where(due, p if tau >= 1.0 else tau * p + (1.0 - tau) * t, t)
                             for p, t in zip(params, target_params, strict=True)]
            return (params, target_params, opt_vars), (value, q_mean, abs_td)

        (params, target_params, opt_vars), out = jax.lax.scan(step, (params, target_params, opt_vars), block)
        return params, target_params, opt_vars, out

    @property
    def train_steps(self) -> int:
        return int(np.asarray(self.opt_vars[self._iteration]))

    def _in_model_order(self, params: list[Any], frozen: list[Any]) -> list[np.ndarray]:
        by_path = dict(zip([v.path for v in self.model.trainable_variables], params, strict=True))
        by_path.update(zip([v.path for v in self.model.non_trainable_variables], frozen, strict=True))
        return [np.asarray(by_path[v.path]) for v in self.model.weights]

    def online_weights(self) -> list[np.ndarray]:
        return self._in_model_order(self.params, self.frozen)

    def set_online_weights(self, weights: list[np.ndarray]) -> None:
        by_path = {v.path: w for v, w in zip(self.model.weights, weights, strict=True)}
        self.params = [ops.convert_to_tensor(by_path[v.path]) for v in self.model.trainable_variables]

    def sync_model(self) -> None:
        for var, value in zip(self.model.trainable_variables, self.params, strict=True):
            var.assign(value)
        for var, value in zip(self.optimizer.variables, self.opt_vars, strict=True):
            var.assign(value)

    def pull_model(self) -> None:
        self.params = [v.value for v in self.model.trainable_variables]

    def state(self) -> dict[str, list[np.ndarray]]:
        return {"online": self.online_weights(), "target": self._in_model_order(self.target_params, self.target_frozen),
                "optimizer": [np.asarray(v) for v in self.opt_vars]}

    def load_state(self, state: dict[str, list[np.ndarray]]) -> None:
        self.check_state(state)
        self.model.set_weights(state["online"])
        for var, value in zip(self.optimizer.variables, state["optimizer"], strict=True):
            var.assign(value)
        self._from_model()
        target = {v.path: w for v, w in zip(self.model.weights, state["target"], strict=True)}
        self.target_params = [ops.convert_to_tensor(target[v.path]) for v in self.model.trainable_variables]
        self.target_frozen = [ops.convert_to_tensor(target[v.path]) for v in self.model.non_trainable_variables]
