"""Every example in README.md and docs/*.md runs as written (tests/docexamples.py says how blocks
are marked: python and console blocks run, text blocks are read, a skipped one names the tool that
runs it). Each page runs in a fresh folder in its own process, its blocks in order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from docexamples import ROOT, blocks, pages

HERE = Path(__file__).resolve().parent


def test_every_block_says_what_it_is_and_every_skip_why() -> None:
    every = [b for page in pages() for b in blocks(page)]
    assert len(every) > 50
    for block in every:
        if block.kind != "text":
            block.runnable()  # (each size to shrink is there once)
    run = [b for b in every if b.kind != "text" and b.skip is None]
    assert len(run) > 25


PAGES = [str(p.relative_to(ROOT)) for p in pages()]


def _run_page(page: str, tmp_path: Path, *, slow: bool) -> None:
    runnable = [b for b in blocks(ROOT / page) if b.kind != "text" and b.skip is None and (slow or not b.slow)]
    if not runnable:
        pytest.skip(f"{page} has no example to run here (its blocks are output, layouts and synopses, or slow)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "KERAS_BACKEND": os.environ.get("KERAS_BACKEND", "tensorflow"), "REPLAYSTORE_REPO": str(ROOT),
           "MINARI_DATASETS_PATH": str(tmp_path / "minari")}
    done = subprocess.run([sys.executable, str(HERE / "docrunner.py"), page, *(["--slow"] if slow else [])],
                          cwd=tmp_path, capture_output=True, text=True, check=False, timeout=1200, env=env)
    assert done.returncode == 0, (done.stderr[-6000:] + done.stdout[-2000:])


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_examples_run_as_written(page: str, tmp_path: Path) -> None:
    _run_page(page, tmp_path, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_pages_slow_examples_run_as_written(page: str, tmp_path: Path) -> None:
    """The pages again with the blocks that take a minute or more (Ray actors, every backend)."""
    if not any(b.slow for b in blocks(ROOT / page)):
        pytest.skip(f"{page} has no slow example")
    _run_page(page, tmp_path, slow=True)
