"""rltrain's defaults against Stable-Baselines3's on envs no preset was tuned for, same budget, same seeds.

    python scripts/bench_defaults.py                              # every row, 3 seeds, the table the docs quote (hours)
    python scripts/bench_defaults.py --envs taxi,frozenlake --seeds 1 --budget-scale 0.2
    python scripts/bench_defaults.py --list

rltrain runs as a user would: ``python -m rltrain env.id=<task> [algo=<algo>]``, nothing else tuned
(``experiment=auto``: a preset applies only where one is made for the task, and the row says so; the Acrobot
rows pass ``experiment=none``). SB3 runs ``PPO/DQN/SAC(policy, env)`` with its defaults
(``scripts/peers/sb3_defaults.py``; sb3-contrib is not used, so the PPO-LSTM row's SB3 column is SB3's
feed-forward PPO). Both evaluate 10 episodes deterministic and 10 stochastic at the end. Each run is a whole
process; CPU seconds are the child's user + system time (rusage), so start-up, training and evaluation all
count. The two alternate per seed so that both meet the same neighbours on a shared machine; only ratios
from one run of this script mean anything (a VM's speed drifts between runs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEERS = REPO / "scripts" / "peers"
EPISODES = 10


@dataclass(frozen=True)
class Row:
    name: str
    algo: str
    env: str  # a Gymnasium id, or bench_envs:<factory> (scripts/peers/bench_envs.py)
    steps: int
    kwargs: dict = field(default_factory=dict)
    extra: tuple[str, ...] = ()  # rltrain overrides beyond algo / env (what a user must say for this env)
    note: str = ""


ROWS = [
    Row("taxi", "ppo", "Taxi-v4", 100_000),
    Row("frozenlake", "ppo", "FrozenLake-v1", 50_000, note="slippery"),
    Row("minigrid-empty", "ppo", "bench_envs:minigrid_image", 50_000, {"name": "MiniGrid-Empty-8x8-v0"}),
    Row("doorkey", "ppo", "bench_envs:minigrid_image", 75_000, {"name": "MiniGrid-DoorKey-5x5-v0"}),
    Row("doorkey-lstm", "ppo", "bench_envs:minigrid_image", 75_000, {"name": "MiniGrid-DoorKey-5x5-v0"},
        ("model.core=lstm",), note="SB3 column: feed-forward PPO"),
    Row("dict-goal", "ppo", "bench_envs:GoalDict", 50_000, note="40x40 image + position"),
    Row("mountaincar-sac", "sac", "MountainCarContinuous-v0", 20_000, note="rltrain: its preset applies"),
    Row("acrobot-ppo", "ppo", "Acrobot-v1", 100_000, extra=("experiment=none",)),
    Row("acrobot-dqn", "dqn", "Acrobot-v1", 100_000, extra=("experiment=none",)),
]


def timed(cmd: list[str], *, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=4 * 3600,
                          env={**os.environ, "PYTHONPATH": str(PEERS)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def run_rltrain(row: Row, steps: int, seed: int, tmp: Path) -> dict:
    run_dir = tmp / f"{row.name}-{seed}"
    cmd = [sys.executable, "-m", "rltrain", f"algo={row.algo}", f"env.id={row.env}", f"total_env_steps={steps}",
           f"seed={seed}", "logger=quiet", f"eval.episodes={EPISODES}", "eval.every_env_steps=0",
           "checkpoint.every_env_steps=0", f"hydra.run.dir={run_dir}", *row.extra]
    cmd += [f"+env.kwargs.{k}={v}" for k, v in row.kwargs.items()]
    cpu, proc = timed(cmd, cwd=PEERS)
    if proc.returncode != 0:
        raise SystemExit(f"rltrain failed on {row.name}: {proc.stderr.strip()[-800:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"deterministic": summary["final_eval_return_deterministic"],
            "stochastic": summary["final_eval_return_stochastic"], "cpu": cpu}


def run_sb3(row: Row, steps: int, seed: int) -> dict:
    cmd = [sys.executable, str(PEERS / "sb3_defaults.py"), "--algo", row.algo, "--env", row.env, "--kwargs",
           json.dumps(row.kwargs), "--steps", str(steps), "--seed", str(seed), "--episodes", str(EPISODES)]
    cpu, proc = timed(cmd, cwd=PEERS)
    if proc.returncode != 0:
        raise SystemExit(f"SB3 failed on {row.name}: {proc.stderr.strip()[-800:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "cpu": cpu}


def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:8.2f} ±{statistics.pstdev(values):5.2f}" if len(values) > 1 else f"{mean:8.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", default=",".join(r.name for r in ROWS), help="comma-separated row names")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="multiply every row's env-step budget")
    ap.add_argument("--list", action="store_true", help="print the rows and exit")
    ap.add_argument("--log", type=Path, help="append one JSON line per finished run (kept if the script is cut off)")
    args = ap.parse_args()
    if args.list:
        for r in ROWS:
            print(f"{r.name:16} {r.algo:4} {r.env} {r.kwargs or ''} {r.steps:,} steps {' '.join(r.extra)} {r.note}")
        return
    wanted = args.envs.split(",")
    unknown = [w for w in wanted if w not in {r.name for r in ROWS}]
    if unknown:
        raise SystemExit(f"unknown --envs {unknown}; rows: {', '.join(r.name for r in ROWS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{'env':16} {'algo':4} {'steps':>8}  {'rltrain det':>15} {'rltrain stoch':>15} {'SB3 det':>15} "
          f"{'SB3 stoch':>15} {'CPU s rl':>9} {'CPU s SB3':>9} {'ratio':>6}", flush=True)
    totals = [0.0, 0.0]
    with tempfile.TemporaryDirectory(prefix="bench-defaults-") as tmp:
        for row in [r for r in ROWS if r.name in wanted]:
            steps = max(1, int(row.steps * args.budget_scale))
            ours, theirs = [], []
            for seed in seeds:  # alternate: both meet the same neighbours
                ours.append(run_rltrain(row, steps, seed, Path(tmp)))
                theirs.append(run_sb3(row, steps, seed))
                if args.log:
                    with args.log.open("a") as log:
                        for who, res in (("rltrain", ours[-1]), ("sb3", theirs[-1])):
                            log.write(json.dumps({"row": row.name, "steps": steps, "seed": seed, "who": who,
                                                  **res}) + "\n")
            cpu = (sum(o["cpu"] for o in ours), sum(t["cpu"] for t in theirs))
            totals = [totals[0] + cpu[0], totals[1] + cpu[1]]
            print(f"{row.name:16} {row.algo:4} {steps:8,}  {spread([o['deterministic'] for o in ours]):>15} "
                  f"{spread([o['stochastic'] for o in ours]):>15} {spread([t['deterministic'] for t in theirs]):>15} "
                  f"{spread([t['stochastic'] for t in theirs]):>15} {cpu[0]:9.1f} {cpu[1]:9.1f} "
                  f"{cpu[0] / cpu[1]:6.2f}  {row.note}", flush=True)
    print(f"{'total':16} {'':4} {'':8}  {'':15} {'':15} {'':15} {'':15} {totals[0]:9.1f} {totals[1]:9.1f} "
          f"{totals[0] / max(totals[1], 1e-9):6.2f}")
    print("returns: mean ± std over seeds of each seed's 10-episode mean; CPU s: summed over seeds, whole processes")


if __name__ == "__main__":
    main()
