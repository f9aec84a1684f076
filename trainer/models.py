"""Q-networks: the ready-made ones (the Nature DQN CNN for image stacks, an MLP for vectors, one for
the dicts of a Dict store) and the checks any model handed to ``DQN`` passes before anything runs.

A Q-network takes the stack exactly as the store returns it: ``(batch, frame_stack, *frame_shape)``
in the store's dtype (uint8 for Atari frames, float32 for CartPole's vectors), frames oldest first,
and returns one Q-value per action, ``(batch, n_actions)``. Scaling, a channels-last layout and
casts belong inside the model (``Rescaling``, ``Permute``): the model is then the whole function from
what is stored to Q-values, and it saves and loads as one ``.keras`` file. A Dict store's stacks
come as a dict, one such array per key (trainer/stacks.py), which a functional model takes through
one ``keras.Input`` named after each key.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import keras
import numpy as np
from keras import layers

from replaystore.format import nesting

from .actions import ActionSpec
from .config import TrainerError
from .rule import DoubleDQN, Rule
from .stacks import StackSpec


class ModelError(TrainerError, ValueError):
    """A model ``DQN`` cannot train (its output, its inputs, or state the loss does not update)."""


@keras.saving.register_keras_serializable(package="replaystore")
class Dueling(layers.Layer):
    """A dueling Q head (Wang et al. 2016): from features, a state value ``V`` and an advantage per
    action ``A``, combined as ``Q = V + A - mean(A)``. Saved and loaded with the model (registered
    as ``replaystore>Dueling``)."""

    def __init__(self, n_actions: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.n_actions = int(n_actions)
        self.value = layers.Dense(1, name="value")
        self.advantage = layers.Dense(self.n_actions, name="advantage")

    def build(self, input_shape: Any) -> None:
        self.value.build(input_shape)
        self.advantage.build(input_shape)

    def call(self, features: Any) -> Any:
        advantage = self.advantage(features)
        return self.value(features) + advantage - keras.ops.mean(advantage, axis=1, keepdims=True)

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (input_shape[0], self.n_actions)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "n_actions": self.n_actions}


def _head(x: Any, n_actions: int, dueling: bool) -> Any:
    try:  # (gymnasium's Discrete.n is a numpy int, which Keras' layers refuse)
        n = operator.index(n_actions)
    except TypeError:
        n = 0
    if n < 1:
        raise ModelError(f"n_actions is {n_actions!r}; it must be a whole number >= 1 (env.action_space.n)")
    return Dueling(n, name="q_values")(x) if dueling else layers.Dense(n, name="q_values")(x)


def nature_cnn(stack_shape: Sequence[int], n_actions: int, *, dtype: Any = "uint8", dueling: bool = False,
               name: str = "nature_cnn") -> keras.Model:
    """The Nature DQN network (Mnih et al. 2015) for stacks of 2-D frames ``(frame_stack, height, width)``:
    scaled by 1/255, the stack made the channels, three convolutions and a 512-unit layer; with
    ``dueling`` a ``Dueling`` head."""
    inputs = keras.Input(shape=tuple(stack_shape), dtype=np.dtype(dtype).name, name="stack")
    x = layers.Rescaling(1.0 / 255.0)(inputs)
    x = layers.Permute((2, 3, 1))(x)  # channels-last: the stack becomes the channels
    x = layers.Conv2D(32, 8, strides=4, activation="relu")(x)
    x = layers.Conv2D(64, 4, strides=2, activation="relu")(x)
    x = layers.Conv2D(64, 3, strides=1, activation="relu")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(512, activation="relu")(x)
    return keras.Model(inputs, _head(x, n_actions, dueling), name=name)


def mlp(stack_shape: Sequence[int], n_actions: int, *, hidden_sizes: Sequence[int] = (120, 84), dtype: Any = "float32",
        dueling: bool = False, name: str = "mlp") -> keras.Model:
    """A multilayer perceptron of ``hidden_sizes`` ReLU layers over the flattened stack (cleanrl's
    CartPole network is 120, 84); with ``dueling`` a ``Dueling`` head."""
    inputs = keras.Input(shape=tuple(stack_shape), dtype=np.dtype(dtype).name, name="stack")
    x = layers.Flatten()(layers.Rescaling(1.0)(inputs))  # Rescaling casts to float32
    for width in hidden_sizes:
        x = layers.Dense(int(width), activation="relu")(x)
    return keras.Model(inputs, _head(x, n_actions, dueling), name=name)


def embedded_mlp(frame_stack: int, states: int, n_actions: int, *, hidden_sizes: Sequence[int] = (120, 84),
                 width: int = 16, dueling: bool = False, name: str = "embedded_mlp") -> keras.Model:
    """For stacks of ``Discrete(states)`` observations (FrozenLake, Taxi, CliffWalking: one int a
    state): each state embedded in ``width`` learned values (a one-hot, learned), then ``mlp``'s layers."""
    inputs = keras.Input(shape=(frame_stack,), dtype="int64", name="stack")
    x = layers.Flatten()(layers.Embedding(states, width)(inputs))
    for units in hidden_sizes:
        x = layers.Dense(int(units), activation="relu")(x)
    return keras.Model(inputs, _head(x, n_actions, dueling), name=name)


def dict_mlp(observation_space: Any, n_actions: int, *, frame_stack: int = 1, hidden_sizes: Sequence[int] = (256, 256),
             width: int = 16, dueling: bool = False, name: str = "dict_mlp") -> keras.Model:
    """For a Dict store's stacks (a goal env's ``observation``, ``achieved_goal``, ``desired_goal``):
    one ``keras.Input`` per key of the gymnasium ``Dict`` ``observation_space``, named after it (a
    nested Dict's or a Tuple's: one per leaf, in the space's structure, named by its path with ``_``
    for ``/``); a ``Discrete`` entry of states ``0..n-1`` embedded in ``width`` learned values, every
    other entry taken as float32 numbers; all of them flattened side by side, then ``hidden_sizes``
    ReLU layers and one Q-value per action."""
    stacks = StackSpec.of_space(observation_space, frame_stack)
    if not stacks.keyed:
        raise TrainerError(f"dict_mlp is for a Dict or Tuple observation space, not {observation_space}; use mlp, "
                           "embedded_mlp or nature_cnn")
    leaf_spaces = dict(nesting.leaves_of(observation_space)[0])
    inputs, parts, names = {}, [], set[str]()
    for key, shape, dtype in stacks.entries:
        label = key.replace(nesting.SEPARATOR, "_")
        label = label if label not in names else f"{label}_{len(names)}"
        names.add(label)
        inputs[key] = keras.Input(shape=(stacks.frame_stack, *shape), dtype=dtype.name, name=label)
        space = leaf_spaces[key]
        if hasattr(space, "n") and tuple(space.shape) == () and int(getattr(space, "start", 0)) == 0:
            x = layers.Embedding(int(space.n), int(width), name=f"{label}_embedding")(inputs[key])
        else:
            x = layers.Rescaling(1.0, name=f"{label}_as_float")(inputs[key])  # (a cast to float32)
        parts.append(layers.Flatten(name=f"{label}_flat")(x))
    x = layers.Concatenate(name="features")(parts) if len(parts) > 1 else parts[0]
    for units in hidden_sizes:
        x = layers.Dense(int(units), activation="relu")(x)
    return keras.Model(stacks.structured(inputs), _head(x, n_actions, dueling), name=name)


def q_network(stack_shape: Sequence[int], dtype: Any, n_actions: int, *, hidden_sizes: Sequence[int],
              dueling: bool = False, name: str = "online") -> keras.Model:
    """What ``replaystore-train`` builds: ``nature_cnn`` for stacks of 2-D frames, else ``mlp``."""
    if len(stack_shape) == 3:
        return nature_cnn(stack_shape, n_actions, dtype=dtype, dueling=dueling, name=name)
    return mlp(stack_shape, n_actions, hidden_sizes=hidden_sizes, dtype=dtype, dueling=dueling, name=name)


def q_network_for(space: Any, frame_stack: int, n_actions: int, *, hidden_sizes: Sequence[int],
                  dueling: bool = False, name: str = "online", builder: Callable[..., Any] | None = None) -> keras.Model:
    """What ``replaystore-train`` builds for an observation space: ``builder(space, n_actions,
    frame_stack)`` when given (the user's own), else ``dict_mlp`` for a ``Dict`` (a goal env's) or a
    ``Tuple`` (Blackjack's), ``embedded_mlp`` for a ``Discrete`` of states ``0..n-1``, else
    ``q_network`` of its stacks (a MultiBinary's or MultiDiscrete's ints go through ``mlp`` as numbers);
    with ``dueling`` the default ones end in a ``Dueling`` head."""
    if builder is not None:
        try:
            model = builder(space, n_actions, frame_stack)
        except Exception as exc:  # noqa: BLE001 - the user's function, whatever it raised, in one line
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise ModelError(f"{getattr(builder, '__name__', builder)}(observation_space, n_actions, frame_stack) "
                             f"raised {type(exc).__name__}: {first[:200]}; --model names a function that builds "
                             "and returns the Q-network") from None
        if not isinstance(model, keras.Model):
            raise ModelError(f"{getattr(builder, '__name__', builder)}(observation_space, n_actions, frame_stack) "
                             f"returned a {type(model).__name__}, not a keras.Model; return the Q-network")
        return model
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        return dict_mlp(space, n_actions, frame_stack=frame_stack, hidden_sizes=hidden_sizes, dueling=dueling, name=name)
    if hasattr(space, "n") and tuple(space.shape) == () and int(getattr(space, "start", 0)) == 0:
        return embedded_mlp(frame_stack, int(space.n), n_actions, hidden_sizes=hidden_sizes, dueling=dueling, name=name)
    return q_network((frame_stack, *space.shape), space.dtype, n_actions, hidden_sizes=hidden_sizes, dueling=dueling,
                     name=name)


def check_savable(model: Any) -> None:
    """Refuse, before anything runs, a model that ``model.save`` cannot write (a subclassed model
    whose ``__init__`` takes arguments and that has no ``get_config``): checkpoints write it."""
    try:
        model.get_config()
    except NotImplementedError:
        name = type(model).__name__
        raise ModelError(f"the model ({name}) cannot be saved: Keras needs {name}.get_config() to write it "
                         f"(its __init__ takes arguments); give {name} a get_config() returning them and register "
                         "it with @keras.saving.register_keras_serializable(), or fit without checkpoint_dir") from None


@dataclasses.dataclass(frozen=True)
class Loading:
    """How a saved model is read back (``keras.saving.load_model``'s ``custom_objects`` and
    ``safe_mode``): the user's own choice, given in their call, never read from a saved file."""

    custom_objects: dict[str, Any] | None = None
    safe_mode: bool = True

    def load(self, path: Any) -> keras.Model:
        """The model in the ``.keras`` file ``path``."""
        return keras.saving.load_model(path, custom_objects=self.custom_objects, compile=False,
                                       safe_mode=self.safe_mode)


def check_reloads(model: Any, stacks: StackSpec, loading: Loading, rule: Rule | None = None,
                  actions: ActionSpec | None = None) -> None:
    """Refuse, before anything runs, a model that saves but does not load back as the same function
    (a ``Lambda`` of a Python lambda in safe mode, or without an ``output_shape``; a custom layer
    neither registered nor in ``custom_objects``): ``DQN.load`` of a checkpoint would fail after a
    crash. The model is saved to a temporary file, loaded as ``loading`` says, and both are called
    on the same random stacks."""
    check_savable(model)
    with tempfile.TemporaryDirectory(prefix="replaystore-reload-") as tmp:
        path = Path(tmp) / "model.keras"
        try:
            model.save(path)
            again = loading.load(path)
            probe = stacks.random(2, np.random.default_rng(0))
            if rule is not None and actions is not None:
                probe = rule.inputs(probe, actions)
            before, after = (keras.tree.flatten(m(probe)) for m in (model, again))  # (predict would donate JAX state)
            same = all(np.allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), rtol=1e-5, atol=1e-5)
                       for a, b in zip(before, after, strict=True))
        except Exception as exc:  # noqa: BLE001 - whatever Keras raised, said in one line with the fix
            raise ModelError(f"the model saves but does not load back ({type(exc).__name__}: {_first_line(exc)}); "
                             f"{_reload_fix(exc, loading)}") from None
    if not same:
        raise ModelError("the model saves but loads back as a different function (its outputs differ on the same "
                         "stacks); build every layer from its config (get_config returning each __init__ argument)")


def check_reloads_once(agent: Any) -> None:
    """``check_reloads`` of the agent's model, once per agent (a loaded model passed it)."""
    if not agent.reloads:
        assert agent.stacks is not None
        agent.built().sync_model()  # (the model's variables take the learner's weights: on JAX they were donated)
        check_reloads(agent.model, agent.stacks, agent.loading, agent.rule, agent.actions)
        agent.reloads = True


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = next((line for line in lines if not line.startswith("Exception encountered")), lines[0] if lines else "")
    return re.sub(r"\x1b\[[0-9;]*m", "", text)[:240]


def _reload_fix(exc: BaseException, loading: Loading) -> str:
    """What to do about a model that does not load back."""
    text = str(exc)
    if "Lambda" in text and "safe_mode" in text:
        return ("a Lambda of a Python lambda is code that Keras' safe mode will not load: give the Lambda a named "
                "function registered with @keras.saving.register_keras_serializable() and an output_shape (or use "
                "replaystore.trainer.Dueling for a dueling head); for your own trusted files only, pass "
                "safe_mode=False to DQN and DQN.load")
    if "output_shape" in text or "infer the shape" in text:
        return "give the Lambda layer an output_shape (Lambda(fn, output_shape=(n_actions,)))"
    if isinstance(exc, NameError) or "is not defined" in text:
        return ("a Lambda's function loses the names it uses when loaded from bytecode: give it a named function "
                "registered with @keras.saving.register_keras_serializable()")
    return ("register each custom layer and function with @keras.saving.register_keras_serializable() (with a "
            "get_config returning its __init__ arguments), or pass them as custom_objects={name: object} to DQN "
            "and DQN.load")


def check_model(model: Any, stacks: StackSpec, actions: ActionSpec | int, rule: Rule | None = None) -> None:
    """Refuse, with one line saying why and what to do, a model ``DQN`` cannot train on these stacks
    (``(batch, frame_stack, *frame_shape)`` arrays, or a dict of them) and actions: not a Keras model, one that cannot take the
    stacks, one whose output is not what the learning ``rule`` reads (double DQN's: one Q-value per
    action), one with nothing to train, or one with state that training updates outside its
    trainable weights (the loss would leave it stale)."""
    rule = rule if rule is not None else DoubleDQN()
    actions = ActionSpec.of(actions)
    if not isinstance(model, keras.Model):
        ready = (f"{actions.n} Q-values (replaystore.trainer.nature_cnn, mlp and dict_mlp are ready-made)"
                 if actions.discrete else "a policy and two critics (replaystore.trainer.sac_mlp and sac_model make one)")
        raise ModelError(f"the model is a {type(model).__name__}, not a keras.Model; build one that maps "
                         f"stacks of {stacks.describe()} to {ready}")
    probe = rule.inputs(stacks.zeros(2), actions)
    try:
        out = model(probe)  # builds a subclassed model
    except Exception as exc:  # noqa: BLE001 - whatever the model raised, said in one line
        if not actions.discrete:
            raise ModelError(f"the model cannot take {rule.name.upper()}'s inputs for stacks of {stacks.describe()} "
                             f"and {actions.describe()} ({type(exc).__name__}: {_first_line(exc)[:200]}); "
                             f"{rule.output_help(actions)}") from exc
        if stacks.keyed:
            given = f"batches of {stacks.describe()}"
            what = ("a dict of stacks (one keras.Input named after each key)" if stacks.tree is None else
                    "that structure of stacks (a keras.Input at each leaf)")
        else:
            given = f"shaped (batch, {', '.join(map(str, stacks.shape))}) of {stacks.dtype.name}"
            what = "that stack (frames oldest first; scale and transpose inside the model)"
        raise ModelError(f"the model cannot take the store's stacks, {given} ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200]}); its input must be {what}") from exc
    wanted = rule.output_shape(actions)
    shapes = [tuple(int(d) for d in keras.ops.shape(part))[1:] for part in keras.tree.flatten(out)]
    if shapes != (wanted if isinstance(wanted, list) else [wanted]):
        shown = shapes[0] if len(shapes) == 1 else shapes
        raise ModelError(f"the model outputs shape {shown} per stack, but the environment has {actions.describe()}: "
                         f"{rule.output_help(actions)}")
    if not model.trainable_variables:
        raise ModelError("the model has no trainable weights; DQN learns its Q-values by gradient steps")
    frozen = [v.value for v in model.non_trainable_variables]
    if frozen:
        params = [v.value for v in model.trainable_variables]
        _, after = model.stateless_call(params, frozen, probe, training=True)
        changed = [v.path for v, a, b in zip(model.non_trainable_variables, frozen, after, strict=True)
                   if not np.array_equal(np.asarray(a), np.asarray(b))]
        if changed:
            raise ModelError(f"the model updates non-trainable state while training ({', '.join(changed[:3])}: "
                             "BatchNormalization's moving statistics, Dropout's seed, ...), which DQN's loss does "
                             "not carry; remove those layers (LayerNormalization needs no such state)")
