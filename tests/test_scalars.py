"""trainer/scalars.py: a run's scalars as JSON lines and TensorBoard files, with TensorFlow or, where
it is not installed (a JAX-only GPU box), with tensorboardX; read back with TensorFlow's reader."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from replaystore.trainer import scalars as scalars_module
from replaystore.trainer.scalars import Scalars, read

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tensorboardX")

WRITES = [(0, {"charts/SPS": 10.0, "losses/td_loss": 0.5}), (1000, {"charts/SPS": 12.5}), (2000, {"eval/mean_return": -3.0})]


def _tensorboard(run_dir: Path) -> list[tuple[int, str, float]]:
    out = []
    for path in sorted((run_dir / "tb").iterdir()):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                number = value.simple_value if value.HasField("simple_value") else float(tf.make_ndarray(value.tensor))
                out.append((event.step, value.tag, number))
    return sorted(out)


def _write(run_dir: Path) -> str | None:
    writer = Scalars(run_dir)
    for step, values in WRITES:
        writer.write(step, values)
    writer.close()
    writer.close()  # idempotent
    return writer.tensorboard


EXPECTED = sorted((step, tag, value) for step, values in WRITES for tag, value in values.items())


def test_tensorflow_writes_tensorboard_and_json_lines(tmp_path: Path) -> None:
    assert _write(tmp_path) == "tensorflow"
    assert _tensorboard(tmp_path) == EXPECTED
    assert [{k: v for k, v in r.items() if k != "time"} for r in read(tmp_path)] == [{"step": s, **v} for s, v in WRITES]


def _hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(scalars_module.importlib.util, "find_spec",
                        lambda name, *a: None if name in names else find_spec(name, *a))


def test_without_tensorflow_tensorboardx_writes_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "tensorflow")
    assert _write(tmp_path) == "tensorboardX"
    assert _tensorboard(tmp_path) == EXPECTED
    assert len(read(tmp_path)) == len(WRITES)


def test_without_either_only_json_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "tensorflow", "tensorboardX")
    assert _write(tmp_path) is None
    assert not (tmp_path / "tb").exists()
    assert [r["step"] for r in read(tmp_path)] == [0, 1000, 2000]


def test_a_line_cut_by_a_crash_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "scalars.jsonl").write_text(json.dumps({"step": 1, "time": 0.0, "x": 1.0}) + '\n{"step": 2, "ti')
    assert read(tmp_path) == [{"step": 1, "time": 0.0, "x": 1.0}]


def test_json_lines_are_strict_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A value not known yet (NaN) and infinities are strings: jq and JavaScript read every line."""
    _hide(monkeypatch, "tensorflow", "tensorboardX")
    writer = Scalars(tmp_path)
    writer.write(1, {"replay/ratio": float("nan"), "a": float("inf"), "b": float("-inf"), "c": 2.0})
    writer.close()

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    line = (tmp_path / "scalars.jsonl").read_text()
    record = json.loads(line, parse_constant=refuse)
    assert (record["replay/ratio"], record["a"], record["b"], record["c"]) == ("nan", "inf", "-inf", 2.0)
