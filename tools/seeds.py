"""Learning across seeds, side by side: the runs of ``tools/readme_seeds.py`` and
``tools/reference_dqn.py``, each one a child process (``python tools/X.py --child JSON``) that
prints one JSON line, run ``--jobs`` at a time, every row kept in ``--out`` as it finishes (a
rerun skips the rows it has), and the table of every seed with the medians printed at the end."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from harness import median  # noqa: E402


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated seeds")
    p.add_argument("--jobs", type=int, default=2, help="runs at once (one a core)")
    p.add_argument("--out", type=Path, default=Path("tools/out/seeds.jsonl"),
                   help="JSON lines of the runs (a rerun skips those there)")
    p.add_argument("--episodes", type=int, default=20, help="greedy games that score a run's final agent")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def run_all(script: Path, runs: Sequence[dict[str, Any]], out: Path, jobs: int, *,
            env: Callable[[dict[str, Any]], dict[str, str]] = lambda run: {}) -> list[dict[str, Any]]:
    """Each run not yet in ``out`` as a child of ``script``; every row of ``out`` for these runs."""
    out.parent.mkdir(parents=True, exist_ok=True)
    done = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    fields = sorted({k for run in runs for k in run})
    key = lambda row: json.dumps({k: row.get(k) for k in fields}, sort_keys=True)  # noqa: E731
    have = {key(row) for row in done}
    todo = [run for run in runs if key(run) not in have]

    def one(run: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        child = subprocess.run([sys.executable, str(script), "--child", json.dumps(run)], capture_output=True,
                               text=True, check=False, env={**os.environ, **env(run)})
        lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
        if child.returncode != 0 or not lines:
            print(f"FAILED {run}: {child.stderr[-2000:]}", file=sys.stderr, flush=True)
            return
        row = {**run, **json.loads(lines[-1]), "wall_s": round(time.perf_counter() - t0, 1)}
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, todo))
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    wanted = {key(run) for run in runs}
    return [row for row in rows if key(row) in wanted]


def table(rows: list[dict[str, Any]], group: Sequence[str], *, goal: float | None = None) -> str:
    """A markdown table: one row per ``group`` value, every seed's score, the median (and how many
    seeds reached ``goal``)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[g] for g in group), []).append(row)
    seeds = sorted({row["seed"] for row in rows})
    head = [*group, *(f"seed {s}" for s in seeds), "median"] + (["reached"] if goal is not None else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, members in sorted(groups.items(), key=lambda item: str(item[0])):
        by_seed = {row["seed"]: row["score"] for row in members}
        scores = [by_seed[s] for s in seeds if s in by_seed]
        cells = [*map(str, name), *(f"{by_seed[s]:.1f}" if s in by_seed else "-" for s in seeds),
                 f"{median(scores):.1f}" if scores else "-"]
        if goal is not None:
            cells.append(f"{sum(score >= goal for score in scores)} of {len(scores)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
