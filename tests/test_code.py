"""The code keeps its own rules (docs/design.md): no module imports another module's private names or
reads another object's private attributes; the store never imports the trainer; pyproject.toml
names every package the wheel installs. (The layers and the absence of import cycles are
import-linter's contracts in pyproject.toml, checked by ``lint-imports`` in CI.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("replaystore", "trainer")
#: private names of other libraries that replaystore reaches for, knowingly, and why
THIRD_PARTY = {"_variant_tensor": "tf.data's own: feed/tfdata.py wraps a pipeline's graph (TensorFlow is pinned)",
               "_make_wrapper_subclass": "torch's way to make a tensor of a shape and dtype that holds no data (its "
                                         "own fake and distributed tensors are made so): integrations/torchrl/lazy.py"}


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


def test_the_store_never_imports_the_trainer() -> None:
    """import-linter sees the trainer as ``trainer`` (its folder); it installs as
    ``replaystore.trainer``, which no module of the store may import either."""
    for path in sorted((ROOT / "replaystore").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [f"{'.' * node.level}{node.module or ''}"] + [a.name for a in node.names]
            assert not any("trainer" in name for name in names), f"{path.relative_to(ROOT)} imports {names}"


def test_pyproject_names_every_package() -> None:
    """The package list is explicit (the trainer's folder maps to replaystore.trainer), so a new
    subpackage must be added to it or the wheel would leave it out."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "replaystore").rglob("__init__.py")}
    on_disk |= {"replaystore.trainer." + ".".join(p.parent.relative_to(ROOT / "trainer").parts)
                for p in (ROOT / "trainer").rglob("__init__.py")}
    assert set(config["packages"]) == {name.rstrip(".") for name in on_disk}
    assert config["package-dir"] == {"replaystore.trainer": "trainer"}
