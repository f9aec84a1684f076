"""A run directory's store: created with the run, or reopened in place to resume
(``replaystore-train``); and ``load_run``, the run's agent in Python."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from replaystore import ReplayStore, StoreNotFoundError
from replaystore.storage.outside import check_not_in_store

from . import args as arguments
from . import checkpoint
from .args import Args
from .config import TrainerError
from .envs import env_spaces, make_env
from .stores import open_streams, same_frames

STORE = "replay.zarr"


def open_writing(args: Args, *, streams: Any, cache_bytes: int) -> ReplayStore:
    """Open the run's store (``streams`` of it) for writing, waiting out a dead writer's lease on a
    store at a URL (``--lease-ttl``)."""
    return open_streams(arguments.store_path(args), streams=streams, cache_bytes=cache_bytes,
                        lease_wait=lease_wait(args), options=arguments.store_options(args))


def lease_wait(args: Args) -> float:
    """How long to wait for a dead writer's streams: its lease (``--lease-ttl``) and a margin, at a URL."""
    return args.lease_ttl + 15 if args.store else 0.0


def open_store(args: Args, env: Any, *, resuming: bool) -> ReplayStore:
    """Create the run directory and its store, or reopen them in place to resume."""
    run_dir = Path(args.run_dir)
    path = arguments.store_path(args)
    cache_bytes = args.cache_mb * 2**20
    if resuming:
        if isinstance(path, Path) and not path.exists():
            raise TrainerError(f"cannot resume: {run_dir} has no {STORE}; it holds no run")
        store = open_writing(args, streams=None, cache_bytes=cache_bytes)
        if (not same_frames(store.observation_space, env.observation_space) or store.frame_stack != args.frame_stack
                or store.action_space != env.action_space):
            store.close()
            raise TrainerError(f"{path} stores {store.observation_space} x{store.frame_stack} with "
                               f"{store.action_space}, which does not match {args.env_id}; it was not written by this run")
        return store
    with new_run_dir(args):
        return ReplayStore.create(path, args.buffer_size, env.observation_space, env.action_space, args.frame_stack,
                                  cache_bytes=cache_bytes, num_streams=arguments.num_streams(args),
                                  extras=arguments.extras(args), **arguments.store_options(args))


@contextlib.contextmanager
def new_run_dir(args: Args) -> Iterator[Path]:
    """Make a new run's directory (refused when it holds files: that is another run, to --resume), and
    write ``args.json`` into it when the block ends without an error; a directory made here is
    removed again when the block fails."""
    run_dir = Path(args.run_dir)
    check_not_in_store(run_dir, what="the run directory")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise TrainerError(f"{run_dir} already holds files; continue that run with --resume {run_dir}, "
                           "or pick a new --run-dir")
    made = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        yield run_dir
    except BaseException:
        if made:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    arguments.save(args, run_dir)


def load_run(run_dir: str | Path, *, store: ReplayStore | str | Path | None = None, best: bool = False,
             model: str | Callable[..., Any] | None = None, env_id: str | None = None) -> Any:
    """The agent of a ``replaystore-train`` run directory (online or ``--offline``) as a ``DQN``, as
    ``DQN.load`` gives a saved one: the run's Q-network (its flags' default model, or the one
    ``model`` builds) with the
    checkpoint's weights, optimizer state and counters, its store (or ``store``) opened to read.
    ``evaluate``, ``act`` and ``model.save`` work at once; ``fit`` goes on into the run's own store
    (or ``store``), as ``--resume`` would with the run's hyperparameters. With ``best`` the online
    weights are those of the run's highest evaluation (``best.npz``; ``checkpoint.load_best(run_dir)``
    gives that evaluation too: step, mean return, returns); TrainerError when the run has none.

    A run directory copied without its store (an online run's, to play its weights elsewhere) loads
    too: the network is made for its env's frames, and the next ``fit`` makes a new store in it.
    With ``best`` it needs only ``args.json`` and ``best.npz``: without ``checkpoint.npz`` the agent
    has no optimizer state and its counters start at 0.

    A run directory is data: nothing read from it is imported. A run of ``--model mymodels:build``
    needs ``model`` from the caller (``"mymodels:build"``, the same, or the function itself), and
    one of an ``--env-id mypkg:Env-v0`` (a module gymnasium imports) needs ``env_id`` (the same, or
    another to play on) where the env is made (a run without its store)."""
    import dataclasses

    import keras

    from .agent import DQN
    from .learnerbase import MAX_GRAD_NORM

    where = Path(run_dir)
    try:
        args = arguments.load(where)
        args.run_dir = str(where)  # (its store is the one beside it: a run directory moved or copied keeps its own)
        saved = checkpoint.load(where)
    except TrainerError as exc:
        raise TrainerError(f"cannot load the run: {str(exc).removeprefix('cannot resume: ')}") from None
    builder = model if callable(model) else None
    given = {key: value for key, value in (("model", args.model if builder else model), ("env_id", env_id))
             if value is not None}
    arguments.check_code_given(args, given, where, how="load_run(..., {name}={value!r})", same_env=False)
    if env_id is not None:
        args.env_id = env_id
    kept = checkpoint.load_best(where) if best else None
    if best and kept is None:
        raise TrainerError(f"{where} holds no {checkpoint.BEST}: the run keeps the weights of its best evaluation "
                           "only when it evaluates (--eval-episodes), and it has not evaluated yet; leave out the best "
                           "weights to take the last checkpoint's")
    if saved is None and kept is None:
        hint = (f"; its best weights ({checkpoint.BEST}) load with best=True (--evaluate --best)"
                if (where / checkpoint.BEST).is_file() else "")
        raise TrainerError(f"cannot load the run: {where} holds no {checkpoint.CHECKPOINT}; the run stopped before "
                           f"its first checkpoint{hint}")
    location = store if store is not None else (args.offline or arguments.store_path(args))
    options = arguments.store_options(args) if store is None and not args.offline else {}
    with contextlib.ExitStack() as stack:
        try:
            data = location if isinstance(location, ReplayStore) else \
                stack.enter_context(ReplayStore.open(location, mode="r", **options))
            space, action_space, frames = data.observation_space, data.action_space, data.frame_stack
        except StoreNotFoundError:
            space, action_space, frames = _env_spaces(args, location)
        network = arguments.q_network(args, space, frames, int(action_space.n), builder=builder)
    arguments.fill_presets(args, space)  # (a run's args.json holds them; one written before they did, not)
    optimizer = keras.optimizers.Adam(learning_rate=args.learning_rate, global_clipnorm=MAX_GRAD_NORM)
    agent = DQN(network, location, optimizer=optimizer, buffer_size=args.buffer_size, frame_stack=args.frame_stack or None,
                **options, **dataclasses.asdict(arguments.config(args)))
    try:
        if agent.learner is None:  # (for the store's stacks; without a store, the env's frames and the run's frame stack)
            agent.replay.for_reading(missing_ok=True)  # (fit reopens it to append; fit_offline only reads)
            agent.build(space, action_space)
        if saved is not None:
            agent.restore(*saved)
        if kept is not None:
            try:
                agent.model.set_weights(kept[0])
            except ValueError as exc:
                raise TrainerError(f"{where / checkpoint.BEST} does not fit the run's Q-network ({exc}); "
                                   "delete it") from None
            learner = agent.learner
            assert learner is not None
            learner.pull_model()
    except BaseException:
        agent.close()  # (the store it opened)
        raise
    return agent


def _env_spaces(args: Args, location: Any) -> tuple[Any, Any, int]:
    """The frame space, action space and frame stack of a run whose store is not there (a run
    directory copied without it, to play its weights elsewhere): those of its env, with the
    recorded frame stack; TrainerError where the store is needed to know them."""
    if args.offline or not args.env_id or not args.frame_stack:
        raise TrainerError(f"cannot load the run: its store {location} is not there, and the run's network is "
                           "made for that store's stacks; put the store back (copy a run directory whole)")
    env = make_env(args.env_id, arguments.env_kwargs(args))
    try:
        space, action_space = env_spaces(env)
    finally:
        env.close()
    return space, action_space, args.frame_stack
