"""The CLI's verbs that make a store from a dataset, or a dataset from a store: ``import-minari``,
``export-minari`` (integrations/minari/) and ``import-dopamine`` (integrations/dopamine/)."""

from __future__ import annotations

import argparse
from typing import Any

from replaystore.errors import ConfigError


def _import_minari(args: argparse.Namespace) -> int:
    from replaystore.cli.progress import Progress
    from replaystore.integrations.minari import store_from_minari

    frame_stack: Any = args.frame_stack
    if frame_stack != "auto":
        try:
            frame_stack = int(frame_stack)
        except ValueError:
            raise ConfigError(f"--frame-stack is {frame_stack!r}; pass auto (detect stacked observations), 1 (store "
                              "them whole) or the k of the dataset's frame stacks") from None
    with Progress(quiet=args.quiet) as bar:
        infos = False if args.no_infos else (args.infos or True)
        r = store_from_minari(args.dataset, args.dst, frame_stack=frame_stack, capacity=args.capacity, infos=infos,
                              progress=lambda done, total: bar.update("storing moves", done, total))
    closed = f"; {r.closed:,} cut short, closed as truncated" if r.closed else ""
    empty = f"; {r.empty:,} without a move left out" if r.empty else ""
    kept = (f"; --capacity {args.capacity:,} keeps the newest {r.kept_steps:,} steps of {r.moves + r.episodes:,}"
            if r.kept_steps < r.moves + r.episodes else "")
    print(f"stored the Minari dataset {r.dataset_id} in {r.path}: {r.episodes:,} episodes, {r.moves:,} moves "
          f"({r.stacking}), {r.bytes_on_disk:,} bytes on disk{closed}{empty}{kept}")
    if r.infos or r.infos_left:
        print(f"infos kept as extras: {', '.join(r.infos) or 'none'}"
              + (f"; left out: {', '.join(r.infos_left)}" if r.infos_left and not args.no_infos else ""))
    return 0


def _export_minari(args: argparse.Namespace) -> int:
    from replaystore.cli.progress import Progress
    from replaystore.integrations.minari import minari_from_store

    with Progress(quiet=args.quiet) as bar:
        r = minari_from_store(args.src, args.dataset_id, stacks=args.stacks, env=args.env, author=args.author,
                              author_email=args.author_email, algorithm_name=args.algorithm,
                              code_permalink=args.code_permalink, description=args.description,
                              progress=lambda done, total: bar.update("writing episodes", done, total))
    left = [f"{n:,} {what}" for n, what in ((r.partial, "cut at their start by the ring"),
                                            (r.in_progress, "in progress")) if n]
    print(f"wrote the Minari dataset {r.dataset_id} at {r.path}: {r.episodes:,} episodes, {r.moves:,} moves, "
          f"observations {r.observation_shape}" + (f"; left out {' and '.join(left)}" if left else ""))
    return 0


def _import_dopamine(args: argparse.Namespace) -> int:
    from replaystore.cli.progress import Progress
    from replaystore.integrations.dopamine import store_from_dopamine

    *runs, dst = args.paths
    if not runs:
        raise ConfigError("import-dopamine takes one or more run folders and a new STORE: replaystore import-dopamine "
                          "RUN_DIR [RUN_DIR ...] STORE")
    with Progress(quiet=args.quiet) as bar:
        r = store_from_dopamine(runs, dst, progress=lambda done, total: bar.update("reading rows", done, total))
    for run in r.runs:
        gaps = (f"; {run.gaps:,} gaps between saves ({run.rows_lost:,} rows no checkpoint holds)" if run.gaps else "")
        print(f"stream {run.stream}: {run.folder}: {run.checkpoints:,} checkpoints, {run.rows:,} rows "
              f"({run.shared:,} that two checkpoints held, stored once) -> {run.steps:,} steps{gaps}")
    print(f"stored {len(r.runs)} run{'s' if len(r.runs) > 1 else ''} in {r.path}: stacks of {r.frame_stack} "
          f"{'x'.join(map(str, r.frame_shape))} frames, {r.actions} actions, {r.bytes_on_disk:,} bytes on disk")
    return 0


def add_dataset_verbs(sub: Any) -> None:
    """Add the dataset verbs to the ``replaystore`` command's subparsers."""
    p = sub.add_parser("import-minari", help="make a new store of every episode of a Minari dataset",
                       description="Make a new store at DST holding every episode of a Minari (offline RL) dataset: "
                                   "an id in Minari's local datasets (MINARI_DATASETS_PATH) or a dataset's folder. "
                                   "Needs pip install 'replaystore[minari]'.")
    p.add_argument("dataset", help="a Minari dataset id (namespace/name-vN) or a dataset's folder")
    p.add_argument("dst", help="a new path (or s3:// URL) for the store")
    p.add_argument("--frame-stack", default="auto",
                   help="auto (default: find observations that are frame stacks and store each frame once), 1 "
                        "(store whole observations), or k")
    p.add_argument("--capacity", type=int, help="steps the store holds (default: every step of the dataset)")
    infos = p.add_mutually_exclusive_group()
    infos.add_argument("--infos", nargs="+", metavar="KEY",
                       help="the info keys to keep as extras of the moves (default: every one a store can keep)")
    infos.add_argument("--no-infos", action="store_true", help="keep no infos")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_import_minari)
    p = sub.add_parser("export-minari", help="write a store's whole episodes as a new Minari dataset",
                       description="Write every whole episode of SRC (stream by stream, oldest first) as a new "
                                   "Minari dataset DATASET_ID under Minari's datasets root (MINARI_DATASETS_PATH); "
                                   "minari.load_dataset reads it. Needs pip install 'replaystore[minari]'.")
    p.add_argument("src")
    p.add_argument("dataset_id", help="the new dataset's id, (namespace/)name-vN")
    p.add_argument("--stacks", action="store_true", help="observations as the frame stacks the agent saw")
    p.add_argument("--env", help="the gymnasium env id the data came from (recover_environment makes it)")
    p.add_argument("--author")
    p.add_argument("--author-email")
    p.add_argument("--algorithm", help="the algorithm that collected the data")
    p.add_argument("--code-permalink")
    p.add_argument("--description")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_export_minari)
    p = sub.add_parser("import-dopamine", help="make a new store of Dopamine runs' replay checkpoints (the DQN "
                       "Replay Dataset)",
                       description="Make a new store at STORE holding every replay checkpoint of each Dopamine run "
                                   "(a folder of $store$_*_ckpt.N.gz files, or a run folder with them in replay_logs): "
                                   "one stream a run, rows that two checkpoints hold stored once, stacks and n-step "
                                   "returns as Dopamine's buffer samples them. See docs/cli.md.")
    p.add_argument("paths", nargs="+", metavar="RUN_DIR... STORE", help="one or more run folders, then a new path "
                   "(or s3:// URL) for the store")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_import_dopamine)
