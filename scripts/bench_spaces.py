"""Action masks, MultiDiscrete / MultiBinary actions and Tuple observations side by side: rltrain PPO against
Stable-Baselines3 at their defaults.

    python scripts/bench_spaces.py                      # every row, 3 seeds each
    python scripts/bench_spaces.py --only masked --seeds 1 --steps 4000
    python scripts/bench_spaces.py --sb3-python /path/to/python   # SB3 + sb3-contrib in another environment

Rows (the envs are ``tests/helpers/space_envs.py``'s, so the repository goes on PYTHONPATH):
  multidiscrete  MultiDiscreteEnv(nvec=[4, 4, 4, 4]) (8 steps, best return 8): rltrain PPO vs SB3 PPO
  masked         MaskedEnv(n=12) (Discrete(12), a random legal subset per step, an illegal action ends the episode
                 at -10; 20 steps, best return 20; the mask from ``action_masks()``): rltrain PPO masked
                 (algo.action_mask=auto) vs unmasked (off) vs sb3-contrib MaskablePPO
  blackjack      Blackjack-v1 (a Tuple observation, which rltrain reads as it is; SB3 refuses Tuples, so its
                 PPO gets gymnasium's FlattenObservation): rltrain PPO vs SB3 PPO

Every run uses its library's defaults (rltrain's PPOSettings with 4 envs; SB3's PPO / MaskablePPO with one
env, n_steps 2048) and the same env-step budget. Each is a whole process timed by the CPU time it used (user +
system, from this process's children rusage). Return: the mean over seeds of the mean of ``--episodes``
deterministic evaluation episodes after training; train return: the mean over seeds of the last 100 training
episodes' mean return (how much the learner paid while learning). ratio: CPU seconds / the row's first entry's.
Runs of the same row alternate between the entries so they meet the same neighbours; timings are never asserted,
and only ratios within one run of this script mean anything on a shared machine.
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
PEER = REPO / "scripts" / "peers" / "sb3_spaces.py"
COMMON = ["logger=quiet", "eval.every_env_steps=0", "checkpoint.every_env_steps=0"]
ROWS = {
    # row -> (env-step budget, [(entry, rltrain overrides or None for the SB3 peer)])
    "multidiscrete": (20_000, [("rltrain PPO", ["env.id=tests.helpers.space_envs:MultiDiscreteEnv",
                                                 "+env.kwargs.nvec=[4,4,4,4]"]),
                               ("SB3 PPO", None)]),
    "masked": (20_000, [("rltrain PPO masked", ["env.id=tests.helpers.space_envs:MaskedEnv", "+env.kwargs.n=12",
                                                "+env.kwargs.source=method", "algo.action_mask=auto"]),
                        ("rltrain PPO unmasked", ["env.id=tests.helpers.space_envs:MaskedEnv", "+env.kwargs.n=12",
                                                  "+env.kwargs.source=method", "algo.action_mask=off"]),
                        ("sb3-contrib MaskablePPO", None)]),
    "blackjack": (20_000, [("rltrain PPO", ["env.id=Blackjack-v1"]), ("SB3 PPO (FlattenObservation)", None)]),
}


def timed(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``cmd`` to the end: (CPU s of the child process tree, the completed process)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=3600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def run_rltrain(overrides: list[str], seed: int, steps: int, episodes: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cpu, _ = timed([sys.executable, "-m", "rltrain", *overrides, *COMMON, f"seed={seed}",
                        f"total_env_steps={steps}", f"eval.episodes={episodes}", f"hydra.run.dir={tmp}/run"],
                       Path(tmp))
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    return {"cpu": cpu, "return": summary["final_eval_return"], "train": summary["train_return_last100"]}


def run_sb3(python: str, row: str, seed: int, steps: int, episodes: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cpu, proc = timed([python, str(PEER), row, str(seed), str(steps), str(episodes)], Path(tmp))
    return {"cpu": cpu, **json.loads(proc.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(ROWS), help="comma-separated rows: " + ", ".join(ROWS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="env steps per run (default: the row's)")
    parser.add_argument("--episodes", type=int, default=20, help="evaluation episodes per run")
    parser.add_argument("--sb3-python", default=sys.executable, help="a Python with stable-baselines3 and "
                        "sb3-contrib (skipped when it lacks them)")
    args = parser.parse_args()
    check = subprocess.run([args.sb3_python, "-c", "import stable_baselines3, sb3_contrib"], capture_output=True)
    have_sb3 = check.returncode == 0
    if not have_sb3:
        print(f"# {args.sb3_python} lacks stable-baselines3 / sb3-contrib: the SB3 entries are skipped")
    started = time.strftime("%Y-%m-%d %H:%M")
    lines = [f"# bench_spaces.py {started}, {args.seeds} seeds, {args.episodes} eval episodes; CPU s are medians, "
             "meaningful only as ratios within this run (the VM's speed drifts 2-5x)",
             "| row | entry | env steps | eval return | train return | CPU s | CPU ratio |",
             "|---|---|---|---|---|---|---|"]
    for row in args.only.split(","):
        budget, entries = ROWS[row]
        steps = args.steps or budget
        results: dict[str, list[dict]] = {name: [] for name, _ in entries}
        for seed in range(1, args.seeds + 1):
            for name, overrides in entries:
                if overrides is None and not have_sb3:
                    continue
                out = run_rltrain(overrides, seed, steps, args.episodes) if overrides is not None \
                    else run_sb3(args.sb3_python, row, seed, steps, args.episodes)
                results[name].append(out)
                print(f"# {row} {name} seed {seed}: eval {out['return']:.2f}, train {out['train']:.2f}, "
                      f"{out['cpu']:.1f} CPU s", flush=True)
        first = statistics.median(r["cpu"] for r in results[entries[0][0]])
        for name, runs in results.items():
            if not runs:
                lines.append(f"| {row} | {name} | {steps} | skipped | | | |")
                continue
            cpu = statistics.median(r["cpu"] for r in runs)
            ret = statistics.mean(r["return"] for r in runs)
            train = statistics.mean(r["train"] for r in runs)
            lines.append(f"| {row} | {name} | {steps} | {ret:.2f} | {train:.2f} | {cpu:.1f} | {cpu / first:.2f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
