"""One block of batches as the consumer holds it (``store.blocks``, prefetch.py).

A ``Block`` is a read-only mapping of field names to numpy arrays shaped ``(batches, batch_size,
...)`` (a Dict store's ``obs`` and ``next_obs``: dicts of them, one per key). Its frame arrays live
in memory the prefetcher recycles (storage/pool.py). ``release()`` (or leaving ``with block:``)
says the consumer is done: the block lets go of its arrays at once, so their memory serves the
next block as soon as nothing else refers to it, and the block's fields raise
``BlockReleasedError`` from then on. An array taken from the block before it was released
keeps its values for as long as it is held: its memory is not reused until it is dropped. So a
consumer cannot read a recycled block by mistake: it gets the block's own values or an error.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Self

import numpy as np

from replaystore.errors import BlockReleasedError


class Block(Mapping[str, np.ndarray]):
    """A block's fields by name, until ``release()``."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, np.ndarray]) -> None:
        self._fields: dict[str, np.ndarray] | None = fields

    def _open(self) -> dict[str, np.ndarray]:
        if self._fields is None:
            raise BlockReleasedError("this block was released, and its memory may hold another block now; keep "
                                     "the arrays you need (block['obs'], ...) before release(), or copy them")
        return self._fields

    def __getitem__(self, name: str) -> np.ndarray:
        return self._open()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._open())

    def __len__(self) -> int:
        return len(self._open())

    @property
    def released(self) -> bool:
        return self._fields is None

    def release(self) -> None:
        """Hand the block's memory back for the next block (once no array taken from it is left)."""
        self._fields = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        if self._fields is None:
            return "Block(released)"
        return "Block(" + ", ".join(f"{name}={_describe(value)}" for name, value in self._fields.items()) + ")"


def _describe(value: Any) -> str:
    if isinstance(value, dict):  # a Dict store's observations
        return "{" + ", ".join(f"{key!r}: {_describe(v)}" for key, v in value.items()) + "}"
    return f"{value.dtype}{list(value.shape)}"
