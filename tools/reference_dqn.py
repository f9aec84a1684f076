"""Our DQN beside an independent one: Stable-Baselines3's DQN with rl-baselines3-zoo's published
hyperparameters (hyperparams/dqn.yml) on CartPole-v1, Acrobot-v1 and MountainCar-v0, each seed of
each in its own process, the same env-step budget (the zoo's ``n_timesteps``), and each final agent
scored over ``--episodes`` greedy games. Ours runs ``replaystore.trainer.DQN`` with the same
hyperparameters, mapped onto its names (``ours``, below), and the same network (``sb3_network``).
Goal: our median >= SB3's on each env. With ``--algo qrdqn`` the same for QR-DQN: sb3-contrib's
``QRDQN`` with the zoo's hyperparams/qrdqn.yml (dqn.yml's values for these envs, and
``n_quantiles``), beside ``DQN(..., rule=QRDQN(n_quantiles))`` with sb3-contrib's optimizer (Adam,
epsilon ``0.01 / batch_size``, no gradient clipping) and its quantile network. With ``--algo sac``
(on Pendulum-v1; ``--envs LunarLanderContinuous-v3`` with Box2D installed) SB3's ``SAC`` with the zoo's hyperparams/sac.yml beside ``DQN(...,
rule=SAC())`` with the same hyperparameters and SB3's networks (``sac_network``), a gradient step
after each env step as SB3 takes it, each final agent scored on the same start states
(``greedy_games``). The lib ``defaults`` is ours as a user meets it: the
README's model (256x256, Keras' initialization) and no hyperparameter given but the seed, so the
classic-control preset (config.PRESETS) and a 1M-step store, on the same budget.
docs/benchmarks.md, "DQN beside Stable-Baselines3", has the tables.

    python tools/reference_dqn.py --out tools/out/reference_dqn.jsonl [--envs CartPole-v1,Acrobot-v1,MountainCar-v0]
        [--seeds 1,2,3,4,5] [--libs replaystore,sb3[,defaults]] [--backend jax] [--jobs 2] [--scale 1.0]
        [--algo dqn|qrdqn|sac]

``--scale`` multiplies every budget (0.05 for a rehearsal). ``--backend`` is the Keras backend ours
runs on (JAX by default: the same learning as TensorFlow's, in about half the time here).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import seeds  # noqa: E402

#: rl-baselines3-zoo's hyperparams/dqn.yml (policy MlpPolicy, net_arch [256, 256] each)
ZOO: dict[str, dict[str, Any]] = {
    "CartPole-v1": {"n_timesteps": 50_000, "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000,
                    "learning_starts": 1000, "gamma": 0.99, "target_update_interval": 10, "train_freq": 256,
                    "gradient_steps": 128, "exploration_fraction": 0.16, "exploration_final_eps": 0.04},
    "Acrobot-v1": {"n_timesteps": 100_000, "learning_rate": 6.3e-4, "batch_size": 128, "buffer_size": 50_000,
                   "learning_starts": 0, "gamma": 0.99, "target_update_interval": 250, "train_freq": 4,
                   "gradient_steps": -1, "exploration_fraction": 0.12, "exploration_final_eps": 0.1},
    "MountainCar-v0": {"n_timesteps": 120_000, "learning_rate": 4e-3, "batch_size": 128, "buffer_size": 10_000,
                       "learning_starts": 1000, "gamma": 0.98, "target_update_interval": 600, "train_freq": 16,
                       "gradient_steps": 8, "exploration_fraction": 0.2, "exploration_final_eps": 0.07},
}

#: rl-baselines3-zoo's hyperparams/qrdqn.yml: dqn.yml's values for these envs, with these quantiles
QUANTILES = {"CartPole-v1": 10, "Acrobot-v1": 25, "MountainCar-v0": 25}

#: rl-baselines3-zoo's hyperparams/sac.yml (SB3's SAC defaults otherwise: batch 256, buffer 1M, learning
#: from step 100, tau 0.005, gamma 0.99, a gradient step per env step, ent_coef "auto", 256x256 networks)
#: LunarLanderContinuous-v3 needs Box2D (pip install box2d pygame); "lin_" is SB3's linear decay to 0
ZOO_SAC: dict[str, dict[str, Any]] = {
    "Pendulum-v1": {"n_timesteps": 20_000, "learning_rate": 1e-3},
    "LunarLanderContinuous-v3": {"n_timesteps": 500_000, "learning_rate": "lin_7.3e-4", "batch_size": 256,
                                 "buffer_size": 1_000_000, "gamma": 0.99, "tau": 0.01, "learning_starts": 10_000,
                                 "net_arch": [400, 300]},
}


def ours(zoo: dict[str, Any]) -> dict[str, Any]:
    """The zoo's hyperparameters in ``DQN``'s names, on SB3's schedule: learning in lockstep with
    acting (``replay_ratio=0``), a block of ``gradient_steps`` gradient steps (``steps_per_call``;
    -1 is ``train_freq``) every ``train_freq`` env steps, as SB3 takes them after each rollout; the
    same target period in gradient steps, exploration schedule, batch, buffer and learning rate
    (Adam, gradient norm clipped at 10, Huber loss: SB3's defaults and ours), 1-step returns. (Our default learner,
    on its own thread at the same replay ratio, interleaves its steps with acting instead: on
    CartPole with these settings it ended at 500 on 2 of 5 seeds, on SB3's schedule 3 of 5;
    docs/benchmarks.md.)

    SB3 copies the target between env steps and takes a rollout's gradient steps in one burst, so a
    ``target_update_interval`` shorter than ``train_freq`` (CartPole's 10 against 256) still means
    one copy per burst: its period is ``max(target_update_interval, train_freq)`` env steps. Ours
    counts the target period in gradient steps (``target_network_frequency // train_frequency``);
    taking the zoo's 10 literally would copy every 5 gradient steps, and CartPole diverged (9.4)."""
    per_call = zoo["train_freq"] if zoo["gradient_steps"] == -1 else zoo["gradient_steps"]
    return {"learning_rate": zoo["learning_rate"], "batch_size": zoo["batch_size"],
            "buffer_size": zoo["buffer_size"], "learning_starts": max(zoo["learning_starts"], zoo["batch_size"]),
            "gamma": zoo["gamma"], "target_network_frequency": max(zoo["target_update_interval"], zoo["train_freq"]),
            "train_frequency": max(1, round(zoo["train_freq"] / per_call)),
            "exploration_fraction": zoo["exploration_fraction"], "end_e": zoo["exploration_final_eps"],
            "replay_ratio": 0, "steps_per_call": per_call, "n_step": 1}


def sb3_network(n_inputs: int, n_actions: int, quantiles: int = 0) -> Any:
    """SB3's ``MlpPolicy`` Q-network for DQN as a Keras model: 256x256 ReLU, each layer initialized as
    PyTorch's ``nn.Linear`` is (weights and biases uniform in +-1/sqrt(fan_in)), taking the store's
    stacks of one frame. The same network, so that the two runs differ only in the DQN around it.
    (With ``mlp``'s Keras initialization, glorot-uniform weights and zero biases, CartPole collapsed
    on 3 of 5 seeds with these settings: docs/benchmarks.md.) With ``quantiles``, sb3-contrib's
    quantile network: ``quantiles`` outputs per action, ``(n_actions, quantiles)`` per stack."""
    import keras

    def dense(units: int, fan_in: int, activation: str | None = None) -> Any:
        bound = 1 / fan_in ** 0.5
        return keras.layers.Dense(units, activation=activation,
                                  kernel_initializer=keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform"),
                                  bias_initializer=keras.initializers.RandomUniform(-bound, bound))

    head = ([dense(n_actions * quantiles, 256), keras.layers.Reshape((n_actions, quantiles))] if quantiles
            else [dense(n_actions, 256)])
    return keras.Sequential([keras.Input((1, n_inputs)), keras.layers.Flatten(), dense(256, n_inputs, "relu"),
                             dense(256, 256, "relu"), *head])


def sac_network(n_inputs: int, size: int, *, torch_init: bool = True, net_arch: Sequence[int] = (256, 256)) -> Any:
    """SB3's SAC networks as ``sac_model``'s parts: an actor and two critics of ``net_arch`` ReLU
    layers, each initialized as PyTorch's ``nn.Linear`` is (``torch_init``; else Keras' own, ``sac_mlp``)."""
    import keras

    from replaystore.trainer import sac_mlp, sac_model

    if not torch_init:
        return sac_mlp((1, n_inputs), size, hidden_sizes=net_arch)

    def dense(units: int, fan_in: int, activation: str | None = None) -> Any:
        bound = 1 / fan_in ** 0.5
        return keras.layers.Dense(units, activation=activation,
                                  kernel_initializer=keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform"),
                                  bias_initializer=keras.initializers.RandomUniform(-bound, bound))

    def layers(fan_in: int) -> list[Any]:
        sizes = [fan_in, *net_arch]
        return [dense(units, fan, "relu") for fan, units in zip(sizes[:-1], sizes[1:], strict=True)]

    def critic(name: str) -> Any:
        stack, action = keras.Input((1, n_inputs), name="stack"), keras.Input((size,), name="action")
        x = keras.layers.Concatenate()([keras.layers.Flatten()(stack), action])
        for layer in layers(n_inputs + size):
            x = layer(x)
        return keras.Model([stack, action], dense(1, net_arch[-1])(x), name=name)

    actor = keras.Sequential([keras.Input((1, n_inputs)), keras.layers.Flatten(), *layers(n_inputs),
                              dense(2 * size, net_arch[-1]), keras.layers.Reshape((2, size))], name="actor")
    return sac_model(actor, critic("critic"), critic("critic_twin"))


def sac_child(run: dict[str, Any], steps: int) -> list[float]:
    """One SAC run (SB3's, or ours on SB3's schedule) and its final greedy returns."""
    import gymnasium as gym

    zoo = dict(ZOO_SAC[run["env"]])
    net_arch, rate = tuple(zoo.pop("net_arch", (256, 256))), zoo.pop("learning_rate")
    settings = {k: v for k, v in zoo.items() if k != "n_timesteps"}  # (the same names in SB3's SAC and ours)
    linear = isinstance(rate, str)
    rate = float(rate[4:]) if linear else rate
    if run["lib"] == "sb3":
        import torch
        import triton  # noqa: F401  (as in child)
        from stable_baselines3 import SAC as SB3SAC

        torch.set_num_threads(1)
        model = SB3SAC("MlpPolicy", gym.make(run["env"]), seed=run["seed"],
                       learning_rate=(lambda progress: rate * progress) if linear else rate,
                       policy_kwargs={"net_arch": list(net_arch)}, **settings)
        model.learn(steps)
        return greedy_games(lambda obs, first: model.predict(obs, deterministic=True)[0], run)
    import keras

    from replaystore.trainer import DQN, SAC

    keras.utils.set_random_seed(run["seed"])
    env = gym.make(run["env"])
    n_inputs, size = int(env.observation_space.shape[0]), int(env.action_space.shape[0])
    where = Path(tempfile.mkdtemp(prefix="reference-")) / "replay.zarr"
    buffer_size = settings.pop("buffer_size", 1_000_000)
    optimizer = None
    if linear:  # SB3's lin_: rate * (1 - t / steps) at env step t, gradient steps from learning_starts on
        starts = settings.get("learning_starts", 100)
        optimizer = keras.optimizers.Adam(keras.optimizers.schedules.PolynomialDecay(
            rate * (1 - starts / steps), decay_steps=max(1, steps - starts), end_learning_rate=0.0))
    if run["lib"] == "defaults":
        agent = DQN(sac_network(n_inputs, size, torch_init=False, net_arch=net_arch), where, rule=SAC(),
                    seed=run["seed"], learning_rate=rate, optimizer=optimizer, buffer_size=buffer_size, **settings)
    else:  # SB3's schedule: one gradient step after each env step, in lockstep
        agent = DQN(sac_network(n_inputs, size, net_arch=net_arch), where, rule=SAC(), seed=run["seed"],
                    learning_rate=rate, optimizer=optimizer, buffer_size=buffer_size, replay_ratio=0,
                    steps_per_call=1, **settings)
    agent.fit(env, steps)
    returns = greedy_games(lambda obs, first: agent.act(obs, restart=first), run)
    agent.close()
    return returns


def greedy_games(act: Any, run: dict[str, Any]) -> list[float]:
    """The returns of ``run["episodes"]`` greedy games, game ``i`` started from ``reset(seed=10_000 *
    run seed + i)``: the same start states for both libraries' agents of a seed (a Pendulum game's
    return depends on where the pendulum starts as much as on the agent).
    ``act(obs, first)``: the agent's greedy action, ``first`` at a game's first observation."""
    import gymnasium as gym

    env, returns = gym.make(run["env"]), []
    for game in range(run["episodes"]):
        obs, _ = env.reset(seed=10_000 * run["seed"] + game)
        total, first, done = 0.0, True, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs, first))
            total, first, done = total + float(reward), False, bool(terminated or truncated)
        returns.append(total)
    env.close()
    return returns


def readme_network(n_inputs: int, n_actions: int) -> Any:
    """The README's Q-network: 256x256 ReLU with Keras' initialization, on stacks of one frame."""
    import keras

    return keras.Sequential([keras.Input((1, n_inputs)), keras.layers.Flatten(),
                             keras.layers.Dense(256, activation="relu"), keras.layers.Dense(256, activation="relu"),
                             keras.layers.Dense(n_actions)])


def child(run: dict[str, Any]) -> None:
    import gymnasium as gym

    t0 = time.perf_counter()
    if run.get("algo") == "sac":
        steps = int(ZOO_SAC[run["env"]]["n_timesteps"] * run["scale"])
        returns = sac_child(run, steps)
        print(json.dumps({"score": float(sum(returns) / len(returns)), "steps": steps,
                          "fit_s": round(time.perf_counter() - t0, 1)}))
        return
    zoo, steps = ZOO[run["env"]], int(ZOO[run["env"]]["n_timesteps"] * run["scale"])
    quantiles = QUANTILES[run["env"]] if run.get("algo") == "qrdqn" else 0
    if run["lib"] == "sb3":
        import torch
        import triton  # noqa: F401  (torch's triton before SB3 loads TensorFlow: both bundle LLVM; tests/conftest.py)
        from sb3_contrib import QRDQN as SB3QRDQN
        from stable_baselines3 import DQN as SB3DQN
        from stable_baselines3.common.evaluation import evaluate_policy

        torch.set_num_threads(1)
        kwargs = {k: v for k, v in zoo.items() if k != "n_timesteps"}
        policy_kwargs: dict[str, Any] = {"net_arch": [256, 256], **({"n_quantiles": quantiles} if quantiles else {})}
        model = (SB3QRDQN if quantiles else SB3DQN)("MlpPolicy", gym.make(run["env"]), seed=run["seed"],
                                                    policy_kwargs=policy_kwargs, **kwargs)
        model.learn(steps)
        eval_env = gym.make(run["env"])
        eval_env.reset(seed=10_000 + run["seed"])
        returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=run["episodes"], deterministic=True,
                                     return_episode_rewards=True)
    else:
        import keras

        from replaystore.trainer import DQN

        keras.utils.set_random_seed(run["seed"])
        env = gym.make(run["env"])
        n_inputs, n_actions = int(env.observation_space.shape[0]), int(env.action_space.n)
        where = Path(tempfile.mkdtemp(prefix="reference-")) / "replay.zarr"
        if quantiles:  # sb3-contrib's QR-DQN optimizer: Adam with epsilon 0.01 / batch, no gradient clipping
            from replaystore.trainer import QRDQN  # (here: a checkout from before rules runs --algo dqn as well)

            settings = ours(zoo)
            optimizer = keras.optimizers.Adam(settings.pop("learning_rate"), epsilon=0.01 / zoo["batch_size"])
            agent = DQN(sb3_network(n_inputs, n_actions, quantiles), where, seed=run["seed"], rule=QRDQN(quantiles),
                        optimizer=optimizer, buffer_size=settings.pop("buffer_size"), **settings)
        elif run["lib"] == "defaults":
            agent = DQN(readme_network(n_inputs, n_actions), where, seed=run["seed"])
        else:
            settings = ours(zoo)
            agent = DQN(sb3_network(n_inputs, n_actions), where, seed=run["seed"],
                        buffer_size=settings.pop("buffer_size"), **settings)
        agent.fit(env, steps)
        returns = agent.evaluate(gym.make(run["env"]), episodes=run["episodes"], seed=10_000 + run["seed"])
        agent.close()
    print(json.dumps({"score": float(sum(returns) / len(returns)), "steps": steps,
                      "fit_s": round(time.perf_counter() - t0, 1)}))


def main() -> int:
    p = seeds.parser(__doc__.split("\n\n")[0])
    p.add_argument("--envs", default="", help="comma-separated env ids (default: the algorithm's zoo envs)")
    p.add_argument("--libs", default="replaystore,sb3")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--backend", default="jax", choices=["jax", "tensorflow", "torch"])
    p.add_argument("--algo", default="dqn", choices=["dqn", "qrdqn", "sac"])
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0
    envs = args.envs or ("Pendulum-v1" if args.algo == "sac" else ",".join(ZOO))  # (Box2D's env: by name)
    runs = [{"env": e, "lib": lib, "seed": int(s), "scale": args.scale, "episodes": args.episodes,
             **({"backend": args.backend} if lib != "sb3" else {}), **({"algo": args.algo} if args.algo != "dqn" else {})}
            for e in envs.split(",") for s in args.seeds.split(",") for lib in args.libs.split(",")]
    rows = seeds.run_all(Path(__file__), runs, args.out, args.jobs,
                         env=lambda run: {"TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1",
                                          "KERAS_BACKEND": run.get("backend", "tensorflow")})
    print(f"\nFinal greedy return ({args.algo}), mean of {args.episodes} games, budget x{args.scale}:\n")
    print(seeds.table(rows, ["env", "lib"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
