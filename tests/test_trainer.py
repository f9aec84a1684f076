"""The trainer's parts in-process: frame stacks match the store's, arguments and resume rules, the
atomic checkpoint, the double-DQN step. Whole runs in subprocesses are in test_trainer_smoke.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import frame, make_store

from replaystore.trainer import checkpoint
from replaystore.trainer.args import Args, TrainerError
from replaystore.trainer.cli import main
from replaystore.trainer.cmdline import parse
from replaystore.trainer.config import linear_schedule
from replaystore.trainer.stacks import push_frames, stacks_of


def test_agent_stacks_are_the_stores_stacks(store_path: Path) -> None:
    """What the agent saw at every step (acting's stacks: ``stacks_of``, ``push_frames``) is bit for
    bit what sample() returns for that transition, including episodes that end mid-stack and restart
    from the next observation (a lost life)."""
    store = make_store(store_path, capacity=256, frame_stack=4, shard_len=32, chunk_len=8)
    rng = np.random.default_rng(0)
    seen: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    obs = frame(0)
    stacks = stacks_of(obs[None], 4)
    for t in range(200):
        nxt = frame(t + 1)
        end = rng.random() < 0.15
        before = stacks[0].copy()
        store.add(obs, 0, 0.0, nxt, end, False)
        slot = (store.added - 2) % store.capacity
        push_frames(stacks, nxt[None], np.array([end]))
        if not end:
            seen[slot] = (before, stacks[0].copy())
        else:
            # next_obs of a terminal move: the store stacks it onto the ending episode
            seen[slot] = (before, np.concatenate([before[1:], nxt[None]]))
        obs = nxt
    checked: set[int] = set()
    for seed in range(6):
        batch = store.sample(len(store), rng=np.random.default_rng(seed))
        for i, slot in enumerate(batch.index):
            np.testing.assert_array_equal(batch.obs[i], seen[int(slot)][0])
            np.testing.assert_array_equal(batch.next_obs[i], seen[int(slot)][1])
            checked.add(int(slot))
    assert len(checked) > 0.9 * len(seen)
    store.close()


def test_linear_schedule() -> None:
    assert linear_schedule(1.0, 0.1, 100, 0) == 1.0
    assert linear_schedule(1.0, 0.1, 100, 50) == pytest.approx(0.55)
    assert linear_schedule(1.0, 0.1, 100, 1000) == 0.1


@pytest.mark.parametrize(("argv", "message"), [
    (["--env-id", "NoSuchGame-v9"], "unknown environment id 'NoSuchGame-v9'"),
    (["--env-id", "Pendulum-v1"], "needs a Discrete action space"),
    (["--env-id", "CartPole-v1", "--buffer-size", "16", "--batch-size", "32"], "smaller than --batch-size 32"),
    (["--env-id", "CartPole-v1", "--gamma", "1.5"], "--gamma is 1.5"),
    (["--env-id", "CartPole-v1", "--hidden-sizes", "a,b"], "--hidden-sizes"),
    (["--env-id", "CartPole-v1", "--replay-ratio", "fast"], "--replay-ratio is 'fast'"),
    (["--env-id", "CartPole-v1", "--replay-ratio", "-2"], "--replay-ratio is '-2'"),
    (["--env-id", "CartPole-v1", "--actors", "2", "--replay-ratio", "0"], "--actors needs the decoupled learner"),
    (["--env-id", "CartPole-v1", "--actors", "2", "--num-envs", "2", "--buffer-size", "1002"],
     "does not split evenly over --num-envs 2 x --actors 2 (each env writes its own stream); use 1000 or 1004"),
    (["--env-id", "CartPole-v1", "--actors", "2", "--actor-restarts", "-1"], "--actor-restarts is -1"),
    (["--env-id", "CartPole-v1", "--overlap-envs", "yes"], "--overlap-envs is 'yes'; it must be one of auto, on, off"),
    (["--env-id", "CartPole-v1", "--env-kwargs", "{bad"], "--env-kwargs is '{bad'; give a JSON object"),
    (["--env-id", "CartPole-v1", "--env-kwargs", "[1]"], "--env-kwargs is '[1]'; give a JSON object"),
    (["--env-id", "ALE/Breakout-v5", "--env-kwargs", '{"mode": 1}'],
     "--env-kwargs: ALE/Breakout-v5 does not take the keyword 'mode' (ale-py's vector env plays the default mode)"),
    (["--env-id", "ALE/Breakout-v5", "--env-kwargs", '{"frameskip": 0}'],
     "--env-kwargs: ALE/Breakout-v5's frameskip is 0; give a whole number >= 1"),
    (["--env-id", "FrozenLake-v1", "--env-kwargs", '{"slippery": false}'],
     "FrozenLake-v1 cannot be made with the keywords {'slippery': False}"),
    (["--env-id", "CartPole-v1", "--info-keys", "is_success:str"], "--info-keys 'is_success:str': extras['is_success'] "
                                                                  "has dtype"),
    (["--env-id", "CartPole-v1", "--info-keys", "a b"], "--info-keys 'a b': extras name 'a b' is not allowed"),
    (["--env-id", "CartPole-v1", "--info-keys", "x,x"], "--info-keys names 'x' twice"),
    (["--env-id", "CartPole-v1", "--hidden-sizes", "300000,300000"], "--hidden-sizes 300000,300000 asks for "
                                                                      "90,000,000,000 weights"),
    (["--env-id", "CartPole-v1", "--sample-threads", "100000"], "--sample-threads is 100000; it must be at most 64"),
    (["--env-id", "CartPole-v1", "--env-kwargs", "[" * 20_000 + "]" * 20_000], "--env-kwargs is '[[[["),
    (["--env-id", "CartPole-v1", "--model", "os:system"], "system(observation_space, n_actions, frame_stack) raised "
                                                          "TypeError"),
    (["--env-id", "CartPole-v1", "--steps-per-call", "100000000"], "--steps-per-call is 100000000; it must be at most"),
    (["--env-id", "CartPole-v1", "--seed", "-1"], "--seed is -1; it must be an integer from 0 to 2**32 - 1"),
], ids=["unknown-env", "continuous-actions", "buffer-below-batch", "gamma", "hidden-sizes", "ratio-word",
        "ratio-negative", "actors-lockstep", "actors-streams", "actor-restarts", "overlap-word", "env-kwargs-json",
        "env-kwargs-list", "env-kwargs-atari", "env-kwargs-atari-value", "env-kwargs-unknown", "info-dtype", "info-name", "info-twice",
        "hidden-sizes-huge", "sample-threads-huge", "env-kwargs-deep", "model-not-a-builder", "steps-per-call-huge",
        "seed-negative"])
def test_bad_arguments_are_one_line_errors_and_write_nothing(tmp_path: Path, argv: list[str], message: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    assert main([*argv, "--run-dir", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not run_dir.exists()


def test_the_command_line_loads_no_keras_before_its_arguments_are_checked() -> None:
    """TensorFlow takes seconds and hundreds of MB to import, and prints its start-up lines unless
    ``process.import_keras`` holds them back: importing the command line loads neither."""
    code = "import sys, replaystore.trainer.cli; print(sorted({'keras', 'tensorflow', 'jax'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_resume_needs_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--resume", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["--resume", str(tmp_path / "empty")]) == 1
    assert "holds no run" in capsys.readouterr().err


def test_resume_refuses_changed_hyperparameters(tmp_path: Path) -> None:
    (tmp_path / "args.json").write_text(json.dumps({"env_id": "CartPole-v1", "run_dir": str(tmp_path)}))
    with pytest.raises(TrainerError, match="--learning-rate cannot change when resuming"):
        parse(["--resume", str(tmp_path), "--learning-rate", "0.1"])
    command = parse(["--resume", str(tmp_path), "--total-timesteps", "123", "--no-progress"])
    args = command.args
    assert command.mode == "resume" and args.total_timesteps == 123 and args.progress is False and args.env_id == "CartPole-v1"


@pytest.mark.parametrize(("saved", "message"), [
    ({"seed": "x"}, "seed is 'x', not an int"),
    ({"learning_rate": "fast"}, "learning_rate is 'fast', not a float"),
    ({"prioritized": 1}, "prioritized is 1, not a bool"),
    ({"total_timesteps": True}, "total_timesteps is True, not an int"),
    ({"env_id": ["CartPole-v1"]}, "env_id is ['CartPole-v1'], not a str"),
    ([1, 2], "it holds list, not an object of flags"),
], ids=["int", "float", "bool", "bool-for-int", "list-for-str", "not-an-object"])
def test_a_damaged_arguments_file_is_a_one_line_error(tmp_path: Path, saved: object, message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A hand-edited or damaged ``args.json`` (a value of the wrong type) was a traceback from deep in
    Keras or numpy; now ``--resume`` and ``--evaluate`` say which flag is wrong, and write nothing."""
    values = {"env_id": "CartPole-v1", "run_dir": str(tmp_path), **saved} if isinstance(saved, dict) else saved
    (tmp_path / "args.json").write_text(json.dumps(values))
    for mode in ("resume", "evaluate"):
        assert main([f"--{mode}", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: cannot {mode}: {tmp_path / 'args.json'} is not a valid arguments file ({message}); "
                              "put back a copy of it") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["args.json"]


def test_an_older_runs_numeric_replay_ratio_is_read(tmp_path: Path) -> None:
    (tmp_path / "args.json").write_text(json.dumps({"env_id": "CartPole-v1", "run_dir": str(tmp_path), "replay_ratio": 0.0}))
    assert parse(["--resume", str(tmp_path)]).args.replay_ratio == "0.0"


def test_new_run_refuses_a_used_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "something").write_text("x")
    assert main(["--env-id", "CartPole-v1", "--run-dir", str(tmp_path)]) == 1
    assert "--resume" in capsys.readouterr().err


def test_checkpoint_is_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = {"online": [np.ones(3)], "target": [np.zeros(3)], "optimizer": [np.array(7)]}
    checkpoint.save(tmp_path, arrays, {"global_step": 10})

    def crash(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, {**arrays, "online": [np.full(3, 9.0)]}, {"global_step": 20})
    monkeypatch.undo()
    (tmp_path / ".checkpoint-x.npz.tmp").write_bytes(b"torn")  # as a SIGKILL mid-write would leave
    checkpoint.remove_partials(tmp_path)
    loaded, state = checkpoint.load(tmp_path)
    assert state == {"global_step": 10} and loaded["online"][0].tolist() == [1, 1, 1]
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.CHECKPOINT]


def test_double_dqn_target(tmp_path: Path) -> None:
    """One step of the compiled learner against the formula: the online net picks, the target net values."""
    import keras
    import tensorflow as tf

    from replaystore.trainer.learner import make_learner
    from replaystore.trainer.models import mlp

    model = mlp((1, 2), 3, hidden_sizes=[8])
    learner = make_learner(model, keras.optimizers.Adam(1e-3), stack_shape=(1, 2), dtype=np.float32,
                           target_every=1000, tau=1.0)
    online = [w.copy() for w in model.get_weights()]
    target = mlp((1, 2), 3, hidden_sizes=[8])
    target.set_weights([w * 0.5 for w in online])
    learner.load_state({"online": online, "target": target.get_weights(), "optimizer": learner.state()["optimizer"]})
    obs = np.random.default_rng(0).normal(size=(4, 1, 2)).astype(np.float32)
    nxt = np.random.default_rng(1).normal(size=(4, 1, 2)).astype(np.float32)
    q_online, q_next_online, q_next_target = (np.asarray(m(x)) for m, x in ((model, obs), (model, nxt), (target, nxt)))
    batch = {"obs": tf.constant(obs), "next_obs": tf.constant(nxt), "action": tf.constant([0, 1, 2, 0], tf.int64),
             "reward": tf.constant([1, 0, -1, 0.5], tf.float32), "discount": tf.constant([0.99, 0, 0.99, 0.5], tf.float32),
             "weight": tf.ones(4)}
    expected = batch["reward"].numpy() + batch["discount"].numpy() * q_next_target[np.arange(4), q_next_online.argmax(1)]
    td = np.abs(expected - q_online[np.arange(4), [0, 1, 2, 0]])
    loss, _, abs_td = learner.train_block({name: value[None] for name, value in batch.items()})
    np.testing.assert_allclose(abs_td[0], td, rtol=1e-5, atol=1e-6)
    huber = np.where(td < 1, 0.5 * td**2, td - 0.5)
    assert float(loss[0]) == pytest.approx(huber.mean(), rel=1e-5)
    assert learner.train_steps == 1


def test_args_defaults_are_cleanrl_atari_for_images_and_the_classic_preset_for_vectors() -> None:
    import gymnasium as gym

    from replaystore.trainer.args import fill_presets

    atari, vectors = Args(), Args()
    fill_presets(atari, gym.spaces.Box(0, 255, (84, 84), np.uint8))
    fill_presets(vectors, gym.spaces.Box(-1, 1, (4,), np.float32))
    assert (atari.buffer_size, atari.learning_starts, atari.train_frequency, atari.target_network_frequency,
            atari.batch_size, atari.learning_rate, atari.n_step, atari.end_e) == (1_000_000, 80_000, 4, 1000, 32, 1e-4, 1, 0.01)
    assert (vectors.learning_starts, vectors.train_frequency, vectors.target_network_frequency, vectors.batch_size,
            vectors.learning_rate, vectors.n_step, vectors.end_e) == (1_000, 2, 500, 128, 2.5e-4, 3, 0.02)
    given = Args(batch_size=64, her_n_sampled_goal=4)  # what is given stays; hindsight takes 1-step returns
    fill_presets(given, gym.spaces.Dict({"observation": gym.spaces.Box(-1, 1, (4,))}))
    assert (given.batch_size, given.n_step, given.learning_starts) == (64, 1, 1_000)


def test_help_states_real_defaults() -> None:
    """--help shows no empty or None defaults, and says what --frame-stack and --steps-per-call pick."""
    from replaystore.trainer.cmdline import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "(default: )" not in text and "(default: None)" not in text
    assert "frames per observation (default: 4 for images, 1 for vectors) --" in text
    assert "(default: the backend's, 8 on TensorFlow and PyTorch, 32 on JAX)" in text
    assert "--total-timesteps TOTAL_TIMESTEPS environment steps of the whole run (default: 10_000_000)" in text
    assert "steps of acting before learning (default: 80_000 for images, 1_000 for vectors)" in text
    assert "(default: --progress)" in text


def test_parsing_tells_given_flags_from_defaults_without_argparse_internals(tmp_path: Path) -> None:
    """Only the flags given replace a resumed run's values, also when given at their default value."""
    saved = Args(env_id="CartPole-v1", total_timesteps=500, eval_episodes=3, run_dir=str(tmp_path))
    (tmp_path / "args.json").write_text(json.dumps(saved.__dict__))
    args = parse(["--resume", str(tmp_path), "--total-timesteps", "10000000"]).args
    assert args.total_timesteps == 10_000_000 and args.eval_episodes == 3  # the default value, given
    args = parse(["--resume", str(tmp_path), "--progress"]).args
    assert args.total_timesteps == 500 and args.progress is True
    with pytest.raises(TrainerError, match="--gamma cannot change"):
        parse(["--resume", str(tmp_path), "--gamma", "0.99"])  # the default value, but given
    evaluation = parse(["--evaluate", str(tmp_path), "--eval-epsilon", "0.05"])
    assert evaluation.mode == "evaluate" and evaluation.args.eval_episodes == 3 and evaluation.args.eval_epsilon == 0.05
    assert parse(["--evaluate", str(tmp_path), "--env-id", "Acrobot-v1"]).args.eval_episodes == 3


def test_learning_starts_not_below_total_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CartPole's preset learns from step 1,000 (Atari's from 80,000): a run of 1,000 steps would not learn."""
    assert main(["--env-id", "CartPole-v1", "--total-timesteps", "1000", "--run-dir", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "--learning-starts 1,000 is not below --total-timesteps 1,000" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "no state", "state not json"])
def test_resume_with_a_damaged_checkpoint_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      damage: str) -> None:
    """Not a zipfile.BadZipFile traceback: exit 1, one line naming the file, before the store is opened."""
    (tmp_path / "args.json").write_text(json.dumps({"env_id": "CartPole-v1", "run_dir": str(tmp_path)}))
    path = checkpoint.save(tmp_path, {"online": [np.ones(3, np.float32)], "target": [np.ones(3, np.float32)],
                                      "optimizer": [np.zeros(1, np.int64)]}, {"global_step": 5})
    good = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"not a zip file at all" * 10)
    elif damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    else:
        arrays = {"online/0": np.ones(3, np.float32), "target/0": np.ones(3, np.float32), "optimizer/0": np.zeros(1)}
        if damage == "state not json":
            arrays["state"] = np.frombuffer(b"{not json", dtype=np.uint8)
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    assert main(["--resume", str(tmp_path), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot resume: {path} is damaged") and err.count("\n") == 1, err
    assert not (tmp_path / "replay.zarr").exists()


@pytest.mark.parametrize(("values", "keyword", "flag"), [
    ({"n_step": 3, "her_n_sampled_goal": 4}, "n_step is 3 with her_n_sampled_goal 4; .* use n_step=1",
     "--n-step is 3 with --her-n-sampled-goal 4; .* use --n-step 1"),
    ({"gamma": 2}, r"^gamma is 2; it must be a number in \[0, 1\]", r"--gamma is 2; it must be a number in \[0, 1\]"),
    ({"replay_ratio": "batch_size"}, "replay_ratio is 'batch_size'; give a number", "--replay-ratio is 'batch_size'"),
], ids=["two-names", "one-name", "ratio"])
def test_one_check_names_the_keyword_for_the_api_and_the_flag_for_the_command_line(
        values: dict[str, Any], keyword: str, flag: str) -> None:
    """The hyperparameters are declared once (config.Hyperparameters) and checked once: the API's
    message names the keyword, the command line's the flag, with no rewriting of messages."""
    from replaystore.trainer.config import FLAGS, DQNConfig

    with pytest.raises(TrainerError, match=keyword):
        DQNConfig(**values).check()
    with pytest.raises(TrainerError, match=flag):
        DQNConfig(**values).check(FLAGS)


def test_every_hyperparameter_is_a_flag_with_its_one_help_and_default() -> None:
    import dataclasses

    from replaystore.trainer.args import Args
    from replaystore.trainer.cmdline import build_parser
    from replaystore.trainer.config import DQNConfig, Hyperparameters

    declared = {f.name: f for f in dataclasses.fields(Hyperparameters)}
    assert {f.name for f in dataclasses.fields(DQNConfig)} == set(declared)
    flags = {f.name: f for f in dataclasses.fields(Args)}
    assert set(declared) <= set(flags)
    helps = {action.dest: action.help for action in build_parser()._actions}
    for name, field in declared.items():
        assert flags[name].metadata["help"] == field.metadata["help"]
        assert str(field.metadata["help"]) in str(helps[name])
        if name not in ("clip_reward", "terminal_on_life_loss"):  # (on by default for ALE ids on the command line)
            assert flags[name].default == field.default, name
