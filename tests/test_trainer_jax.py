"""The trainer on Keras 3's three backends: the JAX and PyTorch gradient steps agree with
TensorFlow's on the same weights and batch, a block of k steps in one call equals k single steps
(target updates included), and whole runs (CartPole, an ALE game with a vector env) complete and
resume on another backend, after a finished run and after SIGKILL. Keras picks its backend at
import, so everything that needs JAX or PyTorch runs in a subprocess with ``KERAS_BACKEND``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_trainer_smoke import CARTPOLE, _gradient_steps, _scalars, _wait_for_checkpoint

from replaystore import ReplayStore
from replaystore.trainer import checkpoint

pytest.importorskip("jax")

STEP = """
import os, sys
import numpy as np
import keras
backend = keras.backend.backend()
data = np.load(sys.argv[1])
stack_shape = tuple(int(x) for x in data["stack_shape"])
from replaystore.trainer.learner import make_learner
from replaystore.trainer.models import q_network
from replaystore.trainer.qrdqn import QRDQN
from replaystore.trainer.actions import ActionSpec
from replaystore.trainer.sac import SAC, sac_model
n = int(data["quantiles"])
rule, actions = (QRDQN(n) if n > 0 else None), None
if n < 0:  # SAC: Box actions of 2 values in [-1, 2] (frames scaled: saturated tanh's rounding differs by backend)
    def critic(name):
        stack, action = keras.Input(stack_shape, dtype="uint8"), keras.Input((2,))
        x = keras.layers.Concatenate()([keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(stack)), action])
        return keras.Model([stack, action], keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(x)), name=name)
    actor = keras.Sequential([keras.Input(stack_shape, dtype="uint8"), keras.layers.Rescaling(1 / 255),
                              keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4),
                              keras.layers.Reshape((2, 2))], name="actor")
    model = sac_model(actor, critic("critic"), critic("twin"))
    rule, actions = SAC(), ActionSpec(shape=(2,), low=(-1.0, -1.0), high=(2.0, 2.0))
elif n:  # QR-DQN's head: n quantiles per action
    model = keras.Sequential([keras.Input(stack_shape, dtype="uint8"), keras.layers.Rescaling(1 / 255),
                              keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3 * n), keras.layers.Reshape((3, n))])
else:
    model = q_network(stack_shape, np.uint8, 3, hidden_sizes=[16])
# epsilon 1e-3, not Keras's 1e-7: Adam's first step moves each weight by lr * g / (|g| + epsilon), so
# with 1e-7 a gradient element near zero (a conv weight behind a dead unit) turns a 1e-8 difference
# between the backends' float sums into a 1e-3 difference in the weight (it failed 44 of 8192 once)
agent = make_learner(model, keras.optimizers.Adam(1e-3, epsilon=1e-3, global_clipnorm=10.0), stack_shape=stack_shape,
                     dtype=np.uint8, target_every=1000, tau=1.0, rule=rule, actions=actions, seed=5)
if "online/0" in data:
    agent.load_state({part: [data[f"{part}/{i}"] for i in range(int(data[f"{part}_n"]))]
                      for part in ("online", "target", "optimizer")})
batch = {k[6:]: data[k] for k in data.files if k.startswith("batch/")}
if n < 0:
    batch["action"] = np.random.default_rng(3).uniform(-1, 2, (len(batch["reward"]), 2)).astype(np.float32)
out = {}
for part, arrays in agent.state().items():
    out[f"{part}_n"] = len(arrays)
    out.update({f"{part}/{i}": a for i, a in enumerate(arrays)})
loss, q, td = agent.train_block({k: v[None] for k, v in batch.items()})
loss, q, td = loss[0], q[0], td[0]
out.update({f"after/{i}": a for i, a in enumerate(agent.state()["online"])})
out.update(loss=loss, q=q, td=td)
np.savez(sys.argv[2], **out)
"""


def _python(code: str, *argv: str, backend: str) -> None:
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def _batch(stack_shape: tuple[int, ...], n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"obs": rng.integers(0, 256, (n, *stack_shape), dtype=np.uint8),
            "next_obs": rng.integers(0, 256, (n, *stack_shape), dtype=np.uint8),
            "action": rng.integers(0, 3, n).astype(np.int64), "reward": rng.normal(size=n).astype(np.float32),
            "discount": (0.99 * (rng.random(n) < 0.8)).astype(np.float32),
            "weight": rng.uniform(0.5, 1.0, n).astype(np.float32)}


@pytest.mark.parametrize(("stack_shape", "quantiles"), [
    pytest.param((2, 5), 0, id="mlp"), pytest.param((2, 5), 4, id="qr-dqn"), pytest.param((2, 5), -1, id="sac"),
    pytest.param((4, 84, 84), 0, id="nature-cnn", marks=pytest.mark.slow)])  # (~25 s)
def test_jax_torch_and_tensorflow_steps_agree(tmp_path: Path, stack_shape: tuple[int, ...], quantiles: int) -> None:
    """TensorFlow makes the weights and takes a step; JAX and PyTorch load the same weights and take
    the same step: the same loss, |td| and weights after (the same optimizer arithmetic, to float
    tolerance), for double DQN's rule, QR-DQN's and SAC's (its networks kept to their own losses by
    each backend's stop_gradient)."""
    batch = {f"batch/{k}": v for k, v in _batch(stack_shape, 8, 0).items()}
    np.savez(tmp_path / "in.npz", stack_shape=np.array(stack_shape), quantiles=quantiles, **batch)
    _python(STEP, str(tmp_path / "in.npz"), str(tmp_path / "tf.npz"), backend="tensorflow")
    with np.load(tmp_path / "tf.npz") as tf_out:
        tf_res = dict(tf_out)
    start = {k: v for k, v in tf_res.items() if k.split("/")[0] in ("online", "target", "optimizer")
             or k.endswith("_n")}
    np.savez(tmp_path / "in2.npz", stack_shape=np.array(stack_shape), quantiles=quantiles, **batch, **start)
    for backend in ("jax", "torch"):
        _python(STEP, str(tmp_path / "in2.npz"), str(tmp_path / f"{backend}.npz"), backend=backend)
        with np.load(tmp_path / f"{backend}.npz") as out:
            for name in ("loss", "q", "td"):
                np.testing.assert_allclose(out[name], tf_res[name], rtol=2e-4, atol=1e-5, err_msg=f"{backend}: {name}")
            for i in range(int(tf_res["online_n"])):
                np.testing.assert_allclose(out[f"after/{i}"], tf_res[f"after/{i}"], rtol=2e-4, atol=1e-5,
                                           err_msg=f"{backend}: weight {i}")
                assert not np.array_equal(tf_res[f"after/{i}"], tf_res[f"online/{i}"])  # the step changed it


K_STEPS = """
import sys
import numpy as np
import keras
from replaystore.trainer.learner import make_learner
from replaystore.trainer.models import mlp


def Agent():
    return make_learner(mlp((2, 5), 3, hidden_sizes=[16], dtype="uint8"), keras.optimizers.Adam(1e-3, global_clipnorm=10.0),
                        stack_shape=(2, 5), dtype=np.uint8, target_every=2, tau=1.0)


data = np.load(sys.argv[1])
block = {k: data[k] for k in data.files}
agents = [Agent() for _ in range(2)]
agents[1].load_state(agents[0].state())
start = agents[0].state()
whole = agents[0].train_block(block)
singles = [agents[1].train_block({k: v[i : i + 1] for k, v in block.items()}) for i in range(3)]
after = [agent.state() for agent in agents]
for part in ("online", "target"):
    for a, b in zip(after[0][part], after[1][part], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=part)
np.testing.assert_allclose(whole[0], np.concatenate([s[0] for s in singles]), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(whole[2], np.concatenate([s[2] for s in singles]), rtol=1e-5, atol=1e-6)
assert agents[0].train_steps == agents[1].train_steps == 3
# target_every=2: the target took the weights after step 2, not those after step 3
assert not all(np.array_equal(t, s) for t, s in zip(after[0]["target"], start["target"]))
assert not all(np.array_equal(t, p) for t, p in zip(after[0]["target"], after[0]["online"]))
# Polyak's update (tau < 1, every step): the target moves a quarter of the way to the online weights
polyak = make_learner(mlp((2, 5), 3, hidden_sizes=[16], dtype="uint8"), keras.optimizers.Adam(1e-3, global_clipnorm=10.0),
                      stack_shape=(2, 5), dtype=np.uint8, target_every=1, tau=0.25)
assert not polyak.model.non_trainable_variables
polyak.load_state(start)
polyak.train_block({k: v[:1] for k, v in block.items()})
got = polyak.state()
for t0, o1, t1 in zip(start["target"], got["online"], got["target"], strict=True):
    np.testing.assert_allclose(t1, 0.25 * o1 + 0.75 * t0, rtol=1e-5, atol=1e-6, err_msg="polyak")
assert not all(np.array_equal(t1, o1) for t1, o1 in zip(got["target"], got["online"]))
print("ok")
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_a_block_of_k_steps_equals_k_single_steps(tmp_path: Path, backend: str) -> None:
    parts = [_batch((2, 5), 8, seed) for seed in range(3)]
    np.savez(tmp_path / "block.npz", **{k: np.stack([p[k] for p in parts]) for k in parts[0]})
    _python(K_STEPS, str(tmp_path / "block.npz"), backend=backend)


def _train(*argv: str, backend: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replaystore.trainer.cli", *argv], capture_output=True, text=True, check=False,
                          timeout=timeout, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": backend})


@pytest.mark.slow  # ~37 s: three runs; the default run resumes a decoupled run on the other backend
# (test_ratio.py) and a Dict run from JAX on TensorFlow (test_trainer_dict.py)
def test_jax_cartpole_run_then_resume_on_tensorflow_and_back(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = _train(*CARTPOLE, "--total-timesteps", "1200", "--run-dir", str(run), "--steps-per-call", "8",
                  backend="jax")
    assert done.returncode == 0, done.stderr[-3000:]
    assert _gradient_steps(run) == (1200 - 200) // 2
    _, state = checkpoint.load(run)
    assert state["train_steps"] % 8 == 0 and state["due_steps"] < 8
    scalars = _scalars(run)
    assert len(scalars["losses/td_loss"]) and all(np.isfinite(scalars["losses/td_loss"]))
    more = _train("--resume", str(run), "--total-timesteps", "1500", "--steps-per-call", "1", backend="tensorflow")
    assert more.returncode == 0, more.stderr[-3000:]
    _, state = checkpoint.load(run)
    assert state["global_step"] == 1500 and state["due_steps"] == 0 and state["train_steps"] == (1500 - 200) // 2
    again = _train("--resume", str(run), "--total-timesteps", "1700", backend="jax")
    assert again.returncode == 0, again.stderr[-3000:]
    assert _gradient_steps(run) == (1700 - 200) // 2
    with ReplayStore.open(run / "replay.zarr") as store:
        assert len(store) == 1700


@pytest.mark.slow  # ~55 s (the default run resumes JAX on TensorFlow and back)
def test_torch_cartpole_run_resumes_on_tensorflow(tmp_path: Path) -> None:
    """Keras on PyTorch: a whole run (the decoupled learner on its thread, numpy blocks from the
    store), its checkpoint resumed on TensorFlow, and back; the replay ratio's count holds."""
    run = tmp_path / "run"
    flags = [a for a in CARTPOLE if a not in ("--replay-ratio", "0")]  # (the decoupled default: ratio 8)
    done = _train(*flags, "--total-timesteps", "1200", "--run-dir", str(run), "--eval-episodes", "2", backend="torch")
    assert done.returncode == 0, done.stderr[-3000:]
    _, state = checkpoint.load(run)
    assert state["global_step"] == 1200 and state["train_steps"] > 0 and state["train_steps"] % 8 == 0
    assert all(np.isfinite(_scalars(run)["losses/td_loss"]))
    more = _train("--resume", str(run), "--total-timesteps", "1400", backend="tensorflow")
    assert more.returncode == 0, more.stderr[-3000:]
    again = _train("--resume", str(run), "--total-timesteps", "1600", backend="torch")
    assert again.returncode == 0, again.stderr[-3000:]
    _, state = checkpoint.load(run)
    assert state["global_step"] == 1600 and state["resumes"] == 2
    assert abs(_gradient_steps(run) - (1600 - 200) * 8 // 16) <= 16 + 8  # the ratio: 8 sampled per inserted


@pytest.mark.slow  # ~25 s (test_trainer_smoke kills and resumes a run on one backend)
def test_jax_run_killed_resumes_on_tensorflow(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "replaystore.trainer.cli", *CARTPOLE, "--total-timesteps", "100000",
                             "--checkpoint-frequency", "300", "--run-dir", str(run)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "jax"})
    try:
        _wait_for_checkpoint(run, proc, 600)
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    _, state = checkpoint.load(run)
    s, before = state["global_step"], _gradient_steps(run)
    more = _train("--resume", str(run), "--total-timesteps", str(s + 300), backend="tensorflow")
    assert more.returncode == 0, more.stderr[-3000:]
    assert f"resuming {run} at step {s:,}" in more.stdout
    assert _gradient_steps(run) == before + 150


@pytest.mark.slow  # ~40 s (test_trainer_smoke runs AtariVectorEnv on TensorFlow)
def test_jax_atari_vector_env_run(tmp_path: Path) -> None:
    run = tmp_path / "breakout"
    done = _train("--env-id", "ALE/Breakout-v5", "--total-timesteps", "600", "--buffer-size", "1000", "--num-envs", "2",
                  "--batch-size", "8", "--learning-starts", "100", "--target-network-frequency", "100",
                  "--steps-per-call", "4", "--run-dir", str(run), "--no-progress", "--sample-threads", "1",
                  "--replay-ratio", "0", backend="jax")
    assert done.returncode == 0, done.stderr[-3000:]
    scalars = _scalars(run)
    assert all(np.isfinite(scalars["losses/td_loss"])) and all(np.isfinite(scalars["losses/q_values"]))
    assert _gradient_steps(run) == (600 - 100) // 4
    with ReplayStore.open(run / "replay.zarr") as store:
        assert store.num_streams == 2 and store.observation_space.shape == (84, 84)


def test_steps_per_call_is_checked(tmp_path: Path) -> None:
    done = _train(*CARTPOLE, "--total-timesteps", "100", "--steps-per-call", "-1", "--run-dir", str(tmp_path / "r"),
                  backend="tensorflow", timeout=120)
    assert done.returncode == 1 and "--steps-per-call is -1" in done.stderr
    assert not (tmp_path / "r").exists()




@pytest.mark.slow  # ~13 s; the default run holds the ratio on TensorFlow (test_ratio.py)
def test_jax_decoupled_run_holds_the_ratio(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = _train(*CARTPOLE, "--total-timesteps", "1000", "--run-dir", str(run), "--steps-per-call", "4",
                  "--replay-ratio", "8", backend="jax")
    assert done.returncode == 0, done.stderr[-3000:]
    _, state = checkpoint.load(run)
    assert state["train_steps"] % 4 == 0 and abs(state["train_steps"] - (1000 - 200) * 8 / 16) <= 8
    assert "replay/ratio" in _scalars(run)


@pytest.mark.slow  # ~33 s
def test_tensorflow_blocks_of_steps_resume_on_jax(tmp_path: Path) -> None:
    """TensorFlow with --steps-per-call 4 (a tf.while_loop over blocks from as_dataset(blocks=True)):
    the lockstep schedule's gradient steps, a block at a time; then JAX continues the run."""
    run = tmp_path / "run"
    done = _train(*CARTPOLE, "--total-timesteps", "1000", "--run-dir", str(run), "--steps-per-call", "4",
                  "--prioritized", backend="tensorflow")
    assert done.returncode == 0, done.stderr[-3000:]
    _, state = checkpoint.load(run)
    assert state["train_steps"] % 4 == 0 and _gradient_steps(run) == (1000 - 200) // 2
    assert all(np.isfinite(_scalars(run)["losses/td_loss"]))
    more = _train("--resume", str(run), "--total-timesteps", "1300", backend="jax")
    assert more.returncode == 0, more.stderr[-3000:]
    assert _gradient_steps(run) == (1300 - 200) // 2
