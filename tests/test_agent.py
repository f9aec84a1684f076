"""The Python API: ``replaystore.trainer.DQN`` with a user's Keras model, fit with Keras callbacks.

In this process (TensorFlow): the hooks' order, count and logs against a recording callback,
EarlyStopping ending a run whose checkpoint and store agree, ModelCheckpoint's ``.keras`` file acting
as the agent does, bad models and bad arguments refused in one line with nothing written. In
subprocesses: a functional dueling model with ``Rescaling`` and a subclassed model on both backends
(fit, save, load, act), and a run SIGKILLed inside ``fit`` that ``DQN.load`` resumes to the steps
asked. CartPole at a few hundred steps throughout; tools/learning_curve.py --api shows them learn.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import keras
import numpy as np
import pytest
from recorder import Recorder, batches_by_epoch

from replaystore import ReplayStore
from replaystore.trainer import DQN, ModelError, TrainerError, checkpoint, mlp

SMALL = {"buffer_size": 2000, "learning_starts": 100, "batch_size": 16, "train_frequency": 1,
         "target_network_frequency": 50, "sample_threads": 1}


def cartpole_model() -> Any:
    keras.utils.set_random_seed(0)
    return mlp((1, 4), 2, hidden_sizes=[32])


def test_verbose_shows_keras_progress_bar_in_env_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Keras' bar counts each epoch's env steps (its own counted learner calls, and learned an
    epoch's count from the first, which learning_starts makes short)."""
    agent = DQN(cartpole_model(), tmp_path / "replay.zarr", **SMALL)
    agent.fit(gym.make("CartPole-v1"), 600, eval_frequency=200, verbose=2)
    agent.close()
    lines = [line.split(" - ")[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines == ["Epoch 1/3", "200/200", "Epoch 2/3", "200/200", "Epoch 3/3", "200/200"]


def test_callbacks_get_the_keras_hooks_in_order_with_the_documented_logs(tmp_path: Path) -> None:
    """Lockstep learning (replay_ratio 0) makes the count exact: 500 gradient steps after step 100,
    4 per learner call, so 125 batches; 3 epochs of 200 env steps, each ended by an evaluation."""
    rec = Recorder()
    agent = DQN(cartpole_model(), tmp_path / "replay.zarr", replay_ratio=0, steps_per_call=4, **SMALL)
    history = agent.fit(gym.make("CartPole-v1"), 600, eval_env=gym.make("CartPole-v1"), eval_frequency=200,
                        eval_episodes=2, callbacks=[rec])
    kinds = [c[0] for c in rec.calls]
    assert kinds[:2] == ["train_begin", "epoch_begin"] and kinds[-2:] == ["epoch_end", "train_end"]
    assert [c[1] for c in rec.named("epoch_begin")] == [0, 1, 2] == [c[1] for c in rec.named("epoch_end")]
    assert [c[1] for c in rec.named("batch_end")] == [c[1] for c in rec.named("batch_begin")]
    assert [len(b) for b in batches_by_epoch(rec.calls)] == [25, 50, 50]  # Keras' batch index counts within an epoch
    assert all(b == list(range(len(b))) for b in batches_by_epoch(rec.calls))
    epoch_at = [i for i, k in enumerate(kinds) if k in ("epoch_begin", "epoch_end")]
    assert [kinds[i] for i in epoch_at] == ["epoch_begin", "epoch_end"] * 3  # epochs do not overlap
    for _, _, logs in rec.named("batch_end"):
        assert {"loss", "q_values", "episodic_return", "sps", "replay_ratio"} <= set(logs)
        assert np.isfinite(logs["loss"]) and np.isfinite(logs["q_values"]) and logs["sps"] > 0
    for _, _, logs in rec.named("epoch_end"):
        assert {"loss", "q_values", "episodic_return", "sps", "replay_ratio", "eval_return"} <= set(logs)
        assert logs["eval_return"] >= 8  # CartPole's shortest game
    assert isinstance(history, keras.callbacks.History)
    assert len(history.history["eval_return"]) == 3 and len(history.history["loss"]) == 3
    assert agent.train_steps == 500 and agent.state.global_step == 600
    with ReplayStore.open(tmp_path / "replay.zarr") as store:
        assert len(store) == 600
    agent.close()


def test_early_stopping_ends_the_run_with_a_checkpoint_that_matches_the_store(tmp_path: Path) -> None:
    """EarlyStopping (no improvement of min_delta after epoch 0) stops after epoch 1 of 5: the
    checkpoint written then is at that step, with every transition acted committed to the store."""
    stopper = keras.callbacks.EarlyStopping(monitor="eval_return", mode="max", patience=1, min_delta=1e9)
    agent = DQN(cartpole_model(), tmp_path / "replay.zarr", **SMALL)
    history = agent.fit(gym.make("CartPole-v1"), 1000, eval_env=gym.make("CartPole-v1"), eval_frequency=200,
                        eval_episodes=1, callbacks=[stopper], checkpoint_dir=tmp_path / "agent")
    assert stopper.stopped_epoch == 1 and len(history.history["eval_return"]) == 2
    assert agent.state.global_step == 400
    agent.close()
    _, state = checkpoint.load(tmp_path / "agent")
    assert state["global_step"] == 400 and state["stored"] == 400
    with ReplayStore.open(tmp_path / "replay.zarr") as store:
        assert store.committed.added == store.added and len(store) == 400
    again = DQN.load(tmp_path / "agent")
    assert again.state.global_step == 400 and again.train_steps == state["train_steps"]
    again.close()


def test_model_checkpoint_writes_a_keras_file_that_acts_like_the_agent(tmp_path: Path) -> None:
    best = tmp_path / "best.keras"
    agent = DQN(cartpole_model(), tmp_path / "replay.zarr", **SMALL)
    agent.fit(gym.make("CartPole-v1"), 400, eval_env=gym.make("CartPole-v1"), eval_frequency=200, eval_episodes=1,
              callbacks=[keras.callbacks.ModelCheckpoint(best, monitor="eval_return", mode="max")])
    loaded = keras.saving.load_model(best, compile=False)
    stacks = np.random.default_rng(0).normal(size=(64, 1, 4)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(loaded(stacks)), agent.learner.q_values(stacks), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.argmax(np.asarray(loaded(stacks)), axis=1), agent.act(stacks))
    assert agent.act(stacks[0]) == int(np.argmax(np.asarray(loaded(stacks[:1]))[0]))
    agent.close()


def _dense(units: int) -> Any:
    return keras.layers.Dense(units)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: mlp((1, 4), 3), "outputs shape (3,) per stack, but the environment has 2 actions"),
    (lambda: keras.Sequential([keras.Input((1, 4)), keras.layers.Flatten(), keras.layers.BatchNormalization(),
                               _dense(2)]), "updates non-trainable state while training"),
    (lambda: keras.Sequential([keras.Input((1, 4)), keras.layers.Flatten(), keras.layers.Dropout(0.5), _dense(2)]),
     "updates non-trainable state while training"),
    (lambda: keras.Sequential([keras.Input((84, 84, 4)), keras.layers.Conv2D(4, 8), keras.layers.Flatten(),
                               _dense(2)]), "cannot take the store's stacks, shaped (batch, 1, 4) of float32"),
    (lambda: (lambda x: x), "not a keras.Model"),
], ids=["output-shape", "batchnorm", "dropout", "input", "not-a-model"])
def test_bad_models_are_refused_in_one_line_before_anything_is_written(tmp_path: Path, build: Any,
                                                                       message: str) -> None:
    agent = DQN(build(), tmp_path / "replay.zarr", **SMALL)
    with pytest.raises(ModelError) as caught:
        agent.fit(gym.make("CartPole-v1"), 300)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "replay.zarr").exists()


@pytest.mark.parametrize(("make", "message"), [
    (lambda path: DQN(cartpole_model(), path, gamma=1.5), "gamma is 1.5; it must be a number in [0, 1]"),
    (lambda path: DQN(cartpole_model(), path, lr=1e-3), "unknown hyperparameter 'lr'; DQN takes alpha, batch_size"),
    (lambda path: DQN(cartpole_model(), path, batch_size=0), "batch_size is 0; it must be a positive integer"),
    (lambda path: DQN(cartpole_model(), path, replay_ratio="fast"), "replay_ratio is 'fast'"),
    (lambda path: DQN(cartpole_model(), path, **SMALL).fit(gym.make("CartPole-v1"), 100),
     "learning_starts is 100, not below total_timesteps 100"),
    (lambda path: DQN(cartpole_model(), path, **SMALL).fit(gym.make("CartPole-v1"), 0), "total_timesteps is 0"),
    (lambda path: DQN(cartpole_model(), path, **SMALL).fit(gym.make("Pendulum-v1"), 300),
     "the environment has Box actions of shape (1,) in [-2, 2]; DQN learns a Discrete action space"),
    (lambda path: DQN(cartpole_model(), 42), "store is a int; pass a ReplayStore or the path or URL of one"),
], ids=["gamma", "unknown", "batch", "ratio", "learning-starts", "total", "continuous", "store"])
def test_bad_arguments_are_refused_in_one_line_before_anything_is_written(tmp_path: Path, make: Any,
                                                                          message: str) -> None:
    with pytest.raises(TrainerError) as caught:
        make(tmp_path / "replay.zarr")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "replay.zarr").exists()


def test_a_store_of_continuous_actions_is_refused_by_dqn(tmp_path: Path) -> None:
    """DQN (one Q-value per action) refuses a store of Box actions, handed over open or by path."""
    from conftest import snapshot

    path = tmp_path / "pendulum.zarr"
    env = gym.make("Pendulum-v1")
    with ReplayStore.create(path, 64, env.observation_space, env.action_space) as store:
        store.add(np.zeros(3, np.float32), np.ones(1, np.float32), 0.5, np.ones(3, np.float32), False, False)
    before = snapshot(path)
    refused = r"holds Box actions of shape \(1,\) in \[-2, 2\]; DQN learns a Discrete action space .*rule=SAC\(\)"
    with ReplayStore.open(path, mode="a") as store, pytest.raises(TrainerError, match=refused):
        DQN(cartpole_model(), store)
    with pytest.raises(TrainerError, match="do not match"):
        DQN(cartpole_model(), path, **SMALL).fit(gym.make("CartPole-v1"), 300)
    assert snapshot(path) == before


def test_fit_with_nothing_left_to_do_changes_nothing(tmp_path: Path) -> None:
    agent = DQN(cartpole_model(), tmp_path / "replay.zarr", **SMALL)
    agent.fit(gym.make("CartPole-v1"), 300)
    before = (agent.store.added, agent.train_steps)
    history = agent.fit(gym.make("CartPole-v1"), 300)
    assert history.history == {} and (agent.store.added, agent.train_steps) == before
    agent.close()


MODELS = """
import os, sys
import numpy as np
import gymnasium as gym
import keras
from keras import layers
from replaystore.trainer import DQN, Dueling

kinds, out = sys.argv[1].split(","), sys.argv[2]


@keras.saving.register_keras_serializable(package="tests")
class TwoHeads(keras.Model):
    # A subclassed dueling Q-network: its own layers, its own call.
    def __init__(self, n_actions=2, **kwargs):
        super().__init__(**kwargs)
        self.n_actions = n_actions
        self.body = layers.Dense(32, activation="relu")
        self.value = layers.Dense(1)
        self.advantage = layers.Dense(n_actions)

    def call(self, stacks):
        x = self.body(keras.ops.reshape(keras.ops.cast(stacks, "float32"), (-1, 4)))
        a = self.advantage(x)
        return self.value(x) + a - keras.ops.mean(a, axis=1, keepdims=True)

    def get_config(self):
        return {**super().get_config(), "n_actions": self.n_actions}


for kind in kinds:
    keras.utils.set_random_seed(0)
    if kind == "functional":
        inputs = keras.Input((1, 4))
        x = layers.Flatten()(layers.Rescaling(0.5)(inputs))
        model = keras.Model(inputs, Dueling(2)(layers.Dense(32, activation="relu")(x)))
    else:
        model = TwoHeads(2)
    where = os.path.join(out, kind)
    agent = DQN(model, os.path.join(where, "replay.zarr"), buffer_size=2000, learning_starts=100, batch_size=16,
                train_frequency=2, target_network_frequency=50, sample_threads=1, steps_per_call=4)
    history = agent.fit(gym.make("CartPole-v1"), 400, eval_env=gym.make("CartPole-v1"), eval_frequency=200,
                        eval_episodes=1, checkpoint_dir=os.path.join(where, "agent"))
    assert np.isfinite(history.history["loss"][-1]) and history.history["replay_ratio"][-1] > 0, history.history
    stacks = np.random.default_rng(0).normal(size=(8, 1, 4)).astype(np.float32)
    q = agent.learner.q_values(stacks)
    agent.close()
    loaded = DQN.load(os.path.join(where, "agent"))
    np.testing.assert_allclose(loaded.learner.q_values(stacks), q, rtol=1e-5, atol=1e-6)
    loaded.fit(gym.make("CartPole-v1"), 500)
    assert loaded.state.global_step == 500 and loaded.train_steps > 150
    loaded.close()
    print("ok", keras.backend.backend(), kind, loaded.train_steps)
"""


def _python(code: str, *argv: str, backend: str = "tensorflow", timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# (JAX ~18 s, PyTorch ~20 s: the default run fits, saves and loads user models on JAX in test_trainer_dict.py)
@pytest.mark.parametrize("backend", ["tensorflow", pytest.param("jax", marks=pytest.mark.slow),
                                     pytest.param("torch", marks=pytest.mark.slow)])
def test_dueling_functional_and_subclassed_models_fit_save_and_load(tmp_path: Path, backend: str) -> None:
    """Both kinds in one process per backend (one import of the backend, ~5 s, instead of two)."""
    if backend != "tensorflow":
        pytest.importorskip(backend)
    out = _python(MODELS, "functional,subclassed", str(tmp_path), backend=backend)
    assert f"ok {backend} functional" in out and f"ok {backend} subclassed" in out


KILLED = """
import sys
import gymnasium as gym
import keras
from replaystore.trainer import DQN, mlp

keras.utils.set_random_seed(0)
agent = DQN(mlp((1, 4), 2, hidden_sizes=[32]), sys.argv[1] + "/replay.zarr", buffer_size=5000, learning_starts=100,
            batch_size=16, train_frequency=2, target_network_frequency=50, sample_threads=1, replay_ratio=0)
agent.fit(gym.make("CartPole-v1"), int(sys.argv[2]), checkpoint_dir=sys.argv[1] + "/agent", checkpoint_frequency=300)
"""


def test_a_run_killed_inside_fit_resumes_with_dqn_load(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path), "100000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint at step 900 within 180 s"
            try:
                saved = checkpoint.load(tmp_path / "agent")
            except TrainerError:
                saved = None  # being replaced right now
            if saved is not None and saved[1]["global_step"] >= 900:
                break
            time.sleep(0.2)
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    _, state = checkpoint.load(tmp_path / "agent")
    s = state["global_step"]
    with ReplayStore.open(tmp_path / "replay.zarr") as store:
        committed = store.committed.added
        actions = store.ring.action[:committed].copy()
    agent = DQN.load(tmp_path / "agent")  # (in this process: the killed run was the other one)
    assert agent.state.global_step == s
    agent.fit(gym.make("CartPole-v1"), s + 300)
    assert agent.state.global_step == s + 300
    assert agent.train_steps + agent.state.due_steps == state["train_steps"] + state["due_steps"] + 150
    agent.close()
    with ReplayStore.open(tmp_path / "replay.zarr") as store:
        np.testing.assert_array_equal(store.ring.action[:committed], actions)  # nothing committed was lost
        assert store.ring.is_last[committed - 1]  # the episode the kill left unfinished was closed
        assert store.added >= committed + 300


class Fixed(gym.Env):
    """Episodes of exactly ``length`` steps, 1 point each: a game's score is its length."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int) -> None:
        self.length, self.t = length, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.zeros(4, np.float32), 1.0, self.t >= self.length, False, {}


def test_a_vector_env_evaluates_each_env_for_its_share_of_the_games(tmp_path: Path) -> None:
    """Short games end first: taking the first games to end would score only those."""
    agent = DQN(cartpole_model(), tmp_path / "replay.zarr", **SMALL)
    agent.fit(gym.make("CartPole-v1"), 150)
    envs = gym.vector.SyncVectorEnv([lambda: Fixed(2), lambda: Fixed(10)],
                                    autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    assert sorted(agent.evaluate(envs, episodes=4)) == [2, 2, 10, 10]
    assert sorted(agent.evaluate(envs, episodes=3)) == [2, 2, 10]
    assert sorted(agent.evaluate(envs, episodes=1)) == [2]
    agent.close()


class Unsavable(keras.Model):
    """A subclassed model whose ``__init__`` takes an argument and that has no ``get_config``."""

    def __init__(self, n_actions: int) -> None:
        super().__init__()
        self.hidden, self.out = keras.layers.Dense(16, activation="relu"), keras.layers.Dense(n_actions)

    def call(self, stacks: Any) -> Any:
        return self.out(self.hidden(keras.ops.reshape(keras.ops.cast(stacks, "float32"), (-1, 4))))


def test_a_model_that_cannot_be_saved_is_refused_before_a_checkpointed_fit(tmp_path: Path) -> None:
    """Not at the first checkpoint, after minutes of training; without checkpoint_dir it trains."""
    agent = DQN(Unsavable(2), tmp_path / "replay.zarr", **SMALL)
    with pytest.raises(ModelError) as caught:
        agent.fit(gym.make("CartPole-v1"), 300, checkpoint_dir=tmp_path / "agent")
    assert "cannot be saved: Keras needs Unsavable.get_config()" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "replay.zarr").exists() and not (tmp_path / "agent").exists()
    agent.fit(gym.make("CartPole-v1"), 300)
    assert agent.train_steps > 0
    with pytest.raises(ModelError):
        agent.save(tmp_path / "agent")
    assert not (tmp_path / "agent").exists()
    agent.close()



def test_the_actor_is_held_to_the_ratio_as_soon_as_the_learner_could_sample(tmp_path: Path) -> None:
    """Not only once the learner has built its feed: building it (the JAX feeder, decode processes)
    and compiling the first call take seconds on a busy machine, and acting on meanwhile ran a
    short run far ahead of the ratio (its first epoch ended with no gradient step)."""
    import threading

    from replaystore.trainer.config import DQNConfig
    from replaystore.trainer.feeding import Learning
    from replaystore.trainer.learner import make_learner
    from replaystore.trainer.ratio import RatioLimiter
    from replaystore.trainer.state import RunState

    store = ReplayStore.create(tmp_path / "replay.zarr", 512, gym.spaces.Box(-5, 5, (4,), np.float32),
                               gym.spaces.Discrete(2), 1)
    obs = np.zeros(4, np.float32)
    for i in range(100):
        store.add(obs + i, 0, 1.0, obs + i + 1, i % 20 == 19, False)
        obs = obs if i % 20 != 19 else obs + 1000
    config = DQNConfig(batch_size=16, learning_starts=50, steps_per_call=4, sample_threads=1)
    config.fill(images=False)
    learner = make_learner(cartpole_model(), keras.optimizers.Adam(1e-3), stack_shape=(1, 4), dtype=np.float32,
                           target_every=config.target_every(), tau=1.0)
    learning = Learning(config, store, learner, RunState())
    learning.limiter = RatioLimiter(8, 16, 50, steps_per_call=4, inserted=100)  # no learner thread: it never starts
    assert not learning.started
    done = threading.Event()
    actor = threading.Thread(target=lambda: (learning.acted(1), done.set()))
    actor.start()
    assert not done.wait(1.0)  # held: the learner is 25 steps behind a slack of 8
    learning.limiter.close()
    assert done.wait(5.0)
    actor.join()
    store.close()
