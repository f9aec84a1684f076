"""The DQN agent: online and target Q-networks, Adam, and the one ``tf.function`` gradient step.

The loss is the double-DQN target (Hasselt et al. 2016) with a Huber loss: the online network picks
the next action, the target network values it, and the store's ``discount`` field (``gamma**k`` for
the ``k`` steps of an n-step return, 0 after a termination) scales the bootstrap. With prioritized
replay the loss is weighted by the batch's importance weights and the step returns ``|td|`` for
``store.update_priorities``.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.networks import MAX_GRAD_NORM, build_q_network, keras_state, load_keras_state


class Agent:
    """Online and target networks, the optimizer, acting and training."""

    owns_target_updates = False  # the loop calls update_target

    def __init__(self, stack_shape: tuple[int, ...], dtype: Any, n_actions: int, *, learning_rate: float,
                 hidden_sizes: list[int]) -> None:
        self.n_actions = n_actions
        self.online = build_q_network(stack_shape, dtype, n_actions, hidden_sizes=hidden_sizes, name="online")
        self.target = build_q_network(stack_shape, dtype, n_actions, hidden_sizes=hidden_sizes, name="target")
        self.target.set_weights(self.online.get_weights())
        self.optimizer = keras.optimizers.Adam(learning_rate=learning_rate, global_clipnorm=MAX_GRAD_NORM)
        self.optimizer.build(self.online.trainable_variables)
        spec = tf.TensorSpec((None, *stack_shape), tf.as_dtype(np.dtype(dtype)))
        self._q_values = tf.function(lambda stack: self.online(stack), input_signature=[spec])
        self._step = tf.function(self._train_step, reduce_retracing=True)

    def act(self, stack: np.ndarray) -> int:
        """The greedy action for one stack ``(frame_stack, *frame_shape)``."""
        return int(np.argmax(self._q_values(stack[None])[0]))

    def act_batch(self, stacks: np.ndarray) -> np.ndarray:
        """The greedy actions for ``(n, frame_stack, *frame_shape)`` stacks, in one forward pass."""
        return np.argmax(np.asarray(self._q_values(stacks)), axis=1)

    def train(self, batch: dict[str, tf.Tensor], gamma: float) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """One gradient step on a batch from ``store.as_dataset``: (loss, mean Q(s, a), |td| per transition)."""
        return self._step(batch)

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

    def update_target(self, tau: float) -> None:
        """target <- tau * online + (1 - tau) * target (tau = 1: a hard copy)."""
        for t, o in zip(self.target.weights, self.online.weights, strict=True):
            t.assign(o.value if tau >= 1.0 else tau * o.value + (1.0 - tau) * t.value)

    # Checkpoint state ---------------------------------------------------------------------------

    def state(self) -> dict[str, list[np.ndarray]]:
        return keras_state(self.online, self.target, self.optimizer)

    def load_state(self, state: dict[str, list[np.ndarray]]) -> None:
        load_keras_state(self.online, self.target, self.optimizer, state)

    @property
    def train_steps(self) -> int:
        """Gradient steps taken (Adam's iteration counter, restored with the checkpoint)."""
        return int(self.optimizer.iterations.value)
