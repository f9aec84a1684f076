"""What a ``replaystore-train`` process does around its run: Keras imported without TensorFlow's
start-up noise, SIGINT and SIGTERM turned into a clean stop (the run checkpoints and exits), and its
peak resident set."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: TensorFlow's start-up lines (absl logging from its C++ libraries, which prints them before
#: TF_CPP_MIN_LOG_LEVEL is read, and twice: once per library that links it).
TF_NOISE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\)|To enable the following instructions"
                      r"|[IWE]\d{4} [\d:. ]+\d+ (port|cudart_stub|cpu_feature_guard|cuda_platform|cuda_executor|"
                      r"cuda_fft|cuda_dnn|cuda_blas|computation_placer)\.cc:\d+\])")


@contextlib.contextmanager
def filtered_stderr(noise: re.Pattern[str]) -> Iterator[None]:
    """Hold what is written to file descriptor 2 (by C++ code too) while the block runs, then write
    back every line that ``noise`` does not match."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().decode(errors="replace").splitlines(keepends=True):
                if not noise.match(line):
                    sys.stderr.write(line)
            sys.stderr.flush()


def import_keras() -> Any:
    """Keras and TensorFlow where it is installed (TensorBoard's writer uses it on either backend;
    scalars.py), without TensorFlow's start-up noise: on a machine without a GPU it prints CPU-flag
    notes, "could not find cuda drivers" and an ``E0000 ... failed call to cuInit`` line that reads
    as a failure, each twice. A ``TF_CPP_MIN_LOG_LEVEL`` below 3 that the user set wins: then
    everything is printed (3, the usual way to ask TensorFlow for quiet, still lets absl's
    pre-initialisation lines through, so those are filtered as if it were unset). On JAX without
    TensorFlow (a GPU box), only Keras."""
    if importlib.util.find_spec("tensorflow") is None:
        import keras
    elif os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3").strip() != "3":
        import keras
        import tensorflow  # noqa: F401
    else:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        with filtered_stderr(TF_NOISE):
            import keras
            import tensorflow  # noqa: F401
    return keras


@contextlib.contextmanager
def stop_signals() -> Iterator[list[int]]:
    """While the block runs, SIGINT and SIGTERM are recorded in the list it gets (the run polls it
    between steps, then checkpoints and stops) instead of raising; the old handlers come back after."""
    stop: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, _: stop.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")
