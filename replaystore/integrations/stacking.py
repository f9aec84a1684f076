"""Frame stacks made by an env wrapper, stored once a frame and rebuilt exactly (no torch, no SB3).

An Atari agent sees a stack of its last ``k`` frames. SB3's ``VecFrameStack`` concatenates them on
the channel axis (channels last, or first after ``VecTransposeImage``) and pads a new episode's stack
with zeros; gymnasium's ``FrameStackObservation`` puts them on a new first axis and pads with the
episode's first frame. Either way the store keeps only each stack's newest frame (its last ``c``
channels on the stack axis) and rebuilds the stack at sample time from the stream's previous
frames, padded the same way (``frame_padding`` in the store's schema).

``StackLayout`` says where the stack is: the axis (first or last), ``k``, and the padding. A layout
is taken from the caller or detected from the first observations of fresh episodes (``detect``):
every candidate axis and ``k`` is tested against what a reset stack must look like (zeros then a
frame, or one frame ``k`` times) and exactly one must fit. Then every ``add`` is checked
(``StackChecker``): an episode's first stack must be padded as the layout says, each next
observation must be the previous stack shifted by one frame, and each observation must be the
previous step's next observation. By induction every stack the store rebuilds is the stack the
agent saw, byte for byte; an observation that breaks this is refused before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, InvalidTransitionError
from replaystore.format.dictobs import DictSpec
from replaystore.storage.rows import same

PADDINGS = ("zero", "reset")


@dataclass(frozen=True)
class StackLayout:
    """Observations of ``obs_shape`` that are ``frame_stack`` frames along ``axis`` (0 or the last),
    each frame ``channels`` wide on that axis, oldest first, padded with ``padding`` before an
    episode's first frame. ``frame_stack == 1``: the observation is stored whole."""

    obs_shape: tuple[int, ...]
    frame_stack: int = 1
    axis: int = 0
    padding: str = "reset"

    @property
    def channels(self) -> int:
        return self.obs_shape[self.axis] // self.frame_stack if self.obs_shape else 1

    @property
    def frame_shape(self) -> tuple[int, ...]:
        if self.frame_stack == 1:
            return self.obs_shape
        shape = list(self.obs_shape)
        shape[self.axis] = self.channels
        return tuple(shape)

    def describe(self) -> str:
        if self.frame_stack == 1:
            return f"whole observations {self.obs_shape} (no frame stack)"
        side = "first" if self.axis == 0 else "last"
        return (f"{self.frame_stack} frames of {self.frame_shape} stacked on the {side} axis of {self.obs_shape}, "
                f"{self.padding}-padded")

    def _cut(self, obs: np.ndarray, start: int | None, stop: int | None) -> np.ndarray:
        """``obs[..., start:stop]`` on the stack axis; ``obs`` has one leading batch axis."""
        index: list[Any] = [slice(None)] * obs.ndim
        index[1 + self.axis] = slice(start, stop)
        return obs[tuple(index)]

    def newest(self, obs: np.ndarray) -> np.ndarray:
        """The newest frame of each row of ``obs`` (``(n, *obs_shape)``), as ``(n, *frame_shape)``."""
        if self.frame_stack == 1:
            return obs
        return np.ascontiguousarray(self._cut(obs, -self.channels, None))

    def shifted(self, obs: np.ndarray, next_obs: np.ndarray) -> np.ndarray:
        """Per row: whether ``next_obs`` is ``obs`` moved on by one frame (its older frames are ``obs``'s newer)."""
        if self.frame_stack == 1:
            return np.ones(len(obs), dtype=bool)
        c = self.channels
        return _rows_equal(self._cut(next_obs, None, -c), self._cut(obs, c, None))

    def padded(self, obs: np.ndarray) -> np.ndarray:
        """Per row: whether ``obs`` is the stack of an episode's first step under this layout."""
        if self.frame_stack == 1:
            return np.ones(len(obs), dtype=bool)
        c = self.channels
        older = self._cut(obs, None, -c)
        if self.padding == "zero":
            return np.asarray(~older.reshape(len(obs), -1).any(axis=1))
        frame = self._cut(obs, -c, None)
        reps = [1] * obs.ndim
        reps[1 + self.axis] = self.frame_stack - 1
        return _rows_equal(older, np.tile(frame, reps))

    def rebuild(self, stacks: np.ndarray) -> np.ndarray:
        """The store's stacks, ``(n, k, *frame_shape)``, as the agent's observations ``(n, *obs_shape)``."""
        n = stacks.shape[0]
        if self.frame_stack == 1:
            return stacks.reshape(n, *self.obs_shape)
        if self.axis == 0:  # frames one after another on the first axis: the same bytes
            return stacks.reshape(n, *self.obs_shape)
        return np.moveaxis(stacks, 1, -2).reshape(n, *self.obs_shape)  # (n, ..., k, c) -> (n, ..., k*c)

    def frame_space(self, space: Any) -> Any:
        """The gymnasium Box of one stored frame, cut from the observation space's bounds."""
        import gymnasium as gym

        if self.frame_stack == 1:
            return space
        low = self._cut(np.asarray(space.low)[None], -self.channels, None)[0]
        high = self._cut(np.asarray(space.high)[None], -self.channels, None)[0]
        return gym.spaces.Box(low=low, high=high, shape=self.frame_shape, dtype=space.dtype)


def _rows_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = len(a)
    equal = np.asarray(a == b)
    if a.dtype.kind == "f":
        equal |= np.isnan(a) & np.isnan(b)
    return np.asarray(equal.reshape(n, -1).all(axis=1))


def candidates(obs_shape: tuple[int, ...], frame_stack: int | None, axis: int | None,
               padding: str | None) -> list[StackLayout]:
    """Every layout of ``obs_shape`` the arguments allow (``None``: any), largest ``k`` first."""
    ndim = len(obs_shape)
    axes = sorted({0, ndim - 1}) if axis is None else [axis]
    paddings = list(PADDINGS) if padding is None else [padding]
    out: list[StackLayout] = []
    for a in axes:
        size = obs_shape[a]
        ks = [frame_stack] if frame_stack is not None else [k for k in range(size, 1, -1) if size % k == 0]
        for k in ks:
            if k >= 2 and size % k == 0:
                out.extend(StackLayout(obs_shape, k, a, p) for p in paddings)
    return out


def choose(obs_shape: tuple[int, ...], first: np.ndarray, *, frame_stack: Any = "auto", stack_axis: Any = None,
           padding: Any = None) -> StackLayout:
    """The layout of observations of ``obs_shape`` given ``first``, a batch of episodes' first
    observations (``(n, *obs_shape)``), and what the caller said (``frame_stack``: an int, or
    ``"auto"``; ``stack_axis``: 0, -1 or None; ``padding``: ``"zero"``, ``"reset"`` or None).

    ``frame_stack=1`` stores whole observations (always exact). ``"auto"`` stores whole
    observations when the observation has fewer than 2 axes or no stacked layout fits; otherwise the
    one layout that fits every row of ``first``, the largest ``k`` on its axis. Two layouts on
    different axes or paddings that both fit are refused (say which with ``stack_axis``/``padding``).
    """
    ndim = len(obs_shape)
    if padding is not None and padding not in PADDINGS:
        raise ConfigError(f"padding is {padding!r}; use 'zero' (SB3's VecFrameStack) or 'reset' (gymnasium's "
                          "FrameStackObservation), or leave it out to detect it")
    axis = None
    if stack_axis is not None:
        if ndim == 0 or stack_axis not in (0, -1, ndim - 1) or isinstance(stack_axis, bool):
            raise ConfigError(f"stack_axis is {stack_axis!r}; use 0 (frames stacked on the first axis) or -1 "
                              f"(the last) of the observation shape {obs_shape}")
        axis = stack_axis % ndim
    if frame_stack == "auto":
        if ndim < 2:
            return StackLayout(obs_shape)
        stack = None
    elif isinstance(frame_stack, (int, np.integer)) and not isinstance(frame_stack, bool) and frame_stack >= 1:
        stack = int(frame_stack)
        if stack == 1:
            return StackLayout(obs_shape)
        if ndim == 0:
            raise ConfigError(f"frame_stack is {stack} but observations of shape {obs_shape} hold no frames to stack")
    else:
        raise ConfigError(f"frame_stack is {frame_stack!r}; pass the k of your VecFrameStack/FrameStackObservation, "
                          "1 to store whole observations, or 'auto' to detect it")
    fits = [c for c in candidates(obs_shape, stack, axis, padding) if bool(c.padded(first).all())
            and (c.padding == "reset" or bool(c.newest(first).reshape(len(first), -1).any(axis=1).all()))]
    best: dict[tuple[int, str], StackLayout] = {}
    for c in fits:  # largest k first: [0, 0, 0, f] is a 4-stack, not a 2-stack of 2-channel frames
        best.setdefault((c.axis, c.padding), c)
    found = list(best.values())
    if len(found) == 1:
        return found[0]
    if not found:
        if stack is None:
            return StackLayout(obs_shape)
        said = f"k={stack}" + (f" on axis {stack_axis}" if axis is not None else "") + (
            f", {padding}-padded" if padding else "")
        raise ConfigError(
            f"the first observations ({obs_shape}) are not frame stacks of {said}: an episode's first stack must be "
            "zeros then a frame (SB3's VecFrameStack) or one frame k times (gymnasium's FrameStackObservation). "
            "Check frame_stack, or pass frame_stack=1 to store whole observations")
    options = ", ".join(f"stack_axis={c.axis if c.axis == 0 else -1}, padding={c.padding!r} (k={c.frame_stack})"
                        for c in found)
    raise ConfigError(f"the first observations ({obs_shape}) fit more than one frame-stack layout: {options}; "
                      "pass stack_axis and padding to say which, or frame_stack=1 to store whole observations")


def from_frames(obs_shape: tuple[int, ...], frame_shape: tuple[int, ...], frame_stack: int, padding: str,
                where: str) -> StackLayout:
    """The layout of an existing store whose frames are ``frame_shape``, for observations of ``obs_shape``."""
    if frame_stack == 1 and frame_shape == obs_shape:
        return StackLayout(obs_shape)
    for axis in sorted({0, len(obs_shape) - 1}):
        layout = StackLayout(obs_shape, frame_stack, axis, padding)
        if frame_stack > 1 and obs_shape[axis] % frame_stack == 0 and layout.frame_shape == frame_shape:
            return layout
    raise ConfigError(f"the store at {where} holds frames of shape {frame_shape} stacked {frame_stack} deep, which "
                      f"do not make observations of shape {obs_shape}; use a new path for this environment")


class StackChecker:
    """Checks each vector step against a layout before it is stored (see the module docstring) and
    says which rows start a new episode and which cannot be stored as a move."""

    def __init__(self, layout: StackLayout, n_envs: int, spec: DictSpec | None = None) -> None:
        """``spec``: the Dict the observations are packed frames of (compared entry by entry)."""
        self.layout = layout
        self.n_envs = n_envs
        self.spec = spec
        self.last: list[np.ndarray | None] = [None] * n_envs  # each row's previous next_obs
        self.open = [False] * n_envs  # whether its stream's episode is in progress (at ``last``)

    def forget(self) -> None:
        """No episode is in progress any more (the store ended them)."""
        self.last = [None] * self.n_envs
        self.open = [False] * self.n_envs

    def check(self, obs: np.ndarray, next_obs: np.ndarray) -> tuple[list[int], list[int]]:
        """``(end, skip)``: the rows whose stream's episode in progress must be ended (as truncated)
        before this step, because ``obs`` starts a new episode instead of continuing it; and the rows
        whose move crosses an episode boundary (a next-step autoreset row: ``obs`` is the last
        observation, ``next_obs`` a reset stack), which are not stored. Raises
        ``InvalidTransitionError`` for a row the layout cannot rebuild exactly, before anything is written."""
        layout = self.layout
        end: list[int] = []
        skip: list[int] = []
        same_as_last = [last is not None and same(obs[i], last, self.spec) for i, last in enumerate(self.last)]
        if layout.frame_stack == 1:
            return [i for i in range(self.n_envs) if self.open[i] and not same_as_last[i]], skip
        starts = layout.padded(obs)
        shifted = layout.shifted(obs, next_obs)
        reset_next = layout.padded(next_obs)
        for i in range(self.n_envs):
            if not shifted[i] and reset_next[i] and same_as_last[i]:
                skip.append(i)  # the vector env's reset row: no move to store
                if self.open[i]:
                    end.append(i)
                continue
            if not (self.open[i] and same_as_last[i]):
                if not starts[i]:
                    raise InvalidTransitionError(
                        f"obs[{i}] neither continues its episode (it differs from the previous next_obs[{i}]) nor starts "
                        f"a new one ({layout.describe()}): the store could not rebuild it exactly; nothing was written. "
                        "If your frames are stacked differently pass frame_stack, stack_axis and padding, or "
                        "frame_stack=1 to store whole observations")
                if self.open[i]:
                    end.append(i)
            if not shifted[i]:
                raise InvalidTransitionError(
                    f"next_obs[{i}] is not obs[{i}] moved on by one frame ({layout.describe()}), so the store could "
                    "not rebuild it exactly; nothing was written. Pass the stacked observations as the env returns "
                    "them (the terminal observation's stack where an episode ended), or frame_stack=1 to store "
                    "whole observations")
        return end, skip

    def advance(self, next_obs: np.ndarray, ended: np.ndarray, skip: list[int]) -> None:
        """After a stored step: where each stream's episode now stands."""
        for i in range(self.n_envs):
            self.last[i] = next_obs[i].copy()
            self.open[i] = not (bool(ended[i]) or i in skip)
