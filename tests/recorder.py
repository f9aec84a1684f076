"""A Keras callback that records every hook call, for the tests of ``fit`` and ``fit_offline``."""

from __future__ import annotations

from typing import Any

import keras


class Recorder(keras.callbacks.Callback):
    """Every hook call, with a copy of its logs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []

    def on_train_begin(self, logs: Any = None) -> None:
        self.calls.append(("train_begin", dict(logs or {})))

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.calls.append(("epoch_begin", epoch))

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.calls.append(("batch_begin", batch))

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.calls.append(("batch_end", batch, dict(logs or {})))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.calls.append(("epoch_end", epoch, dict(logs or {})))

    def on_train_end(self, logs: Any = None) -> None:
        self.calls.append(("train_end", dict(logs or {})))

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == name]


def batches_by_epoch(calls: list[tuple[Any, ...]]) -> list[list[int]]:
    """The ``batch`` indices of each epoch's ``on_train_batch_end``."""
    epochs: list[list[int]] = []
    for kind, value, *_ in calls:
        if kind == "epoch_begin":
            epochs.append([])
        elif kind == "batch_end":
            epochs[-1].append(value)
    return epochs
