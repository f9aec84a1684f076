"""The code keeps its own rules (docs/design.md): no module imports another module's private names or
reads another object's private attributes. (The layers and the absence of import cycles are
import-linter's contracts in pyproject.toml, checked by ``lint-imports`` in CI.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("replaystore",)
#: private names of other libraries that replaystore reaches for, knowingly, and why
THIRD_PARTY = {"_variant_tensor": "tf.data's own: feed/tfdata.py wraps a pipeline's graph (TensorFlow is pinned)"}


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class _Check(ast.NodeVisitor):
    """Private names reached from outside: imports, and attributes of anything but ``self``/``cls``
    (another instance of the class that sets the attribute is its own business)."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.own: list[set[str]] = []  # the private attributes each enclosing class sets on self

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if _private(alias.name):
                self.problems.append(f"line {node.lineno}: imports {alias.name} from {node.module}")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        own = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id in ("self", "cls") and _private(n.attr)}
        own.update(n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        self.own.append(own)
        self.generic_visit(node)
        self.own.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _private(node.attr):
            base = node.value
            mine = isinstance(base, ast.Name) and base.id in ("self", "cls")
            mine |= isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"
            mine |= bool(self.own) and node.attr in self.own[-1]
            if not mine and node.attr not in THIRD_PARTY:
                self.problems.append(f"line {node.lineno}: reads {ast.unparse(node)}")
        self.generic_visit(node)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_names_cross_a_module(path: Path) -> None:
    check = _Check()
    check.visit(ast.parse(path.read_text(), str(path)))
    assert not check.problems, f"{path.relative_to(ROOT)}: " + "; ".join(check.problems)
