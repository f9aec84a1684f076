"""Videos of games (``replaystore-train --evaluate RUN --video FILE``).

``VideoFile`` writes RGB frames to FILE:

- ``.mp4``: OpenCV's MPEG-4 (``mp4v``: VLC and most players; browsers want H.264, which the
  opencv wheels do not encode), streamed to disk, so a game of any length costs one frame of RAM;
- ``.gif``: Pillow's, each frame reduced to a palette of 256 colours as it comes (Atari's screens
  have fewer, so nothing is lost there), and at most ``GIF_FRAMES`` of them (~35 KB each for Atari).

It is written beside its final name (``.NAME-PID.part.SUFFIX``) and renamed onto it when whole, so
a crash, a full disk or Ctrl-C leaves no half-written video (and an earlier one stays as it was).

``RecordGame`` wraps an env made with ``render_mode="rgb_array"`` (``make_env(..., render=True)``)
and writes the screen after its reset and after each step of its first game, then stops recording.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from .config import TrainerError

SUFFIXES = (".mp4", ".gif")
#: A .gif keeps at most this many frames (its frames are held in RAM until it is written).
GIF_FRAMES = 10_000


def check_video_path(path: str | Path) -> Path:
    """``path`` as a video's file; TrainerError for a suffix other than SUFFIXES, a directory, or a
    folder that does not exist."""
    out = Path(path)
    if out.is_dir():
        raise TrainerError(f"--video {path} is a directory; give a file name ending in .mp4 or .gif")
    if out.suffix.lower() not in SUFFIXES:
        raise TrainerError(f"--video {path}: name the file .mp4 (any length, streamed to disk) or .gif (at most "
                           f"{GIF_FRAMES:,} frames)")
    if not out.parent.is_dir():
        raise TrainerError(f"--video {path}: the folder {out.parent} does not exist; make it first")
    return out


def rgb(frame: Any) -> np.ndarray:
    """``frame`` as an RGB image; TrainerError for anything else."""
    image = np.asarray(frame)
    if image.ndim != 3 or image.shape[-1] != 3 or image.dtype != np.uint8 or not image.size:
        raise TrainerError(f"the env's screen is an array of shape {image.shape} and dtype {image.dtype}; a video "
                           "needs RGB images, (height, width, 3) uint8")
    return image


class VideoFile:
    """RGB frames (``(H, W, 3)`` uint8, all of one size) into an .mp4 or .gif at ``fps``: ``add``
    each, then ``commit`` (renames the whole file onto ``path``) or ``discard``."""

    def __init__(self, path: str | Path, fps: float) -> None:
        self.path = check_video_path(path)
        self.fps = float(fps)
        self.part = self.path.with_name(f".{self.path.stem}-{os.getpid()}.part{self.path.suffix}")
        self.gif = self.path.suffix.lower() == ".gif"
        self.frames = 0  # frames written
        self.left_out = 0  # frames past GIF_FRAMES, not in the .gif
        self._writer: Any = None
        self._pictures: list[Any] = []
        self._size: tuple[int, int] | None = None

    def add(self, frame: np.ndarray) -> None:
        image = rgb(frame)
        size = (int(image.shape[1]), int(image.shape[0]))
        if self._size is None:
            self._size = size
            self._open(size)
        elif size != self._size:
            raise TrainerError(f"the env's screen changed size from {self._size[0]}x{self._size[1]} to "
                               f"{size[0]}x{size[1]} during the game; a video keeps one size")
        if self.gif:
            if len(self._pictures) >= GIF_FRAMES:
                self.left_out += 1
                return
            from PIL import Image

            self._pictures.append(Image.fromarray(np.ascontiguousarray(image), mode="RGB")
                                  .convert("P", palette=Image.Palette.ADAPTIVE, colors=256))
        else:
            self._writer.write(np.ascontiguousarray(image[..., ::-1]))  # OpenCV takes BGR
        self.frames += 1

    def _open(self, size: tuple[int, int]) -> None:
        if self.gif:
            try:
                import PIL  # noqa: F401
            except ImportError as exc:
                raise TrainerError("a .gif needs Pillow: pip install pillow (or name the video .mp4)") from exc
            return
        try:
            import cv2
        except ImportError as exc:
            raise TrainerError("an .mp4 needs OpenCV: pip install opencv-python-headless (or name the video .gif)") from exc
        self._writer = cv2.VideoWriter(str(self.part), cv2.VideoWriter.fourcc(*"mp4v"), self.fps, size)
        if not self._writer.isOpened():
            self._writer = None
            self.part.unlink(missing_ok=True)
            raise TrainerError(f"OpenCV cannot write {self.path} (MPEG-4 at {size[0]}x{size[1]}); name the video .gif")

    def commit(self) -> Path:
        """Write what is left and rename the whole file onto ``path``; TrainerError when no frame came."""
        if not self.frames:
            self.discard()
            raise TrainerError(f"no frame was recorded for {self.path}")
        try:
            if self.gif:
                first, *rest = self._pictures
                first.save(self.part, format="GIF", save_all=True, append_images=rest,
                           duration=max(20, round(1000 / self.fps)), loop=0)
                self._pictures = []
            else:
                self._writer.release()
                self._writer = None
            os.replace(self.part, self.path)
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


class RecordGame(gym.Wrapper):
    """Writes ``env.render()`` into ``video`` after the reset and after each step of the first game
    (until a step is terminated or truncated); later games are played unrecorded. ``recorded``:
    whether the first game ended."""

    def __init__(self, env: gym.Env, video: VideoFile) -> None:
        super().__init__(env)
        self.video = video
        self.recording = True
        self.recorded = False

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        out = self.env.reset(**kwargs)
        if self.recording:
            self._frame()
        return out

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        out = self.env.step(action)
        if self.recording:
            self._frame()
            if out[2] or out[3]:
                self.recording, self.recorded = False, True
        return out

    def check_screen(self) -> None:
        """TrainerError unless the env, reset, shows an RGB screen (nothing is recorded)."""
        rgb(self._screen())

    def _frame(self) -> None:
        self.video.add(self._screen())

    def _screen(self) -> Any:
        try:
            frame = self.env.render()
        except gym.error.DependencyNotInstalled as exc:
            raise TrainerError(f"the env cannot show its screen: {exc}; or leave out --video") from None
        if frame is None:
            raise TrainerError("the env's render() gave no screen; leave out --video")
        return frame
