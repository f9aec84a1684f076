"""Q-networks (Keras 3): the Nature DQN CNN for image stacks and an MLP for vector observations.

Both take the stack exactly as the store returns it, ``(batch, frame_stack, *frame_shape)`` in the
store's dtype, so no preprocessing happens outside the model: images are scaled by 1/255 and moved to
channels-last inside it.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import layers

#: Clip the global gradient norm (cleanrl's Atari PPO/DQN practice keeps early updates sane).
#: Fields of a block the gradient step reads (``index`` stays on the host for the priorities).
TRAIN_FIELDS = ("obs", "next_obs", "action", "reward", "discount", "weight")
MAX_GRAD_NORM = 10.0


def build_q_network(stack_shape: tuple[int, ...], dtype: Any, n_actions: int, *, hidden_sizes: list[int],
                    name: str) -> keras.Model:
    """The Nature CNN (Mnih et al. 2015) when frames are 2-D images, else an MLP of ``hidden_sizes``."""
    inputs = keras.Input(shape=stack_shape, dtype=np.dtype(dtype).name, name="stack")
    if len(stack_shape) == 3:  # (frame_stack, height, width) images
        x = layers.Rescaling(1.0 / 255.0)(inputs)
        x = layers.Permute((2, 3, 1))(x)  # channels-last: the stack becomes the channels
        x = layers.Conv2D(32, 8, strides=4, activation="relu")(x)
        x = layers.Conv2D(64, 4, strides=2, activation="relu")(x)
        x = layers.Conv2D(64, 3, strides=1, activation="relu")(x)
        x = layers.Flatten()(x)
        x = layers.Dense(512, activation="relu")(x)
    else:
        x = layers.Flatten()(layers.Rescaling(1.0)(inputs))  # Rescaling casts to float32
        for width in hidden_sizes:
            x = layers.Dense(width, activation="relu")(x)
    outputs = layers.Dense(n_actions, name="q_values")(x)
    return keras.Model(inputs, outputs, name=name)


def keras_state(online: keras.Model, target: keras.Model, optimizer: keras.optimizers.Optimizer) -> dict[str, list[np.ndarray]]:
    """The checkpoint's arrays (checkpoint.py): the same on every backend, so a run resumes on another."""
    return {
        "online": [np.asarray(w) for w in online.get_weights()],
        "target": [np.asarray(w) for w in target.get_weights()],
        "optimizer": [np.asarray(v.value) for v in optimizer.variables],
    }


def load_keras_state(online: keras.Model, target: keras.Model, optimizer: keras.optimizers.Optimizer,
                     state: dict[str, list[np.ndarray]]) -> None:
    """Put ``keras_state``'s arrays back into the models and the optimizer."""
    online.set_weights(state["online"])
    target.set_weights(state["target"])
    variables = optimizer.variables
    if len(variables) != len(state["optimizer"]):
        raise ValueError(f"the checkpoint holds {len(state['optimizer'])} optimizer variables, the optimizer "
                         f"has {len(variables)}")
    for var, value in zip(variables, state["optimizer"], strict=True):
        var.assign(value)
