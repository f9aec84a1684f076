"""A/B: one benchmark run against two versions of replaystore, one after the other, in interleaved
rounds, so that a shared machine's drift falls on both alike.

    python tools/ab.py --old 8d40b14 --json tools/out/bench_sampling_quick.json --rounds 3 -- \\
        python tools/bench_sampling.py --quick --reuse

The old version is checked out (``git worktree``) under tools/out/ab-REV and put first on
``PYTHONPATH`` for its runs (the benchmark scripts themselves, and their stores under tools/out,
are this checkout's); the new version is this checkout. After each run the benchmark's JSON output
is read, and at the end every number in it is printed: the median of its rounds for the old and the
new version, and their ratio (new / old; above 1 is faster where the number is a rate).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import median, save  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def leaves(doc: object, prefix: str = "") -> dict[str, float]:
    """Every number in a JSON document, by its path."""
    out: dict[str, float] = {}
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.update(leaves(value, f"{prefix}/{key}" if prefix else str(key)))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        out[prefix] = float(doc)
    return out


def checkout(rev: str) -> Path:
    where = HERE / "out" / f"ab-{rev}"
    if not (where / "replaystore").exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), rev], check=True)
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the git revision to compare this checkout with")
    ap.add_argument("--json", required=True, help="the JSON file the benchmark writes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--match", default="", help="report only numbers whose path contains this")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark's command line")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    old = checkout(args.old)
    results: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for round_ in range(args.rounds):
        for version in ("old", "new"):
            env = dict(os.environ)
            if version == "old":
                env["PYTHONPATH"] = os.pathsep.join([str(old), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            print(f"round {round_ + 1}, {version}: {' '.join(command)}", flush=True)
            subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
            results[version].append(leaves(json.loads(Path(args.json).read_text())))
    keys = [k for k in results["new"][0] if args.match in k and all(k in r for r in results["old"] + results["new"])]
    print(f"\n| {'number':60s} | old ({args.old}) | new | new / old |")
    print("|---|---|---|---|")
    summary = {}
    for key in keys:
        a = median(r[key] for r in results["old"])
        b = median(r[key] for r in results["new"])
        summary[key] = {"old": a, "new": b, "ratio": b / a if a else None}
        ratio = f"{b / a:.3f}" if a else "-"
        print(f"| {key:60s} | {a:,.4g} | {b:,.4g} | {ratio} |")
    save(HERE / "out" / "ab.json", {"old": args.old, "command": command, "rounds": args.rounds, "summary": summary,
                                    "runs": results})
    sys.stdout.flush()


if __name__ == "__main__":
    main()
