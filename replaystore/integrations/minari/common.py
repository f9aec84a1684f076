"""What both directions share: Minari imported on first use, and the progress callback's type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replaystore.errors import ReplayStoreError

Progress = Callable[[int, int], None]  # (done, total): moves read in, or episodes written out


def minari_module() -> Any:
    """``import minari``, or a ``ReplayStoreError`` that says how to install it."""
    try:
        import minari
    except ImportError as exc:
        raise ReplayStoreError(f"Minari is not installed ({exc}): pip install 'replaystore[minari]'") from None
    return minari
