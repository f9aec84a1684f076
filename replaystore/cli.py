"""The ``replaystore`` command: ``inspect`` and ``verify`` a store without loading its frames.

``main(argv) -> int``; one handler maps every ``ReplayStoreError`` (and OS error) to a one-line
``error: ...`` and exit status 1. No TensorFlow is imported, so the command starts fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from replaystore.errors import ReplayStoreError


def _inspect(args: argparse.Namespace) -> int:
    from replaystore.inspect import format_summary, inspect_store

    info = inspect_store(args.path)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print("\n".join(format_summary(info)))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from replaystore.verify import verify_store

    with Progress(transient=True, disable=args.quiet or not sys.stderr.isatty()) as bar:
        task = bar.add_task("verifying shards", total=None)
        report = verify_store(args.path, progress=lambda done, total: bar.update(task, completed=done, total=total))
    for p in report.problems:
        where = f"{p.array}" + (f" shard {p.shard}" if p.shard is not None else "") + (f" chunk {p.chunk}" if p.chunk is not None else "")
        slots = f" slots {p.slots[0]}..{p.slots[1]}" if p.slots else ""
        live = f"; holds live steps {p.live_steps[0]}..{p.live_steps[1]}" if p.live_steps else "; holds no live steps"
        print(f"DAMAGED {where}{slots}{live}: {p.message}")
    status = "OK" if report.ok else f"{len(report.problems)} problem(s)"
    print(f"{args.path}: {report.chunks_checked} chunks checked, {status}")
    return 0 if report.ok else 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replaystore", description="Look after replay stores on disk.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="summarise a store without loading its frames")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_inspect)
    p = sub.add_parser("verify", help="read every chunk and check checksums and metadata")
    p.add_argument("path")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ReplayStoreError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
