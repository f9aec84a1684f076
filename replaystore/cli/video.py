"""Frames into a video file: ``replaystore episodes --save INDEX FILE.mp4|FILE.gif`` and the
trainer's ``replaystore-train --evaluate RUN --video FILE``.

``VideoFile(path, fps)`` takes uint8 images one at a time, gray ``(H, W)`` or colour ``(H, W, 3)``,
all of one shape, and writes them as

- ``.mp4``: OpenCV's MPEG-4 (``mp4v``: VLC and most players; browsers want H.264, which the opencv
  wheels do not encode), streamed to disk, so a video of any length costs one frame of RAM. MPEG-4
  wants even sides: a frame with an odd side gets its last row or column repeated once;
- ``.gif``: Pillow's, a gray frame as it is, a colour one reduced to a palette of 256 colours as it
  comes (Atari's screens have fewer, so nothing is lost there); they are held in RAM until the file
  is written, so ``max_frames`` may bound them (the ones past it are counted in ``left_out``).

It is written beside its final name (``.NAME-PID.part.SUFFIX``), flushed to disk and renamed onto
it when whole, so a crash, a full disk or Ctrl-C leaves no half-written video, and an earlier file
of that name stays as it was until then.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import ConfigError
from replaystore.storage.outside import check_target, publish_file

SUFFIXES = (".mp4", ".gif")


def check_video_path(path: str | Path, *, what: str) -> Path:
    """``path`` as a video's file; ``ConfigError`` (its message begins with ``what``, the flag that
    named it) for a suffix other than ``SUFFIXES``, a directory, or a folder that does not exist."""
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"{what} {path} is a directory; give a file name ending in .mp4 or .gif")
    if out.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"{what} {path}: name the file .mp4 (MPEG-4, any length, streamed to disk) or .gif")
    if not out.parent.is_dir():
        raise ConfigError(f"{what} {path}: the folder {out.parent} does not exist; make it first")
    return check_target(out, what=f"{what} {path}")


class VideoFile:
    """uint8 frames, gray ``(H, W)`` or RGB ``(H, W, 3)`` and all of one shape, into an .mp4 or a
    .gif at ``fps``: ``add`` each, then ``commit`` (renames the whole file onto ``path``) or
    ``discard``. ``what`` names the file in errors (a flag: ``--video``, ``--save``)."""

    def __init__(self, path: str | Path, fps: float, *, max_frames: int | None = None, what: str = "the video") -> None:
        if not fps > 0:
            raise ConfigError(f"a video of {fps!r} frames per second; give a number > 0")
        self.path = check_video_path(path, what=what)
        self.replace = self.path.exists()  # (an older video there is replaced; where none was, none made meanwhile)
        self.fps = float(fps)
        self.max_frames = max_frames
        self.part = self.path.with_name(f".{self.path.stem}-{os.getpid()}.part{self.path.suffix}")
        self.gif = self.path.suffix.lower() == ".gif"
        self.frames = 0  # frames written
        self.left_out = 0  # frames past max_frames, not in the .gif
        self._writer: Any = None
        self._pictures: list[Any] = []
        self._shape: tuple[int, ...] | None = None

    def add(self, frame: np.ndarray) -> None:
        image = np.asarray(frame)
        if self._shape is None:
            if image.dtype != np.uint8 or not (image.ndim == 2 or (image.ndim == 3 and image.shape[-1] == 3)) \
                    or not image.size:
                raise ConfigError(f"a frame of shape {image.shape} and dtype {image.dtype}; a video takes uint8 "
                                  "images, gray (height, width) or colour (height, width, 3)")
            self._open(image.shape)
            self._shape = image.shape
        elif image.shape != self._shape or image.dtype != np.uint8:
            raise ConfigError(f"a frame of shape {image.shape} and dtype {image.dtype} after frames of shape "
                              f"{self._shape} uint8; a video keeps one size")
        if self.gif:
            if self.max_frames is not None and len(self._pictures) >= self.max_frames:
                self.left_out += 1
                return
            from PIL import Image

            picture = Image.fromarray(np.ascontiguousarray(image), mode="L" if image.ndim == 2 else "RGB")
            self._pictures.append(picture if image.ndim == 2
                                  else picture.convert("P", palette=Image.Palette.ADAPTIVE, colors=256))
        else:
            self._writer.write(_even(image if image.ndim == 2 else image[..., ::-1]))  # (OpenCV takes BGR)
        self.frames += 1

    def _open(self, shape: tuple[int, ...]) -> None:
        if self.gif:
            try:
                import PIL  # noqa: F401
            except ImportError as exc:
                raise ConfigError("a .gif needs Pillow: pip install pillow (or name the video .mp4)") from exc
            return
        try:
            import cv2
        except ImportError as exc:
            raise ConfigError("an .mp4 needs OpenCV: pip install opencv-python-headless (or name the video .gif)") from exc
        size = (shape[1] + shape[1] % 2, shape[0] + shape[0] % 2)
        self._writer = cv2.VideoWriter(str(self.part), cv2.VideoWriter.fourcc(*"mp4v"), self.fps, size,
                                       isColor=len(shape) == 3)
        if not self._writer.isOpened():
            self._writer = None
            self.part.unlink(missing_ok=True)
            raise ConfigError(f"OpenCV cannot write {self.path} (MPEG-4 at {size[0]}x{size[1]}); name the video .gif")

    def commit(self) -> Path:
        """Write what is left, flush it to disk and rename the whole file onto ``path``;
        ``ConfigError`` when no frame came."""
        if not self.frames:
            self.discard()
            raise ConfigError(f"no frame was recorded for {self.path}")
        try:
            if self.gif:
                first, *rest = self._pictures
                first.save(self.part, format="GIF", save_all=True, append_images=rest,
                           duration=max(20, round(1000 / self.fps)), loop=0)
                self._pictures = []
            else:
                self._writer.release()
                self._writer = None
            publish_file(self.part, self.path, replace=self.replace)
        except BaseException:
            self.discard()
            raise
        return self.path

    def discard(self) -> None:
        """Drop the frames and the part written; ``path`` stays as it was."""
        if self._writer is not None:
            self._writer.release()
            self._writer = None
        self._pictures = []
        self.part.unlink(missing_ok=True)


def _even(image: np.ndarray) -> np.ndarray:
    """``image`` with its last row and column repeated where its height or width is odd (MPEG-4's
    frames have even sides; OpenCV would crop them)."""
    h, w = image.shape[:2]
    if h % 2 or w % 2:
        pad = ((0, h % 2), (0, w % 2)) + ((0, 0),) * (image.ndim - 2)
        return np.pad(image, pad, mode="edge")
    return np.ascontiguousarray(image)
