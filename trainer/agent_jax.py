"""The DQN agent on Keras 3's JAX backend (``KERAS_BACKEND=jax``): the same networks, loss and
optimizer as agent.py (TensorFlow), written with Keras' stateless API so the whole learner is pure
JAX functions compiled by ``jax.jit``.

- The online and target weights and Adam's variables live as JAX arrays in this object (``params``,
  ``target_params``, ``opt_vars``); the Keras models and optimizer only supply the computation
  (``Model.stateless_call``, ``Optimizer.stateless_apply``).
- ``train_block`` runs one gradient step per batch of a block from ``store.jax_blocks`` (shape
  ``(k, batch, ...)``) in one compiled call (``lax.scan``): the device never waits on Python
  between the k steps. The target network is updated inside the scan, every ``target_every``
  gradient steps (counted by Adam's iteration counter, so a resumed run keeps the rhythm), with
  ``tau`` (1: a hard copy).
- Priorities (``|td|`` of each transition) come back once per block: with ``--prioritized`` the
  block's k batches were all drawn with the priorities of the moment the block was drawn, and new
  priorities are written after the call (a lag of up to one block plus the blocks in flight).
- ``state()`` / ``load_state()`` use the same plain arrays in the same order as agent.py, so a run
  checkpointed on one backend resumes on the other.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from trainer.networks import MAX_GRAD_NORM, TRAIN_FIELDS, build_q_network, keras_state, load_keras_state


class JaxAgent:
    """Online and target networks, Adam, acting and k-step training, as JAX arrays and jitted calls."""

    backend = "jax"

    def __init__(self, stack_shape: tuple[int, ...], dtype: Any, n_actions: int, *, learning_rate: float,
                 hidden_sizes: list[int], target_every: int, tau: float) -> None:
        if keras.backend.backend() != "jax":
            raise RuntimeError(f"JaxAgent needs KERAS_BACKEND=jax set before keras is imported; keras runs on "
                               f"{keras.backend.backend()}")
        self.n_actions = n_actions
        self.target_every = max(1, int(target_every))
        self.tau = float(tau)
        self.online = build_q_network(stack_shape, dtype, n_actions, hidden_sizes=hidden_sizes, name="online")
        self.target = build_q_network(stack_shape, dtype, n_actions, hidden_sizes=hidden_sizes, name="target")
        self.optimizer = keras.optimizers.Adam(learning_rate=learning_rate, global_clipnorm=MAX_GRAD_NORM)
        self.optimizer.build(self.online.trainable_variables)
        self._iteration = [v.path for v in self.optimizer.variables].index(self.optimizer.iterations.path)
        self.params = [v.value for v in self.online.trainable_variables]
        self.frozen = [v.value for v in self.online.non_trainable_variables]
        self.target_params = [jnp.array(p) for p in self.params]
        self.target_frozen = [v.value for v in self.target.non_trainable_variables]
        self.opt_vars = [v.value for v in self.optimizer.variables]
        self._q = jax.jit(lambda params, stack: self.online.stateless_call(params, self.frozen, stack)[0])
        # The target weights and Adam's variables are updated in place on a GPU; the online weights are
        # not, since an acting thread may be reading them (--replay-ratio). The CPU backend cannot reuse them.
        donate = (1, 2) if jax.default_backend() != "cpu" else ()
        self._train = jax.jit(self._train_block, donate_argnums=donate)

    # Acting -------------------------------------------------------------------------------------

    def act(self, stack: np.ndarray) -> int:
        """The greedy action for one stack ``(frame_stack, *frame_shape)``."""
        return int(np.argmax(np.asarray(self._q(self.params, stack[None]))[0]))

    def act_batch(self, stacks: np.ndarray) -> np.ndarray:
        """The greedy actions for ``(n, frame_stack, *frame_shape)`` stacks, in one forward pass."""
        return np.argmax(np.asarray(self._q(self.params, stacks)), axis=1)

    # Learning -----------------------------------------------------------------------------------

    def train_block(self, block: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One gradient step per batch of ``block`` (``(k, batch, ...)`` arrays), in one compiled call;
        returns per step the loss and the mean Q(s, a), and ``|td|`` per transition ``(k, batch)``."""
        fields = {name: block[name] for name in TRAIN_FIELDS}
        self.params, self.target_params, self.opt_vars, out = self._train(self.params, self.target_params,
                                                                          self.opt_vars, fields)
        loss, q_mean, abs_td = out
        return np.asarray(loss), np.asarray(q_mean), np.asarray(abs_td)

    def _loss(self, params: list[Any], target_params: list[Any], batch: dict[str, Any]) -> tuple[Any, tuple[Any, Any]]:
        """The double-DQN Huber loss of agent.py, as a function of the online weights."""
        q_all, _ = self.online.stateless_call(params, self.frozen, batch["obs"])
        next_online, _ = self.online.stateless_call(params, self.frozen, batch["next_obs"])
        next_target, _ = self.target.stateless_call(target_params, self.target_frozen, batch["next_obs"])
        next_action = jnp.argmax(next_online, axis=1)
        next_value = jnp.take_along_axis(next_target, next_action[:, None], axis=1)[:, 0]
        target = jax.lax.stop_gradient(batch["reward"] + batch["discount"] * next_value)
        q = jnp.take_along_axis(q_all, batch["action"].astype(jnp.int32)[:, None], axis=1)[:, 0]
        abs_td = jnp.abs(target - q)
        quadratic = jnp.minimum(abs_td, 1.0)
        huber = 0.5 * jnp.square(quadratic) + (abs_td - quadratic)
        return jnp.mean(batch["weight"] * huber), (jnp.mean(q), abs_td)

    def _train_block(self, params: list[Any], target_params: list[Any], opt_vars: list[Any],
                     block: dict[str, Any]) -> tuple[Any, ...]:
        grad = jax.value_and_grad(self._loss, has_aux=True)

        def step(carry: tuple[Any, ...], batch: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            params, target_params, opt_vars = carry
            (loss, (q_mean, abs_td)), grads = grad(params, target_params, batch)
            params, opt_vars = self.optimizer.stateless_apply(opt_vars, grads, params)
            due = opt_vars[self._iteration] % self.target_every == 0
            target_params = [jnp.where(due, p if self.tau >= 1.0 else self.tau * p + (1.0 - self.tau) * t, t)
                             for p, t in zip(params, target_params, strict=True)]
            return (params, target_params, opt_vars), (loss, q_mean, abs_td)

        (params, target_params, opt_vars), out = jax.lax.scan(step, (params, target_params, opt_vars), block)
        return params, target_params, opt_vars, out

    # Weights for acting elsewhere (Ray actors) ----------------------------------------------------

    def online_weights(self) -> list[np.ndarray]:
        """The online network's weights as plain arrays, in Keras' order (the same list as agent.py's)."""
        by_path = dict(zip([v.path for v in self.online.trainable_variables], self.params, strict=True))
        by_path.update(zip([v.path for v in self.online.non_trainable_variables], self.frozen, strict=True))
        return [np.asarray(by_path[v.path]) for v in self.online.weights]

    def set_online_weights(self, weights: list[np.ndarray]) -> None:
        by_path = {v.path: w for v, w in zip(self.online.weights, weights, strict=True)}
        self.params = [jnp.asarray(by_path[v.path]) for v in self.online.trainable_variables]

    # Checkpoint state ---------------------------------------------------------------------------

    def _to_keras(self) -> None:
        """Copy the arrays into the Keras variables (whose order and names the checkpoint uses)."""
        for var, value in zip(self.online.trainable_variables, self.params, strict=True):
            var.assign(value)
        for var, value in zip(self.target.trainable_variables, self.target_params, strict=True):
            var.assign(value)
        for var, value in zip(self.optimizer.variables, self.opt_vars, strict=True):
            var.assign(value)

    def state(self) -> dict[str, list[np.ndarray]]:
        self._to_keras()
        return keras_state(self.online, self.target, self.optimizer)

    def load_state(self, state: dict[str, list[np.ndarray]]) -> None:
        load_keras_state(self.online, self.target, self.optimizer, state)
        self.params = [jnp.array(v.value) for v in self.online.trainable_variables]
        self.target_params = [jnp.array(v.value) for v in self.target.trainable_variables]
        self.opt_vars = [jnp.array(v.value) for v in self.optimizer.variables]

    @property
    def train_steps(self) -> int:
        """Gradient steps taken (Adam's iteration counter, restored with the checkpoint)."""
        return int(self.opt_vars[self._iteration])
