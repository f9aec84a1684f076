"""SAC as a learning rule (trainer/sac.py): its squashed Gaussian is SB3's, one gradient step moves
each network by its own loss only (SB3's three losses, worked out here on the model's parts), the
agent acts in a Box's bounds (samples while training, the mean when greedy) and stores the actions
the env took, saves and loads with its rule and Box actions and resumes, and what SAC cannot learn
is refused in one line; a run on JAX resumes on PyTorch. The three backends' agreement on a SAC
gradient step is tests/test_trainer_jax.py's, actors for SAC tests/test_actors_api.py's; learning on Pendulum beside SB3 is tools/reference_dqn.py --algo sac's."""

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

from replaystore import ReplayStore
from replaystore.trainer import DQN, SAC, ModelError, StackSpec, TrainerError, check_model, mlp, sac_mlp
from replaystore.trainer.actions import ActionSpec
from replaystore.trainer.learner import make_learner
from replaystore.trainer.sac import squashed

PENDULUM = ActionSpec(shape=(1,), low=(-2.0,), high=(2.0,))


def test_the_squashed_log_probability_is_sb3s() -> None:
    torch = pytest.importorskip("torch")
    from stable_baselines3.common.distributions import SquashedDiagGaussianDistribution

    rng = np.random.default_rng(0)
    policy = rng.normal(size=(16, 2, 3)).astype(np.float32)
    policy[:, 1] = np.clip(policy[:, 1], -3, 1)
    noise = rng.normal(size=(16, 3)).astype(np.float32)
    action, log_prob = (keras.ops.convert_to_numpy(x) for x in squashed(keras.ops.convert_to_tensor(policy),
                                                                      keras.ops.convert_to_tensor(noise)))
    mean, log_std = torch.as_tensor(policy[:, 0]), torch.as_tensor(policy[:, 1])
    gaussian = mean + log_std.exp() * torch.as_tensor(noise)
    dist = SquashedDiagGaussianDistribution(3).proba_distribution(mean, log_std)
    np.testing.assert_allclose(action, torch.tanh(gaussian).numpy(), rtol=1e-5, atol=1e-6)
    # (where tanh saturates, 1 - tanh(u)**2 is float32 rounding, on either side)
    unsaturated = (gaussian.abs() < 3).all(dim=1).numpy()
    assert unsaturated.sum() >= 8
    np.testing.assert_allclose(log_prob[unsaturated], dist.log_prob(torch.tanh(gaussian), gaussian).numpy()[unsaturated],
                               rtol=1e-4, atol=1e-4)


def test_it_acts_uniformly_at_random_until_learning_starts(tmp_path: Path) -> None:
    """SB3's warm-up: the first ``learning_starts`` moves are uniform over the Box, drawn from the
    agent's generator (a draw for epsilon, then the action), the policy's after."""
    agent = DQN(sac_mlp((1, 3), 1, hidden_sizes=(8,)), tmp_path / "replay.zarr", rule=SAC(), seed=6,
                buffer_size=2_000, batch_size=16, learning_starts=250)
    agent.fit(gym.make("Pendulum-v1"), 300)
    agent.close()
    rng = np.random.default_rng(6)
    expected = []
    for _ in range(250):
        assert rng.random() < 1.0
        expected.append(rng.uniform(-2.0, 2.0, (1, 1))[0])
    with ReplayStore.open(tmp_path / "replay.zarr") as store:
        moves = np.concatenate([e.action for e in store.iter_episodes()])
    np.testing.assert_allclose(moves[:250], np.asarray(expected, np.float32), rtol=1e-6)
    assert not np.allclose(moves[250:], rng.uniform(-2.0, 2.0, (50, 1)))


def _batch(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"obs": rng.normal(size=(n, 1, 3)).astype(np.float32), "next_obs": rng.normal(size=(n, 1, 3)).astype(np.float32),
            "action": rng.uniform(-2, 2, (n, 1)).astype(np.float32), "reward": rng.normal(size=n).astype(np.float32),
            "discount": (0.99 * (rng.random(n) < 0.8)).astype(np.float32),
            "weight": rng.uniform(0.5, 1.0, n).astype(np.float32)}


def test_one_step_moves_each_network_by_its_own_loss_only() -> None:
    """With SGD at rate 1, the step's change of each weight is minus its gradient: the critics' by
    the critics' loss, the actor's by the actor's through the critics, the entropy weight's by its
    own, each loss worked out here as SB3 writes it, from the model's parts. In a fresh process: in
    two CI rehearsals' long-lived xdist workers the actor's or a critic's first kernel moved by a
    third of this, which a fresh process never showed (the cause is not found yet)."""
    done = subprocess.run([sys.executable, "-c", "import test_sac; test_sac.one_step_check()"], capture_output=True,
                          text=True, timeout=300, check=False, cwd=Path(__file__).parent,
                          env={**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]


def one_step_check() -> None:
    """``test_one_step_moves_each_network_by_its_own_loss_only``'s check, in the process it runs in."""
    import tensorflow as tf

    keras.utils.set_random_seed(1)
    model = sac_mlp((1, 3), 1, hidden_sizes=(8,))
    learner = make_learner(model, keras.optimizers.SGD(1.0), stack_shape=(1, 3), dtype=np.float32, target_every=1,
                           tau=0.005, rule=SAC(), actions=PENDULUM, seed=7)
    batch = _batch(np.random.default_rng(2), 16)
    noise = np.random.default_rng((7, 0)).standard_normal((1, 16, 2, 1), dtype=np.float32)[0]
    actor, critic, twin, entropy = (model.get_layer(name) for name in ("actor", "critic", "critic_twin",
                                                                       "entropy_weight"))
    before = {id(v): np.array(v.numpy()) for v in model.trainable_variables}  # (by the variable: two layers
    # of a long-lived process's models may share a name, and so a path)
    obs, next_obs, taken = (tf.constant(x) for x in (batch["obs"], batch["next_obs"], batch["action"] / 2.0))
    log_alpha = entropy.log_alpha
    alpha = float(np.exp(log_alpha.numpy()))
    # the target critics are the online ones before the step (the targets start as copies)
    next_action, next_log_prob = squashed(actor(next_obs), noise[:, 1])
    q_next = tf.minimum(critic([next_obs, next_action]), twin([next_obs, next_action]))[:, 0]
    y = batch["reward"] + batch["discount"] * (q_next - alpha * next_log_prob)
    with tf.GradientTape() as tape:
        td1 = critic([obs, taken])[:, 0] - y
        td2 = twin([obs, taken])[:, 0] - y
        critics_loss = 0.5 * tf.reduce_mean(batch["weight"] * (td1 ** 2 + td2 ** 2))
    critic_vars = critic.trainable_variables + twin.trainable_variables
    expected = dict(zip([id(v) for v in critic_vars], tape.gradient(critics_loss, critic_vars), strict=True))
    with tf.GradientTape() as tape:
        action, log_prob = squashed(actor(obs), noise[:, 0])
        q_pi = tf.minimum(critic([obs, action]), twin([obs, action]))[:, 0]
        actor_loss = tf.reduce_mean(alpha * log_prob - q_pi)
    expected.update(zip([id(v) for v in actor.trainable_variables],
                        tape.gradient(actor_loss, actor.trainable_variables), strict=True))
    expected[id(log_alpha)] = -np.mean(log_prob.numpy() - 1.0)  # d/d log_alpha of -log_alpha * (log_prob - size)
    learner.train_block({k: v[None] for k, v in batch.items()})
    assert sorted(expected) == sorted(before)
    for var in model.trainable_variables:
        np.testing.assert_allclose(before[id(var)] - var.numpy(), np.asarray(expected[id(var)]), rtol=2e-3, atol=2e-5,
                                   err_msg=var.path)


def test_acting_samples_while_training_and_takes_the_mean_when_greedy() -> None:
    keras.utils.set_random_seed(0)
    model = sac_mlp((1, 3), 1, hidden_sizes=(8,))
    learner = make_learner(model, keras.optimizers.Adam(), stack_shape=(1, 3), dtype=np.float32, target_every=1,
                           tau=0.005, rule=SAC(), actions=PENDULUM)
    stacks = np.random.default_rng(0).normal(size=(64, 1, 3)).astype(np.float32)
    policy = learner.q_values(stacks)
    greedy = learner.act_batch(stacks)
    assert greedy.shape == (64, 1) and greedy.dtype == np.float32
    np.testing.assert_allclose(greedy[:, 0], 2.0 * np.tanh(policy[:, 0, 0]), rtol=1e-5, atol=1e-6)
    sampled = learner.act_batch(stacks, np.random.default_rng(1))
    assert np.all(np.abs(sampled) <= 2.0) and not np.allclose(sampled, greedy)
    again = learner.act_batch(stacks, np.random.default_rng(1))
    np.testing.assert_array_equal(sampled, again)
    assert isinstance(learner.act(stacks[0]), np.ndarray)


def test_a_sac_agent_fits_stores_box_actions_saves_loads_and_resumes(tmp_path: Path) -> None:
    keras.utils.set_random_seed(3)
    agent = DQN(sac_mlp((1, 3), 1, hidden_sizes=(32, 32)), tmp_path / "replay.zarr", rule=SAC(), seed=3,
                buffer_size=5_000, batch_size=32)
    assert agent.config.tau == 0.005 and agent.config.learning_starts == 100 and agent.config.end_e == 0.0
    agent.fit(gym.make("Pendulum-v1"), 400, checkpoint_dir=tmp_path / "ck", eval_env=gym.make("Pendulum-v1"),
              eval_episodes=1)
    steps = agent.train_steps
    assert steps > 0 and "SAC()" in repr(agent)
    obs = np.zeros(3, np.float32)
    action = agent.act(obs)
    assert action.shape == (1,) and -2.0 <= float(action[0]) <= 2.0
    returns = agent.evaluate(gym.make("Pendulum-v1"), episodes=2)
    assert len(returns) == 2 and all(-2_000 < r <= 0 for r in returns)
    agent.close()
    with ReplayStore.open(tmp_path / "replay.zarr") as store:
        assert len(store) == 400 and store.action_space.shape == (1,)
        stored = store.sample(256, rng=np.random.default_rng(0)).action
        assert stored.dtype == np.float32 and np.all(np.abs(stored) <= 2.0) and np.unique(stored).size > 100
    saved = json.loads((tmp_path / "ck" / "agent.json").read_text())
    assert saved["rule"] == {"name": "sac", "config": {}}
    assert saved["stacks"]["actions"] == {"shape": [1], "low": [-2.0], "high": [2.0]}
    loaded = DQN.load(tmp_path / "ck")
    assert loaded.rule == SAC() and loaded.train_steps == steps and loaded.actions == agent.actions
    stacks = np.random.default_rng(2).normal(size=(8, 1, 3)).astype(np.float32)
    np.testing.assert_allclose(loaded.learner.q_values(stacks), agent.learner.q_values(stacks), rtol=1e-5, atol=1e-6)
    loaded.fit(gym.make("Pendulum-v1"), 600)
    assert loaded.state.global_step == 600 and loaded.train_steps > steps
    loaded.close()


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: DQN(sac_mlp((1, 4), 1), p, rule=SAC()).fit(gym.make("CartPole-v1"), 10),
     r"the environment has 2 actions; SAC learns Box actions: use DQN's rule or QRDQN for Discrete actions"),
    (lambda p: DQN(mlp((1, 3), 1), p).fit(gym.make("Pendulum-v1"), 10),
     r"the environment has Box actions of shape \(1,\) in \[-2, 2\]; DQN learns a Discrete action space .*"
     r"use rule=SAC\(\) for Box actions"),
    (lambda p: DQN(mlp((1, 3), 1), p, rule=SAC()).fit(gym.make("Pendulum-v1"), 10),
     r"the model cannot take SAC's inputs .*SAC's model takes \{'obs': stacks"),
    (lambda p: DQN(sac_mlp((1, 3), 1), p, rule=SAC(), cql_alpha=1.0), r"cql_alpha is 1\.0, but .* not SAC's"),
    (lambda p: DQN(sac_mlp((1, 3), 1), p, rule=SAC()).fit(gym.make("MountainCar-v0"), 10),
     r"SAC learns Box actions"),
])
def test_what_sac_cannot_learn_is_refused_in_one_line(tmp_path: Path, make: Any, message: str) -> None:
    with pytest.raises(TrainerError, match=message) as caught:
        make(tmp_path / "replay.zarr")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "replay.zarr").exists()


def test_unbounded_box_actions_are_refused() -> None:
    with pytest.raises(TrainerError, match=r"must be finite with low < high; wrap the env with .*RescaleAction"):
        ActionSpec.of_space(gym.spaces.Box(-np.inf, np.inf, (2,), np.float32))
    with pytest.raises(ModelError, match=r"cannot take SAC's inputs for stacks of \(1, 3\) float32 and Box actions of "
                                         r"shape \(2,\).*expected axis -1 of input shape to have value 4.*sac_model"):
        check_model(sac_mlp((1, 3), 1), StackSpec.single((1, 3), np.float32),
                    ActionSpec(shape=(2,), low=(-1.0, -1.0), high=(1.0, 1.0)), SAC())


def test_box_actions_round_trip_through_agent_json() -> None:
    spec = ActionSpec.of_space(gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 3.0], np.float32)))
    assert ActionSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert ActionSpec.from_json(4) == ActionSpec(n=4) == ActionSpec.of_space(gym.spaces.Discrete(4))
    unit = np.array([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]], np.float32)
    scaled = spec.scaled(unit)
    np.testing.assert_allclose(scaled, [[-1, 0], [1, 3], [0, 1.5]])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(spec.unit(scaled)), unit, atol=1e-6)


RUN = """
import sys
import gymnasium as gym
import keras
from replaystore.trainer import DQN, SAC, sac_mlp
run, total = sys.argv[1], int(sys.argv[2])
if total == 300:
    agent = DQN(sac_mlp((1, 3), 1, hidden_sizes=(16,)), run + "/replay.zarr", rule=SAC(), seed=4, batch_size=32,
                steps_per_call=8)
else:
    agent = DQN.load(run + "/agent")
agent.fit(gym.make("Pendulum-v1"), total, checkpoint_dir=run + "/agent")
print(keras.backend.backend(), agent.state.global_step, agent.train_steps)
"""


def test_a_sac_run_on_jax_resumes_on_pytorch(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    lines = []
    for backend, total in (("jax", 300), ("torch", 500)):
        done = subprocess.run([sys.executable, "-c", RUN, str(tmp_path), str(total)], capture_output=True, text=True,
                              timeout=300, check=False,
                              env={**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert done.returncode == 0, done.stderr[-3000:]
        lines.append(done.stdout.split()[-3:])
    assert lines[0][:2] == ["jax", "300"] and lines[1][:2] == ["torch", "500"]
    assert int(lines[1][2]) > int(lines[0][2]) > 0


def test_sac_acts_in_a_vector_env_one_stream_each(tmp_path: Path) -> None:
    envs = gym.make_vec("Pendulum-v1", 2, vectorization_mode="sync")
    agent = DQN(sac_mlp((1, 3), 1, hidden_sizes=(8,)), tmp_path / "replay.zarr", rule=SAC(), seed=1, buffer_size=2_000,
                batch_size=16)
    agent.fit(envs, 300, eval_env=envs, eval_episodes=2)
    assert agent.state.global_step == 300 and agent.train_steps > 0
    actions = agent.act(np.zeros((2, 3), np.float32), restart=np.array([True, True]))
    assert actions.shape == (2, 1) and np.abs(actions).max() <= 2.0
    agent.close()
    with ReplayStore.open(tmp_path / "replay.zarr") as store:
        assert len(store) == 300 and [st.added for st in store.stream_states()] == [151, 151]  # (each: a first frame)


def test_networks_whose_layers_share_names_keep_their_own_targets() -> None:
    """The actor's and critics' layers may share names (and so variable paths): the checkpoint's
    target weights go back to their own variables (learners map them by variable, not by path)."""
    def actor() -> keras.Model:
        stack = keras.Input((1, 3))
        x = keras.layers.Dense(8, activation="relu", name="fc")(keras.layers.Flatten()(stack))
        return keras.Model(stack, keras.layers.Reshape((2, 1))(keras.layers.Dense(2, name="out")(x)), name="actor")

    def critic(name: str) -> keras.Model:
        stack, action = keras.Input((1, 3)), keras.Input((1,))
        x = keras.layers.Concatenate()([keras.layers.Flatten()(stack), action])
        return keras.Model([stack, action], keras.layers.Dense(1, name="out")(keras.layers.Dense(8, name="fc")(x)),
                           name=name)

    from replaystore.trainer import sac_model

    model = sac_model(actor(), critic("critic"), critic("twin"))
    assert len({v.path for v in model.trainable_variables}) < len(model.trainable_variables)
    learner = make_learner(model, keras.optimizers.Adam(1e-2), stack_shape=(1, 3), dtype=np.float32, target_every=1,
                           tau=0.5, rule=SAC(), actions=PENDULUM)
    learner.train_block({k: v[None] for k, v in _batch(np.random.default_rng(0), 16).items()})
    state = learner.state()
    again = make_learner(sac_model(actor(), critic("critic"), critic("twin")), keras.optimizers.Adam(1e-2),
                         stack_shape=(1, 3), dtype=np.float32, target_every=1, tau=0.5, rule=SAC(), actions=PENDULUM)
    again.load_state(state)
    for part in ("online", "target", "optimizer"):
        for a, b in zip(state[part], again.state()[part], strict=True):
            np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(t, o) for t, o in zip(state["target"], state["online"], strict=True))
