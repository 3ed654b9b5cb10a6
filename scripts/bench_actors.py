"""Throughput of ``trainer=subprocess_actors`` with 1, 2 and 4 actors, and the scaling ratios.

Two environments: CartPole-v1 (cheap steps: the learner and the IPC dominate) and ``BusyCartPole``, the
same env plus a fixed CPU cost per step (a busy loop, 200 us by default) standing in for a heavy
simulator, where actors are the bottleneck and should scale with the cores. The learner batch is fixed
(``batch_rollouts``) so every configuration does the same learning work per env step.

    python scripts/bench_actors.py                      # impala, both envs, 1/2/4 actors
    python scripts/bench_actors.py --algo ppo --actors 1 2 --steps 20000

``bench_throughput.py`` can import ``bench(...)`` and print its rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]


class BusyCartPole(gym.Wrapper):
    """CartPole-v1 that burns ``cost_us`` microseconds of CPU per step (not sleep: it holds a core)."""

    def __init__(self, cost_us: float = 200.0):
        super().__init__(gym.make("CartPole-v1"))
        self.cost_s = cost_us * 1e-6

    def step(self, action):
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        return self.env.step(action)


ENVS = {"cartpole": ("CartPole-v1", {}), "busy": ("bench_actors:BusyCartPole", {"cost_us": 200.0})}


def run_one(algo: str, env: str, actors: int, steps: int, *, batch_rollouts: int, envs_per_actor: int,
            start_method: str = "fork") -> dict:
    """Train ``steps`` env steps; returns SPS over the training loop (actors started, final eval excluded)."""
    from hydra import compose, initialize_config_dir

    from rltrain.cli.build import run

    env_id, kwargs = ENVS[env]
    overrides = [f"algo={algo}", "trainer=subprocess_actors", f"trainer.num_actors={actors}",
                 f"trainer.batch_rollouts={batch_rollouts}", f"trainer.start_method={start_method}",
                 f"env.id={env_id}", f"env.num_envs={envs_per_actor}", f"total_env_steps={steps}",
                 "eval.every_env_steps=0", "eval.episodes=1", "checkpoint.every_env_steps=0",
                 "log.every_env_steps=0", "logger.progress=off", "seed=1"]
    overrides += [f"+env.kwargs.{k}={v}" for k, v in kwargs.items()]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with initialize_config_dir(config_dir=str(REPO / "rltrain" / "conf"), version_base="1.3"):
            cfg = compose(config_name="train", overrides=overrides)
        summary = run(cfg, Path(tmp))
        wall = time.perf_counter() - t0
    return {"algo": algo, "env": env, "actors": actors, "steps": summary["total_env_steps"],
            "sps": summary["sps"], "wall_s": wall, "status": summary["status"]}


def bench(algo: str = "impala", envs: tuple[str, ...] = ("cartpole", "busy"), actors: tuple[int, ...] = (1, 2, 4),
          steps: dict[str, int] | None = None, batch_rollouts: int = 4, envs_per_actor: int = 4) -> list[dict]:
    steps = steps or {"cartpole": 60_000, "busy": 20_000}
    rows = []
    for env in envs:
        base = None
        for a in actors:
            row = run_one(algo, env, a, steps[env], batch_rollouts=batch_rollouts, envs_per_actor=envs_per_actor)
            base = base or row["sps"]
            row["scaling_vs_1"] = row["sps"] / base
            rows.append(row)
            print(f"{algo:7s} {env:9s} actors={a}  {row['sps']:9,.0f} sps  x{row['scaling_vs_1']:.2f} vs 1 actor  "
                  f"({row['steps']} steps, {row['wall_s']:.1f}s wall)", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", default="impala")
    p.add_argument("--envs", nargs="+", default=["cartpole", "busy"], choices=list(ENVS))
    p.add_argument("--actors", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=None, help="env steps per run (default: 60k cartpole, 20k busy)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args()
    steps = {e: args.steps for e in ENVS} if args.steps else None
    print(f"# {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} (a shared machine makes this noisy)")
    rows = bench(args.algo, tuple(args.envs), tuple(args.actors), steps)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
