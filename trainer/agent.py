"""``DQN``: a Keras model, a replay store and the hyperparameters, fit on an environment.

    import keras
    from replaystore import ReplayStore
    from replaystore.trainer import DQN

    model = keras.Sequential([...])   # (batch, frame_stack, *frame_shape) stacks -> (batch, n_actions) Q-values
                                      # (a Dict env's: a dict of such stacks, one keras.Input per key)
    agent = DQN(model, "runs/x/replay.zarr", gamma=0.99, n_step=3, learning_starts=20_000,
                optimizer=keras.optimizers.Adam(1e-4))
    history = agent.fit(env, total_timesteps=1_000_000, eval_env=eval_env, eval_frequency=50_000,
                        callbacks=[keras.callbacks.CSVLogger("runs/x/log.csv")])
    agent.evaluate(eval_env, episodes=10)        # raw returns
    agent.act(obs_stack)                         # greedy action(s)
    agent.save("runs/x"); DQN.load("runs/x")     # resume: the store is the replay part

The store is created the first time ``fit`` sees the environment (a path or URL that holds no store
yet), or reopened for appending. The learner (learner.py) trains the model through Keras' stateless
API on whichever backend Keras runs on; the run's loop (run.py) acts into the store, feeds the
learner beside it and calls the Keras callbacks (callbacks.py). docs/trainer.md has the whole API.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np

from replaystore import ReplayStore

from . import persist
from .acting import acting_on, exploring
from .actions import ActionSpec
from .actorplan import check_actors, plan_for
from .actors import ActorSource
from .callbacks import Hooks, keeping_best, kept_best
from .config import PRESETS, TrainerError, check_count, check_run_arguments, config_from
from .envs import env_spaces
from .evaluation import Played, play
from .feeding import Learning
from .hindsight import check_goals, choose_reward, hindsight_sampler
from .learner import MAX_GRAD_NORM, Learner, make_learner
from .models import Loading, check_model, check_reloads_once
from .offline import learn_offline
from .rule import DoubleDQN, Rule
from .rules import check_rule
from .run import Run, Source
from .stacks import RecentFrames, StackSpec
from .state import RunState
from .stores import AgentStore, check_for_network, check_not_dataset, place


class DQN:
    """Deep Q-learning (Mnih et al. 2015, double-DQN targets, Huber loss) of ``model`` with ``store``
    as its replay memory. Hyperparameters keep cleanrl's names (``DQNConfig``; those not given take
    their preset's values, for image frames or not, when ``fit`` first sees the observations);
    ``optimizer`` defaults to Adam at ``learning_rate`` with a global gradient norm clipped at 10."""

    def __init__(self, model: keras.Model, store: ReplayStore | str | Path, *,
                 optimizer: keras.optimizers.Optimizer | None = None, buffer_size: int = 1_000_000,
                 frame_stack: int | None = None, cache_bytes: int = 256 * 2**20,
                 storage_options: dict[str, Any] | None = None, custom_objects: dict[str, Any] | None = None,
                 safe_mode: bool = True, rule: Rule | None = None, **hyperparameters: Any) -> None:
        """``store``: a ``ReplayStore`` open for appending, or the path or URL of one to open (or, on
        the first ``fit``, to create with ``buffer_size`` steps and ``frame_stack`` frames a stack: 4
        for image frames, 1 for vectors, when not given). ``custom_objects``, ``safe_mode``: how the
        saved model is read back (as ``DQN.load``), checked before ``fit`` or ``save`` writes it.
        ``rule``: the learning rule, ``QRDQN(n_quantiles)`` for quantile regression (the model then
        gives ``(n_actions, n_quantiles)`` per stack); double DQN when left out."""
        given_rule = check_rule(rule) if rule is not None else None
        self.config = config_from({**(given_rule.defaults() if given_rule is not None else {}), **hyperparameters})
        self.rule = given_rule if given_rule is not None else DoubleDQN(self.config.cql_alpha)
        self.rule.check_run(self.config)
        self.model = model
        given = optimizer or getattr(model, "optimizer", None)
        rate = self.config.learning_rate or PRESETS["vectors"]["learning_rate"]  # (set again once the frames are known)
        self.optimizer = given or keras.optimizers.Adam(learning_rate=rate,
                                                        global_clipnorm=MAX_GRAD_NORM if self.rule.clips else None)
        self.preset_rate = given is None and self.config.learning_rate is None
        if getattr(model, "optimizer", None) is not self.optimizer:
            model.optimizer = self.optimizer  # what compile() sets; callbacks read it (TensorBoard's learning rate)
        self.replay = AgentStore(store, buffer_size=buffer_size, frame_stack=frame_stack, cache_bytes=cache_bytes,
                                 storage_options=storage_options)
        self.learner: Learner | None = None
        self.stacks: StackSpec | None = None  # the Q-network's input (trainer/stacks.py)
        self.actions: ActionSpec | None = None  # what it acts in (trainer/actions.py)
        self.state = RunState(epsilon=self.config.start_e)
        self.rng = np.random.default_rng(self.config.seed)
        self.resumed = False  # loaded from a checkpoint: the next fit closes the store's unfinished episode
        self.loading = Loading(custom_objects, bool(safe_mode))
        self.reloads = False  # the model passed check_reloads
        self.best: tuple[list[np.ndarray], dict[str, Any]] | None = None  # the best evaluation's weights and info
        self.holds = "last"  # which weights the model holds: the run's last, or its best evaluation's (persist.py)
        self.frames = RecentFrames()  # the last frames of the envs act() is given raw observations of
        if self.store is not None:
            self.build(self.store.observation_space, self.store.action_space)

    # The store and the learner ------------------------------------------------------------------

    def build(self, observation_space: Any, action_space: Any) -> Learner:
        """Check the model against the stacks and actions, and make the learner (once): for the
        store's stacks when it is open, else for these spaces (an env's) and the agent's frame
        stack (``load_run`` of a run directory without its store)."""
        if self.learner is None:
            actions = self.replay.check_learnable(observation_space, action_space, self.rule)
            stack = self.store.frame_stack if self.store is not None else self.replay.default_stack(observation_space)
            self.build_for(StackSpec.of_space(observation_space, stack), actions)
        assert self.learner is not None
        return self.learner

    def build_for(self, stacks: StackSpec, actions: ActionSpec | int) -> None:
        """Make the learner for these stacks and actions (a saved agent's: ``agent.json``); the
        hyperparameters not given take their preset's values for these frames."""
        if not self.config.filled:
            self.config.fill(stacks.images)
            if self.preset_rate:
                self.optimizer.learning_rate = self.config.learning_rate
        if self.config.her_n_sampled_goal:
            check_goals(stacks)
        actions = ActionSpec.of(actions)
        check_model(self.model, stacks, actions, self.rule)
        self.learner = make_learner(self.model, self.optimizer, stacks=stacks, target_every=self.config.target_every(),
                                    tau=self.config.tau, rule=self.rule, actions=actions, seed=self.config.seed)
        self.stacks, self.actions = stacks, actions
        self.replay.stacks = stacks

    @property
    def store(self) -> ReplayStore | None:
        """The replay store while it is open (``fit`` opens it to append, ``fit_offline`` to read)."""
        return self.replay.store

    @property
    def location(self) -> str | Path:
        """Where the replay store is: a path or URL."""
        return self.replay.location

    def use_store(self, store: ReplayStore | str | Path, *, storage_options: dict[str, Any] | None = None) -> None:
        """Act and learn with ``store`` from now on (a ``ReplayStore``, or the path or URL of one to
        open, or to create on the next ``fit`` with the agent's frame stack); the agent's current
        store is flushed and closed. For fine-tuning online an agent that learned offline: its
        dataset stays as it was. A store of other stacks than the Q-network's is refused."""
        self.replay.switch(store)
        if storage_options is not None:
            self.replay.storage_options = dict(storage_options) or None

    # Acting -------------------------------------------------------------------------------------

    def act(self, obs: Any, *, restart: bool | np.ndarray = False) -> Any:
        """The greedy action for what an env returns, or for stacks as the store returns them:

        - one env's observation (``env.reset()``'s or ``env.step()``'s, a frame): the agent keeps
          the last ``frame_stack`` of them and acts on that stack, padded at an episode's start with
          its first frame as the store pads; an episode starts at the first call, after ``reset()``,
          and where ``restart`` is True (the observation after ``env.reset()``);
        - a vector env's observations ``(num_envs, *frame)``, with ``restart`` one bool per env
          (True where that observation begins an episode: with gymnasium's default autoreset, the
          previous step's ``terminated | truncated``); the first call starts every env;
        - one stack ``(frame_stack, *frame_shape)`` or a batch of them (a Dict store's: a dict).
        """
        learner, vector = self.built(), np.ndim(restart) > 0
        assert self.stacks is not None
        if vector or self.stacks.is_frame(obs):
            batch, single = self.frames.push(self.stacks, obs, restart), not vector
        else:
            batch, single = self.stacks.batch(obs)
        actions = learner.act_batch(batch)
        return learner.actions.one(actions) if single else actions

    def reset(self) -> None:  # (forget the frames act kept: the next observations begin new episodes)
        self.frames.reset()

    @property
    def train_steps(self) -> int:
        """Gradient steps taken (the optimizer's iteration counter)."""
        return self.built().train_steps

    def built(self) -> Learner:
        """The learner; TrainerError before it is made."""
        if self.learner is None:
            raise TrainerError("the model is not built yet: fit it first (or pass an open ReplayStore)")
        return self.learner

    # Fitting ------------------------------------------------------------------------------------

    def fit(self, env: Any, total_timesteps: int, *, eval_env: Any = None, eval_frequency: int = 0,
            eval_episodes: int = 10, eval_epsilon: float = 0.0, eval_seed: int | None = None,
            callbacks: Sequence[keras.callbacks.Callback] = (), checkpoint_dir: str | Path | None = None,
            checkpoint_frequency: int = 100_000, verbose: int = 0,
            compute_reward: Callable[..., Any] | None = None, source: Source | None = None,
            should_stop: Callable[[], bool] | None = None, checkpoint_writer: Callable[[], None] | None = None,
            restore_best_weights: bool = False, actors: int = 0) -> keras.callbacks.History:
        """Act on ``env`` (a gymnasium env, or a vector env whose envs write one stream each) until the
        run has taken ``total_timesteps`` env steps in all (a loaded agent goes on from its count;
        one that took them already returns at once), learning from the store as it goes; returns
        the callbacks' ``History``.

        Every ``eval_frequency`` env steps (and at the end) ``eval_env`` plays ``eval_episodes``
        games and an epoch ends (callbacks.py). With ``checkpoint_dir`` the agent is saved there
        every ``checkpoint_frequency`` env steps, at the end, on a callback's stop and on Ctrl-C, so
        ``DQN.load`` resumes it after a crash with every transition committed. ``compute_reward``
        relabels a goal env's batches (``her_n_sampled_goal``; by default the env's). With ``actors``
        N, N Ray processes act instead (a local Ray), each on its own copy of ``env``
        (``gymnasium.make(env.spec)``) into its own stream, with the model as ``save`` writes it, while
        this process learns (actors.py). ``source``, ``should_stop`` and ``checkpoint_writer`` are
        ``replaystore-train``'s.

        What the agent is left with: the last step's weights, as Keras leaves a model; with
        ``restore_best_weights`` (and ``eval_env``) its best evaluation's, as ``EarlyStopping(
        restore_best_weights=True)`` does (the checkpoint keeps the last, to go on from). Either way
        ``agent.best`` and ``checkpoint_dir``'s ``best.npz`` hold the best (``DQN.load(dir, best=True)``)."""
        check_count("total_timesteps", total_timesteps, least=1)
        check_run_arguments(eval_env, eval_frequency, eval_episodes, checkpoint_frequency, verbose)
        if checkpoint_dir is not None and checkpoint_writer is not None:
            raise TrainerError("pass checkpoint_dir or checkpoint_writer, not both")
        callbacks = keeping_best(callbacks, self, eval_env, checkpoint_dir, restore_best_weights)
        config, state = self.config, self.state
        check_actors(actors, env, source, config)
        spaces = env_spaces(env)
        streams = actors or (int(env.num_envs) if hasattr(env, "num_envs") else 1)
        check_not_dataset(self.location, state.datasets)
        opened = self.store is None
        if source is not None and self.store is None:
            raise TrainerError("fit(source=...) needs the agent's store open: pass a ReplayStore to DQN")
        try:
            if source is None:  # an existing store is checked against the env before the model is
                self.replay.for_append(*spaces, streams, create=False)
            learner = self.build(*spaces)
            if checkpoint_dir is not None or actors:  # (save writes the model, the actors load it: refused now)
                check_reloads_once(self)
            reward = choose_reward(config, compute_reward, env)
            if eval_env is not None:  # refused now, not at the first evaluation
                assert self.stacks is not None
                assert self.actions is not None
                check_for_network(*env_spaces(eval_env), self.stacks, self.actions)
            if state.global_step < total_timesteps and config.learning_starts >= total_timesteps:
                raise TrainerError(f"learning_starts is {config.learning_starts:,}, not below total_timesteps "
                                   f"{total_timesteps:,}: the run would take no gradient step; lower learning_starts")
        except BaseException:
            if opened:  # leave the store as it was found: closed
                self.replay.close()
            raise
        store = self.replay.for_append(*spaces, streams, create=True) if source is None else self.store
        if actors:  # the actors write the streams; this process learns from them, read-only
            self.replay.close()
            store = self.replay.for_reading()
        assert store is not None
        sampler = hindsight_sampler(config, store, reward)
        stop = should_stop or (lambda: False)
        write = checkpoint_writer or self._saver(checkpoint_dir)
        if state.global_step >= total_timesteps:  # nothing to do: the store and the weights stay as they are
            return Hooks(callbacks, learner, verbose=verbose, start_step=state.global_step, total=state.global_step,
                         every=0, evaluating=False).history
        if store.writing and (source is None or self.resumed):
            # The acting below resets the env (and a resumed run's env state is gone): an episode in
            # progress in the store cannot go on, so it ends as truncated.
            store.end_episode()
        self.resumed = False
        if place(self.location) not in state.written:
            state.written.append(place(self.location))
        learning = Learning(config, store, learner, state, sampler=sampler)
        hooks = Hooks(callbacks, learner, verbose=verbose, start_step=state.global_step, total=total_timesteps,
                      every=eval_frequency, evaluating=eval_env is not None, replay_ratio=learning.replay_ratio)
        owned = source is None
        if actors:
            source = ActorSource(plan_for(self, actors, 1, total_timesteps, env_spec=env.spec), store, learner,
                                 state.global_step, lambda line: print(line, file=sys.stderr, flush=True))
        elif source is None:
            source = acting_on(env, store, config, seed=config.seed + 7919 * state.resumes)
        evaluate = self._evaluator(eval_env, eval_episodes, eval_epsilon, eval_seed)
        run = Run(config, store, learning, state, hooks, act=exploring(learner, self.rng), rng=self.rng,
                  total_timesteps=total_timesteps, evaluate=evaluate, eval_frequency=eval_frequency,
                  checkpoint=write, checkpoint_frequency=checkpoint_frequency, should_stop=stop,
                  warmup=self.rule.warms_up)
        hooks.train_begin()

        def body() -> None:
            if config.ratio() > 0:
                learning.start_thread(state.global_step)
            run.loop(source)

        try:
            run.through(body)
        finally:
            if owned:
                source.close()
        hooks.train_end(state.global_step)
        kept_best(callbacks, self)
        return hooks.history

    def fit_offline(self, gradient_steps: int, *, eval_env: Any = None, eval_frequency: int = 0,
                    eval_episodes: int = 10, eval_epsilon: float = 0.0, eval_seed: int | None = None,
                    callbacks: Sequence[keras.callbacks.Callback] = (), checkpoint_dir: str | Path | None = None,
                    checkpoint_frequency: int = 10_000, verbose: int = 0,
                    compute_reward: Callable[..., Any] | None = None, should_stop: Callable[[], bool] | None = None,
                    checkpoint_writer: Callable[[], None] | None = None,
                    restore_best_weights: bool = False) -> keras.callbacks.History:
        """Learn from the store as it is, acting nowhere (offline RL), until the learner has taken
        ``gradient_steps`` gradient steps in all (a loaded agent goes on from its count; one that
        took them already returns at once); returns the callbacks' ``History``.

        The store (a path or URL is opened read-only; nothing in it changes) is sampled as ``fit``
        samples it. Set ``cql_alpha`` (1.0 is usual) for conservative Q-learning: plain DQN learning
        offline follows the overestimated values of actions the data never took. The arguments are
        ``fit``'s, counted in gradient steps: every ``eval_frequency`` of them ``eval_env`` (whose
        frames and actions must be the store's) plays ``eval_episodes`` games and an epoch ends;
        with ``checkpoint_dir`` the agent is saved every ``checkpoint_frequency`` of them, at the
        end, when a callback stops the run and on Ctrl-C (offline.py). With ``her_n_sampled_goal``
        the batches are relabelled with ``compute_reward``, by default ``eval_env``'s. ``should_stop`` and
        ``checkpoint_writer`` are for ``replaystore-train --offline`` (signals, its run directory).
        ``restore_best_weights`` and ``agent.best`` as in ``fit``."""
        check_count("gradient_steps", gradient_steps, least=1)
        check_run_arguments(eval_env, eval_frequency, eval_episodes, checkpoint_frequency, verbose)
        if checkpoint_dir is not None and checkpoint_writer is not None:
            raise TrainerError("pass checkpoint_dir or checkpoint_writer, not both")
        callbacks = keeping_best(callbacks, self, eval_env, checkpoint_dir, restore_best_weights)
        return learn_offline(self, gradient_steps, callbacks, eval_env=eval_env, eval_frequency=eval_frequency,
                             verbose=verbose, checkpoint_frequency=checkpoint_frequency, compute_reward=compute_reward,
                             should_stop=should_stop, check_reloads=checkpoint_dir is not None,
                             write=checkpoint_writer or self._saver(checkpoint_dir),
                             evaluate=self._evaluator(eval_env, eval_episodes, eval_epsilon, eval_seed))

    def _saver(self, directory: str | Path | None) -> Callable[[], object] | None:
        return None if directory is None else (lambda: self.save(directory))

    def _evaluator(self, env: Any, episodes: int, epsilon: float,
                   seed: int | None) -> Callable[[], Played] | None:
        if env is None:
            return None
        return lambda: self.play(env, episodes, epsilon=epsilon, seed=seed)  # (play picks the default seed)

    def evaluate(self, env: Any, episodes: int = 10, *, epsilon: float = 0.0, seed: int | None = None) -> list[float]:
        """The raw returns of ``episodes`` whole games (all lives) played greedily (with
        ``epsilon``-random moves) on ``env``, a gymnasium env or a vector env (whose envs play
        ``episodes`` games between them, in equal shares)."""
        return self.play(env, episodes, epsilon=epsilon, seed=seed).returns

    def play(self, env: Any, episodes: int = 10, *, epsilon: float = 0.0, seed: int | None = None,
             on_game: Callable[[float], None] | None = None) -> Played:
        """``evaluate``'s games, as ``Played``: each game's raw return, and for a goal env (one that
        reports ``info["is_success"]`` at a game's end) whether it reached its goal. ``on_game`` is
        called with each game's return as the game ends."""
        assert self.stacks is not None and self.actions is not None
        return play(env, self.built(), self.stacks, self.actions, episodes, epsilon=epsilon,
                    seed=self.config.seed + 100_000 if seed is None else seed,
                    life_loss=self.config.terminal_on_life_loss, on_game=on_game)

    # Saving -------------------------------------------------------------------------------------

    def checkpoint_arrays(self) -> tuple[dict[str, list[np.ndarray]], dict[str, Any]]:
        """What a checkpoint holds: the learner's arrays, and the run's counters (the store flushed
        first, so a checkpoint never runs ahead of the replay data it trained on)."""
        return persist.checkpoint_arrays(self)

    def save(self, path: str | Path) -> Path:
        """Save the agent in directory ``path``: ``model.keras`` (the model, loadable with
        ``keras.saving.load_model``), ``checkpoint.npz`` (online and target weights, the optimizer's
        state, the run's counters and generator), ``agent.json`` (the hyperparameters, the
        optimizer's configuration, where the store is, which weights the model holds) and, once an
        evaluation was played, ``best.npz`` (the weights of the best one). The store itself stays
        where it is, flushed: it is the replay half of the checkpoint. Each file is replaced
        atomically. A model that would not load back is refused first (``check_reloads``)."""
        return persist.save(self, Path(path))

    @classmethod
    def load(cls, path: str | Path, *, store: ReplayStore | str | Path | None = None,
             custom_objects: dict[str, Any] | None = None, safe_mode: bool = True, best: bool = False) -> DQN:
        """The agent ``save`` wrote in ``path``, with its store (or ``store``, which may be a path that
        holds no store yet: the next ``fit`` creates it) as its replay: ``fit`` reopens it to append
        and goes on from the saved step count, with every transition the store committed;
        ``fit_offline`` goes on from the saved gradient step count. ``custom_objects`` and
        ``safe_mode`` are ``keras.saving.load_model``'s: pass ``safe_mode=False`` only for files you
        wrote yourself (a ``Lambda`` of a Python lambda is code). With ``best`` the online weights
        are those of the best evaluation (``best.npz``); ``agent.holds`` says which weights it has."""
        return persist.load(cls, Path(path), store=store, loading=Loading(custom_objects, safe_mode), best=best)

    def restore(self, arrays: dict[str, list[np.ndarray]], state: dict[str, Any]) -> None:
        """Take a checkpoint's arrays and counters (``checkpoint_arrays``); the next ``fit`` goes on."""
        persist.restore(self, arrays, state)

    def __repr__(self) -> str:
        best = self.best[1] if self.best is not None else None
        kept = (f"; best evaluation {best['mean_return']:.1f} at step {best['step']:,}" if best is not None else "")
        rule = "" if isinstance(self.rule, DoubleDQN) else f" by {self.rule!r}"
        return (f"<DQN{rule} on {self.location}: the {self.holds} weights, step {self.state.global_step:,}, "
                f"{self.state.train_steps:,} gradient steps{kept}>")

    def close(self) -> None:
        """Close the store (flushing what was added); the next ``fit`` or ``fit_offline`` opens it again."""
        self.replay.close()
