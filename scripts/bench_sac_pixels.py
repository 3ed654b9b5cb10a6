"""SAC from pixels: training steps/s after ``learning_starts`` on 84x84 RGB frames, for one or more rltrain installs.

    python scripts/bench_sac_pixels.py                                     # this checkout, 2 runs
    python scripts/bench_sac_pixels.py --python new=.venv/bin/python --python old=/path/to/other/.venv/bin/python

Each run is a whole ``python -m rltrain`` process of the given interpreter (so another checkout's install is
measured by its own code) on ``bench_envs:PointMassPixels`` (scripts/peers/bench_envs.py: a point mass steered
from 84x84x3 uint8 frames, Box actions) with SAC's defaults (conf/algo/sac.yaml: batch 256, one update per
env step, 256x256 heads, Nature CNN) except a 10k replay (1M frames of 84x84x3 would need 21 GB) and
``learning_starts`` = the batch size, so updates begin where the measured span starts. Steps/s come from the
run's own ``metrics.csv`` (``time/wall``, the loop's training wall time) between the rows at ``learning_starts``
and at the end. Installs alternate run by run so that each meets the same neighbours; only ratios from one run
of this script mean anything on a shared machine (a VM's speed drifts 2-5x between runs). Timings are never
asserted.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEERS = REPO / "scripts" / "peers"


def run_once(python: str, *, learning_starts: int, steps: int, seed: int, tmp: Path) -> float:
    """Training steps/s of one run between env step ``learning_starts`` and ``learning_starts + steps``."""
    run_dir = tmp / f"run-{time.monotonic_ns()}"
    cmd = [python, "-m", "rltrain", "algo=sac", "env.id=bench_envs:PointMassPixels", "env.num_envs=1",
           f"total_env_steps={learning_starts + steps}", f"algo.learning_starts={learning_starts}",
           f"algo.batch_size={learning_starts}", "algo.buffer_size=10000",
           f"log.every_env_steps={math.gcd(learning_starts, steps)}",  # rows at learning_starts and at the end
           f"seed={seed}", "logger=quiet", "eval.every_env_steps=0", "eval.episodes=1",
           "checkpoint.every_env_steps=0", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(PEERS)}  # bench_envs importable; each install imports its own rltrain
    proc = subprocess.run(cmd, cwd=PEERS, capture_output=True, text=True, env=env, timeout=7200)
    if proc.returncode != 0:
        raise SystemExit(f"{python} failed: {proc.stderr.strip()[-1500:]}")
    with open(run_dir / "metrics.csv") as f:
        rows = {int(float(r["env_steps"])): float(r["time/wall"]) for r in csv.DictReader(f)}
    end = learning_starts + steps
    return steps / (rows[end] - rows[learning_starts])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", action="append", default=[],
                   help="NAME=INTERPRETER of an rltrain install (repeat; default: this one as 'this')")
    p.add_argument("--runs", type=int, default=2, help="runs per install (alternating)")
    p.add_argument("--steps", type=int, default=128, help="measured env steps (one update each) after warm-up")
    p.add_argument("--learning-starts", type=int, default=256, help="random warm-up steps; also the batch size")
    args = p.parse_args(argv)
    installs = dict(entry.split("=", 1) for entry in args.python) or {"this": sys.executable}
    sps: dict[str, list[float]] = {name: [] for name in installs}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for name, python in installs.items():
                sps[name].append(run_once(python, learning_starts=args.learning_starts, steps=args.steps,
                                          seed=i + 1, tmp=Path(tmp)))
                print(f"[{name}] run {i + 1}: {sps[name][-1]:.2f} steps/s", file=sys.stderr, flush=True)
    first = statistics.median(next(iter(sps.values())))
    print(f"| install | SAC steps/s after learning_starts (84x84x3, batch {args.learning_starts}), median of "
          f"{args.runs} | runs | ratio to {next(iter(sps))} |")
    print("|---|---:|---|---:|")
    for name, values in sps.items():
        med = statistics.median(values)
        print(f"| {name} | {med:.2f} | {', '.join(f'{v:.2f}' for v in values)} | x{med / first:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
