"""Per-step columns kept narrow in RAM: flags as bits of one shared byte, floats as codes.

A store's per-step scalars live in RAM for the whole ring (ring.py), so their width is the store's
RAM per step. On disk each field keeps its own dtype (schema.scalar_fields: int32 actions, float32
rewards, one bool each for the flags); in RAM they are narrower, bit for bit the same values:

=============================  ==========  ===========================================================
field                          bytes       in RAM
=============================  ==========  ===========================================================
terminated, truncated,         1 (all      ``BitColumn``: one bit each of one byte per slot
is_last, the sampleable flag   four)
action (``Discrete``)          1           the narrowest integer dtype that holds the space
reward, priority               0, 1 or 4   ``CodeColumn``: a code into a table of the distinct values
                                           stored so far: a spare bit of the flags' byte while there
                                           are at most two, a byte up to 256, then float32 for good
ep_step                        0           an index of episode starts (episteps.py)
=============================  ==========  ===========================================================

Both column kinds index like numpy arrays (``column[slots]``, ``column[slots] = values``, slices,
masks, any index shape) and return numpy arrays of the field's dtype, so the samplers read them as
they read arrays. ``region(start, stop)`` is a view of slots ``start .. stop - 1`` sharing the
storage: a stream's ring sees its part of the store's columns (rings.py). A code column's views
follow a widening made through any of them.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from replaystore.format.spaces import ActionSpec, DiscreteSpec, StepField

#: The most distinct values a code column holds before it widens.
MAX_CODES = 256
#: The per-step flags, as bits of one byte: the three stored ones and the sampleable bitmap.
FLAGS = ("terminated", "truncated", "is_last", "valid")
#: The float fields kept as codes.
CODED = ("reward", "priority")


def new_columns(specs: dict[str, StepField], length: int, *, action: ActionSpec | None = None) -> dict[str, Any]:
    """RAM columns of ``length`` slots for every field of ``specs`` (schema.scalar_fields) but
    ``ep_step`` (each ring indexes its own), and ``valid``. ``action``: the store's action space, so
    that a ``Discrete`` one is kept in the narrowest integer type that holds it."""
    flags = flag_columns(FLAGS, length)
    byte = flags[FLAGS[0]].byte
    out: dict[str, Any] = {}
    for name, (shape, dtype) in specs.items():
        if name in flags:
            out[name] = flags[name]
        elif name in CODED and not shape:  # each starts as a bit of the flags' byte (bits 4 and 5)
            out[name] = CodeColumn.new(length, dtype, bit_of=(byte, len(FLAGS) + CODED.index(name)),
                                       byte_codes=name != "priority")  # (updated priorities are all distinct)
        elif name == "action" and isinstance(action, DiscreteSpec):
            out[name] = np.zeros(length, dtype=action_ram_dtype(action))
        elif name != "ep_step":
            out[name] = np.zeros((length, *shape), dtype=dtype)
    out["valid"] = flags["valid"]
    return out


def action_ram_dtype(action: DiscreteSpec) -> np.dtype:
    """The narrowest integer dtype holding every action of ``action`` (uint8 for Atari's 18)."""
    lo, hi = action.start, action.start + action.n - 1
    return next(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.int64)
                if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)

class Column(Protocol):
    """What the rings need of a per-step field: numpy indexing, a dtype, a length and views."""

    @property
    def dtype(self) -> np.dtype: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any) -> Any: ...

    def __setitem__(self, index: Any, values: Any) -> None: ...


def whole_array(column: Any, dtype: Any = None, copy: Any = None) -> np.ndarray:
    """A column's ``__array__``: every slot's value, as a new array (``np.asarray(column)``)."""
    out = column[:]
    return out if dtype is None else out.astype(dtype)


def whole_copy(column: Any) -> np.ndarray:
    """A column's ``copy``: every slot's value, as a numpy array."""
    return np.asarray(column[:])


def region(values: Any, start: int, stop: int) -> Any:
    """Slots ``start .. stop - 1`` of ``values`` (a numpy array or a column), sharing its storage."""
    if isinstance(values, np.ndarray):
        return values[start:stop]
    return values.region(start, stop)


class BitColumn:
    """A bool per slot, kept as bit ``bit`` of ``byte`` (uint8, shared with up to 7 other flags)."""

    dtype = np.dtype(bool)

    def __init__(self, byte: np.ndarray, bit: int, *, owner: bool = False) -> None:
        self.byte = byte
        self.mask = np.uint8(1 << bit)
        self.bit = bit
        self.owner = owner  # the first flag of a byte array counts its bytes (``nbytes``)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.byte.shape

    @property
    def nbytes(self) -> int:
        return int(self.byte.nbytes) if self.owner else 0

    __array__ = whole_array
    copy = whole_copy

    def __len__(self) -> int:
        return len(self.byte)

    def __getitem__(self, index: Any) -> Any:
        return (self.byte[index] & self.mask) != 0

    def __setitem__(self, index: Any, values: Any) -> None:
        mask = self.mask
        if isinstance(index, (int, np.integer)) and isinstance(values, (bool, np.bool_, int, np.integer)):
            b = self.byte[index]
            self.byte[index] = b | mask if values else b & ~mask
            return
        current = self.byte[index]
        self.byte[index] = np.where(np.asarray(values, dtype=bool), current | mask, current & ~mask)

    def region(self, start: int, stop: int) -> BitColumn:
        return BitColumn(self.byte[start:stop], self.bit)


def flag_columns(names: tuple[str, ...], length: int) -> dict[str, BitColumn]:
    """One ``BitColumn`` per name (at most 8), all bits of one byte per slot."""
    if len(names) > 8:
        raise ValueError(f"at most 8 flags share a byte, not {len(names)}")
    byte = np.zeros(length, dtype=np.uint8)
    return {name: BitColumn(byte, bit, owner=bit == 0) for bit, name in enumerate(names)}


class CodeBook:
    """A code column's storage, in the narrowest of three tiers that holds its values, compared by
    their bits (so -0.0, 0.0 and NaNs stay what they were):

    1. a bit of a byte shared with the flags (``bit_of``): at most two distinct values;
    2. a byte of its own (``codes``): at most ``MAX_CODES``;
    3. the values themselves (``wide``).

    It only ever widens (``widen``), copying the codes once."""

    def __init__(self, length: int, dtype: np.dtype, bit_of: tuple[np.ndarray, int] | None = None, *,
                 byte_codes: bool = True) -> None:
        """``byte_codes``: False for a field whose values are continuous once there are more than two
        (priorities): from a bit it widens straight to the values."""
        self.dtype = np.dtype(dtype)
        self.bits = np.dtype(f"u{self.dtype.itemsize}")  # the values' bits, as the table's keys
        self.table = np.zeros(MAX_CODES, dtype=self.dtype)
        self.size = 1  # code 0 is the value 0, which a new (zeroed) slot holds
        self.code_of: dict[int, int] = {0: 0}
        # the writer's fast path: one float given (``_float_key``) -> its code
        self.code_of_float: dict[float, int] = {}
        self.byte: np.ndarray | None = None  # tier 1: codes 0 and 1 as bit ``bit`` of ``byte``
        self.bit = 0
        self.codes: np.ndarray | None = None  # tier 2
        self.wide: np.ndarray | None = None  # tier 3
        if bit_of is not None:
            self.byte, self.bit = bit_of
        else:
            self.codes = np.zeros(length, dtype=np.uint8)
        self.byte_codes = byte_codes
        self.generation = 0  # bumped when widened: views take their slice of the new storage

    @property
    def limit(self) -> int:
        """The most distinct values the present tier holds."""
        return 2 if self.byte is not None else MAX_CODES

    @property
    def storage(self) -> np.ndarray:
        out = self.byte if self.byte is not None else self.codes if self.codes is not None else self.wide
        assert out is not None
        return out

    def encode(self, values: np.ndarray) -> np.ndarray | None:
        """The codes of ``values``, adding new values to the table; None when they do not fit the
        present tier (nothing is added then)."""
        keys = values.view(self.bits)
        unique, inverse = np.unique(keys, return_inverse=True)
        known = [self.code_of.get(key) for key in unique.tolist()]
        new = [i for i, code in enumerate(known) if code is None]
        if self.size + len(new) > self.limit:
            return None
        for i in new:
            code = known[i] = self.code_of[int(unique[i])] = self.size
            self.table[code] = unique[i : i + 1].view(self.dtype)[0]
            self.size += 1
        return np.asarray(known, dtype=np.uint8)[inverse].reshape(values.shape)

    def widen(self, *, past_codes: bool = False) -> None:
        """To the next tier (``past_codes``: from a bit straight to the values, where the values
        coming would not fit a byte's codes either: no byte a slot made on the way)."""
        step = 1 << 20  # a million slots at a time: the temporaries stay small
        if self.byte is not None and (past_codes or not self.byte_codes):
            self.wide = np.empty(len(self.byte), dtype=self.dtype)
            for at in range(0, len(self.byte), step):
                self.wide[at : at + step] = self.table[(self.byte[at : at + step] >> np.uint8(self.bit)) & np.uint8(1)]
            self.byte = None
        elif self.byte is not None:
            self.codes = (self.byte >> np.uint8(self.bit)) & np.uint8(1)
            self.byte = None
        else:
            assert self.codes is not None
            self.wide = np.empty(len(self.codes), dtype=self.dtype)
            for at in range(0, len(self.codes), step):
                self.wide[at : at + step] = self.table[self.codes[at : at + step]]
            self.codes = None
        self.generation += 1


class CodeColumn:
    """Float values of one field (see the module docstring): slots ``start .. stop - 1`` of ``book``."""

    def __init__(self, book: CodeBook, start: int, stop: int, *, owner: bool = False) -> None:
        self.book = book
        self.start, self.stop = start, stop
        self.owner = owner
        self._generation = -1
        self._view: np.ndarray
        self._sync()

    @classmethod
    def new(cls, length: int, dtype: Any, *, bit_of: tuple[np.ndarray, int] | None = None,
            byte_codes: bool = True) -> CodeColumn:
        """A column of ``length`` zeros; ``bit_of``: ``(byte array, bit)`` to start in (tier 1);
        ``byte_codes``: see ``CodeBook``."""
        return cls(CodeBook(length, np.dtype(dtype), bit_of, byte_codes=byte_codes), 0, length, owner=True)

    def _sync(self) -> None:
        self._view = self.book.storage[self.start : self.stop]
        self._generation = self.book.generation

    @property
    def dtype(self) -> np.dtype:
        return self.book.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.stop - self.start,)

    @property
    def tier(self) -> int:
        """1: a bit; 2: a byte; 3: the values themselves (see ``CodeBook``)."""
        book = self.book
        return 1 if book.byte is not None else 2 if book.codes is not None else 3

    @property
    def nbytes(self) -> int:
        """The RAM this column's own storage takes (a tier-1 bit lives in a byte counted with the flags)."""
        if not self.owner or self.book.byte is not None:
            return 0
        return int(self.book.storage.nbytes)

    __array__ = whole_array
    copy = whole_copy

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, index: Any) -> Any:
        book = self.book
        if self._generation != book.generation:
            self._sync()
        if book.wide is not None:
            return self._view[index]
        if book.byte is not None:
            return book.table[(self._view[index] >> np.uint8(book.bit)) & np.uint8(1)]
        return book.table[self._view[index]]

    def __setitem__(self, index: Any, values: Any) -> None:
        book = self.book
        if self._generation != book.generation:
            self._sync()
        while book.wide is None:
            key = _float_key(values)
            if key is not None:  # one value, the writer's path: a dict lookup
                code = book.code_of_float.get(key)
                if code is not None:
                    self._put(index, code)
                    return
            raw = np.asarray(values, dtype=book.dtype)
            codes = book.encode(raw)
            if codes is not None:
                if key is not None:
                    book.code_of_float[key] = int(codes)
                self._put(index, int(codes) if raw.ndim == 0 else codes)
                return
            book.widen(past_codes=book.size + np.unique(raw.view(book.bits)).size > MAX_CODES)
            self._sync()
        self._view[index] = values

    def zero(self, index: int) -> None:
        """Set one slot to 0 (code 0 in every tier), the cheapest way."""
        book = self.book
        if self._generation != book.generation:
            self._sync()
        if book.byte is None:
            self._view[index] = 0
        else:
            self._view[index] &= np.uint8(~(1 << book.bit) & 0xFF)

    def _put(self, index: Any, codes: Any) -> None:
        book = self.book
        if book.byte is None:
            self._view[index] = codes
            return
        mask = np.uint8(1 << book.bit)
        if isinstance(index, (int, np.integer)) and isinstance(codes, int):
            b = self._view[index]
            self._view[index] = b | mask if codes else b & ~mask
            return
        current = self._view[index]
        self._view[index] = np.where(np.asarray(codes, dtype=bool), current | mask, current & ~mask)

    def region(self, start: int, stop: int) -> CodeColumn:
        return CodeColumn(self.book, self.start + start, self.start + stop)


def _float_key(value: Any) -> float | None:
    """One float as a dict key, or None: a NaN never finds itself, and -0.0 would find 0.0's code."""
    if not isinstance(value, (float, np.floating)):
        return None
    f = float(value)
    return f if f == f and (f or math.copysign(1.0, f) > 0) else None
