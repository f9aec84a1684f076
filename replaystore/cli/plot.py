"""``replaystore inspect --plot FILE.png``: a picture of what a store holds.

Top: the return of every complete live episode, oldest first, with a running mean. Below: a grid of
sampled transitions, one row each: the frame stack the agent saw and the next frame, labelled with
the action, reward and how the move ended. Image frames are drawn as images; vector observations as
one heat map per stack. Uses matplotlib's object API (no pyplot, no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from replaystore.cli.summary import episodes
from replaystore.errors import ConfigError
from replaystore.storage.outside import check_target, publish_file, temporary
from replaystore.store import ReplayStore

SAMPLES = 4


def plot_store(path: str | Path, out: str | Path, *, samples: int = SAMPLES, seed: int = 0) -> Path:
    """Draw the store at ``path`` into the image ``out`` (any format matplotlib writes, by suffix; no
    suffix: PNG, ``.png`` added; an existing directory: ``<store name>.png`` in it); returns the file
    written."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ConfigError("inspect --plot needs matplotlib: pip install 'replaystore[plot]'") from exc
    out = Path(out)
    if out.is_dir():
        out = out / f"{Path(str(path).rstrip('/')).stem or 'store'}.png"
    elif not out.suffix:
        out = out.with_name(out.name + ".png")
    out = check_target(out, what="the plot")
    replace = out.exists()  # (an older plot there is replaced; where none was, none made meanwhile)
    with ReplayStore.open(path, cache_bytes=0) as store:  # (each chunk is read once: no cache to hold)
        eps = [episodes(store, j) for j in range(store.num_streams)]
        k = store.frame_stack
        images = len(store.schema.observation.shape) >= 2
        n = min(samples, len(store))
        cols = k + 1 if images else 1
        fig = Figure(figsize=(max(8.0, 1.6 * cols), 3.0 + 1.7 * max(n, 1)), layout="constrained")
        grid = fig.add_gridspec(1 + max(n, 1), cols, height_ratios=[1.6] + [1.0] * max(n, 1))
        ax = fig.add_subplot(grid[0, :])
        _plot_returns(ax, eps)
        if n == 0:
            ax = fig.add_subplot(grid[1, :])
            ax.text(0.5, 0.5, "no sampleable transitions", ha="center", va="center")
            ax.set_axis_off()
        else:
            batch = store.sample(n, rng=np.random.default_rng(seed))
            for row in range(n):
                action = np.array2string(batch.action[row], precision=2) if batch.action.ndim > 1 else int(batch.action[row])
                label = (f"slot {int(batch.index[row])}: action {action}, reward {float(batch.reward[row]):g}"
                         + (", terminated" if batch.terminated[row] else ", truncated" if batch.truncated[row] else ""))
                if images:
                    frames = [*batch.obs[row], batch.next_obs[row][-1]]
                    for col, frame in enumerate(frames):
                        a = fig.add_subplot(grid[1 + row, col])
                        _show_frame(a, frame)
                        a.set_title("next" if col == k else (label if col == 0 else _age(k - 1 - col)),
                                    fontsize=7, loc="left" if col == 0 else "center")
                else:
                    a = fig.add_subplot(grid[1 + row, 0])
                    stack = np.concatenate([_components(batch.obs, row), _components(batch.next_obs, row)[-1:]])
                    im = a.imshow(stack, aspect="auto", cmap="viridis")
                    a.set_yticks(range(k + 1), [_age(k - 1 - i) for i in range(k)] + ["next"], fontsize=7)
                    a.set_title(label, fontsize=8, loc="left")
                    a.set_xlabel("observation component" if not isinstance(batch.obs, dict) else
                                 "observation component (" + ", then ".join(batch.obs) + ")", fontsize=7)
                    fig.colorbar(im, ax=a)
        fig.suptitle(f"{path}: {len(store):,} transitions, capacity {store.capacity:,}", fontsize=10)
        tmp = temporary(out)
        try:
            fig.savefig(tmp, dpi=90, format=out.suffix.lstrip(".").lower())
            publish_file(tmp, out, replace=replace)
        except ValueError as exc:  # a suffix matplotlib does not write
            raise ConfigError(f"cannot draw {out}: {exc}; name the file .png, .svg or .pdf") from None
        finally:
            tmp.unlink(missing_ok=True)
    return out


def _age(steps_back: int) -> str:
    return "t" if steps_back == 0 else f"t-{steps_back}"


def _plot_returns(ax: Any, per_stream: list[dict[str, np.ndarray]]) -> None:
    """Episode returns by the position they ended at, one series per stream (streams written by a
    vector env step together, so their positions line up in time), and a running mean of each."""
    total = sum(int(np.count_nonzero(eps["whole"])) for eps in per_stream)
    if total == 0:
        ax.text(0.5, 0.5, "no complete episode among the live steps", ha="center", va="center")
        ax.set_axis_off()
        return
    several = len(per_stream) > 1
    for j, eps in enumerate(per_stream):
        whole = eps["whole"]
        returns, x = eps["returns"][whole], eps["end_step"][whole]
        if returns.size == 0:
            continue
        points = ax.plot(x, returns, ".", markersize=3, alpha=0.5,
                         label=f"stream {j}" if several else "episode return")
        window = max(1, min(100, returns.size // 10))
        if window > 1:
            mean = np.convolve(returns, np.ones(window) / window, mode="valid")
            ax.plot(x[window - 1:], mean, "-", linewidth=1.5, color=points[0].get_color(),
                    label=None if several else f"mean of {window}")
    ax.set_xlabel("step of its stream (position the episode ended at)" if several else
                  "step (position the episode ended at)")
    ax.set_ylabel("return")
    ax.set_title(f"{total:,} complete episodes" + (f" in {len(per_stream)} streams" if several else ""), fontsize=9)
    if len(per_stream) <= 10:
        ax.legend(fontsize=7, loc="best")


def _show_frame(ax: Any, frame: np.ndarray) -> None:
    if frame.ndim == 3 and frame.shape[-1] in (3, 4):
        ax.imshow(frame)
    else:
        ax.imshow(frame if frame.ndim == 2 else frame[..., 0], cmap="gray")
    ax.set_axis_off()


def _components(obs: Any, row: int) -> np.ndarray:
    """Row ``row``'s stack as ``(frame_stack, components)`` floats: a Dict store's entries side by side."""
    parts = obs.values() if isinstance(obs, dict) else [obs]
    return np.concatenate([p[row].reshape(p.shape[1], -1).astype(np.float64) for p in parts], axis=1)
