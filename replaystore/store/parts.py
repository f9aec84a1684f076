"""What the store's parts share, and how the facade hands its methods to them.

``Parts`` is made once per open store (facade.py's ``ReplayStore.__init__``): the backend, the
rings, the frame reader, the view of other writers' commits, this process's stream writers, the
prioritized samplers' state, the lock and the memory budget. ``Reading`` (reading.py) and
``Writing`` (writing.py) each hold it and nothing else, so neither declares attributes another
class must set, and neither knows the facade.

``delegated(part, function)`` is a method of the facade that is ``function`` of one of its parts:
``ReplayStore.sample = delegated("_reading", Reading.sample)`` makes ``store.sample`` the bound
method ``store._reading.sample``, with its signature, types and docstring.
"""

from __future__ import annotations

import threading
import types
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from replaystore.errors import StoreClosedError
from replaystore.format.schema import stream_stride
from replaystore.sampling.priority import Priorities
from replaystore.sampling.samplers import Sampler
from replaystore.storage.backend import Backend
from replaystore.storage.choose import is_url
from replaystore.storage.reader import FrameReader
from replaystore.storage.rings import Rings
from replaystore.storage.stream import StreamWriter
from replaystore.storage.view import View


class Parts:
    """One open store's parts and shared state (see the module docstring)."""

    def __init__(self, backend: Backend, *, writing: list[int], cache_bytes: int, decode_threads: int = 1,
                 memory_budget: int | None = None) -> None:
        schema, layout = backend.schema, backend.layout
        assert schema is not None and layout is not None
        self.backend = backend
        self.path: str | Path = backend.where if is_url(backend.where) else Path(backend.where)
        self.schema = schema
        self.layout = layout
        self.writing = sorted(writing)  # the streams this store writes, in the order add_batch takes them
        self.closed = False
        self.memory_budget = memory_budget
        self.prefetchers: weakref.WeakSet[Any] = weakref.WeakSet()  # live ones: their RAM is the store's too
        # Guards the rings, the writers and the reader's caches: ``add``/``flush`` and the planning half of
        # sampling hold it; decoding frames does not (see reader.py), so samplers on other threads
        # (``as_dataset``) and the acting thread's ``add`` mostly run side by side.
        self.mutex = threading.RLock()
        self.rings = Rings(schema.num_streams, schema.stream_capacity, stream_stride(schema, layout),
                           schema.frame_stack, layout.shard_len, schema.action,
                           zero_padding=schema.frame_padding == "zero", extras=schema.extras)
        self.reader = FrameReader(backend.frames, schema, layout, cache_bytes=cache_bytes,
                                  decode_threads=decode_threads, slots_of=self.rings.slots)
        self.view = View(backend, layout, self.rings, self.reader)
        self.view.load(self.writing)
        self.writers = [StreamWriter(backend, schema, layout, self.rings, self.reader, self.view.states[k], index=k)
                        for k in self.writing]
        self.by_stream = {w.index: w for w in self.writers}
        if self.writers:
            writers = tuple(self.writers)
            self.reader.live_regions = lambda: [r for w in writers if (r := w.shards.live_region()) is not None]
            backend.keep_claims()
        self.priorities = Priorities(self.rings)  # the prioritized samplers' state
        self.samplers: dict[tuple, Sampler] = {}

    @property
    def num_streams(self) -> int:
        return self.schema.num_streams

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosedError(f"{self.path} was closed; open it again with ReplayStore.open")


PartT = TypeVar("PartT")
P = ParamSpec("P")
R = TypeVar("R")


class delegated(Generic[PartT, P, R]):  # noqa: N801 - used as a method decorator would be
    """A facade's method that is ``function`` of the part in the facade's attribute ``part``."""

    def __init__(self, part: str, function: Callable[Concatenate[PartT, P], R]) -> None:
        self.part = part
        self.function = function
        self.__doc__ = function.__doc__
        self.__name__ = function.__name__
        self.__wrapped__ = function

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return types.MethodType(self.function, getattr(obj, self.part))

    def __call__(self, obj: object, *args: Any, **kwargs: Any) -> Any:
        """Called on the class, as a method is: ``ReplayStore.sample(store, 32)``."""
        return self.function(getattr(obj, self.part), *args, **kwargs)
