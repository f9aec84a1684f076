"""What a frame read carries between its phases (``Plan``, see reader.py), and the row writes on a
plan's output: the output may be several arrays laid end to end (``parts``, ``bounds``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replaystore.storage.chunkread import ChunkRead


@dataclass
class Plan:
    """What ``finish`` needs: the output, which rows still need decoding, and the chunk bytes."""

    parts: list[np.ndarray]  # the output, (n_i, *obs_shape) each, rows served from RAM already filled
    bounds: list[int]  # where each part starts among the rows of the parts laid end to end, and the total
    rows: np.ndarray  # rows (of the parts laid end to end) to fill from decoded chunks
    which: np.ndarray  # for each of ``rows``: index into ``payloads``
    offset: np.ndarray  # for each of ``rows``: frame offset inside its chunk
    ids: list[int]  # the distinct global chunk ids the rows need
    payloads: list[bytes | None]  # for each of ``ids``: verified compressed bytes, or None (an empty chunk)
    shape: tuple[int, ...]  # the shape of the positions array
    as_one: bool  # every payload may be decoded joined with the others (decoders.ChunkDecoder.decode_many)
    single: bool  # the output is one array (not a list of ``out`` arrays)
    reads: list[tuple[int, ChunkRead]]  # payloads still to read (index into ``payloads``), see ``fetch``
    padded: int = 0  # rows left out of ``rows`` because they are zero padding (already zeroed)
    generations: np.ndarray | None = None  # with a FrameMirror: each of ``ids``' shard generation when planned


def distinct(values: np.ndarray) -> int:
    """How many distinct values ``values`` holds (a sort: a third of ``np.unique``'s cost on a batch)."""
    if values.size < 2:
        return int(values.size)
    ordered = np.sort(values)
    return int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1


def take_into(parts: list[np.ndarray], bounds: list[int], frames: np.ndarray, index: np.ndarray) -> None:
    """``frames[index]`` into ``parts`` laid end to end, one ``np.take`` per part into its memory.
    ``mode="clip"``: with numpy's default ``"raise"`` it gathers into a fresh copy and copies it back
    (so that a bad index leaves ``out`` untouched), ~3x the cost; ``index`` is in range by construction."""
    for part, start, stop in zip(parts, bounds, bounds[1:]):
        np.take(frames, index[start:stop], axis=0, out=part, mode="clip")


def fill_zero(parts: list[np.ndarray], bounds: list[int], rows: np.ndarray) -> None:
    """Zero ``rows`` (ascending) of ``parts`` laid end to end."""
    cuts = np.searchsorted(rows, bounds).tolist()
    for part, start, a, b in zip(parts, bounds, cuts, cuts[1:]):
        if a < b:
            part[rows[a:b] - start] = 0


def scatter(parts: list[np.ndarray], bounds: list[int], rows: np.ndarray, values: np.ndarray) -> None:
    """Write ``values`` to ``rows`` (ascending) of ``parts`` laid end to end (``bounds``: where each starts)."""
    cuts = np.searchsorted(rows, bounds).tolist()
    for part, start, a, b in zip(parts, bounds, cuts, cuts[1:]):
        if a < b:
            part[rows[a:b] - start] = values[a:b]


def output_parts(out: np.ndarray | list[np.ndarray], shape: tuple[int, ...], frame_shape: tuple[int, ...],
                 dtype: np.dtype) -> list[np.ndarray]:
    """A read's ``out`` (one array, or a list of one per row of positions shaped ``shape``) as flat
    ``(n_i, *frame_shape)`` parts (views: nothing is copied); ``ValueError`` for the wrong arrays."""
    if isinstance(out, list):
        wanted, given = (*shape[1:], *frame_shape), out
        if not shape or len(out) != shape[0]:
            raise ValueError(f"out is a list of {len(out)} arrays; positions of shape {shape} need one per row")
    else:
        wanted, given = (*shape, *frame_shape), [out]
    for part in given:
        if part.shape != wanted or part.dtype != dtype or not part.flags.c_contiguous:
            raise ValueError(f"out must hold C-contiguous {dtype} arrays of shape {wanted}, "
                             f"got {part.dtype} {part.shape}")
    return [part.reshape(-1, *frame_shape) for part in given]
