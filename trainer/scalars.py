"""A run's scalars, written twice: as TensorBoard event files under ``run_dir/tb`` and as JSON lines
in ``run_dir/scalars.jsonl`` (one object per write: ``step``, ``time`` and the tags' values; strict
JSON, a value not known yet is ``"nan"``), which needs nothing installed and is what tools/ read.

TensorBoard's files are written by TensorFlow's summary writer where TensorFlow is installed (the
``train`` extra), else by tensorboardX where that is (a JAX-only GPU box: ``pip install
tensorboardX``), else not at all: ``tensorboard`` is then None and the JSON lines are the record.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Any

SCALARS = "scalars.jsonl"


class Scalars:
    """Writes ``{tag: value}`` at a step to TensorBoard (when it can) and to ``scalars.jsonl``."""

    def __init__(self, run_dir: Path) -> None:
        self._file = open(run_dir / SCALARS, "a")  # noqa: SIM115 (closed by close())
        self._tf: Any = None
        self._tbx: Any = None
        #: which library writes the TensorBoard files: "tensorflow", "tensorboardX" or None
        self.tensorboard: str | None = None
        if importlib.util.find_spec("tensorflow") is not None:
            import tensorflow as tf

            self._tf = tf
            self._writer = tf.summary.create_file_writer(str(run_dir / "tb"))
            self.tensorboard = "tensorflow"
        elif importlib.util.find_spec("tensorboardX") is not None:
            from tensorboardX import SummaryWriter

            self._tbx = SummaryWriter(str(run_dir / "tb"))
            self.tensorboard = "tensorboardX"

    def write(self, step: int, values: dict[str, float]) -> None:
        record: dict[str, Any] = {"step": step, "time": time.time()}
        record.update((tag, _strict(float(value))) for tag, value in values.items())
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        if self._tf is not None:
            with self._writer.as_default(step=step):
                for tag, value in values.items():
                    self._tf.summary.scalar(tag, value)
        elif self._tbx is not None:
            for tag, value in values.items():
                self._tbx.add_scalar(tag, float(value), step)

    def flush(self) -> None:
        self._file.flush()
        if self._tf is not None:
            self._writer.flush()
        elif self._tbx is not None:
            self._tbx.flush()

    def close(self) -> None:
        """Flush and close; idempotent."""
        if self._file.closed:
            return
        self.flush()
        self._file.close()
        if self._tf is not None:
            self._writer.close()
        elif self._tbx is not None:
            self._tbx.close()


def _strict(value: float) -> float | str:
    """A value for strict JSON: NaN (a value not known yet) and infinities as strings, as the store's
    own JSON keeps them (docs/format.md)."""
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def read(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/scalars.jsonl``, in the order written (a last line cut by a crash
    is left out)."""
    return read_lines(Path(run_dir) / SCALARS)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (``scalars.jsonl``, ``evals.jsonl``), none if it does not exist; a
    line that does not parse (the last one, cut by a crash or being written) is left out."""
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
