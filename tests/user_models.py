"""Q-networks of a user's own, for ``replaystore-train --model user_models:NAME`` (tests/ on
PYTHONPATH): each is called as ``NAME(observation_space, n_actions, frame_stack)``."""

from __future__ import annotations

from typing import Any

import keras


def layer_normed(observation_space: Any, n_actions: int, frame_stack: int) -> keras.Model:
    """A vector env's stacks, flattened, through a normalised hidden layer."""
    inputs = keras.Input((frame_stack, *observation_space.shape), dtype=observation_space.dtype.name)
    x = keras.layers.Dense(64, activation="relu")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(n_actions)(keras.layers.LayerNormalization()(x)), name="layer_normed")


def not_a_model(observation_space: Any, n_actions: int, frame_stack: int) -> str:
    return "a model"


def one_output_too_many(observation_space: Any, n_actions: int, frame_stack: int) -> keras.Model:
    inputs = keras.Input((frame_stack, *observation_space.shape))
    return keras.Model(inputs, keras.layers.Dense(n_actions + 1)(keras.layers.Flatten()(inputs)))


def batch_normed(observation_space: Any, n_actions: int, frame_stack: int) -> keras.Model:
    inputs = keras.Input((frame_stack, *observation_space.shape))
    x = keras.layers.BatchNormalization()(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(n_actions)(x))


NOT_CALLABLE = 3
