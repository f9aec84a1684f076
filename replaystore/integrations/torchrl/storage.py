"""``ReplayStoreStorage``: TorchRL's ``TensorStorage`` contract over a replay store (records.py holds
the numpy side). Defined on first use, so that importing replaystore never imports torch or TorchRL.

It is a ``TensorStorage`` to TorchRL (the default collate, the samplers' and writers' checks), but
it keeps nothing in a TensorDict: ``set`` hands the collector's TensorDicts to ``Records`` as numpy
leaves and ``get`` builds a TensorDict from the transitions the store returns, on ``device``.

Checkpoints: the store on disk is the storage's whole state, so ``dumps(path)`` (and a replay
buffer's ``rb.dumps``, which calls it) flushes the store and writes one
small JSON file, ``replaystore.json``: the store's path and how many transitions were written;
``loads`` reopens that store and takes back TorchRL's indices as they were at ``dumps`` (transitions
written after it stay in the store unindexed, and are overwritten in time).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import ConfigError
from replaystore.integrations.torchrl.lazy import ColumnReads, column_class
from replaystore.integrations.torchrl.records import Records

_CLASSES: dict[str, Any] = {}
#: the checkpoint's one file, and the most of it ``loads`` reads
META = "replaystore.json"
MAX_META_BYTES = 64 * 1024


def storage_class() -> Any:
    if "storage" not in _CLASSES:
        try:
            import torch
            from tensordict import TensorDict, is_tensor_collection
            from torchrl.data.replay_buffers.checkpointers import StorageCheckpointerBase
            from torchrl.data.replay_buffers.storages import TensorStorage
        except ImportError as exc:
            raise ImportError("ReplayStoreStorage needs TorchRL: pip install 'replaystore[torchrl]'") from exc
        _CLASSES["storage"] = _define(torch, TensorDict, is_tensor_collection, StorageCheckpointerBase, TensorStorage)
    return _CLASSES["storage"]


def _define(torch: Any, TensorDict: Any, is_tensor_collection: Any, StorageCheckpointerBase: Any,
            TensorStorage: Any) -> Any:

    class Checkpointer(StorageCheckpointerBase):
        """``dumps``/``loads`` of a ``ReplayStoreStorage``: the store's path and count (module docstring)."""

        def dumps(self, storage: Any, path: Any) -> None:
            path = Path(path)
            path.mkdir(parents=True, exist_ok=True)
            storage.records.flush()
            (path / META).write_text(json.dumps(storage.state_dict(), indent=1) + "\n")

        def loads(self, storage: Any, path: Any) -> None:
            where = Path(path) / META
            try:
                with open(where, "rb") as f:
                    text = f.read(MAX_META_BYTES + 1)
            except FileNotFoundError:
                raise ConfigError(f"{path} holds no {META}: it is not a ReplayStoreStorage checkpoint") from None
            if len(text) > MAX_META_BYTES:
                raise ConfigError(f"{where} is over {MAX_META_BYTES} bytes: not a ReplayStoreStorage checkpoint")
            try:
                state = json.loads(text)
            except ValueError as exc:
                raise ConfigError(f"{where} is not JSON ({exc}): not a ReplayStoreStorage checkpoint") from None
            storage.load_state_dict(state)

    class ReplayStoreStorage(TensorStorage):
        """TorchRL's transitions in a replay store on disk, each frame stored once.

        ``path``: the store (a directory; an ``s3://`` URL with ``storage_options``); one that holds a
        store written here is continued, unless ``overwrite``. ``max_size``: the transitions kept
        (TorchRL's indices). ``frame_stack`` (``"auto"``, 1 or k), ``stack_axis`` (0, -1) and
        ``padding`` (``"reset"``, ``"zero"``): how ``CatFrames`` stacked the observations, found
        from the first batch when left out. ``observation_key``: the observations' key
        (``"pixels"`` for a ``from_pixels`` env). ``streams``: the envs the collector steps (counted
        in the first batch when left out). ``cache_bytes``: the store's chunk cache. ``device``:
        where ``get`` puts the tensors.
        """

        _default_checkpointer = Checkpointer

        def __init__(self, path: Any, max_size: int, *, frame_stack: Any = "auto", stack_axis: Any = None,
                     padding: Any = None, observation_key: Any = "observation", streams: Any = None,
                     cache_bytes: int | None = None, overwrite: bool = False,
                     storage_options: dict[str, Any] | None = None, device: Any = "cpu") -> None:
            self.records = Records(path, max_size, frame_stack=frame_stack, stack_axis=stack_axis, padding=padding,
                                   observation_key=observation_key, streams=streams, cache_bytes=cache_bytes,
                                   overwrite=overwrite, storage_options=storage_options)
            super().__init__(storage=None, max_size=int(max_size), device=device)
            self._synced()

        def _synced(self) -> None:
            self._len = self.records.length
            self.initialized = self.records.store is not None

        @property
        def checkpointer(self) -> Any:
            return self._checkpointer

        @checkpointer.setter
        def checkpointer(self, value: Any) -> None:
            if value is None:
                value = Checkpointer()
            if not isinstance(value, Checkpointer):
                raise ConfigError(f"ReplayStoreStorage checkpoints with its own checkpointer, not "
                                  f"{type(value).__name__}: the store on disk holds the transitions, and "
                                  "rb.dumps(dir) records where it is; leave checkpointer out")
            self._checkpointer = value

        @property
        def store(self) -> Any:
            """The ``ReplayStore`` underneath (None until the first transitions are written)."""
            return self.records.store

        @property
        def _total_shape(self) -> Any:
            return torch.Size([self.max_size])

        # -----------------------------------------------------------------------------------------
        # TorchRL's storage contract

        def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
            if set_cursor:
                self._set_last_cursor(cursor)
            index = _index(cursor, self.max_size)
            if isinstance(data, (list, tuple)) and data and is_tensor_collection(data[0]):
                data = torch.stack(list(data))
            if not is_tensor_collection(data):
                raise ConfigError(f"ReplayStoreStorage keeps TensorDicts, not {type(data).__name__}: use a "
                                  "TensorDictReplayBuffer, or extend a ReplayBuffer with TensorDicts")
            if np.ndim(cursor) == 0 and not isinstance(cursor, slice):
                data = data.unsqueeze(0)
            if data.batch_dims != 1:
                raise ConfigError(f"the transitions have batch size {list(data.batch_size)}; ReplayStoreStorage "
                                  "takes one batch dimension (a collector's [envs, time]: reshape(-1) first)")
            self.records.write(index, _leaves(data), count=set_cursor)
            self._synced()
            self._bump_mutation_revision()

        def get(self, index: Any) -> Any:
            if not self.initialized:
                raise RuntimeError("Cannot get elements out of a non-initialized storage.")
            single = isinstance(index, (int, np.integer)) or (isinstance(index, torch.Tensor) and index.ndim == 0)
            idx = _index(index, len(self), stop=len(self))
            leaves = self.records.read(idx)
            td = TensorDict({}, batch_size=list(idx.shape), device=self.device)
            for key, value in leaves.items():
                td.set(key, torch.from_numpy(np.ascontiguousarray(value)).to(self.device))
            return td[0] if single else td

        def __getitem__(self, index: Any) -> Any:
            """``storage[index]``, as TorchRL's samplers read it (``storage[:]`` to find trajectories,
            ``storage[idx]`` for a window's done flags): a TensorDict of ``Column``s, read from the
            store when used (lazy.py). An int, or indices of more than one axis, are read at once,
            as ``get`` (which the buffer's ``sample`` calls) reads."""
            if isinstance(index, (int, np.integer)) or (isinstance(index, torch.Tensor) and index.ndim == 0):
                return self.get(index)
            if not self.initialized:
                raise RuntimeError("Cannot get elements out of a non-initialized storage.")
            idx = _index(index, len(self), stop=len(self))
            if idx.ndim != 1:
                return self.get(index)
            records, column = self.records, column_class()
            loads = ColumnReads(records, idx)  # (refused now, as a read at once would be, if any holds nothing)
            td = TensorDict({}, batch_size=list(idx.shape), device=self.device)
            for key, (shape, dtype) in records.specs().items():
                tensor_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
                td.set(key, column(idx, shape, tensor_dtype, td.device, lambda rows, key=key: loads(key, rows)))
            return td

        def __len__(self) -> int:
            return self._len

        def _empty(self) -> None:
            self.records.positions[:] = -1
            self.records.length = 0
            self._len = 0
            self._bump_mutation_revision()

        def state_dict(self) -> dict[str, Any]:
            records = self.records
            return {"store": str(records.store.path) if records.store is not None else str(records.path),
                    "max_size": self.max_size, "length": records.length, "seq": records.seq}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.records.restore(state_dict)
            self._synced()
            self._bump_mutation_revision()

        def contains(self, item: Any) -> Any:
            if isinstance(item, (int, np.integer)):
                item = int(item) + (len(self) if item < 0 else 0)
                return 0 <= item < len(self) and bool(self.records.positions[item] >= 0)
            if isinstance(item, torch.Tensor):
                idx = item.cpu().numpy().astype(np.int64)
                ok = (idx >= 0) & (idx < len(self))
                ok[ok] = self.records.positions[idx[ok]] >= 0
                return torch.as_tensor(ok, device=item.device)
            raise TypeError(f"contains takes an int or a tensor of ints, not {type(item).__name__}")

        def close(self) -> None:
            """Commit what was written and close the store (it is also closed at exit)."""
            self.records.close()
            self.initialized = False

        def __getstate__(self) -> dict[str, Any]:
            raise TypeError("a ReplayStoreStorage is not pickled: it holds an open store; share the path, and open "
                            "it read-only elsewhere (ReplayStore.open(path))")

        def __repr__(self) -> str:
            where = self.records.store.path if self.records.store is not None else self.records.path
            return f"ReplayStoreStorage(path={str(where)!r}, len={len(self)}, max_size={self.max_size})"

    ReplayStoreStorage.__module__ = "replaystore.integrations.torchrl"
    ReplayStoreStorage.__qualname__ = "ReplayStoreStorage"
    return ReplayStoreStorage


def _index(index: Any, size: int, *, stop: int | None = None) -> np.ndarray:
    """TorchRL's index (an int, a slice, a range, a list, a tensor or array of ints, a bool mask, or a
    tuple of one of those: a sampler's index per storage dimension, here one) as an int64 array."""
    if isinstance(index, tuple) and len(index) == 1:
        index = index[0]
    if isinstance(index, slice):
        return np.arange(*index.indices(size if stop is None else stop), dtype=np.int64)
    if isinstance(index, range):
        return np.asarray(index, dtype=np.int64)
    if hasattr(index, "detach"):
        index = index.detach().cpu().numpy()
    arr = np.asarray(index)
    if arr.dtype == bool:
        return np.flatnonzero(arr).astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise ConfigError(f"index {index!r} is not an int, a slice or ints")
    out = arr.astype(np.int64)
    return np.where(out < 0, out + size, out)


def _leaves(data: Any) -> dict[tuple[str, ...], np.ndarray]:
    out = {}
    for key, value in data.items(include_nested=True, leaves_only=True):
        key = key if isinstance(key, tuple) else (key,)
        if not hasattr(value, "detach") or not hasattr(value, "numpy"):
            raise ConfigError(f"{key!r} holds {type(value).__name__}, not a tensor: ReplayStoreStorage keeps tensors; "
                              "exclude it before extend (td.exclude(...))")
        out[key] = value.detach().cpu().numpy()
    return out
