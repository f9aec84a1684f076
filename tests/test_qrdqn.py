"""QR-DQN as a learning rule (trainer/qrdqn.py): its loss is sb3-contrib's on the same quantiles,
the agent acts on the quantiles' means, a model of the wrong shape and bad arguments are refused in
one line, and a QR-DQN agent saves, loads (its rule with it) and resumes; a damaged rule in
``agent.json`` is refused, never imported. The three backends' agreement on a QR-DQN gradient step
is tests/test_trainer_jax.py's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import keras
import numpy as np
import pytest

from replaystore.trainer import DQN, QRDQN, ModelError, StackSpec, TrainerError, check_model, mlp
from replaystore.trainer.actions import ActionSpec
from replaystore.trainer.learner import make_learner
from replaystore.trainer.rule import Nets


def quantile_model(n_actions: int = 2, n: int = 5, inputs: int = 4) -> keras.Model:
    return keras.Sequential([keras.Input((1, inputs)), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(n_actions * n), keras.layers.Reshape((n_actions, n))])


def test_the_loss_is_sb3_contribs_on_the_same_quantiles() -> None:
    torch = pytest.importorskip("torch")
    from sb3_contrib.common.utils import quantile_huber_loss

    rng = np.random.default_rng(0)
    b, a, n = 6, 3, 5
    now, following = (rng.normal(size=(b, a, n)).astype(np.float32) * 2 for _ in range(2))
    batch = {"obs": np.zeros((b, 1)), "next_obs": np.zeros((b, 1)), "action": rng.integers(0, a, b),
             "reward": rng.normal(size=b).astype(np.float32),
             "discount": (0.99 * (rng.random(b) < 0.7)).astype(np.float32), "weight": np.ones(b, np.float32)}
    nets = Nets(lambda _: keras.ops.convert_to_tensor(now), lambda _: keras.ops.convert_to_tensor(following),
                lambda _: keras.ops.convert_to_tensor(now), ActionSpec(n=a))
    loss, (q_mean, priority) = QRDQN(n).loss(nets, batch)
    # sb3-contrib's QR-DQN train step, on its (batch, n_quantiles, n_actions) layout
    nxt = torch.as_tensor(following).transpose(1, 2)
    greedy = nxt.mean(dim=1, keepdim=True).argmax(dim=2, keepdim=True).expand(b, n, 1)
    target = (torch.as_tensor(batch["reward"])[:, None]
              + torch.as_tensor(batch["discount"])[:, None] * nxt.gather(dim=2, index=greedy).squeeze(dim=2))
    actions = torch.as_tensor(batch["action"])[:, None, None].expand(b, n, 1)
    current = torch.as_tensor(now).transpose(1, 2).gather(dim=2, index=actions).squeeze(dim=2)
    expected = quantile_huber_loss(current, target, sum_over_quantiles=True)
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(loss)), float(expected), rtol=1e-5)
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(q_mean)), float(current.mean()), rtol=1e-5)
    delta = target[:, None, :] - current[:, :, None]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(priority), delta.abs().mean(dim=(1, 2)).numpy(), rtol=1e-5)
    # prioritized replay's importance weights scale each transition's share
    weighted = dict(batch, weight=np.arange(1, b + 1, dtype=np.float32))
    heavy, _ = QRDQN(n).loss(nets, weighted)
    per = [float(quantile_huber_loss(current[i:i + 1], target[i:i + 1])) for i in range(b)]
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(heavy)), np.mean(np.arange(1, b + 1) * per), rtol=1e-5)


def test_the_learner_acts_on_the_quantiles_mean() -> None:
    model = quantile_model(n_actions=3, n=4)
    learner = make_learner(model, keras.optimizers.Adam(1e-3), stack_shape=(1, 4), dtype=np.float32, target_every=10,
                           tau=1.0, rule=QRDQN(4))
    stacks = np.random.default_rng(1).normal(size=(16, 1, 4)).astype(np.float32)
    means = keras.ops.convert_to_numpy(model(stacks)).mean(axis=-1)
    np.testing.assert_allclose(learner.q_values(stacks), means, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(learner.act_batch(stacks), means.argmax(axis=1))


@pytest.mark.parametrize(("make", "message"), [
    (lambda: QRDQN(0), r"n_quantiles is 0; it must be a whole number in \[1, 1,024\]"),
    (lambda: QRDQN(2.5), r"n_quantiles is 2\.5; it must be a whole number"),
    (lambda: QRDQN(True), r"n_quantiles is True; it must be a whole number"),
    (lambda: DQN(quantile_model(), "unused.zarr", rule="qr-dqn"), r"rule is 'qr-dqn'; pass one of .*QRDQN\(\)"),
    (lambda: DQN(quantile_model(), "unused.zarr", rule=QRDQN(5), cql_alpha=1.0),
     r"cql_alpha is 1\.0, but conservative Q-learning's term is DQN's rule's"),
])
def test_bad_rule_arguments_are_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any,
                                                    message: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TrainerError, match=message) as caught:
        make()
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_a_model_of_the_wrong_shape_is_told_what_qr_dqn_reads() -> None:
    stacks = StackSpec.single((1, 4), np.float32)
    with pytest.raises(ModelError, match=r"outputs shape \(2,\) per stack.*QR-DQN's model gives 5 quantiles per action, "
                                         r"shape \(2, 5\) per stack \(Dense\(10\) then Reshape\(\(2, 5\)\)\)"):
        check_model(mlp((1, 4), 2), stacks, 2, QRDQN(5))
    with pytest.raises(ModelError, match=r"outputs shape \(2, 5\) per stack.*one Q-value per action \(Dense\(2\)\)"):
        check_model(quantile_model(), stacks, 2)
    check_model(quantile_model(), stacks, 2, QRDQN(5))


def test_a_qr_dqn_agent_saves_loads_with_its_rule_and_resumes(tmp_path: Path) -> None:
    keras.utils.set_random_seed(3)
    agent = DQN(quantile_model(), tmp_path / "replay.zarr", rule=QRDQN(5), seed=3, buffer_size=5_000,
                learning_starts=200, batch_size=32)
    agent.fit(gym.make("CartPole-v1"), 600, checkpoint_dir=tmp_path / "ck")
    stacks = np.random.default_rng(2).normal(size=(8, 1, 4)).astype(np.float32)
    q = agent.learner.q_values(stacks)
    steps = agent.train_steps
    assert steps > 0 and "QRDQN(n_quantiles=5)" in repr(agent)
    agent.close()
    saved = json.loads((tmp_path / "ck" / "agent.json").read_text())
    assert saved["rule"] == {"name": "qr-dqn", "config": {"n_quantiles": 5}}
    loaded = DQN.load(tmp_path / "ck")
    assert loaded.rule == QRDQN(5) and loaded.learner.rule == QRDQN(5) and loaded.train_steps == steps
    np.testing.assert_allclose(loaded.learner.q_values(stacks), q, rtol=1e-5, atol=1e-6)
    loaded.fit(gym.make("CartPole-v1"), 900)
    assert loaded.state.global_step == 900 and loaded.train_steps > steps
    loaded.close()


@pytest.mark.parametrize("rule", [{"name": "qr-dqn", "config": {"n_quantiles": 0}},
                                  {"name": "os.system", "config": {}},
                                  {"name": "qr-dqn", "config": {"n_quantiles": 5, "code": "x"}},
                                  {"name": "qr-dqn", "config": ["n_quantiles"]}, "qr-dqn"])
def test_a_damaged_rule_in_agent_json_is_refused_in_one_line(tmp_path: Path, rule: Any) -> None:
    agent = DQN(quantile_model(), tmp_path / "replay.zarr", rule=QRDQN(5), seed=0, buffer_size=2_000,
                learning_starts=100, batch_size=16)
    agent.fit(gym.make("CartPole-v1"), 150, checkpoint_dir=tmp_path / "ck")
    agent.close()
    doc = json.loads((tmp_path / "ck" / "agent.json").read_text())
    (tmp_path / "ck" / "agent.json").write_text(json.dumps(dict(doc, rule=rule)))
    with pytest.raises(TrainerError, match=r"agent\.json's learning rule .* is not one this replaystore knows") as caught:
        DQN.load(tmp_path / "ck")
    assert "\n" not in str(caught.value)
