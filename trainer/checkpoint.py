"""Atomic checkpoints: files replaced whole, so a crash at any moment leaves the previous version or
the new one, never a torn file.

``checkpoint.npz`` holds the online and target weights, the optimizer's variables (Adam's moments
and iteration count) and a JSON ``state`` (the run's counters and its exploration generator, state.py).
Every file is written to a temporary name in the same directory, fsynced, renamed over the old one,
and the directory fsynced. The replay store is not in it: the store on disk is the replay half of
the checkpoint, flushed just before each one is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from replaystore.storage.readfile import npz_arrays, read_text

from .actions import ActionSpec
from .config import TrainerError
from .stacks import StackSpec

CHECKPOINT = "checkpoint.npz"
PARTS = ("online", "target", "optimizer")
#: Files ``DQN.save`` writes beside the checkpoint: the model, and what rebuilds the agent around it.
MODEL_FILE = "model.keras"
AGENT_FILE = "agent.json"
#: ``replaystore-train``'s best weights: the online weights of the run's highest evaluation so far.
BEST = "best.npz"


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[IO[bytes]]:
    """A file to write ``path``'s new contents to; renamed over ``path`` (fsynced) when the block ends
    without an error, removed otherwise."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=f"{path.suffix}.tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, whole."""
    with replacing(path) as f:
        f.write(data)


def save(run_dir: Path, arrays: dict[str, list[np.ndarray]], state: dict[str, Any]) -> Path:
    """Write ``arrays`` (``Learner.state()``) and ``state`` atomically to ``run_dir/checkpoint.npz``."""
    payload: dict[str, Any] = {f"{part}/{i:04d}": np.asarray(a) for part in PARTS for i, a in enumerate(arrays[part])}
    payload["state"] = np.frombuffer(json.dumps(state).encode(), dtype=np.uint8)
    path = run_dir / CHECKPOINT
    with replacing(path) as f:
        np.savez(f, **payload)
    return path


def save_model(path: Path, model: Any) -> None:
    """``model.save`` (a ``.keras`` file), replaced atomically."""
    tmp = path.with_name(f".{path.stem}-saving.keras")  # Keras wants the .keras suffix on the name it writes
    try:
        model.save(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(run_dir: Path) -> tuple[dict[str, list[np.ndarray]], dict[str, Any]] | None:
    """The arrays and state of the run's checkpoint, or None if the run stopped before its first one
    (it is written as soon as the networks exist); TrainerError if it is unreadable."""
    path = run_dir / CHECKPOINT
    if not path.is_file():
        return None
    try:
        data = _arrays(path)
        arrays: dict[str, list[np.ndarray]] = {part: [] for part in PARTS}
        for key in sorted(k for k in data if k != "state"):
            part, _ = key.split("/")
            arrays[part].append(data[key])
        state = json.loads(data["state"].tobytes().decode())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise TrainerError(f"cannot resume: {path} is damaged ({type(exc).__name__}: {exc}); the networks cannot be "
                           "restored from it: put back a copy of the file, or start a new run (the replay store "
                           "is untouched)") from exc
    if set(arrays) != set(PARTS) or not all(arrays.values()) or not isinstance(state, dict) \
            or not isinstance(state.get("global_step"), int):
        raise TrainerError(f"cannot resume: {path} is damaged (not the arrays and state a checkpoint holds); put "
                           "back a copy of the file, or start a new run (the replay store is untouched)")
    return arrays, state


def _arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a checkpoint file, each array's declared size checked before it is inflated:
    ``np.savez`` stores them uncompressed, so together they are at most the file's size (a small
    file of compressed zeros that declares gigabytes is refused unread)."""
    budget = 2 * path.stat().st_size + 2**20
    return dict(npz_arrays(path, budget=budget, what="a checkpoint file"))


def save_best(run_dir: Path, weights: list[np.ndarray], info: dict[str, Any]) -> None:
    """Write ``weights`` (``model.get_weights()``) and ``info`` (the evaluation: its step, mean
    return and returns) atomically to ``run_dir/best.npz``."""
    payload: dict[str, Any] = {f"online/{i:04d}": np.asarray(a) for i, a in enumerate(weights)}
    payload["info"] = np.frombuffer(json.dumps(info).encode(), dtype=np.uint8)
    with replacing(run_dir / BEST) as f:
        np.savez(f, **payload)


def load_best(run_dir: Path) -> tuple[list[np.ndarray], dict[str, Any]] | None:
    """The weights and evaluation ``save_best`` wrote, or None when there are none; TrainerError if
    the file is unreadable."""
    path = run_dir / BEST
    if not path.is_file():
        return None
    try:
        data = _arrays(path)
        weights = [data[k] for k in sorted(k for k in data if k.startswith("online/"))]
        info = json.loads(data["info"].tobytes().decode())
        if not isinstance(info, dict) or not isinstance(info.get("mean_return"), int | float) or not weights:
            raise ValueError("not the weights and evaluation a best.npz holds")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise TrainerError(f"{path} is damaged ({type(exc).__name__}: {exc}); delete it (the run writes it again at "
                           "its next evaluation) or put back a copy") from exc
    return weights, info


def save_agent(directory: Path, model: Any, doc: dict[str, Any], arrays: dict[str, list[np.ndarray]],
               state: dict[str, Any]) -> None:
    """Write a saved agent: ``model.keras``, ``checkpoint.npz`` and ``agent.json`` (``doc``), each atomically."""
    save_model(directory / MODEL_FILE, model)
    save(directory, arrays, state)
    write_atomically(directory / AGENT_FILE, json.dumps(doc, indent=2, default=str).encode())


def load_agent(directory: Path, loading: Any) -> tuple[
        Any, dict[str, Any], tuple[dict[str, list[np.ndarray]], dict[str, Any]]]:
    """What ``save_agent`` wrote: the model (read as ``loading``, a ``models.Loading``, says),
    ``agent.json`` (its ``optimizer`` made an optimizer) and the checkpoint's arrays and state;
    TrainerError naming what is missing or unreadable."""
    import keras

    if not (directory / AGENT_FILE).is_file() or not (directory / MODEL_FILE).is_file():
        if (directory / "args.json").is_file():
            raise TrainerError(f"{directory} is a replaystore-train run directory, not a saved agent ({AGENT_FILE} and "
                               f"{MODEL_FILE}): load it with replaystore.trainer.load_run({str(directory)!r})")
        raise TrainerError(f"{directory} holds no saved agent ({AGENT_FILE} and {MODEL_FILE}); pass the directory "
                           "DQN.save or fit(checkpoint_dir=...) wrote")
    try:
        doc = json.loads(read_text(directory / AGENT_FILE, what="an agent.json"))
        model = loading.load(directory / MODEL_FILE)
        doc["optimizer"] = keras.optimizers.deserialize(doc["optimizer"])
    except Exception as exc:  # noqa: BLE001 - whatever Keras raised loading the user's model, in one line
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()
                      and not line.startswith("Exception encountered")), type(exc).__name__)
        hint = ("; if you wrote this file yourself and trust it, DQN.load(..., safe_mode=False) loads its Lambda"
                if "safe_mode" in str(exc) else "; pass the custom layers and functions it uses as custom_objects"
                if isinstance(exc, TypeError | ValueError | NameError) else "")
        raise TrainerError(f"cannot load the agent in {directory}: {first[:300]}{hint}") from None
    saved = load(directory)
    if saved is None:
        raise TrainerError(f"{directory} holds no checkpoint.npz; the agent was not saved there")
    return model, doc, saved


def saved_stacks(directory: Path, doc: dict[str, Any]) -> tuple[StackSpec, ActionSpec] | None:
    """The Q-network's stacks and actions as ``agent.json`` keeps them (None in an agent saved before
    they were kept); TrainerError if they are damaged."""
    stacks = doc.get("stacks")
    if stacks is None:
        return None
    try:
        spec, actions = StackSpec.from_json(stacks)
        return spec, ActionSpec.from_json(actions)
    except (KeyError, TypeError, ValueError) as exc:
        raise TrainerError(f"{directory / AGENT_FILE} is damaged: its stacks are {stacks!r} ({type(exc).__name__}); "
                           "put back a copy of the file") from None


def remove_partials(run_dir: Path) -> None:
    """Delete temporary files left by a crash while a checkpoint was being written."""
    for tmp in [*run_dir.glob(".*.tmp"), *run_dir.glob(".*-saving.keras")]:
        tmp.unlink(missing_ok=True)
