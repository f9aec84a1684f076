"""The learning rules an agent can be saved with, by the name ``agent.json`` records (rule.py has
the interface). A saved rule is made again from this table and its keywords, each checked by the
rule's own ``__init__``: nothing read from a run directory names code to import."""

from __future__ import annotations

from typing import Any

from .config import TrainerError
from .qrdqn import QRDQN
from .rule import DoubleDQN, Rule
from .sac import SAC

RULES: dict[str, type[Rule]] = {rule.name: rule for rule in (DoubleDQN, QRDQN, SAC)}


def check_rule(rule: Any) -> Rule:
    """``rule`` if it is one of ``RULES``' (an agent saves only those), else TrainerError."""
    if not isinstance(rule, Rule) or RULES.get(rule.name) is not type(rule):
        raise TrainerError(f"rule is {rule!r}; pass one of replaystore.trainer's learning rules "
                           f"({', '.join(cls.__name__ + '()' for cls in RULES.values())}), or leave it out for DQN")
    return rule


def rule_to_json(rule: Rule) -> dict[str, Any]:
    return {"name": rule.name, "config": rule.get_config()}


def rule_from_json(doc: Any, where: str) -> Rule | None:
    """The rule ``rule_to_json`` wrote (None: an agent saved before rules were recorded, DQN's)."""
    if doc is None:
        return None
    try:
        cls = RULES[doc["name"]]
        config = doc["config"]
        if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
            raise TypeError("its config is not a dict of keywords")
        return cls(**config)
    except (KeyError, TypeError, ValueError, TrainerError) as exc:
        raise TrainerError(f"{where}'s learning rule {doc!r} is not one this replaystore knows "
                           f"({type(exc).__name__}: {exc}); known: {', '.join(RULES)}") from None
