"""The ``replaystore`` command and its verbs: inspect (``summary``), verify, compact, plot."""

from replaystore.cli.main import main

__all__ = ["main"]
