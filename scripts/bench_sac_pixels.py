"""SAC from pixels: training steps/s after ``learning_starts`` on 84x84 RGB frames, for one or more rltrain installs.

    python scripts/bench_sac_pixels.py                                     # this checkout, 2 runs
    python scripts/bench_sac_pixels.py --python new=.venv/bin/python --python old=/path/to/other/.venv/bin/python

Each run is a whole ``python -m rltrain`` process of the given interpreter (so another checkout's install is
measured by its own code) on ``bench_envs:PointMassPixels`` (scripts/peers/bench_envs.py: a point mass steered
from 84x84x3 uint8 frames, Box actions) with SAC's defaults (SACSettings: batch 256, one update per
env step, 256x256 heads, Nature CNN) except a 10k replay (1M frames of 84x84x3 would need 21 GB) and
``learning_starts`` = the batch size, so updates begin where the measured span starts. Two rates per install:
wall steps/s from the run's own ``metrics.csv`` (``time/wall``, the loop's training wall time) between the rows
at ``learning_starts`` and at the end; and steps per CPU second, from the CPU time of that run beyond that of a
run stopped 8 steps after ``learning_starts`` (CPU time barely moves with the neighbours' load; wall time
does). Installs alternate run by run so that each meets the same neighbours; only ratios from one run of this
script mean anything on a shared machine (a VM's speed drifts 2-5x between runs). Timings are never asserted.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEERS = REPO / "scripts" / "peers"
SHORT = 8  # steps past learning_starts of the run whose CPU time is subtracted (a run must take one update)


def run_once(python: str, *, learning_starts: int, steps: int, seed: int, tmp: Path) -> tuple[float, float]:
    """One whole run to ``learning_starts + steps`` env steps: (training wall steps/s between env step
    ``learning_starts`` and the end, from its metrics.csv; the CPU seconds the process used)."""
    run_dir = tmp / f"run-{time.monotonic_ns()}"
    cmd = [python, "-m", "rltrain", "algo=sac", "env.id=bench_envs:PointMassPixels", "env.num_envs=1",
           f"total_env_steps={learning_starts + steps}", f"algo.learning_starts={learning_starts}",
           f"algo.batch_size={learning_starts}", "algo.buffer_size=10000",
           f"log.every_env_steps={math.gcd(learning_starts, steps)}",  # rows at learning_starts and at the end
           f"seed={seed}", "logger=quiet", "eval.every_env_steps=0", "eval.episodes=1",
           "checkpoint.every_env_steps=0", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(PEERS)}  # bench_envs importable; each install imports its own rltrain
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=PEERS, capture_output=True, text=True, env=env, timeout=7200)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{python} failed: {proc.stderr.strip()[-1500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(run_dir / "metrics.csv") as f:
        rows = {int(float(r["env_steps"])): float(r["time/wall"]) for r in csv.DictReader(f)}
    return steps / (rows[learning_starts + steps] - rows[learning_starts]), cpu


def measure(python: str, *, learning_starts: int, steps: int, seed: int, tmp: Path) -> tuple[float, float]:
    """(wall steps/s, CPU steps/s) after ``learning_starts``. The CPU rate: the CPU seconds a run to
    ``learning_starts + steps`` used beyond a run to ``learning_starts + SHORT`` (start-up, warm-up and the final
    evaluation cancel), over the ``steps - SHORT`` steps between: CPU time hardly moves with the neighbours'
    load, wall time does."""
    wall, cpu_long = run_once(python, learning_starts=learning_starts, steps=steps, seed=seed, tmp=tmp)
    _, cpu_short = run_once(python, learning_starts=learning_starts, steps=SHORT, seed=seed, tmp=tmp)
    return wall, (steps - SHORT) / max(cpu_long - cpu_short, 1e-9)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", action="append", default=[],
                   help="NAME=INTERPRETER of an rltrain install (repeat; default: this one as 'this')")
    p.add_argument("--runs", type=int, default=2, help="runs per install (alternating)")
    p.add_argument("--steps", type=int, default=128, help="measured env steps (one update each) after warm-up")
    p.add_argument("--learning-starts", type=int, default=256, help="random warm-up steps; also the batch size")
    args = p.parse_args(argv)
    if args.steps <= SHORT or args.steps % SHORT or args.learning_starts % SHORT:
        p.error(f"--steps (> {SHORT}) and --learning-starts must be multiples of {SHORT}")
    installs = dict(entry.split("=", 1) for entry in args.python) or {"this": sys.executable}
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in installs}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for name, python in installs.items():
                rates[name].append(measure(python, learning_starts=args.learning_starts, steps=args.steps,
                                           seed=i + 1, tmp=Path(tmp)))
                wall, cpu = rates[name][-1]
                print(f"[{name}] run {i + 1}: {wall:.2f} steps/s wall, {cpu:.2f} per CPU second", file=sys.stderr,
                      flush=True)
    base = next(iter(rates))
    med = {name: [statistics.median(r[k] for r in runs) for k in (0, 1)] for name, runs in rates.items()}
    print(f"SAC on 84x84x3 frames (bench_envs:PointMassPixels), batch {args.learning_starts}, {args.steps} updates "
          f"after learning_starts; median of {args.runs} run(s)")
    print(f"| install | steps/s (wall) | steps per CPU second | runs (wall / CPU) | ratio to {base} (wall / CPU) |")
    print("|---|---:|---:|---|---|")
    for name, runs in rates.items():
        w, c = med[name]
        each = ", ".join(f"{a:.2f} / {b:.2f}" for a, b in runs)
        print(f"| {name} | {w:.2f} | {c:.2f} | {each} | x{w / med[base][0]:.2f} / x{c / med[base][1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
