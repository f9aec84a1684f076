"""Files written outside a store, one guarded way (replaystore/storage/outside.py): never through a
link, over a FIFO, or inside any store (whatever the URL form), where the next in-place compaction
would silently delete them. Each refusal is one line; the store and a sentinel stay as they were."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import snapshot
from hostile import Sentinel, filled_store

from replaystore import UnsafePathError
from replaystore.cli import main as cli_main
from replaystore.storage.outside import store_around


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return filled_store(tmp_path)


def _one_line(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and all(w in err for w in words), err


def test_a_plot_through_a_link_into_a_store_is_refused(store: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "plot.png"
    link.symlink_to(store / "zarr.json")  # (it overwrote the store's zarr.json)
    before = snapshot(store)
    assert cli_main(["inspect", str(store), "--plot", str(link)]) == 1
    _one_line(capsys, "is a symbolic link")
    assert snapshot(store) == before


@pytest.mark.parametrize("form", ["path", "file-url"])
def test_a_plot_or_an_episode_inside_the_store_is_refused(store: Path, form: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    named = str(store) if form == "path" else f"file://{store}"
    before = snapshot(store)
    assert cli_main(["inspect", named, "--plot", str(store / "obs" / "plot.png")]) == 1
    _one_line(capsys, "is inside the replay store")
    assert cli_main(["episodes", named, "--save", "0", str(store / "ep.npz")]) == 1
    _one_line(capsys, "inside")
    assert snapshot(store) == before and not (store / "ep.npz").exists()


def test_a_fifo_target_is_refused_at_once(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "plot.png")
    assert cli_main(["inspect", str(store), "--plot", str(tmp_path / "plot.png")]) == 1
    _one_line(capsys, "not a regular file")


def test_a_store_inside_a_store_is_refused(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sentinel = Sentinel(tmp_path / "elsewhere" / "keep.txt")
    before = snapshot(store)
    assert cli_main(["compact", str(store), str(store / "inner.zarr"), "--quiet"]) == 1
    _one_line(capsys)
    (tmp_path / "other").mkdir()
    other = filled_store(tmp_path / "other")
    assert cli_main(["compact", str(other), str(store / "streams" / "inner.zarr"), "--quiet"]) == 1
    _one_line(capsys, "inside the replay store")
    assert snapshot(store) == before and sentinel.unchanged()


def test_a_run_directory_or_a_checkpoint_inside_a_store_is_refused(store: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import gymnasium as gym

    from replaystore.trainer import DQN, mlp
    from replaystore.trainer.cli import main as train

    before = snapshot(store)
    assert train(["--env-id", "CartPole-v1", "--total-timesteps", "200", "--learning-starts", "100",
                  "--run-dir", str(store / "run")]) == 1
    _one_line(capsys, "is inside the replay store")
    agent = DQN(mlp((1, 4), 2, hidden_sizes=[8]), tmp_path / "own.zarr", learning_starts=50, batch_size=8)
    with pytest.raises(UnsafePathError, match="inside the replay store"):
        agent.fit(gym.make("CartPole-v1"), 100, checkpoint_dir=store / "agent", eval_env=gym.make("CartPole-v1"),
                  eval_frequency=50, eval_episodes=1)
    assert not (tmp_path / "own.zarr").exists()  # (refused before the run began)
    agent.close()
    assert snapshot(store) == before and not (store / "run").exists() and not (store / "agent").exists()


def test_a_minari_export_into_a_store_is_refused(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(store / "datasets"))
    before = snapshot(store)
    assert cli_main(["export-minari", str(store), "mine/x-v0", "--quiet"]) == 1
    _one_line(capsys, "inside the replay store")
    assert snapshot(store) == before


def test_store_around_finds_the_store_whatever_the_spelling(store: Path, tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(store)
    for spelling in (store / "obs" / "x", tmp_path / "link" / "x", f"file://{store}/x", store):
        assert store_around(spelling) == store.resolve()
    assert store_around(tmp_path / "elsewhere.png") is None and store_around("s3://b/x.zarr") is None


def test_a_new_file_never_replaces_one_made_meanwhile(tmp_path: Path) -> None:
    from replaystore import StoreExistsError
    from replaystore.storage.outside import publish_file, temporary

    target = tmp_path / "plot.png"
    tmp = temporary(target)
    tmp.write_bytes(b"mine")
    target.write_bytes(b"theirs, made while the command ran")
    with pytest.raises(StoreExistsError, match="appeared while the command ran"):
        publish_file(tmp, target, replace=False)
    assert target.read_bytes() == b"theirs, made while the command ran" and not tmp.exists()
    tmp.write_bytes(b"mine")
    publish_file(tmp, target, replace=True)  # (the command's own older output)
    assert target.read_bytes() == b"mine" and not tmp.exists()
