"""The examples of README.md and docs/*.md, read as tests/test_docs.py runs them.

Every fenced block names what it is: ``python`` (run), ``console`` (shell commands, run with bash),
or ``text`` (output, a layout, a command's synopsis: read, not run). An HTML comment on the line
just before a fence, invisible where the page is rendered, tells the test more::

    <!-- example: skip; tools/gpu_suite.py runs it -->     not run here, and why (the reason is required)
    <!-- example: slow; ~50 s on 2 cores -->               run by the slow suite only (pytest -m slow)
    <!-- example: shrink "100_000" -> "1_500" -->          sizes made smaller for the test, each once
    <!-- example: given td_error = np.ones(32) -->         Python (or shell) run just before the block
    <!-- example: file mymodels.py -->                      the block is a file the page's reader writes

A page's blocks run in order, as one script in one fresh folder: a block may use what the blocks
before it made (names, files), as a reader following the page would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("python", "console", "text")
FENCE = re.compile(r"^```(\S*)\s*$")
DIRECTIVE = re.compile(r"^<!-- example: (skip|slow|shrink|given|file)\b(.*?)-->\s*$")
SHRINK = re.compile(r'"((?:[^"\\]|\\.)*)" -> "((?:[^"\\]|\\.)*)"')


@dataclass
class Block:
    page: str
    line: int  # the fence's line, 1-based
    kind: str
    code: str
    skip: str | None = None
    slow: bool = False
    shrink: list[tuple[str, str]] = field(default_factory=list)
    given: list[str] = field(default_factory=list)
    file: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def runnable(self) -> str:
        """The block's code with its sizes shrunk (ValueError when a size is not there once)."""
        code = self.code
        for old, new in self.shrink:
            if code.count(old) != 1:
                raise ValueError(f"{self.where}: shrink {old!r} is in the block {code.count(old)} times, not once")
            code = code.replace(old, new)
        return code


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The page's blocks in order; ValueError for a block of no kind or a directive that is not one."""
    name = str(path.relative_to(ROOT))
    lines = path.read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        block = Block(name, i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n")
        if block.kind not in KINDS:
            raise ValueError(f"{block.where}: a block of kind {block.kind!r}; name it python, console or text")
        k = i - 1
        while k >= 0 and lines[k].startswith("<!-- example:"):
            d = DIRECTIVE.match(lines[k])
            if not d:
                raise ValueError(f"{name}:{k + 1}: not a directive: {lines[k]}")
            what, rest = d.group(1), d.group(2).strip()
            if what == "skip":
                block.skip = rest.lstrip(";").strip()
                if not block.skip:
                    raise ValueError(f"{name}:{k + 1}: a skip needs its reason")
            elif what == "slow":
                block.slow = True
            elif what == "shrink":
                pairs = SHRINK.findall(rest)
                if not pairs:
                    raise ValueError(f"{name}:{k + 1}: shrink \"old\" -> \"new\"")
                block.shrink.extend((a.replace('\\"', '"'), b.replace('\\"', '"')) for a, b in pairs)
            elif what == "file":
                block.file = rest
            else:
                block.given.insert(0, rest)
            k -= 1
        found.append(block)
        i = end + 1
    return found
