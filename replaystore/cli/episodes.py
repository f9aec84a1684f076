"""``replaystore episodes``: the live episodes of a stream, and one of them saved whole.

Listing reads the scalar arrays only (``episode_table``), like ``inspect``. ``--save INDEX FILE``
reads one episode's frames (``ReplayStore.episode``) and writes them, with its moves, to FILE:

- ``.npz``: ``obs`` (every observation, single frames), ``action``, ``reward``, ``terminated``,
  ``truncated``, and ``stream``, ``index``, ``first_step``, ``from_start``, ``ended``,
  ``first_move``; and each extra of the moves as ``extras.NAME``;
- ``.mp4`` or ``.gif``: the observations as a video (video.py: OpenCV's MPEG-4, or Pillow's GIF,
  which matplotlib brings), for frames that are images (``(H, W)``, ``(H, W, 1|3|4)`` or channels
  first; an alpha channel is dropped); of a Dict store, its entry ``key`` (``--key``; without it,
  the one entry that is an image, if there is one).

The file is written beside its final name and renamed onto it, so a crash or a full disk leaves no
half-written file; FILE must not be inside the store. ``--moves A:B`` saves a part; an episode whose
frames (with their images: three times them for a .gif, twice for an .mp4) would take more than half
of the memory the process may use is refused before it is read.
"""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, UnsafePathError
from replaystore.format import nesting
from replaystore.format.spaces import BoxSpec, stored_box
from replaystore.sampling.episodes import Episode, episode_table, how_it_ended, stream_ring, window
from replaystore.sampling.memory import check_episode
from replaystore.storage.outside import check_target, publish_file, temporary
from replaystore.storage.where import is_url, normalized
from replaystore.store import ReplayStore

from .video import VideoFile

NEWEST = 20  # episodes listed without --all
SUFFIXES = (".npz", ".mp4", ".gif")


def list_episodes(path: str | Path, *, stream: int = 0, newest: int | None = NEWEST) -> dict[str, Any]:
    """The live episodes of ``stream`` (the ``newest`` of them; None: all), JSON-ready."""
    with ReplayStore.open(path, cache_bytes=0) as store:  # (each chunk is read once: no cache to hold)
        ring = stream_ring(store.rings, stream)
        table = episode_table(ring)
        count = int(table["start_step"].size)
        first = 0 if newest is None else max(0, count - newest)
        rows = []
        scalars = [e for e in store.schema.extras if e.shape == ()]  # (shown: each one at the last move)
        for i in range(first, count):
            ended, from_start = how_it_ended(ring, table, i)
            row = {"index": i, "first_step": int(table["start_step"][i]), "last_step": int(table["end_step"][i]),
                   "moves": int(table["lengths"][i]), "return": float(table["returns"][i]), "ended": ended,
                   "from_start": from_start}
            if scalars:
                last = (int(table["end_step"][i]) - 1) % ring.capacity if table["lengths"][i] else None
                row["extras_at_last_move"] = {e.name: None if last is None else ring.fields[e.field][last].item()
                                              for e in scalars}
            rows.append(row)
        return {"path": str(path), "stream": stream, "num_streams": store.num_streams, "live_episodes": count,
                "complete": int(np.count_nonzero(table["whole"])), "episodes": rows}


def format_episodes(info: dict[str, Any]) -> list[str]:
    """The listing as lines for a terminal."""
    n, shown = info["live_episodes"], len(info["episodes"])
    where = f"stream {info['stream']} of {info['num_streams']}" if info["num_streams"] > 1 else "the store"
    head = f"{n:,} live episodes in {where} ({info['complete']:,} complete)"
    if shown < n:
        head += f"; the newest {shown} (--all lists every one)"
    lines = [head]
    if shown:
        names = list(info["episodes"][0].get("extras_at_last_move", {}))  # a store's scalar extras, last move's
        extra = "".join(f"  {name[:12]:>12}" for name in names)
        lines.append(f"{'index':>7}  {'first step':>12}  {'moves':>7}  {'return':>10}{extra}  ended")
        for row in info["episodes"]:
            note = "" if row["from_start"] else "  (its start was overwritten)"
            values = "".join(f"  {_short(row['extras_at_last_move'][name]):>12}" for name in names)
            lines.append(f"{row['index']:>7}  {row['first_step']:>12,}  {row['moves']:>7,}  {row['return']:>10.2f}"
                         f"{values}  {row['ended']}{note}")
    return lines


def _short(value: Any) -> str:
    """An extra's value for the listing: a bool or int as it is, a float to 4 significant digits."""
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


#: The most frames a second a saved video may play (an infinite rate makes OpenCV's writer spin).
MAX_FPS = 1000.0


def save_episode(path: str | Path, index: int, out: str | Path, *, stream: int = 0, fps: float = 15.0,
                 moves: slice | None = None, key: str | None = None) -> tuple[Path, Episode]:
    """Write episode ``index`` of ``stream`` (or its ``moves``) to ``out`` (.npz, .mp4 or .gif);
    returns the file and the episode. ``key``: the entry of a Dict store a video shows. An episode
    whose frames, with the video's images beside them, would take more than half of the memory this
    process may use is refused before it is read."""
    out = Path(out)
    if out.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"cannot save an episode as {out.name!r}: name the file .npz (every array), .mp4 or .gif "
                          "(the frames as a video)")
    if not 0 < fps <= MAX_FPS:  # (inf or nan: OpenCV's writer spins forever)
        raise ConfigError(f"--fps is {fps!r}; give frames per second above 0 and at most {MAX_FPS:g} (15 is usual)")
    if not is_url(str(path)):
        store_dir, target = normalized(str(path)), os.path.realpath(out)
        if target == store_dir or target.startswith(store_dir + os.sep):
            raise UnsafePathError(errno.EINVAL, f"{out} is inside the store {path}; save the episode outside it")
    check_target(out, what="the episode")  # (no link, FIFO or directory there; inside no store)
    replace = out.exists()  # (an older file of the command's own: replaced; none: never one made meanwhile)
    video = VideoFile(out, fps, what="--save") if out.suffix.lower() != ".npz" else None
    try:
        with ReplayStore.open(path, cache_bytes=0) as store:  # (each chunk is read once: no cache to hold)
            key, box = _shown(store, path, key) if video else (None, store.schema.observation)
            if video:
                _frames_as_images(np.zeros((1, *box.shape), dtype=np.uint8))  # refuse early
                _check_images(store, index, stream, moves, out.suffix.lower())
            episode = store.episode(index, stream=stream, moves=moves)
        if video:
            flat = _flat_obs(store, episode.obs)
            frames = flat[key] if key is not None and flat is not None else episode.obs
            for image in _to_uint8(frames, box.low, box.high):
                video.add(image[..., :3] if image.ndim == 3 else image)  # (an alpha channel dropped)
            video.commit()
            return out, episode
    finally:
        if video is not None:
            video.discard()  # (nothing after a commit)
    data = io.BytesIO()
    flat = _flat_obs(store, episode.obs)
    obs = {f"obs.{key}": v for key, v in flat.items()} if flat is not None else {"obs": episode.obs}
    arrays: dict[str, Any] = {**obs, "action": episode.action, "reward": episode.reward,
                              "terminated": episode.terminated, "truncated": episode.truncated,
                              "stream": episode.stream, "index": episode.index, "first_step": episode.first_step,
                              "from_start": episode.from_start, "ended": np.str_(episode.ended),
                              "first_move": episode.first_move,
                              **{f"extras.{name}": v for name, v in episode.extras.items()}}
    np.savez_compressed(data, **arrays)
    tmp = temporary(out)
    try:
        with open(tmp, "xb") as f:
            f.write(data.getbuffer())
        publish_file(tmp, out, replace=replace)  # (a file made there meanwhile, where none was, is kept)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out, episode


def _shown(store: ReplayStore, path: str | Path, key: str | None) -> tuple[str | None, BoxSpec]:
    """What a video shows: the store's observations (no key), or a Dict store's entry ``key`` and its
    Box (``ConfigError`` naming the image entries when ``key`` is missing or not one of them)."""
    spec = store.schema.observation_dict
    if spec is None:
        if key is not None:
            raise ConfigError(f"--key {key!r} names an entry of a Dict observation, but {path} holds Box "
                              "observations; leave --key out")
        return None, store.schema.observation
    boxes = {k: stored_box(e) for k, e in spec.spaces}
    images = [k for k, b in boxes.items() if _is_image(b.shape)]
    if key is None and len(images) == 1:
        return images[0], boxes[images[0]]
    if key is None or key not in boxes or key not in images:
        what = "which entry to show" if key is None else f"--key {key!r} is not an image entry"
        raise ConfigError(f"{path} holds observations of {spec.describe()}; {what}: "
                          + (f"pass --key with one of {images}" if images else "none is an image, so save the episode "
                             "as .npz (each key as obs.KEY)"))
    return key, boxes[key]


def _flat_obs(store: ReplayStore, obs: Any) -> dict[str, np.ndarray] | None:
    """A Dict store's observations as one array per entry, a nested one's named by their paths
    (``achieved_goal/kettle``); None for a Box store's."""
    spec = store.schema.observation_dict
    if spec is None:
        return None
    if spec.tree is None:
        return dict(obs)
    leaves = nesting.flatten(spec.tree, obs, name="obs", path=str(store.path), expected=spec.describe)
    return dict(zip(spec.keys, leaves, strict=True))


def _is_image(shape: tuple[int, ...]) -> bool:
    try:
        _frames_as_images(np.zeros((1, *shape), dtype=np.uint8))
    except ConfigError:
        return False
    return True


def _check_images(store: ReplayStore, index: int, stream: int, moves: slice | None, suffix: str) -> None:
    """Refuse a video whose frames and images would not fit, against half of the memory this process
    may use: three times the frames' bytes for a .gif (uint8 copies, and Pillow's), twice for an
    .mp4 (streamed to disk)."""
    lengths = episode_table(stream_ring(store.rings, stream))["lengths"]
    if not -lengths.size <= index < lengths.size:
        return  # (store.episode says what is wrong with the index)
    a, b = window(moves, int(lengths[index]), f"episode {index}")
    frame = int(np.prod(store.schema.observation.shape, dtype=np.int64)) * np.dtype(store.schema.observation.dtype).itemsize
    # (a Dict store's whole frame: the episode is read whole, every entry of it)
    copies = 3 if suffix == ".gif" else 2
    check_episode(copies * (b - a + 1) * frame, None,
                  what=f"episode {index} of stream {stream} as a{'n' if suffix == '.mp4' else ''} {suffix} ({b - a:,} moves)")


def _frames_as_images(frames: np.ndarray) -> np.ndarray:
    """``(n, H, W)`` or ``(n, H, W, 3|4)`` views of ``(n, *frame_shape)``; ``ConfigError`` if they are not images."""
    shape = frames.shape[1:]
    if len(shape) == 2:
        return frames
    if len(shape) == 3:
        if shape[-1] in (1, 3, 4):
            return frames[..., 0] if shape[-1] == 1 else frames
        if shape[0] in (1, 3, 4):  # channels first
            moved = np.moveaxis(frames, 1, -1)
            return moved[..., 0] if shape[0] == 1 else moved
    raise ConfigError(f"the observations have shape {shape}, which is not an image ((H, W), (H, W, C) or (C, H, W) "
                      "with C in 1, 3, 4); save the episode as .npz instead")


def _to_uint8(frames: np.ndarray, low: Any, high: Any) -> np.ndarray:
    """Frames as uint8 images: uint8 as they are, booleans as 0/255, anything else scaled from the
    space's bounds (or, where those are infinite, the episode's own range)."""
    images = _frames_as_images(frames)
    if images.dtype == np.uint8:
        return images
    if images.dtype == np.bool_:
        return images.astype(np.uint8) * 255
    values = images.astype(np.float64)
    lo, hi = float(np.min(np.asarray(low, dtype=np.float64))), float(np.max(np.asarray(high, dtype=np.float64)))
    if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
        lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
    scaled = (values - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(values)
    return np.clip(np.nan_to_num(scaled), 0, 255).astype(np.uint8)
