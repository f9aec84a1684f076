"""What every benchmark here shares: rounds in alternating order, medians, pinning to cores, peak RSS
from VmHWM, children that report JSON, and the JSON a run saves.

- **Peak RSS is VmHWM** (``/proc/self/status``), never ``ru_maxrss``: Linux carries ``ru_maxrss``
  over an ``exec`` from the process that forked the child, so a small child of a large parent
  reports the parent's peak.
- **Rounds alternate the order** of the contenders (``order``): what runs first on a shared,
  noisy machine (a cold cache, a neighbour's burst) does not always favour the same one. Ratios are
  taken within a round and their median reported (``ratio``).
- **Per-core figures pin** the process (and its threads) to one core (``pin``), as
  ``taskset -c N`` does.
- **A child** (``child``) is this interpreter running a script or ``-c`` code with tools/ on its
  path; it prints one JSON object as its last line (``report`` adds its peak RSS), which the parent
  parses.
- **Saved JSON** (``save``) says when and on what machine it was measured.

    from harness import child, median, order, peak_rss_mb, pin, rate, report, save
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent


def memory(pid: int | str = "self") -> dict[str, float]:
    """A process's VmRSS, VmHWM (its peak), RssAnon and RssFile, in MB (this process's by default)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
            out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def peak_rss_mb(pid: int | str = "self") -> float:
    """A process's peak RSS in MB (VmHWM; this process's by default)."""
    return memory(pid)["VmHWM"]


def pin(cores: int | Iterable[int]) -> list[int]:
    """Run this process (and the threads it starts from now on) on ``cores`` only; returns them."""
    chosen = [cores] if isinstance(cores, int) else list(cores)
    os.sched_setaffinity(0, chosen)
    return chosen


def order(names: Sequence[str], round_index: int) -> list[str]:
    """The contenders in round ``round_index``'s order: as given in even rounds, reversed in odd ones."""
    return list(names) if round_index % 2 == 0 else list(names)[::-1]


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def ratio(rounds: Sequence[dict[str, float]], top: str, bottom: str) -> float:
    """The median over rounds of ``round[top] / round[bottom]`` (each round's pair measured side by side)."""
    return median(r[top] / r[bottom] for r in rounds)


def rate(fn: Callable[[], Any], calls: int, *, warmup: int = 0) -> float:
    """Calls of ``fn`` a second, over ``calls`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return calls / (time.perf_counter() - start)


def report(result: dict[str, Any]) -> None:
    """Print ``result`` with this process's peak RSS (``peak_rss_mb``) as one JSON line: a child's answer."""
    print(json.dumps({**result, "peak_rss_mb": peak_rss_mb()}), flush=True)


def child(args: Sequence[str], *, code: str | None = None, cores: Sequence[int] | None = None,
          env: dict[str, str] | None = None, timeout: float | None = None,
          preexec: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run ``python SCRIPT ARGS`` (``args[0]`` a script) or ``python -P -c CODE ARGS`` with tools/ on
    its path, pinned to ``cores`` if given (``taskset``), calling ``preexec`` in the child before it
    starts Python (e.g. to join a cgroup), and return the JSON object its last line holds. (``-P``:
    ``-c`` would put the working directory first on the path, ahead of ``PYTHONPATH``, so a
    checkout's own replaystore would shadow the version ``ab.py`` or ``bench_ram.py --before`` put
    there.)"""
    argv = [sys.executable, "-P", "-c", code, *args] if code is not None else [sys.executable, *args]
    if cores is not None:
        argv = ["taskset", "-c", ",".join(map(str, cores)), *argv]
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(TOOLS), full.get("PYTHONPATH", "")) if p)
    done = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=timeout, preexec_fn=preexec)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine() -> dict[str, Any]:
    """The cores, CPU model and RAM of this machine (where the figures come from)."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    ram = next((int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:")), 0)
    return {"cores": os.cpu_count(), "cpu": model, "ram_bytes": ram, "python": platform.python_version()}


def save(path: Path | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON at ``path`` (nothing when None), with when and where it was measured."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**payload, "when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine()},
                               indent=1))
