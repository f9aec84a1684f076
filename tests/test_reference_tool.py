"""tools/reference_dqn.py's mapping of rl-baselines3-zoo's DQN hyperparameters onto ``DQN``'s names
(SB3's schedule: a block of ``gradient_steps`` every ``train_freq`` env steps, learning in lockstep,
the target copied once per block when its interval is shorter), and tools/seeds.py's bookkeeping of
rows whose runs have different fields (ours has a backend, SB3's not)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import reference_dqn  # noqa: E402
import seeds  # noqa: E402


def test_the_zoos_schedule_maps_onto_ours() -> None:
    cartpole = reference_dqn.ours(reference_dqn.ZOO["CartPole-v1"])  # train_freq 256, gradient_steps 128
    assert (cartpole["train_frequency"], cartpole["steps_per_call"], cartpole["replay_ratio"]) == (2, 128, 0)
    assert cartpole["target_network_frequency"] // cartpole["train_frequency"] == 128  # one copy per block
    acrobot = reference_dqn.ours(reference_dqn.ZOO["Acrobot-v1"])  # train_freq 4, gradient_steps -1
    assert (acrobot["train_frequency"], acrobot["steps_per_call"], acrobot["target_network_frequency"]) == (1, 4, 250)
    assert acrobot["learning_starts"] == 128  # (the zoo's 0: at least one batch)
    car = reference_dqn.ours(reference_dqn.ZOO["MountainCar-v0"])  # train_freq 16, gradient_steps 8
    assert (car["train_frequency"], car["steps_per_call"], car["target_network_frequency"]) == (2, 8, 600)
    assert car["gamma"] == 0.98 and car["end_e"] == 0.07


def test_rows_of_runs_with_different_fields_are_kept_and_found(tmp_path: Path) -> None:
    runs = [{"env": "E", "lib": "replaystore", "seed": 1, "backend": "jax"}, {"env": "E", "lib": "sb3", "seed": 1}]
    out = tmp_path / "rows.jsonl"
    out.write_text("".join(json.dumps({**run, "score": 1.0 + i}) + "\n" for i, run in enumerate(runs)))
    rows = seeds.run_all(TOOLS / "reference_dqn.py", runs, out, jobs=1)  # (both done: nothing runs)
    assert sorted(row["score"] for row in rows) == [1.0, 2.0]
    table = seeds.table(rows, ["env", "lib"])
    assert "| E | replaystore | 1.0 | 1.0 |" in table and "| E | sb3 | 2.0 | 2.0 |" in table
