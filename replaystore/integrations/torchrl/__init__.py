"""A replay store as TorchRL's storage: ``ReplayStoreStorage`` (docs/torchrl.md).

    from torchrl.data import TensorDictReplayBuffer
    from replaystore.integrations.torchrl import ReplayStoreStorage

    rb = TensorDictReplayBuffer(storage=ReplayStoreStorage("runs/rb.zarr", max_size=1_000_000), batch_size=32)
    for data in collector:
        rb.extend(data.reshape(-1))

records.py keeps the transitions (numpy, no torch); storage.py is the TorchRL class, defined on
first use: importing this module imports neither torch nor TorchRL (``pip install
'replaystore[torchrl]'``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ReplayStoreStorage"]  # noqa: F822 (module __getattr__)


def __getattr__(name: str) -> Any:
    if name == "ReplayStoreStorage":
        from replaystore.integrations.torchrl.storage import storage_class

        return storage_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
