"""Models for test_agent_reload.py: dueling heads written the ways users write them, and a custom
layer that is not registered."""

from __future__ import annotations

from typing import Any

import keras


@keras.saving.register_keras_serializable(package="tests")
def dueling_combine(parts: Any) -> Any:
    value, advantage = parts
    return value + advantage - keras.ops.mean(advantage, axis=1, keepdims=True)


def _trunk(n_in: int) -> tuple[Any, Any]:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((1, n_in))
    x = keras.layers.Dense(32, activation="relu")(keras.layers.Flatten()(inputs))
    return inputs, x


def lambda_dueling(*, output_shape: bool = True) -> keras.Model:
    """The dueling head most users write: a Lambda of a Python lambda (code: safe mode refuses it)."""
    inputs, x = _trunk(4)
    value, advantage = keras.layers.Dense(1)(x), keras.layers.Dense(2)(x)
    head = keras.layers.Lambda(lambda t: t[0] + t[1] - keras.ops.mean(t[1], axis=1, keepdims=True),
                               **({"output_shape": (2,)} if output_shape else {}))
    return keras.Model(inputs, head([value, advantage]))


def registered_dueling() -> keras.Model:
    """The dueling head that reloads: a Lambda of a registered function, with its output shape."""
    inputs, x = _trunk(4)
    value, advantage = keras.layers.Dense(1)(x), keras.layers.Dense(2)(x)
    return keras.Model(inputs, keras.layers.Lambda(dueling_combine, output_shape=(2,))([value, advantage]))


def doubled_by_lambda() -> keras.Model:
    """A Lambda of a Python lambda that needs no global name: loads with safe_mode=False only."""
    inputs, x = _trunk(4)
    return keras.Model(inputs, keras.layers.Lambda(lambda t: t * 2.0, output_shape=(2,))(keras.layers.Dense(2)(x)))


class Scale(keras.layers.Layer):
    """A custom layer, not registered: it loads through custom_objects only."""

    def __init__(self, factor: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x: Any) -> Any:
        return x * self.factor

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "factor": self.factor}


def scaled() -> keras.Model:
    inputs, x = _trunk(4)
    return keras.Model(inputs, Scale(0.5)(keras.layers.Dense(2)(x)))
