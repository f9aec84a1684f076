"""Runs one page's examples (tests/docexamples.py) in order, in the current folder: ``python
docrunner.py PAGE [--slow]`` (``--slow``: the blocks marked slow too). Python blocks share one namespace; console blocks run with bash. A block that
fails ends the run with its page and line."""

from __future__ import annotations

import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docexamples import ROOT, blocks  # noqa: E402


def main(page: str, *, slow: bool) -> int:
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in blocks(ROOT / page):
        if block.kind == "text" or block.skip is not None or (block.slow and not slow):
            continue
        t0 = time.perf_counter()
        print(f"== {block.where} ({block.kind})", file=sys.stderr, flush=True)
        code = block.runnable()
        try:
            if block.file is not None:
                Path(block.file).parent.mkdir(parents=True, exist_ok=True)
                Path(block.file).write_text(code)
            elif block.kind == "python":
                for given in block.given:
                    exec(compile(given, f"{block.where} (given)", "exec"), namespace)  # noqa: S102
                exec(compile(code, block.where, "exec"), namespace)  # noqa: S102
            else:
                subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join([*block.given, code])], check=True)
        except BaseException as exc:  # noqa: BLE001 - said with the block's place
            traceback.print_exc()
            print(f"FAILED {block.where}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"   ok in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], slow="--slow" in sys.argv[2:]))
