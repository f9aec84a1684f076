"""The GPU suite: Pong learned, the learner fed against its bound, and the trainer end to end, on one
GPU machine (Keras 3 on JAX), as one command made of resumable steps of at most ten minutes.

On the CPU side, once (downloads the wheels the GPU image lacks into the ignored ``.whl/``)::

    python tools/gpu_suite.py prepare

Rehearsed on a CPU machine (the same steps at small sizes, TensorFlow hidden as on the GPU image,
a few minutes)::

    python tools/gpu_suite.py run --rehearse --dir /tmp/gpu_rehearsal

On the GPU machine, from the project's root with ``.whl/`` carried along, the same command each
time, until it prints ``suite done``::

    python3 tools/gpu_suite.py run [--dir /tmp/gpu_suite] [--wait 560] [--steps pong,train,learner] [--seed 1]

``--steps`` names the steps to take (default: all three; with 15 minutes of GPU time only ``pong``
fits, and a runner that went on to ``train`` would spend the rest on a step it cannot finish).

Each ``run`` installs the carried wheels and the project into ``/tmp/site`` (once per machine),
starts the suite's runner in the background (``setsid``; unless one is running already), follows
its log for at most ``--wait`` seconds, and copies what the suite has written so far (JSON, PNG,
logs, the Pong run's ``best.npz``; not the stores or checkpoints) into ``$OUT`` (or ``--copy-to``).
The runner takes the steps below in order and records each one done in ``DIR/suite.json``; a
machine that stays warm between two calls keeps
the runner going, and a runner that was cut off is started again by the next call and goes on from
the first step not done. The Pong step continues its run directory (``learning_curve.py
--resume``: the trainer's ``--resume`` keeps every committed transition and the last checkpoint).

Steps (each writes into ``DIR``):

  pong     tools/learning_curve.py --env-id ALE/Pong-v5 --backends jax --stop-at-goal --resume:
           the preset's run (32 envs, replay ratio 16), stopped at its first evaluation of 20 games
           at or above +18: ``curves/ALE_Pong-v5-jax-1.json`` (every evaluation's step, returns and
           wall time) and ``curves/ALE_Pong-v5-1.png``; ``pong.log``
  train    tools/bench_train.py --backends jax --modes decoupled --overlap off,on: env steps/s,
           gradient steps/s and peak RSS with 16 and 32 envs at replay ratio 8, 1M-step buffer, the envs
           stepped all at once and in two halves in turn: ``bench_train.json``, ``train.log``
  learner  tools/bench_learner.py --backends jax: fed by a 1M-transition store against the bound,
           1, 8, 32 and 64 gradient steps per call: ``bench_learner.json``, ``learner.log``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = Path("/tmp/site")
#: what the GPU image lacks, beyond ../shared/device/fetch-wheels.sh's default set: setuptools builds
#: the project's own wheel there; tensorboardX (and protobuf) write TensorBoard files without TensorFlow
EXTRA_WHEELS = ("setuptools", "tensorboardX", "protobuf")
KEEP = (".json", ".jsonl", ".png", ".log", ".txt", ".started")  # (.started: the wall clock a curve's times count from)
#: files kept whatever their suffix: the Pong run's best weights (~7 MB; its checkpoint and store stay)
KEEP_NAMES = ("best.npz",)
#: seconds between two copies of the results out while following the runner
COPY_EVERY = 30.0

STEPS: dict[str, list[str]] = {
    "pong": ["tools/learning_curve.py", "--env-id", "ALE/Pong-v5", "--backends", "jax", "--stop-at-goal", "--resume",
             "--seed", "{seed}", "--out", "{dir}/curves"],
    "train": ["tools/bench_train.py", "--backends", "jax", "--modes", "decoupled", "--envs", "16,32",
              "--overlap", "off,on", "--learning-starts", "5000", "--steps", "40000", "--buffer-size", "1000000",
              "--sample-threads", "4", "--json", "{dir}/bench_train.json"],
    "learner": ["tools/bench_learner.py", "--backends", "jax", "--reuse", "--transitions", "1000000", "--recorded", "25000",
                "--seconds", "8", "--rounds", "2", "--steps-per-call", "1,8,32,64", "--threads", "4",
                "--json", "{dir}/bench_learner.json"],
}


#: ``--rehearse``: the same steps at sizes a 2-core CPU machine takes in minutes, in the current
#: environment (nothing installed), with TensorFlow hidden as it is on the GPU image
REHEARSAL: dict[str, list[str]] = {
    "pong": ["--", "--total-timesteps", "12000", "--learning-starts", "4000", "--train-frequency", "32",
             "--eval-frequency", "4000", "--eval-episodes", "2", "--num-envs", "4", "--buffer-size", "20000",
             "--sample-threads", "2"],
    "learner": ["--transitions", "40000", "--recorded", "5000", "--seconds", "2", "--rounds", "1",
                "--steps-per-call", "8,32", "--threads", "2"],
    "train": ["--envs", "4", "--learning-starts", "1000", "--steps", "2500", "--buffer-size", "20000",
              "--sample-threads", "2", "--steps-per-call", "8"],
}
NO_TF = """import sys
class Hidden:
    def __init__(self, finder): self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tensorboardX"): return None
        return self.finder.find_spec(name, path, target)
    def __getattr__(self, name): return getattr(self.finder, name)
sys.meta_path[:] = [Hidden(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
"""


def prepare() -> None:
    """CPU side: the wheels, into .whl/ (git-ignored; carried to the GPU machine)."""
    script = ROOT.parent / "shared" / "device" / "fetch-wheels.sh"
    subprocess.run(["bash", str(script), *EXTRA_WHEELS], cwd=ROOT, check=True)


def install(rehearse: bool) -> dict[str, str]:
    """GPU side: the carried wheels and the project (built from this tree) into /tmp/site; the
    environment the steps run in."""
    if rehearse:
        hidden = Path("/tmp/gpu_suite_no_tf")
        hidden.mkdir(exist_ok=True)
        (hidden / "sitecustomize.py").write_text(NO_TF)
        return {**os.environ, "PYTHONPATH": str(hidden), "KERAS_BACKEND": "jax", "PYTHONUNBUFFERED": "1"}
    # (not the tree itself on the path: its replaystore/ lacks the trainer, which the install maps in;
    # the steps run outside the tree for the same reason)
    env = {**os.environ, "PYTHONPATH": str(SITE), "KERAS_BACKEND": "jax", "PYTHONUNBUFFERED": "1"}
    if not (SITE / ".installed").exists():
        wheels = sorted(str(p) for p in (ROOT / ".whl").glob("*.whl"))
        if not wheels:
            raise SystemExit("no wheels in .whl/: run `python tools/gpu_suite.py prepare` on the CPU side and carry .whl")
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(SITE)]
        subprocess.run([*pip, *wheels], check=True)
        subprocess.run([*pip, "--find-links", str(ROOT / ".whl"), str(ROOT)], check=True, cwd="/tmp")
        (SITE / ".installed").write_text(time.ctime())
    return env


def runner(directory: Path, rehearse: bool, steps: list[str], seed: int) -> int:
    """The steps not done yet, in order; each step's output goes to DIR/<step>.log."""
    env = install(rehearse)
    state_path = directory / "suite.json"
    for name, argv in STEPS.items():
        if name not in steps:
            continue
        state = json.loads(state_path.read_text()) if state_path.exists() else {}
        if state.get(_key(name, seed), {}).get("done"):
            continue
        cmd = [sys.executable, str(ROOT / argv[0]), *(a.format(dir=directory, seed=seed) for a in argv[1:]),
               *(REHEARSAL[name] if rehearse else [])]
        t0 = time.time()
        with open(directory / f"{name}.log", "a") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            rc = subprocess.call(cmd, cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT)
        state[_key(name, seed)] = {"done": rc in (0, 1) if name == "pong" else rc == 0, "rc": rc,
                                   "seconds": time.time() - t0}
        state_path.write_text(json.dumps(state, indent=1) + "\n")
        print(f"step {name}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
    return 0


def follow(args: argparse.Namespace) -> int:
    """Start the runner unless it runs, follow it for --wait seconds, copy the results out."""
    directory: Path = args.dir
    directory.mkdir(parents=True, exist_ok=True)
    pid_path, log_path = directory / "runner.pid", directory / "runner.log"
    if not _alive(pid_path):
        with open(log_path, "a") as log:
            argv = [sys.executable, __file__, "runner", "--dir", str(directory), "--steps", ",".join(args.steps),
                    "--seed", str(args.seed),
                    *(["--rehearse"] if args.rehearse else [])]
            proc = subprocess.Popen(argv, cwd=ROOT,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        pid_path.write_text(str(proc.pid))
        print(f"runner started (pid {proc.pid})", flush=True)
    deadline = time.time() + args.wait
    seen: dict[Path, int] = {}
    copy_to = args.copy_to or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    copied = time.time()
    while _alive(pid_path) and time.time() < deadline:
        _echo(directory, seen)
        time.sleep(5)
        if copy_to is not None and time.time() - copied > COPY_EVERY:  # (a call cut off still brings these back)
            _copy(directory, copy_to)
            copied = time.time()
    _echo(directory, seen)
    if copy_to is not None:
        _copy(directory, copy_to)
    state = json.loads((directory / "suite.json").read_text()) if (directory / "suite.json").exists() else {}
    if all(state.get(_key(name, args.seed), {}).get("done") for name in args.steps):
        print(f"suite done: {json.dumps(state)}")
        return 0
    print(f"suite not done ({json.dumps(state)}); the runner is {'running' if _alive(pid_path) else 'stopped'}: "
          "run the same command again")
    return 3


def _alive(pid_path: Path) -> bool:
    if not pid_path.exists():
        return False
    pid = int(pid_path.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our own child that ended) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _echo(directory: Path, seen: dict[Path, int]) -> None:
    """The logs' new lines since the last call."""
    for path in sorted(directory.glob("*.log")):
        size = path.stat().st_size
        if size > seen.get(path, 0):
            with open(path, errors="replace") as f:
                f.seek(seen.get(path, 0))
                for line in f.read().splitlines():
                    print(f"[{path.stem}] {line}")
            seen[path] = size
    sys.stdout.flush()


def _copy(directory: Path, target: Path) -> None:
    """Results, logs and best weights (not stores or checkpoints) under DIR, to the same places under
    target; a file unchanged since its last copy is not copied again."""
    for path in directory.rglob("*"):
        if (path.is_file() and (path.suffix in KEEP or path.name in KEEP_NAMES) and "replay.zarr" not in path.parts):
            dest = target / path.relative_to(directory)
            stat = path.stat()
            if dest.exists() and (dest.stat().st_size, dest.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns):
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)


def _key(step: str, seed: int) -> str:
    """A step's name in ``suite.json``: the Pong run of another seed than 1 is a step of its own."""
    return f"{step}-seed{seed}" if step == "pong" and seed != 1 else step


def _steps(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in STEPS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown step {', '.join(unknown) or '(none given)'}: choose from {', '.join(STEPS)}")
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("prepare", "run", "runner"))
    ap.add_argument("--dir", type=Path, default=Path("/tmp/gpu_suite"), help="where the suite's files go (default: %(default)s)")
    ap.add_argument("--wait", type=float, default=560.0, help="seconds to follow the runner before returning")
    ap.add_argument("--copy-to", type=Path, help="copy the results here (default: $OUT, when set)")
    ap.add_argument("--steps", type=_steps, default=list(STEPS),
                    help=f"the steps to take, comma-separated, in the suite's order (default: {','.join(STEPS)})")
    ap.add_argument("--seed", type=int, default=1, help="the Pong run's seed (default: %(default)s; its run "
                    "directory and curve are named by it)")
    ap.add_argument("--rehearse", action="store_true", help="on a CPU machine: small sizes, this environment, no TensorFlow")
    args = ap.parse_args()
    if args.command == "prepare":
        prepare()
        return 0
    if args.command == "runner":
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        args.dir.mkdir(parents=True, exist_ok=True)
        return runner(args.dir, args.rehearse, args.steps, args.seed)
    return follow(args)


if __name__ == "__main__":
    sys.exit(main())
