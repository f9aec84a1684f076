"""Videos of games (``replaystore-train --evaluate RUN --video FILE``).

The file is the store command's ``VideoFile`` (replaystore/cli/video.py: ``.mp4`` streamed to disk,
``.gif`` at most ``GIF_FRAMES`` frames here, ~35 KB each for Atari, written beside its name and
renamed onto it when whole). ``RecordGame`` wraps an env made with ``render_mode="rgb_array"``
(``make_env(..., render=True)``) and writes the screen after its reset and after each step of its
first game, then stops recording.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from replaystore.cli.video import VideoFile
from replaystore.cli.video import check_video_path as _check_path

from .config import TrainerError

#: A .gif keeps at most this many frames (its frames are held in RAM until it is written).
GIF_FRAMES = 10_000


def check_video_path(path: str | Path) -> Path:
    """``path`` as ``--video``'s file; ConfigError for a suffix other than .mp4 or .gif, a
    directory, or a folder that does not exist."""
    return _check_path(path, what="--video")


def video_file(path: Path, fps: float) -> VideoFile:
    """The file ``--video`` writes: a .gif of at most GIF_FRAMES frames, an .mp4 of any length."""
    return VideoFile(path, fps, max_frames=GIF_FRAMES, what="--video")


def rgb(frame: Any) -> np.ndarray:
    """``frame`` as an RGB image; TrainerError for anything else."""
    image = np.asarray(frame)
    if image.ndim != 3 or image.shape[-1] != 3 or image.dtype != np.uint8 or not image.size:
        raise TrainerError(f"the env's screen is an array of shape {image.shape} and dtype {image.dtype}; a video "
                           "needs RGB images, (height, width, 3) uint8")
    return image


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
        self.video.add(rgb(self._screen()))

    def _screen(self) -> Any:
        try:
            frame = self.env.render()
        except gym.error.DependencyNotInstalled as exc:
            raise TrainerError(f"the env cannot show its screen: {exc}; or leave out --video") from None
        if frame is None:
            raise TrainerError("the env's render() gave no screen; leave out --video")
        return frame
