"""``storage[...]`` kept in the store until used: what ``ReplayStoreStorage`` returns when indexed
(TorchRL's samplers read ``storage[:]`` to find trajectories, ``SliceSampler`` and
``HERReplayBuffer``, and ``storage[idx]`` for a window's done flags; ``rb[idx]`` reads it too). The
buffer's ``sample`` calls ``get``, which reads at once.

A TensorDict of the rows indexed, whose leaves are ``Column`` tensors: each has its leaf's shape,
dtype and device but holds no data. Indexing a column along its first axis (``col[i]``,
``col[a:b]``, ``col[idx]``, ``col[mask]``, and ``td[idx]`` of the TensorDict, which indexes each
leaf) reads those rows only: observations through the store (each frame once, stacked again; the
two stacks of the same rows in one read), every other leaf from the store's columns in RAM.
Anything else done with a column (``squeeze``, arithmetic, ``numpy()``, ``clone``,
``torch.stack``...) reads the whole column once, keeps it in the column, and goes on with it as a
plain tensor. So ``storage[:][("collector", "traj_ids")]`` costs one gather from RAM, not a decode
of every frame. What a column gives equals what a read at once gives, bit for bit; only its type
(``Column``, a ``torch.Tensor``) tells them apart.

Defined on first use (``column_class``), so that importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

_CLASSES: dict[str, Any] = {}


class ColumnReads:
    """The reads of one ``storage[...]``'s columns: a leaf's rows from ``records`` (records.py's
    ``Records.column``). Both observation stacks come from one read of the transitions, so the
    second of the two columns to read the same rows takes the first one's (the last read is kept)."""

    def __init__(self, records: Any, rows: np.ndarray) -> None:
        """``rows``: TorchRL's indices the columns hold (refused here if any holds nothing)."""
        self.records = records
        self.frames: tuple[np.ndarray, dict[Any, np.ndarray]] | None = None
        self.slots: tuple[np.ndarray, np.ndarray] | None = (rows, records.slots(rows)) if rows.size else None

    def __call__(self, key: Any, rows: np.ndarray) -> np.ndarray:
        records = self.records
        if not rows.size:
            return records.column(key, rows)
        if key in (records.obs_key, records.next_key):
            if self.frames is None or not _same(self.frames[0], rows):
                self.frames = (rows, records.read(rows))
            return self.frames[1][key]
        if self.slots is None or not _same(self.slots[0], rows):
            self.slots = (rows, records.slots(rows))
        return records.column(key, rows, self.slots[1])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (a.shape == b.shape and bool(np.array_equal(a, b)))


#: a column of at most this many values is read to be printed (a larger one says what it is)
REPR_MOST = 1 << 20
#: what a column answers from its shape alone (properties are ``__get__``)
METADATA = frozenset({"__get__", "__len__", "size", "dim", "ndimension", "numel", "nelement", "element_size",
                      "is_floating_point", "is_complex", "is_shared", "get_device"})


def column_class() -> Any:
    if "column" not in _CLASSES:
        import torch

        _CLASSES["column"] = _define(torch)
    return _CLASSES["column"]


def _define(torch: Any) -> Any:
    from torch.utils._pytree import tree_map

    class Column(torch.Tensor):
        """One leaf of ``storage[...]``, read from the store when used (module docstring)."""

        rows: np.ndarray
        loads: Callable[[np.ndarray], np.ndarray]
        whole: Any

        @staticmethod
        def __new__(cls, rows: np.ndarray, shape: tuple[int, ...], dtype: Any, device: Any,
                    loads: Callable[[np.ndarray], np.ndarray]) -> Any:
            column = torch.Tensor._make_wrapper_subclass(cls, (len(rows), *shape), dtype=dtype, device=device)
            column.rows, column.loads, column.whole = rows, loads, None
            return column

        def load(self, rows: np.ndarray) -> Any:
            """Rows ``rows`` of this column's (positions in it, any shape) as a plain tensor."""
            flat = np.asarray(rows, dtype=np.int64).reshape(-1)
            values = np.ascontiguousarray(self.loads(self.rows[flat]))
            return torch.from_numpy(values).reshape((*np.shape(rows), *self.shape[1:])).to(self.device)

        def materialized(self) -> Any:
            if self.whole is None:
                values = np.ascontiguousarray(self.loads(self.rows))
                self.whole = torch.from_numpy(values).reshape(self.shape).to(self.device)
            return self.whole

        def indexed(self, item: Any) -> Any:
            """``self[item]`` read as rows when ``item`` indexes the first axis; None otherwise."""
            first, rest = (item[0], item[1:]) if isinstance(item, tuple) and item else (item, ())
            if first is None or first is Ellipsis or isinstance(first, bool) or any(
                    r is None or isinstance(r, (torch.Tensor, np.ndarray, list)) for r in rest):
                return None
            if isinstance(first, torch.Tensor):
                first = first.detach().cpu().numpy()
            try:
                rows = np.arange(len(self.rows))[first]
            except (IndexError, TypeError, ValueError):
                return None  # (the plain tensor's own error, from the whole column)
            data = self.load(rows)
            return data[(slice(None),) * np.ndim(rows) + tuple(rest)] if rest else data

        def __repr__(self, *, tensor_contents: Any = None) -> str:
            if self.whole is not None or self.numel() <= REPR_MOST:
                return repr(self.materialized())
            return (f"Column(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device}: in the replay "
                    "store until used)")

        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.Tensor.__getitem__ and isinstance(args[0], Column) and args[0].whole is None:
                got = args[0].indexed(args[1])
                if got is not None:
                    return got
            if getattr(func, "__name__", "") in METADATA:
                return super().__torch_function__(func, types, args, kwargs)
            args, kwargs = tree_map(_plain, (args, kwargs))
            return func(*args, **kwargs)

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            args, kwargs = tree_map(_plain, (args, kwargs or {}))
            return func(*args, **kwargs)

    def _plain(value: Any) -> Any:
        return value.materialized() if isinstance(value, Column) else value

    Column.__module__ = "replaystore.integrations.torchrl"
    Column.__qualname__ = "Column"
    return Column
