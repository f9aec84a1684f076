"""replaystore.trainer: a DQN agent for any Keras model, with a replaystore as its replay memory.

    from replaystore.trainer import DQN, nature_cnn, mlp

``DQN`` (agent.py) fits a Keras model on a gymnasium env (or a vector env) with Keras callbacks, by
double DQN or, with ``rule=QRDQN(...)`` (qrdqn.py), quantile regression, or on ``Box`` actions with
``rule=SAC()`` (sac.py: soft actor-critic, its model made by ``sac_model`` or ``sac_mlp``);
``nature_cnn``, ``mlp``, ``embedded_mlp`` and ``dict_mlp`` (models.py) are ready-made Q-networks;
``make_vector_env`` (envs.py) the command line's vector envs (``halves=True``: a ``HalvedVectorEnv``,
which ``fit`` steps a half at a time); ``replaystore-train`` (cli.py) is
the command line over the same agent, and ``load_run`` (rundir.py) a run directory's agent in Python. docs/trainer.md has the whole API.

Installed from the repository's ``trainer/`` folder as ``replaystore.trainer`` (pyproject.toml maps
it), with ``pip install replaystore[train]``. Names are imported on first use, so that the command
line can parse its flags before Keras (and TensorFlow) load; the first of them loads Keras without
TensorFlow's start-up lines on stderr (``process.import_keras``; a ``TF_CPP_MIN_LOG_LEVEL`` the
user set shows them).
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agent import DQN
    from .config import DQNConfig, TrainerError
    from .envs import HalvedVectorEnv, make_vector_env
    from .models import Dueling, ModelError, check_model, dict_mlp, embedded_mlp, mlp, nature_cnn
    from .qrdqn import QRDQN
    from .rundir import load_run
    from .sac import SAC, EntropyWeight, sac_actor, sac_critic, sac_mlp, sac_model
    from .stacks import StackSpec

__all__ = ["DQN", "DQNConfig", "Dueling", "EntropyWeight", "HalvedVectorEnv", "ModelError", "QRDQN", "SAC", "StackSpec",
           "TrainerError", "check_model", "dict_mlp", "embedded_mlp", "load_run", "make_vector_env", "mlp", "nature_cnn",
           "sac_actor", "sac_critic", "sac_mlp", "sac_model"]

_WHERE = {"DQN": "agent", "DQNConfig": "config", "TrainerError": "config", "ModelError": "models", "Dueling": "models",
          "check_model": "models", "mlp": "models", "nature_cnn": "models", "embedded_mlp": "models",
          "dict_mlp": "models", "load_run": "rundir", "StackSpec": "stacks", "HalvedVectorEnv": "envs",
          "make_vector_env": "envs", "QRDQN": "qrdqn", "SAC": "sac", "EntropyWeight": "sac", "sac_actor": "sac",
          "sac_critic": "sac", "sac_mlp": "sac", "sac_model": "sac"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        if "keras" not in sys.modules:  # TensorFlow's start-up lines held back, as replaystore-train does
            from .process import import_keras

            import_keras()
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
