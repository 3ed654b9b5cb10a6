"""Off-policy cost against Stable-Baselines3: rltrain DQN and SAC beside SB3's at the same settings.

    python scripts/bench_offpolicy.py                    # DQN (CartPole-v1, 30k steps) and SAC (Pendulum-v1)
    python scripts/bench_offpolicy.py --only dqn --runs 5
    python scripts/bench_offpolicy.py --sb3-python /path/to/python   # SB3 installed in another environment

Each run is a whole process, rltrain's ``python -m rltrain ...`` and ``scripts/peers/sb3_offpolicy.py``,
timed by the CPU time the child used (user + system, from this process's children rusage) and wall time.
The two run alternately (rltrain, SB3, rltrain, SB3, ...) so that both meet the same neighbours; the
table gives the median of the paired runs and the ratio rltrain / SB3 (issue 23 asks for <= 0.6).

Settings (SB3's, spelled out in ``scripts/peers/sb3_offpolicy.py``; the same values for rltrain below):
  DQN  CartPole-v1, 1 env, 64x64 ReLU, lr 1e-4, buffer 100k, learning_starts 1000, batch 32, train_freq 4,
       1 gradient step, target copied every 10k steps, epsilon 1 -> 0.05 over 10% of the budget, Huber
       loss, grad-norm 10, gamma 0.99.
  SAC  Pendulum-v1, 1 env, WIDTHxWIDTH ReLU (SB3's default 256), lr 1e-3 for actor, critics and alpha
       (rl-baselines3-zoo's Pendulum), buffer 1M, learning_starts 100, batch 256, tau 0.005, 1 update per
       step, alpha tuned from 1.0 toward -dim(A).
rltrain writes what a user's run writes apart from TensorBoard (``logger=quiet``: metrics.csv, checkpoints,
summary) and runs its final evaluation (``eval.episodes`` below); SB3 writes and evaluates nothing. Timings
are never asserted; only ratios from one run of this script mean anything on a shared machine.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEER = REPO / "scripts" / "peers" / "sb3_offpolicy.py"

COMMON = ["experiment=none", "env.num_envs=1", "logger=quiet", "eval.every_env_steps=0", "eval.episodes=5",
          "checkpoint.every_env_steps=0"]
DQN_ARGS = ["algo=dqn", "env=cartpole", "algo.lr=1e-4", "algo.buffer_size=100000", "algo.learning_starts=1000",
            "algo.batch_size=32", "algo.train_frequency=4", "algo.gradient_steps=1",
            "algo.target_network_frequency=10000", "algo.tau=1.0", "algo.gamma=0.99", "algo.start_e=1.0",
            "algo.end_e=0.05", "algo.exploration_fraction=0.1", "algo.loss=huber", "algo.max_grad_norm=10",
            "model.hidden_sizes=[64,64]", "model.activation=relu"]


def sac_args(width: int) -> list[str]:
    return ["algo=sac", "env=pendulum", "algo.policy_lr=1e-3", "algo.q_lr=1e-3", "algo.buffer_size=1000000",
            "algo.learning_starts=100", "algo.batch_size=256", "algo.tau=0.005", "algo.gamma=0.99",
            "algo.train_frequency=1", "algo.gradient_steps=1", "algo.policy_frequency=1", "algo.alpha=1.0",
            "algo.autotune=true", f"model.hidden_sizes=[{width},{width}]", "model.activation=relu"]


def timed(cmd: list[str], *, cwd: Path, env: dict | None = None) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run ``cmd`` to the end: (wall s, CPU s of the child process tree, the completed process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def run_rltrain(overrides: list[str], seed: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        wall, cpu, _ = timed([sys.executable, "-m", "rltrain", *overrides, *COMMON, f"seed={seed}",
                              f"total_env_steps={steps}", f"hydra.run.dir={tmp}/run"], cwd=Path(tmp), env=env)
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    return {"wall": wall, "cpu": cpu, "return": summary.get("train_return_last100")}


def run_sb3(python: str, algo: str, seed: int, steps: int, *extra: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu, proc = timed([python, str(PEER), algo, str(seed), str(steps), *extra], cwd=Path(tmp))
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall": wall, "cpu": cpu, "return": out["train_return_last100"]}


def sb3_missing(python: str) -> str | None:
    """Why SB3 cannot run under ``python`` (one line), or None."""
    try:
        probe = subprocess.run([python, "-c", "import stable_baselines3, torch"], capture_output=True, text=True)
    except OSError:  # no such interpreter
        probe = None
    if probe is None or probe.returncode != 0:
        return (f"stable-baselines3 is not importable by {python}: the SB3 side is skipped "
                "(pip install --no-deps stable-baselines3, or pass --sb3-python)")
    return None


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="dqn,sac", help="comma-separated: dqn, sac")
    ap.add_argument("--runs", type=int, default=3, help="paired runs per algorithm (seeds 1..N)")
    ap.add_argument("--dqn-steps", type=int, default=30_000)
    ap.add_argument("--sac-steps", type=int, default=5_000)
    ap.add_argument("--sac-width", type=int, default=256, help="hidden width of SAC's actor and critics")
    ap.add_argument("--sb3-python", default=sys.executable, help="a Python with stable-baselines3 installed")
    args = ap.parse_args()

    missing = sb3_missing(args.sb3_python)
    if missing:
        print(missing, file=sys.stderr)
        print(f"SB3 side skipped: {missing}")
    cases = {"dqn": ("DQN CartPole-v1", DQN_ARGS, args.dqn_steps, ()),
             "sac": (f"SAC Pendulum-v1 {args.sac_width}x{args.sac_width}", sac_args(args.sac_width), args.sac_steps,
                     (str(args.sac_width),))}
    rows = []
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        title, overrides, steps, extra = cases[name]
        ours, peer = [], []
        for seed in range(1, args.runs + 1):
            ours.append(run_rltrain(overrides, seed, steps))
            if not missing:
                peer.append(run_sb3(args.sb3_python, name, seed, steps, *extra))
            print(f"{title} seed {seed}: rltrain {ours[-1]['cpu']:.1f} s CPU"
                  + (f", SB3 {peer[-1]['cpu']:.1f} s CPU" if peer else ""), file=sys.stderr, flush=True)
        cpu_ratio = [o["cpu"] / p["cpu"] for o, p in zip(ours, peer, strict=False)]
        rows.append((f"{title}, {steps} steps", fmt([o["cpu"] for o in ours]), fmt([p["cpu"] for p in peer]),
                     f"{statistics.median(cpu_ratio):.2f}" if cpu_ratio else "-",
                     fmt([o["wall"] for o in ours]), fmt([p["wall"] for p in peer]),
                     fmt([o["return"] for o in ours if o["return"] is not None]),
                     fmt([p["return"] for p in peer if p["return"] is not None]),
                     ", ".join(f"{r:.2f}" for r in cpu_ratio)))
    print(f"\n{args.runs} paired runs, medians; CPU = the whole process (user + system)\n")
    print("| case | rltrain CPU s | SB3 CPU s | CPU ratio | rltrain wall s | SB3 wall s | rltrain return | "
          "SB3 return | ratios per pair |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
