"""``DQN.fit_offline``: learning from a store as it is, with no env stepped.

A CartPole store written by a noisy heuristic policy (half its moves random, mean return ~150) is
the dataset. Conservative Q-learning learns a policy from it that beats the data, on TensorFlow here
and on JAX in a subprocess; the store's files are byte for byte the same afterwards. The Keras
hooks come in the documented order with gradient steps as the steps; a checkpointed offline run
resumes with ``DQN.load`` and goes on to its count, then fits online into a store of its own;
prioritized replay keeps its priorities in RAM; a Minari dataset imported by ``store_from_minari``
is learned from, and so is a store on SeaweedFS's S3; bad input is refused in one line with nothing
written, and a store the agent opened is closed again. tools/bench_offline.py
measures DQN against CQL on several datasets, and the RAM of learning from an Atari dataset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import keras
import numpy as np
import pytest
import recorder
from conftest import snapshot
from recorder import batches_by_epoch

from replaystore.trainer import DQN, TrainerError, mlp

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from bench_offline import heuristic, write_dataset  # noqa: E402  (the datasets the benchmark learns from)

OFFLINE = {"batch_size": 64, "train_frequency": 1, "target_network_frequency": 500, "learning_rate": 1e-3,
           "sample_threads": 1}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    path = tmp_path_factory.mktemp("offline") / "cartpole.zarr"
    return path, write_dataset(path, 10_000, 0.5, seed=0)


def model() -> Any:
    keras.utils.set_random_seed(0)
    return mlp((1, 4), 2, hidden_sizes=(64, 64))


def test_cql_learns_from_a_fixed_store_and_leaves_it_as_it_was(dataset: tuple[Path, float]) -> None:
    path, data_return = dataset
    before = snapshot(path)
    agent = DQN(model(), path, cql_alpha=1.0, **OFFLINE)
    history = agent.fit_offline(2000, eval_env=gym.make("CartPole-v1"), eval_frequency=1000, eval_episodes=5)
    assert agent.store is not None and agent.store.mode == "r"
    returns = agent.evaluate(gym.make("CartPole-v1"), episodes=10)
    agent.close()
    assert data_return < 200 and np.mean(returns) >= 400 > 2 * data_return
    assert len(history.history["eval_return"]) == 2 and agent.train_steps == 2000
    assert snapshot(path) == before


JAX_CHILD = """
import json, sys
import gymnasium as gym, keras, numpy as np
from replaystore.trainer import DQN, mlp
keras.utils.set_random_seed(0)
agent = DQN(mlp((1, 4), 2, hidden_sizes=(64, 64)), sys.argv[1], cql_alpha=1.0, **json.loads(sys.argv[2]))
agent.fit_offline(2000)
agent.save(sys.argv[3])
again = DQN.load(sys.argv[3])
print(json.dumps({"steps": again.train_steps, "returns": again.evaluate(gym.make("CartPole-v1"), episodes=10),
                  "backend": keras.backend.backend()}))
"""


@pytest.mark.slow  # ~13 s; CQL learns on TensorFlow in the default run (test_cql_learns_from_a_fixed_store_and_leaves_it_as_it_was)
def test_cql_learns_on_jax_too(dataset: tuple[Path, float], tmp_path: Path) -> None:
    pytest.importorskip("jax")
    path, _ = dataset
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    out = subprocess.run([sys.executable, "-c", JAX_CHILD, str(path), json.dumps(OFFLINE), str(tmp_path / "agent")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["backend"] == "jax" and result["steps"] == 2016  # whole calls of 32 steps
    assert np.mean(result["returns"]) >= 400


class Recorder(recorder.Recorder):
    """The Keras hooks, and replaystore's ``on_steps`` and ``on_evaluation``."""

    def on_steps(self, step: int, logs: dict[str, float]) -> None:
        self.calls.append(("steps", step, dict(logs)))

    def on_evaluation(self, step: int, logs: dict[str, Any]) -> None:
        self.calls.append(("evaluation", step, len(logs["returns"])))


def test_the_keras_hooks_count_gradient_steps(dataset: tuple[Path, float]) -> None:
    """96 gradient steps, 8 a call: 12 batches; an evaluation every 32 steps: 3 epochs."""
    path, _ = dataset
    rec = Recorder()
    agent = DQN(model(), path, steps_per_call=8, **OFFLINE)
    history = agent.fit_offline(96, eval_env=gym.make("CartPole-v1"), eval_frequency=32, eval_episodes=2,
                                callbacks=[rec])
    agent.close()
    kinds = [c[0] for c in rec.calls]
    assert kinds[0] == "train_begin" and kinds[-1] == "train_end"
    assert batches_by_epoch(rec.calls) == [list(range(4))] * 3
    assert [c[1] for c in rec.calls if c[0] == "evaluation"] == [32, 64, 96]
    assert [c[1] for c in rec.calls if c[0] == "epoch_end"] == [0, 1, 2]
    batch = next(c[2] for c in rec.calls if c[0] == "batch_end")
    assert np.isfinite(batch["loss"]) and np.isfinite(batch["q_values"]) and batch["sps"] > 0
    assert np.isnan(batch["episodic_return"])  # nothing acts
    (steps,) = [c for c in rec.calls if c[0] == "steps"]  # the last stretch's (fewer than REPORT_STEPS)
    assert steps[1] == 96 and "epsilon" not in steps[2]
    assert 9_000 < steps[2]["replay_size"] <= 10_000 and steps[2]["charts/learner_steps_per_s"] > 0
    assert len(history.history["eval_return"]) == 3


def test_verbose_shows_keras_progress_bar_in_gradient_steps(dataset: tuple[Path, float],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A line an epoch (``verbose=2``), each counting the epoch's gradient steps, resumed off a
    multiple of ``eval_frequency`` too."""
    path, _ = dataset
    agent = DQN(model(), path, steps_per_call=8, **OFFLINE)
    agent.fit_offline(16, verbose=2)
    capsys.readouterr()
    agent.fit_offline(96, eval_env=gym.make("CartPole-v1"), eval_frequency=32, eval_episodes=2, verbose=2)
    agent.close()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [line.split(" - ")[0] for line in lines] == ["Epoch 1/3", "16/16", "Epoch 2/3", "32/32", "Epoch 3/3",
                                                         "32/32"]
    assert all("loss:" in line and "eval_return:" in line for line in lines[1::2])


def test_a_checkpointed_offline_run_resumes_to_its_count_and_fits_online_into_its_own_store(tmp_path: Path) -> None:
    copy = tmp_path / "copy.zarr"
    write_dataset(copy, 2000, 0.5, seed=1)
    agent = DQN(model(), copy, steps_per_call=8, learning_starts=100, **OFFLINE)
    agent.fit_offline(64, checkpoint_dir=tmp_path / "agent", checkpoint_frequency=32)
    agent.close()
    before = snapshot(copy)
    again = DQN.load(tmp_path / "agent")
    assert again.train_steps == 64 and again.store is not None and again.store.mode == "r"
    weights = again.model.get_weights()
    again.fit_offline(64)  # already there: nothing changes
    assert again.train_steps == 64 and all(np.array_equal(a, b) for a, b in
                                           zip(weights, again.model.get_weights(), strict=True))
    again.fit_offline(128)
    assert again.train_steps == 128 and snapshot(copy) == before
    # Online from here: not into the dataset (refused, nothing written) but into a store of its own
    with pytest.raises(TrainerError, match="learned offline from"):
        again.fit(gym.make("CartPole-v1"), 300)
    again.use_store(tmp_path / "online.zarr")
    again.fit(gym.make("CartPole-v1"), 300)
    assert again.state.global_step == 300 and again.store is not None and len(again.store) == 300
    again.close()
    assert snapshot(copy) == before


def test_prioritized_replay_keeps_its_priorities_in_ram(dataset: tuple[Path, float]) -> None:
    path, _ = dataset
    before = snapshot(path)
    agent = DQN(model(), path, prioritized=True, steps_per_call=8, **OFFLINE)
    agent.fit_offline(64)
    assert agent.store is not None
    priorities = agent.store.priorities(np.arange(len(agent.store)))
    assert (priorities != 1.0).sum() > 100  # the sampled ones, set to |td| + eps
    agent.close()
    assert snapshot(path) == before


def test_a_minari_dataset_is_learned_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    minari = pytest.importorskip("minari")
    from minari import DataCollector

    from replaystore.integrations.minari import store_from_minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    env = DataCollector(gym.make("CartPole-v1"))
    rng = np.random.default_rng(0)
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        while True:
            action = int(rng.integers(2)) if rng.random() < 0.5 else heuristic(obs)
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
    dataset = env.create_dataset("cartpole/noisy-v0", eval_env="CartPole-v1", algorithm_name="noisy heuristic")
    store_from_minari(dataset, tmp_path / "store.zarr")
    agent = DQN(model(), tmp_path / "store.zarr", cql_alpha=1.0, **OFFLINE)
    agent.fit_offline(2000)
    returns = agent.evaluate(minari.load_dataset("cartpole/noisy-v0").recover_environment(eval_env=True),
                             episodes=10)
    agent.close()
    assert np.mean(returns) >= 400


def test_a_dataset_on_object_storage_is_learned_from_and_the_agent_finds_it_again(s3_url: str,
                                                                                 tmp_path: Path) -> None:
    write_dataset(s3_url, 2000, 0.5, seed=2)
    agent = DQN(model(), s3_url, steps_per_call=8, **OFFLINE)
    agent.fit_offline(32, checkpoint_dir=tmp_path / "agent")
    agent.close()
    assert json.loads((tmp_path / "agent" / "agent.json").read_text())["store"] == s3_url
    again = DQN.load(tmp_path / "agent")
    assert again.store is not None and again.store.mode == "r" and len(again.store) > 1900
    again.fit_offline(64)
    assert again.train_steps == 64
    again.close()


def test_bad_input_is_refused_in_one_line_with_nothing_written(dataset: tuple[Path, float], tmp_path: Path) -> None:
    path, _ = dataset
    before = snapshot(path)
    with pytest.raises(TrainerError, match="holds no replay store; learning offline needs an existing one"):
        DQN(model(), tmp_path / "missing.zarr").fit_offline(10)
    assert not (tmp_path / "missing.zarr").exists()
    tiny = tmp_path / "tiny.zarr"
    write_dataset(tiny, 20, 0.5, seed=0)
    with pytest.raises(TrainerError, match=r"holds 1\d transitions; a batch of 64 with 3-step returns needs at least 67"):
        DQN(model(), tiny, **OFFLINE).fit_offline(10)
    unbuilt = DQN(model(), tiny, **OFFLINE)
    with pytest.raises(TrainerError, match="holds 1"):
        unbuilt.fit_offline(10)
    assert unbuilt.store is None  # closed again, as it was found
    agent = DQN(model(), path, **OFFLINE)
    with pytest.raises(TrainerError, match=r"the evaluation env gives frames of Box.*\(2,\).*holds Box.*\(4,\)"):
        agent.fit_offline(10, eval_env=gym.make("MountainCar-v0"))
    for kwargs, message in (({"gradient_steps": 0}, "gradient_steps is 0; it must be an integer >= 1"),
                            ({"gradient_steps": 5, "eval_frequency": -1}, "eval_frequency is -1"),
                            ({"gradient_steps": 5, "eval_env": gym.make("CartPole-v1"), "eval_episodes": 0},
                             "eval_episodes is 0")):
        with pytest.raises(TrainerError, match=message):
            agent.fit_offline(**kwargs)
    with pytest.raises(TrainerError, match=r"the evaluation env gives frames of Box.* with Box\(-2\.0, 2\.0, \(1,\), float32\), but .* holds .* with Discrete\(2\)"):
        agent.fit_offline(10, eval_env=gym.make("Pendulum-v1"))
    agent.close()
    for value in (-1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(TrainerError, match=f"cql_alpha is {value!r}; it must be a finite number >= 0"):
            DQN(model(), path, cql_alpha=value)
    assert snapshot(path) == before
