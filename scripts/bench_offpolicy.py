"""Off-policy cost against Stable-Baselines3: rltrain DQN and SAC beside SB3's at the same settings.

    python scripts/bench_offpolicy.py --sb3-python /path/to/python   # every row, 3 seeds each
    python scripts/bench_offpolicy.py --only dqn --runs 5
    python scripts/bench_offpolicy.py --only sac-goal --goal-steps 5000

Each run is a whole process, rltrain's ``python -m rltrain ...`` and ``scripts/peers/sb3_offpolicy.py``,
timed by the CPU time the child used (user + system, from this process's children rusage) and wall time.
The two run alternately (rltrain, SB3, rltrain, SB3, ...) so that both meet the same neighbours; the table
gives the median of the paired runs, the ratio rltrain / SB3 of each pair (seed) and the returns (the mean of
the last 100 training episodes) of each seed. Only ratios from one run of this script mean anything on a
shared machine; timings are never asserted.

Rows (SB3's settings, spelled out in ``scripts/peers/sb3_offpolicy.py``; the same values for rltrain here):
  dqn       CartPole-v1, 1 env, 64x64 ReLU, lr 1e-4, buffer 100k, learning_starts 1000, batch 32, train_freq 4,
            1 gradient step, target copied every 10k steps, epsilon 1 -> 0.05 over 10% of the budget, Huber
            loss, grad-norm 10, gamma 0.99.
  sac       Pendulum-v1, 1 env, WIDTHxWIDTH ReLU (SB3's default 256), lr 1e-3 for actor, critics and alpha
            (rl-baselines3-zoo's Pendulum), buffer 1M, learning_starts 100, batch 256, tau 0.005, 1 update per
            step, alpha tuned from 1.0 toward -dim(A).
  sac-goal  bench_envs:PointReach (scripts/peers/bench_envs.py: a goal-conditioned Dict of three small vectors,
            sparse reward), 1 env, each library's SAC with nothing else set (SB3's MultiInputPolicy; rltrain's
            generic defaults, which are SB3's values: lr 3e-4, batch 256, 256x256, learning_starts 100).
rltrain writes what a user's run writes apart from TensorBoard (``logger=quiet``: metrics.csv, checkpoints,
summary) and runs its final evaluation (``eval.episodes`` below); SB3 writes and evaluates nothing.
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
PEERS = REPO / "scripts" / "peers"
PEER = PEERS / "sb3_offpolicy.py"

COMMON = ["experiment=none", "env.num_envs=1", "logger=quiet", "eval.every_env_steps=0", "eval.episodes=5",
          "checkpoint.every_env_steps=0"]
DQN_ARGS = ["algo=dqn", "env=cartpole", "algo.lr=1e-4", "algo.buffer_size=100000", "algo.learning_starts=1000",
            "algo.batch_size=32", "algo.train_frequency=4", "algo.gradient_steps=1",
            "algo.target_network_frequency=10000", "algo.tau=1.0", "algo.gamma=0.99", "algo.start_e=1.0",
            "algo.end_e=0.05", "algo.exploration_fraction=0.1", "algo.loss=huber", "algo.max_grad_norm=10",
            "model.hidden_sizes=[64,64]", "model.activation=relu"]
GOAL_ARGS = ["algo=sac", "env.id=bench_envs:PointReach"]


def sac_args(width: int) -> list[str]:
    return ["algo=sac", "env=pendulum", "algo.policy_lr=1e-3", "algo.q_lr=1e-3", "algo.buffer_size=1000000",
            "algo.learning_starts=100", "algo.batch_size=256", "algo.tau=0.005", "algo.gamma=0.99",
            "algo.train_frequency=1", "algo.gradient_steps=1", "algo.policy_frequency=1", "algo.alpha=1.0",
            "algo.autotune=true", f"model.hidden_sizes=[{width},{width}]", "model.activation=relu"]


def timed(cmd: list[str], *, cwd: Path, env: dict, timeout: float = 3600
          ) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run ``cmd`` to the end: (wall s, CPU s of the child process tree, the completed process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def path_env(*dirs: Path) -> dict:
    """This environment with ``dirs`` first on PYTHONPATH (this checkout's rltrain, bench_envs)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, dirs), os.environ.get("PYTHONPATH", "")])}


def run_rltrain(overrides: list[str], seed: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu, _ = timed([sys.executable, "-m", "rltrain", *overrides, *COMMON, f"seed={seed}",
                              f"total_env_steps={steps}", f"hydra.run.dir={tmp}/run"], cwd=Path(tmp),
                             env=path_env(REPO, PEERS))
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    return {"wall": wall, "cpu": cpu, "return": summary.get("train_return_last100")}


def run_sb3(python: str, case: str, seed: int, steps: int, *extra: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu, proc = timed([python, str(PEER), case, str(seed), str(steps), *extra], cwd=Path(tmp),
                                env=path_env(PEERS))
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
                "(pip install stable-baselines3 there, or pass --sb3-python)")
    return None


def median(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f}" if values else "-"


def returns(runs: list[dict]) -> str:
    """Each seed's return, then their mean."""
    rs = [r["return"] for r in runs if r["return"] is not None]
    return (", ".join(f"{r:.1f}" for r in rs) + f" (mean {statistics.mean(rs):.1f})") if rs else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="dqn,sac,sac-goal", help="comma-separated: dqn, sac, sac-goal")
    ap.add_argument("--runs", type=int, default=3, help="paired runs per row (seeds 1..N)")
    ap.add_argument("--dqn-steps", type=int, default=30_000)
    ap.add_argument("--sac-steps", type=int, default=6_000)
    ap.add_argument("--goal-steps", type=int, default=10_000)
    ap.add_argument("--sac-width", type=int, default=256, help="hidden width of SAC's actor and critics (Pendulum)")
    ap.add_argument("--sb3-python", default=sys.executable, help="a Python with stable-baselines3 installed")
    args = ap.parse_args()

    # rltrain's modules as an installed package has them, compiled (pip compiles at install, as SB3's are): a
    # checkout under PYTHONDONTWRITEBYTECODE would otherwise compile every module in every run
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "rltrain")], check=False)
    missing = sb3_missing(args.sb3_python)
    if missing:
        print(missing, file=sys.stderr)
    width = args.sac_width
    cases = {"dqn": ("DQN CartPole-v1, SB3 settings", DQN_ARGS, args.dqn_steps, ()),
             "sac": (f"SAC Pendulum-v1 {width}x{width}, SB3 settings", sac_args(width), args.sac_steps, (str(width),)),
             "sac-goal": ("SAC PointReach (Dict of 3 vectors), defaults", GOAL_ARGS, args.goal_steps, ())}
    rows = []
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        title, overrides, steps, extra = cases[name]
        ours, peer = [], []
        for seed in range(1, args.runs + 1):
            ours.append(run_rltrain(overrides, seed, steps))
            if not missing:
                peer.append(run_sb3(args.sb3_python, name, seed, steps, *extra))
            print(f"{title} seed {seed}: rltrain {ours[-1]['cpu']:.1f} s CPU, return {ours[-1]['return']}"
                  + (f"; SB3 {peer[-1]['cpu']:.1f} s CPU, return {peer[-1]['return']}" if peer else ""),
                  file=sys.stderr, flush=True)
        ratios = [o["cpu"] / p["cpu"] for o, p in zip(ours, peer, strict=False)]
        rows.append((f"{title}, {steps} steps", median([o["cpu"] for o in ours]), median([p["cpu"] for p in peer]),
                     median(ratios, 2), ", ".join(f"{r:.2f}" for r in ratios) or "-",
                     median([o["wall"] for o in ours]), median([p["wall"] for p in peer]), returns(ours),
                     returns(peer)))
    print(f"\n{args.runs} paired runs per row (seeds 1..{args.runs}), medians; CPU = the whole process (user + "
          "system); ratios are rltrain / SB3 per seed, from this one invocation\n")
    print("| row | rltrain CPU s | SB3 CPU s | CPU ratio | ratio per seed | rltrain wall s | SB3 wall s | "
          "rltrain return per seed | SB3 return per seed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
