"""TorchRL's own DQN recipe for CartPole on two storages, side by side: ``LazyTensorStorage`` (the
recipe's) and ``ReplayStoreStorage`` (a replay store on disk), every seed in its own process.

The recipe is pytorch/rl's sota-implementations/dqn (dqn_cartpole.py with config_cartpole.yaml),
built here from TorchRL's parts with its settings: one CartPole-v1 env with ``RewardSum`` and
``StepCounter``; a ``QValueActor`` over an MLP of 120 and 84 ReLU units; epsilon-greedy from 1 to
0.05 over 250k frames; a collector of 1,000 frames a batch, 500,100 frames in all, the first 10,000
random; a ``TensorDictReplayBuffer`` of 10,000 transitions (prefetch 10), batches of 128; 100
gradient steps per batch (``DQNLoss``, l2, gamma 0.99, Adam 2.5e-4), the target network copied every
50 of them (``HardUpdate``); 5 greedy test episodes every 50k frames. Only the storage differs.
Each run is scored by its final policy over ``--episodes`` greedy episodes.

    python tools/torchrl_dqn.py --out tools/out/torchrl_dqn.jsonl [--seeds 1,2,3] [--jobs 2] [--scale 1.0]

``--scale`` multiplies the frame budgets (0.02 for a rehearsal). docs/benchmarks.md, "TorchRL's DQN
recipe on a replay store", has the table.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import seeds  # noqa: E402

RECIPE = {"total_frames": 500_100, "frames_per_batch": 1000, "init_random_frames": 10_000, "annealing_frames": 250_000,
          "eps_start": 1.0, "eps_end": 0.05, "buffer_size": 10_000, "batch_size": 128, "lr": 2.5e-4, "gamma": 0.99,
          "hard_update_freq": 50, "num_updates": 100, "test_interval": 50_000, "num_test_episodes": 5}


def child(run: dict[str, Any]) -> dict[str, Any]:
    import torch
    from tensordict.nn import TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.data import Composite, LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.envs import ExplorationType, GymEnv, RewardSum, StepCounter, TransformedEnv, set_exploration_type
    from torchrl.modules import MLP, EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss, HardUpdate

    from replaystore.integrations.torchrl import ReplayStoreStorage

    cfg = dict(RECIPE)
    scale = run["scale"]
    for name in ("total_frames", "init_random_frames", "annealing_frames", "test_interval"):
        cfg[name] = max(cfg["frames_per_batch"], int(cfg[name] * scale))
    torch.manual_seed(run["seed"])
    torch.set_num_threads(1)  # (two runs at a time on two cores)

    def env_of() -> Any:
        env = TransformedEnv(GymEnv("CartPole-v1"))
        env.append_transform(RewardSum())
        env.append_transform(StepCounter())
        return env

    proof = env_of()
    action_spec = proof.full_action_spec["action"]
    model = QValueActor(MLP(in_features=proof.observation_spec["observation"].shape[-1], activation_class=torch.nn.ReLU,
                            out_features=action_spec.space.n, num_cells=[120, 84]),
                        spec=Composite(action=action_spec), in_keys=["observation"])
    greedy = EGreedyModule(annealing_num_steps=cfg["annealing_frames"], eps_init=cfg["eps_start"], eps_end=cfg["eps_end"],
                           spec=model.spec)
    explore = TensorDictSequential(model, greedy)
    train_env = env_of()
    train_env.set_seed(run["seed"])
    collector = Collector(train_env, explore, frames_per_batch=cfg["frames_per_batch"], total_frames=cfg["total_frames"],
                          init_random_frames=cfg["init_random_frames"], max_frames_per_traj=-1)
    folder = tempfile.mkdtemp(prefix="torchrl_dqn_")
    storage = (LazyTensorStorage(max_size=cfg["buffer_size"]) if run["storage"] == "LazyTensorStorage"
               else ReplayStoreStorage(Path(folder) / "rb.zarr", max_size=cfg["buffer_size"]))
    rb = TensorDictReplayBuffer(storage=storage, batch_size=cfg["batch_size"], prefetch=10)
    loss = DQNLoss(value_network=model, loss_function="l2", delay_value=True)
    loss.make_value_estimator(gamma=cfg["gamma"])
    target = HardUpdate(loss, value_network_update_interval=cfg["hard_update_freq"])
    optimizer = torch.optim.Adam(loss.parameters(), lr=cfg["lr"])
    test_env = env_of()
    test_env.set_seed(run["seed"] + 10_000)

    def play(episodes: int) -> float:
        scores = []
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            for _ in range(episodes):
                td = test_env.rollout(max_steps=10_000, policy=model, auto_reset=True, break_when_any_done=True)
                scores.append(float(td["next", "reward"].sum()))
        return sum(scores) / len(scores)

    frames, evals, sample_s, t0 = 0, [], 0.0, time.perf_counter()
    for i, data in enumerate(collector):
        data = data.reshape(-1)
        rb.extend(data)
        frames += data.numel()
        greedy.step(data.numel())
        if frames < cfg["init_random_frames"]:
            continue
        for _ in range(cfg["num_updates"]):
            s0 = time.perf_counter()
            batch = rb.sample()
            sample_s += time.perf_counter() - s0
            out = loss(batch)
            optimizer.zero_grad()
            out["loss"].backward()
            optimizer.step()
            target.step()
        if (frames // cfg["test_interval"]) > ((frames - data.numel()) // cfg["test_interval"]):
            evals.append([frames, play(cfg["num_test_episodes"])])
        collector.update_policy_weights_()
    collector.shutdown()
    score = play(run["episodes"])
    return {"score": score, "evals": evals, "frames": frames, "run_s": round(time.perf_counter() - t0, 1),
            "sample_s": round(sample_s, 1)}


def main() -> None:
    p = seeds.parser(__doc__)
    p.set_defaults(seeds="1,2,3", out=Path("tools/out/torchrl_dqn.jsonl"))
    p.add_argument("--storages", default="LazyTensorStorage,ReplayStoreStorage")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every frame budget")
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return
    runs = [{"storage": s, "seed": int(seed), "scale": args.scale, "episodes": args.episodes}
            for seed in args.seeds.split(",") for s in args.storages.split(",")]
    rows = seeds.run_all(Path(__file__), runs, args.out, args.jobs)
    print(seeds.table(rows, ["storage"], goal=475.0))
    for row in sorted(rows, key=lambda r: (r["storage"], r["seed"])):
        curve = " ".join(f"{f // 1000}k:{s:.0f}" for f, s in row["evals"])
        print(f"{row['storage']} seed {row['seed']}: {row['run_s']} s, sampling {row['sample_s']} s; {curve}")


if __name__ == "__main__":
    main()
