#!/usr/bin/env python
"""Throughput of trainer=distributed_simulator: SPS at world_size 1 and 2 with equal work per rank.

Each rank steps ``--num-envs`` envs for ``--steps-per-rank`` env steps, so W ranks do W times the work;
perfect scaling is an SPS ratio of W. SPS is measured inside the training loop (rank 0's summary: all
ranks' steps over the loop's wall time), so process start-up is excluded. Usage:

    python scripts/bench_distributed.py [--steps-per-rank 40960] [--worlds 1 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run(world: int, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "rltrain", "trainer=distributed_simulator", f"trainer.world_size={world}",
               f"env.num_envs={args.num_envs}", f"algo.rollout_len={args.rollout_len}",
               f"total_env_steps={world * args.steps_per_rank}", "eval.every_env_steps=0", "eval.episodes=1",
               "checkpoint.every_env_steps=0", "logger.progress=off", "device=cpu", f"hydra.run.dir={tmp}/run"]
        subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        return json.loads((Path(tmp) / "run" / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps-per-rank", type=int, default=40960)
    ap.add_argument("--num-envs", type=int, default=4)
    ap.add_argument("--rollout-len", type=int, default=128)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}  per rank: {args.num_envs} envs x "
          f"{args.rollout_len} steps, {args.steps_per_rank} env steps")
    best: dict[int, float] = {}
    for world in args.worlds:
        for _ in range(args.repeats):
            s = run(world, args)
            best[world] = max(best.get(world, 0.0), float(s["sps"]))
            ranks = ", ".join(f"{v:,.0f}" for v in s["rank_sps"])
            print(f"world_size={world}: {s['sps']:,.0f} SPS total (per rank: {ranks}); backend={s['backend']}")
    base = best.get(1)
    if base:
        for world, sps in best.items():
            print(f"scaling world_size={world} / world_size=1: {sps / base:.2f}x (ideal {world}x)")


if __name__ == "__main__":
    main()
