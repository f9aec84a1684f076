"""The ``replaystore`` command: ``inspect`` and ``verify`` a store without loading its frames, list
its ``episodes`` and save one (episodes.py), ``compact`` it or ``merge`` several (compact.py), make one from a
Minari dataset or a Minari dataset from one (``import-minari``, ``export-minari``), or one from a
Dopamine run's replay checkpoints (``import-dopamine``): cli/datasets.py.

``main(argv) -> int``; one handler maps every ``ReplayStoreError`` (and OS error) to a one-line
``error: ...`` and exit status 1. No TensorFlow is imported, so the command starts fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from replaystore.cli.datasets import add_dataset_verbs
from replaystore.errors import ConfigError, ReplayStoreError
from replaystore.storage.readfile import read_text
from replaystore.storage.where import is_url, local_path


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
        written, episode = save_episode(args.path, number, out, stream=args.stream, fps=args.fps,
                                        moves=parse_moves(args.moves), key=args.key)
        info = {"file": str(written), "stream": episode.stream, "index": episode.index, "moves": len(episode),
                "first_move": episode.first_move, "return": episode.episode_return, "ended": episode.ended,
                "first_step": episode.first_step}
        if args.json:
            print(json.dumps(strict_json(info), indent=2, allow_nan=False))
        else:
            part = f" (moves {episode.first_move:,}..{episode.first_move + len(episode) - 1:,})" if args.moves else ""
            print(f"episode {episode.index} of stream {episode.stream}{part}: {len(episode):,} moves, return "
                  f"{episode.episode_return:g}, {episode.ended} -> {written}")
        return 0
    if args.moves is not None:
        raise ConfigError("--moves picks the moves that --save writes; give --save INDEX FILE too")
    listing = list_episodes(args.path, stream=args.stream, newest=None if args.all else NEWEST)
    if args.json:
        print(json.dumps(strict_json(listing), indent=2, allow_nan=False))
    else:
        print("\n".join(format_episodes(listing)))
    return 0


def parse_moves(text: str | None) -> slice | None:
    """``--moves A:B`` (either end may be left out, negative counts from the end) as a slice."""
    if text is None:
        return None
    try:
        a, b = (int(x) if x.strip() else None for x in text.split(":"))
    except ValueError:
        raise ConfigError(f"--moves is {text!r}; give A:B, the episode's moves A..B-1 (such as 0:1000, 5000:, "
                          "-1000:)") from None
    return slice(a, b)


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

    with _bar(args) as progress:
        r = compact_store(args.src, args.dst, capacity=args.capacity, codec=_codec(args), chunk_len=args.chunk_len,
                          shard_len=args.shard_len, num_streams=args.streams, drop_damaged=args.drop_damaged,
                          progress=progress)
    _say_rewritten(r, "compacted")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from replaystore.cli.compact import merge_stores

    if len(args.stores) < 3:
        raise ConfigError(f"merge takes two or more stores and a new DST, and got {len(args.stores)} path(s): "
                          "replaystore merge SRC SRC [SRC ...] DST")
    *srcs, dst = args.stores
    for i, src in enumerate(srcs):  # (a run directory's store, said on stderr, as for the verbs that only read)
        srcs[i] = _followed(src)
    with _bar(args) as progress:
        r = merge_stores(srcs, dst, capacity=args.capacity, codec=_codec(args), chunk_len=args.chunk_len,
                         shard_len=args.shard_len, num_streams=args.streams, drop_damaged=args.drop_damaged,
                         progress=progress)
    _say_rewritten(r, "merged")
    return 0


def _codec(args: argparse.Namespace) -> Any:
    """--codec and --level as a ``CodecSpec`` (None: the source's)."""
    from replaystore.format.schema import CodecSpec

    if args.codec is None and args.level is None:
        return None
    name, _, cname = (args.codec or "zstd").partition(":")
    return CodecSpec(name=name, level=3 if args.level is None else args.level, cname=cname or "zstd")


@contextlib.contextmanager
def _bar(args: argparse.Namespace) -> Iterator[Callable[[str, int, int], None]]:
    """compact's and merge's progress: verifying, then writing."""
    from replaystore.cli.progress import Progress

    with Progress(quiet=args.quiet) as bar:

        def progress(phase: str, done: int, total: int) -> None:
            bar.update({"verify": "verifying shards", "write": "writing steps"}[phase], done, total)

        yield progress


def _say_rewritten(r: Any, verb: str) -> None:
    """What compact or merge did (a ``CompactReport``)."""
    for line in r.dropped:
        print(f"dropped damaged {line}")
    if r.dropped:
        print(f"dropped {r.steps_dropped:,} live steps with the episodes that touched damage")
    if r.streams_after != r.streams_before:
        how = "merged" if r.streams_after < r.streams_before else "split the episodes of"
        print(f"{how} {r.streams_before} stream(s) into {r.streams_after}"
              + (f"; left out {r.steps_unjoined:,} steps of episodes whose first frames were already overwritten"
                 if r.steps_unjoined else ""))
    if r.steps_cut:
        each = f" ({r.capacity_after // r.streams_after:,} a stream)" if r.streams_after > 1 else ""
        print(f"left out the oldest {r.steps_cut:,} steps to fit capacity {r.capacity_after:,}{each}")
    print(f"{verb} {r.src} -> {r.dst}: {r.transitions_before:,} -> {r.transitions_after:,} transitions, "
          f"{r.steps_kept:,} steps in {r.episodes_kept:,} episodes; {r.bytes_before:,} -> {r.bytes_after:,} bytes on disk")


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
                                   "(every observation and move) as .npz, or its frames as a video (.mp4 or .gif).")
    p.add_argument("path")
    p.add_argument("--stream", type=int, default=0, help="the stream (default 0)")
    p.add_argument("--all", action="store_true", help="list every live episode (default: the newest 20)")
    p.add_argument("--save", nargs=2, metavar=("INDEX", "FILE"),
                   help="save episode INDEX (as listed; negative: from the newest) to FILE.npz, FILE.mp4 or FILE.gif")
    p.add_argument("--moves", metavar="A:B", help="with --save: only the episode's moves A..B-1 and the observations "
                   "around them (Python's slice rules: 0:1000, 5000:, -1000:); for an episode too large to save whole")
    p.add_argument("--fps", type=float, default=15.0, help="frames per second of a saved .mp4 or .gif (default 15)")
    p.add_argument("--key", help="with --save FILE.mp4 or FILE.gif of a Dict store: the image entry to show (default: the one "
                   "entry that is an image)")
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
    p.add_argument("--streams", type=int, help="merge a store's streams into this many, or split its episodes over this many (default: keep them)")
    _rewriting(p)
    p.set_defaults(func=_compact)
    p = sub.add_parser("merge", help="make one new store of the live steps of two or more stores",
                       usage="%(prog)s SRC SRC [SRC ...] DST [--streams M] [--capacity N] [--codec C] [--level L] "
                             "[--chunk-len N] [--shard-len N] [--drop-damaged] [--quiet]",
                       description="Make a new store at DST holding the live steps of every SRC (stores of one kind: "
                                   "the same spaces, frame stack and extras), each source stream a stream of DST in the "
                                   "order given, episodes in progress closed as truncated. The sources are only read.")
    p.add_argument("stores", nargs="+", metavar="SRC", help="two or more stores (or run directories), then DST, a new path")
    p.add_argument("--capacity", type=int, help="DST's capacity in steps (default: what keeps every live step; "
                   "smaller keeps each stream's newest)")
    p.add_argument("--codec", help="zstd or blosc:CNAME (default: the first store's)")
    p.add_argument("--streams", type=int, help="merge the source streams into this many, or split their episodes over "
                   "this many (default: one stream of DST per source stream)")
    _rewriting(p)
    p.set_defaults(func=_merge)
    add_dataset_verbs(sub)
    return parser


#: What ``replaystore-train`` writes in a run directory (its flags, the store among them).
RUN_ARGS = "args.json"


def run_store(path: str) -> str | None:
    """The store of a ``replaystore-train`` run directory at ``path`` (one with an ``args.json`` and
    no ``zarr.json``): its ``replay.zarr``, the ``--store`` URL it wrote, or the dataset it learned
    from offline; None when ``path`` is not a run directory."""
    if is_url(path):
        return None
    where = local_path(path)
    if not (where / RUN_ARGS).is_file() or (where / "zarr.json").exists():
        return None
    try:
        doc = json.loads(read_text(where / RUN_ARGS, what="an args.json"))
    except (OSError, ValueError):
        return None
    named = [doc.get(key) for key in ("offline", "store")] if isinstance(doc, dict) else []
    return next((str(v) for v in named if isinstance(v, str) and v), str(where / "replay.zarr"))


def _rewriting(p: argparse.ArgumentParser) -> None:
    """The flags compact and merge share."""
    p.add_argument("--level", type=int, help="compression level (zstd 1..22, blosc 0..9)")
    p.add_argument("--chunk-len", type=int, help="frames per chunk")
    p.add_argument("--shard-len", type=int, help="steps per shard file")
    p.add_argument("--drop-damaged", action="store_true", help="drop the episodes that touch damaged chunks")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _followed(path: str) -> str:
    """``path``, or the store of the run directory it names (said on stderr)."""
    store = run_store(path)
    if store is None:
        return path
    print(f"{path} is a replaystore-train run directory: its store is {store}", file=sys.stderr)
    return store


def _in_run_dir(args: argparse.Namespace, attr: str, *, read_only: bool) -> None:
    """Point ``args.<attr>`` at the store of the run directory it names: verbs that only read follow it
    (said on stderr); compact, which rewrites the store, is told to name it."""
    path = getattr(args, attr, None)
    store = run_store(path) if isinstance(path, str) else None
    if store is None or not isinstance(path, str):
        return
    if not read_only:
        raise ConfigError(f"{path} is a replaystore-train run directory, not a replay store; its store is {store}: "
                          "pass that")
    setattr(args, attr, _followed(path))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_joined(sys.argv[1:] if argv is None else list(argv)))
    try:
        _in_run_dir(args, "path", read_only=True)  # inspect, episodes, verify
        _in_run_dir(args, "src", read_only=args.command == "export-minari")
        return int(args.func(args))
    except BrokenPipeError:  # `replaystore inspect ... | head`: the reader left; end quietly
        _quiet_stdout()
        return 128 + signal.SIGPIPE
    except (ReplayStoreError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _joined(argv: list[str]) -> list[str]:
    """``--moves -1000:`` as ``--moves=-1000:`` (argparse takes a value that starts with ``-`` for a flag)."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i and argv[i - 1] == "--moves" and arg.startswith("-") and out and out[-1] == "--moves":
            out[-1] = f"--moves={arg}"
        else:
            out.append(arg)
    return out


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
