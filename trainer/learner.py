"""The learner: a learning rule's loss (rule.py: double DQN by default, with conservative
Q-learning's term for offline learning; qrdqn.py: quantile regression), written once in
``keras.ops``, and a block's gradient steps compiled as one call on the backend Keras runs on
(here, one learner per backend; learnerbase.py has the ``Learner`` interface). The store's
``discount`` (``gamma**k`` for the ``k`` steps of an n-step return, 0 after a termination) scales
the bootstrap; prioritized replay weights the loss by the batch's importance weights, and each
step returns a priority per transition for ``store.update_priorities``.

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

import warnings
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from .actions import ActionSpec
from .config import TrainerError
from .learnerbase import MAX_GRAD_NORM, TRAIN_FIELDS, Learner, WeightsInModel, target_update, td_loss
from .rule import Rule
from .stacks import StackSpec, tree_map

# (the loss, the interface and the clip norm stay importable from here, where they were before learnerbase.py)
__all__ = ["MAX_GRAD_NORM", "TRAIN_FIELDS", "JaxLearner", "Learner", "TensorFlowLearner", "TorchLearner", "make_learner",
           "td_loss"]

def make_learner(model: keras.Model, optimizer: keras.optimizers.Optimizer, *, stacks: StackSpec | None = None,
                 stack_shape: Sequence[int] | None = None, dtype: Any = None, target_every: int, tau: float,
                 rule: Rule | None = None, actions: ActionSpec | None = None, seed: int = 0) -> Learner:
    """The learner for the backend Keras runs on (``KERAS_BACKEND``: tensorflow, jax or torch), for the model's
    input ``stacks`` (or one array of stacks shaped ``stack_shape`` of ``dtype``), learning by ``rule``
    (double DQN when None) in ``actions`` (Discrete, as many as the model's Q-values, when None);
    ``seed`` seeds the noise of a rule that reads some (SAC's)."""
    if stacks is None:
        if stack_shape is None or dtype is None:
            raise TypeError("make_learner needs stacks=StackSpec(...) or stack_shape= and dtype=")
        stacks = StackSpec.single(tuple(stack_shape), dtype)
    backend = keras.backend.backend()
    kinds: dict[str, type[Learner]] = {"tensorflow": TensorFlowLearner, "jax": JaxLearner, "torch": TorchLearner}
    if backend in kinds:
        return kinds[backend](model, optimizer, stacks=stacks, target_every=target_every, tau=tau,  # type: ignore[call-arg]
                              rule=rule, actions=actions, seed=seed)
    raise TrainerError(f"Keras runs on {backend!r}; the DQN learner runs on 'tensorflow', 'jax' or 'torch' (set "
                       "KERAS_BACKEND before keras is imported)")


class TensorFlowLearner(WeightsInModel):
    """The model's variables are the online weights; the target's are ``tf.Variable`` copies."""

    backend = "tensorflow"

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, *, stacks: StackSpec,
                 target_every: int, tau: float, rule: Rule | None = None, actions: ActionSpec | None = None,
                 seed: int = 0) -> None:
        import tensorflow as tf

        super().__init__(model, optimizer, target_every=target_every, tau=tau, rule=rule, actions=actions, seed=seed)
        self.variables = list(model.trainable_variables)
        self.target = [tf.Variable(v.value, trainable=False) for v in model.trainable_variables]
        self.target_frozen = [tf.Variable(v.value, trainable=False) for v in model.non_trainable_variables]
        self._q = tf.function(lambda x: self.rule.values(model(self.rule.inputs(x, self.actions))),
                              input_signature=[stacks.tf_signature()])
        self._train = tf.function(self._train_block, reduce_retracing=True)

    def q_values(self, stacks: Any) -> np.ndarray:
        return np.asarray(self._q(stacks))

    def train_block(self, block: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        loss, q_mean, abs_td = self._train(self.with_noise(block))
        return loss.numpy(), q_mean.numpy(), abs_td.numpy()

    def _train_block(self, block: dict[str, Any]) -> tuple[Any, Any, Any]:
        import tensorflow as tf

        model, optimizer = self.model, self.optimizer

        def target(stacks: Any) -> Any:
            return model.stateless_call(self.target, self.target_frozen, stacks)[0]

        def fixed(stacks: Any) -> Any:
            return model.stateless_call([tf.stop_gradient(v.value) for v in self.variables],
                                        [v.value for v in model.non_trainable_variables], stacks)[0]

        k = tf.shape(block["action"])[0]
        losses, q_means, abs_tds = (tf.TensorArray(tf.float32, size=k) for _ in range(3))
        for i in tf.range(k):  # autograph: a tf.while_loop
            batch = {name: tf.nest.map_structure(lambda v: v[i], value) for name, value in block.items()}
            with tf.GradientTape() as tape:
                loss, (q_mean, abs_td) = self.loss(model, target, fixed, batch)
            optimizer.apply_gradients(zip(tape.gradient(loss, self.variables), self.variables, strict=True))
            if optimizer.iterations % self.target_every == 0:
                for t, o in zip(self.target, self.variables, strict=True):
                    t.assign(target_update(o.value, t, self.tau))
            losses = losses.write(i, tf.cast(loss, tf.float32))
            q_means = q_means.write(i, tf.cast(q_mean, tf.float32))
            abs_tds = abs_tds.write(i, tf.cast(abs_td, tf.float32))
        return losses.stack(), q_means.stack(), abs_tds.stack()

    def _array(self, value: Any) -> np.ndarray:
        return np.asarray(value.numpy())

    def _assign(self, copy: Any, value: np.ndarray) -> None:
        copy.assign(value)


class TorchLearner(WeightsInModel):
    """The model's variables (``torch.nn.Parameter``s) are the online weights; the target's are
    detached tensor copies on the same device. Keras' PyTorch backend compiles nothing: a block's
    steps are a Python loop of eager steps (gradients by ``torch.autograd.grad``, the optimizer's
    ``apply`` under ``torch.no_grad``), so ``steps_per_call`` only sets the size of the blocks the
    store hands over (``store.blocks``)."""

    backend = "torch"

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, *, stacks: StackSpec,
                 target_every: int, tau: float, rule: Rule | None = None, actions: ActionSpec | None = None,
                 seed: int = 0) -> None:
        super().__init__(model, optimizer, target_every=target_every, tau=tau, rule=rule, actions=actions, seed=seed)
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
            return self.rule.values(self.model(self.rule.inputs(self._tensors(stacks), self.actions))).cpu().numpy()

    def train_block(self, block: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        import torch

        fields = {name: self._tensors(value) for name, value in self.with_noise(block).items()}
        model, optimizer, variables = self.model, self.optimizer, self.variables
        parameters = [v.value for v in variables]

        def target(stacks: Any) -> Any:
            with torch.no_grad():
                return model.stateless_call(self.target, self.target_frozen, stacks)[0]

        def fixed(stacks: Any) -> Any:
            return model.stateless_call([p.detach() for p in parameters],
                                        [v.value for v in model.non_trainable_variables], stacks)[0]

        out: list[tuple[Any, Any, Any]] = []
        step = self.train_steps  # (read once: on a GPU each read of the counter waits for the device)
        for i in range(int(fields["action"].shape[0])):
            batch = {name: tree_map(lambda v: v[i], value) for name, value in fields.items()}
            loss, (q_mean, abs_td) = self.loss(model, target, fixed, batch)
            grads = torch.autograd.grad(loss, parameters)
            with torch.no_grad():
                optimizer.apply(list(grads), variables)
                step += 1  # (apply counted it)
                if step % self.target_every == 0:
                    for t, o in zip(self.target, parameters, strict=True):
                        t.copy_(target_update(o, t, self.tau))
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
                 target_every: int, tau: float, rule: Rule | None = None, actions: ActionSpec | None = None,
                 seed: int = 0) -> None:
        import jax

        super().__init__(model, optimizer, target_every=target_every, tau=tau, rule=rule, actions=actions, seed=seed)
        self._iteration = [v.path for v in optimizer.variables].index(optimizer.iterations.path)
        self._from_model()
        self.target_params = [ops.copy(p) for p in self.params]
        self.target_frozen = [ops.copy(p) for p in self.frozen]
        self._q = jax.jit(lambda params, stacks: self.rule.values(
            model.stateless_call(params, self.frozen, self.rule.inputs(stacks, self.actions))[0]))
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
        fields = self.with_noise(block)
        self.params, self.target_params, self.opt_vars, (loss, q_mean, abs_td) = self._train(
            self.params, self.target_params, self.opt_vars, fields)
        return np.asarray(loss), np.asarray(q_mean), np.asarray(abs_td)

    def _train_block(self, params: list[Any], target_params: list[Any], opt_vars: list[Any],
                     block: dict[str, Any]) -> tuple[Any, ...]:
        import jax

        model, frozen, target_frozen = self.model, self.frozen, self.target_frozen

        def loss(params: list[Any], target_params: list[Any], batch: dict[str, Any]) -> tuple[Any, Any]:
            return self.loss(lambda x: model.stateless_call(params, frozen, x)[0],
                             lambda x: model.stateless_call(target_params, target_frozen, x)[0],
                             lambda x: model.stateless_call([jax.lax.stop_gradient(p) for p in params], frozen, x)[0],
                             batch)

        grad = jax.value_and_grad(loss, has_aux=True)
        tau = self.tau

        def step(carry: tuple[Any, ...], batch: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            params, target_params, opt_vars = carry
            (value, (q_mean, abs_td)), grads = grad(params, target_params, batch)
            params, opt_vars = self.optimizer.stateless_apply(opt_vars, grads, params)
            due = opt_vars[self._iteration] % self.target_every == 0
            target_params = [ops.where(due, target_update(p, t, tau), t)
                             for p, t in zip(params, target_params, strict=True)]
            return (params, target_params, opt_vars), (value, q_mean, abs_td)

        (params, target_params, opt_vars), out = jax.lax.scan(step, (params, target_params, opt_vars), block)
        return params, target_params, opt_vars, out

    @property
    def train_steps(self) -> int:
        return int(np.asarray(self.opt_vars[self._iteration]))

    def _in_model_order(self, params: list[Any], frozen: list[Any]) -> list[np.ndarray]:
        by_var = dict(zip([id(v) for v in self.model.trainable_variables], params, strict=True))
        by_var.update(zip([id(v) for v in self.model.non_trainable_variables], frozen, strict=True))
        return [np.asarray(by_var[id(v)]) for v in self.model.weights]

    def online_weights(self) -> list[np.ndarray]:
        return self._in_model_order(self.params, self.frozen)

    def set_online_weights(self, weights: list[np.ndarray]) -> None:
        by_var = {id(v): w for v, w in zip(self.model.weights, weights, strict=True)}
        self.params = [ops.convert_to_tensor(by_var[id(v)]) for v in self.model.trainable_variables]

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
        target = {id(v): w for v, w in zip(self.model.weights, state["target"], strict=True)}
        self.target_params = [ops.convert_to_tensor(target[id(v)]) for v in self.model.trainable_variables]
        self.target_frozen = [ops.convert_to_tensor(target[id(v)]) for v in self.model.non_trainable_variables]
