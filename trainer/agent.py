"""The DQN agent on TensorFlow: online and target Q-networks, Adam, and the ``tf.function`` that
takes a block's gradient steps.

The loss is the double-DQN target (Hasselt et al. 2016) with a Huber loss: the online network picks
the next action, the target network values it, and the store's ``discount`` field (``gamma**k`` for
the ``k`` steps of an n-step return, 0 after a termination) scales the bootstrap. With prioritized
replay the loss is weighted by the batch's importance weights and the step returns ``|td|`` for
``store.update_priorities``.

``train_block`` takes one gradient step per batch of a block (``(k, batch, ...)`` tensors, from
``store.as_dataset(..., blocks=True)``) in one ``tf.function`` call: the loop over the block's rows
is a ``tf.while_loop``, so Python is not in the way between the k steps (as ``lax.scan`` in
agent_jax.py). The target network is updated inside the loop every ``target_every`` gradient
steps, counted by Adam's iteration counter, exactly as on JAX.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.networks import MAX_GRAD_NORM, TRAIN_FIELDS, build_q_network, keras_state, load_keras_state


class Agent:
    """Online and target networks, the optimizer, acting and training."""

    backend = "tensorflow"

    def __init__(self, stack_shape: tuple[int, ...], dtype: Any, n_actions: int, *, learning_rate: float,
                 hidden_sizes: list[int], target_every: int, tau: float) -> None:
        self.n_actions = n_actions
        self.target_every = max(1, int(target_every))
        self.tau = float(tau)
        self.online = build_q_network(stack_shape, dtype, n_actions, hidden_sizes=hidden_sizes, name="online")
        self.target = build_q_network(stack_shape, dtype, n_actions, hidden_sizes=hidden_sizes, name="target")
        self.target.set_weights(self.online.get_weights())
        self.optimizer = keras.optimizers.Adam(learning_rate=learning_rate, global_clipnorm=MAX_GRAD_NORM)
        self.optimizer.build(self.online.trainable_variables)
        spec = tf.TensorSpec((None, *stack_shape), tf.as_dtype(np.dtype(dtype)))
        self._q_values = tf.function(lambda stack: self.online(stack), input_signature=[spec])
        self._block = tf.function(self._train_block, reduce_retracing=True)

    def act(self, stack: np.ndarray) -> int:
        """The greedy action for one stack ``(frame_stack, *frame_shape)``."""
        return int(np.argmax(self._q_values(stack[None])[0]))

    def act_batch(self, stacks: np.ndarray) -> np.ndarray:
        """The greedy actions for ``(n, frame_stack, *frame_shape)`` stacks, in one forward pass."""
        return np.argmax(np.asarray(self._q_values(stacks)), axis=1)

    def train_block(self, block: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One gradient step per batch of ``block`` (``(k, batch, ...)`` tensors or arrays), in one
        ``tf.function`` call; returns per step the loss and the mean Q(s, a), and ``|td|`` per
        transition ``(k, batch)``."""
        loss, q_mean, abs_td = self._block({name: block[name] for name in TRAIN_FIELDS})
        return loss.numpy(), q_mean.numpy(), abs_td.numpy()

    def _train_block(self, block: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        k = tf.shape(block["obs"])[0]
        losses = tf.TensorArray(tf.float32, size=k)
        q_means = tf.TensorArray(tf.float32, size=k)
        abs_tds = tf.TensorArray(tf.float32, size=k)
        for i in tf.range(k):  # autograph: a tf.while_loop
            loss, q_mean, abs_td = self._train_step({name: value[i] for name, value in block.items()})
            if self.optimizer.iterations % self.target_every == 0:
                self._update_target(self.tau)
            losses = losses.write(i, loss)
            q_means = q_means.write(i, q_mean)
            abs_tds = abs_tds.write(i, abs_td)
        return losses.stack(), q_means.stack(), abs_tds.stack()

    def _train_step(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        next_online = self.online(batch["next_obs"])
        next_action = tf.argmax(next_online, axis=1, output_type=tf.int32)
        next_target = self.target(batch["next_obs"])
        next_value = tf.gather(next_target, next_action, axis=1, batch_dims=1)
        target = tf.stop_gradient(batch["reward"] + batch["discount"] * next_value)
        action = tf.cast(batch["action"], tf.int32)
        with tf.GradientTape() as tape:
            q = tf.gather(self.online(batch["obs"]), action, axis=1, batch_dims=1)
            td = target - q
            abs_td = tf.abs(td)
            quadratic = tf.minimum(abs_td, 1.0)
            huber = 0.5 * tf.square(quadratic) + (abs_td - quadratic)
            loss = tf.reduce_mean(batch["weight"] * huber)
        variables = self.online.trainable_variables
        grads = tape.gradient(loss, variables)
        self.optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss, tf.reduce_mean(q), abs_td

    def _update_target(self, tau: float) -> None:
        """target <- tau * online + (1 - tau) * target (tau = 1: a hard copy)."""
        for t, o in zip(self.target.weights, self.online.weights, strict=True):
            t.assign(o.value if tau >= 1.0 else tau * o.value + (1.0 - tau) * t.value)

    # Weights for acting elsewhere (Ray actors) ----------------------------------------------------

    def online_weights(self) -> list[np.ndarray]:
        """The online network's weights as plain arrays (the same list on both backends)."""
        return [np.asarray(w) for w in self.online.get_weights()]

    def set_online_weights(self, weights: list[np.ndarray]) -> None:
        self.online.set_weights(weights)

    # Checkpoint state ---------------------------------------------------------------------------

    def state(self) -> dict[str, list[np.ndarray]]:
        return keras_state(self.online, self.target, self.optimizer)

    def load_state(self, state: dict[str, list[np.ndarray]]) -> None:
        load_keras_state(self.online, self.target, self.optimizer, state)

    @property
    def train_steps(self) -> int:
        """Gradient steps taken (Adam's iteration counter, restored with the checkpoint)."""
        return int(self.optimizer.iterations.value)
