"""The ``replaystore`` command: ``inspect`` and ``verify`` a store without loading its frames, list
its ``episodes`` and save one (episodes.py), and ``compact`` it (compact.py).

``main(argv) -> int``; one handler maps every ``ReplayStoreError`` (and OS error) to a one-line
``error: ...`` and exit status 1. No TensorFlow is imported, so the command starts fast.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from replaystore.errors import ConfigError, ReplayStoreError


def _inspect(args: argparse.Namespace) -> int:
    from replaystore.cli.summary import format_summary, inspect_store

    info = inspect_store(args.path)
    if args.plot:
        from replaystore.cli.plot import plot_store

        info["plot"] = str(plot_store(args.path, args.plot))
    if args.json:
        print(json.dumps(strict_json(info), indent=2, allow_nan=False))
    else:
        print("\n".join(format_summary(info)))
        if args.plot:
            print(f"plot              {info['plot']}")
    return 0


def _episodes(args: argparse.Namespace) -> int:
    from replaystore.cli.episodes import NEWEST, format_episodes, list_episodes, save_episode

    if args.save is not None:
        index, out = args.save
        try:
            number = int(index)
        except ValueError:
            raise ConfigError(f"--save takes INDEX FILE; {index!r} is not an episode index (an integer, "
                              "negative from the newest)") from None
        written, episode = save_episode(args.path, number, out, stream=args.stream, fps=args.fps)
        info = {"file": str(written), "stream": episode.stream, "index": episode.index, "moves": len(episode),
                "return": episode.episode_return, "ended": episode.ended, "first_step": episode.first_step}
        if args.json:
            print(json.dumps(strict_json(info), indent=2, allow_nan=False))
        else:
            print(f"episode {episode.index} of stream {episode.stream}: {len(episode):,} moves, return "
                  f"{episode.episode_return:g}, {episode.ended} -> {written}")
        return 0
    listing = list_episodes(args.path, stream=args.stream, newest=None if args.all else NEWEST)
    if args.json:
        print(json.dumps(strict_json(listing), indent=2, allow_nan=False))
    else:
        print("\n".join(format_episodes(listing)))
    return 0


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float as the string ``"inf"``, ``"-inf"`` or ``"nan"`` (as the
    store's zarr.json keeps them, docs/format.md): strict JSON, which jq and JavaScript read."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _verify(args: argparse.Namespace) -> int:
    from replaystore.cli.progress import Progress
    from replaystore.cli.verify import verify_store

    with Progress(quiet=args.quiet) as bar:
        report = verify_store(args.path, progress=lambda done, total: bar.update("verifying shards", done, total))
    for p in report.problems:
        print(f"DAMAGED {p.where()}: {p.message}")
    status = "OK" if report.ok else f"{len(report.problems)} problem(s)"
    print(f"{args.path}: {report.chunks_checked} chunks checked, {status}")
    return 0 if report.ok else 2


def _compact(args: argparse.Namespace) -> int:
    from replaystore.cli.compact import compact_store
    from replaystore.cli.progress import Progress
    from replaystore.format.schema import CodecSpec

    codec = None
    if args.codec is not None or args.level is not None:
        name, _, cname = (args.codec or "zstd").partition(":")
        codec = CodecSpec(name=name, level=3 if args.level is None else args.level, cname=cname or "zstd")
    with Progress(quiet=args.quiet) as bar:

        def progress(phase: str, done: int, total: int) -> None:
            bar.update({"verify": "verifying shards", "write": "writing steps"}[phase], done, total)

        r = compact_store(args.src, args.dst, capacity=args.capacity, codec=codec, chunk_len=args.chunk_len,
                          shard_len=args.shard_len, num_streams=args.streams, drop_damaged=args.drop_damaged,
                          progress=progress)
    for line in r.dropped:
        print(f"dropped damaged {line}")
    if r.dropped:
        print(f"dropped {r.steps_dropped:,} live steps with the episodes that touched damage")
    if r.streams_after != r.streams_before:
        print(f"merged {r.streams_before} streams into {r.streams_after}"
              + (f"; left out {r.steps_unjoined:,} steps of episodes whose first frames were already overwritten"
                 if r.steps_unjoined else ""))
    if r.steps_cut:
        print(f"left out the oldest {r.steps_cut:,} steps to fit capacity {args.capacity:,}")
    print(f"compacted {r.src} -> {r.dst}: {r.transitions_before:,} -> {r.transitions_after:,} transitions, "
          f"{r.steps_kept:,} steps in {r.episodes_kept:,} episodes; {r.bytes_before:,} -> {r.bytes_after:,} bytes on disk")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replaystore", description="Look after replay stores on disk.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="summarise a store without loading its frames")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="also draw episode returns and sampled frame stacks into FILE")
    p.set_defaults(func=_inspect)
    p = sub.add_parser("episodes", help="list the live episodes of a stream, or save one (--save INDEX FILE)",
                       description="List the live episodes of a stream from the scalar arrays, or save one whole "
                                   "(every observation and move) as .npz, or its frames as a .gif.")
    p.add_argument("path")
    p.add_argument("--stream", type=int, default=0, help="the stream (default 0)")
    p.add_argument("--all", action="store_true", help="list every live episode (default: the newest 20)")
    p.add_argument("--save", nargs=2, metavar=("INDEX", "FILE"),
                   help="save episode INDEX (as listed; negative: from the newest) to FILE.npz or FILE.gif")
    p.add_argument("--fps", type=float, default=15.0, help="frames per second of a saved .gif (default 15)")
    p.add_argument("--json", action="store_true", help="print the listing (or what was saved) as JSON")
    p.set_defaults(func=_episodes)
    p = sub.add_parser("verify", help="read every chunk and check checksums and metadata")
    p.add_argument("path")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_verify)
    p = sub.add_parser("compact", help="rewrite a store oldest-first with only its live steps (atomically)",
                       description="Rewrite SRC oldest-first with only its live steps, into DST or (no DST) in place, "
                                   "atomically: a crash leaves either the old store or the new one.")
    p.add_argument("src")
    p.add_argument("dst", nargs="?", default=None, help="a new path (default: replace SRC)")
    p.add_argument("--capacity", type=int, help="a new capacity in steps (smaller keeps the newest)")
    p.add_argument("--codec", help="zstd (default) or blosc:CNAME, e.g. blosc:lz4")
    p.add_argument("--level", type=int, help="compression level (zstd 1..22, blosc 0..9)")
    p.add_argument("--chunk-len", type=int, help="frames per chunk")
    p.add_argument("--shard-len", type=int, help="steps per shard file")
    p.add_argument("--streams", type=int, help="merge a store of streams into this many (default: keep them)")
    p.add_argument("--drop-damaged", action="store_true", help="drop the episodes that touch damaged chunks")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_compact)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `replaystore inspect ... | head`: the reader left; end quietly
        _quiet_stdout()
        return 128 + signal.SIGPIPE
    except (ReplayStoreError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
