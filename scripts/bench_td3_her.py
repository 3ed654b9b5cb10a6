"""Algorithms against their peers, same settings, one script run: final return / success rate and CPU.

    python scripts/bench_td3_her.py --sb3-python /path/to/python   # every row, 3 seeds each
    python scripts/bench_td3_her.py --only td3-pendulum --runs 2

Each run is a whole process (``python -m rltrain ...`` and ``scripts/peers/sb3_algorithms.py``), timed by the
CPU time the child used (user + system, from this process's children rusage) and wall time; the two alternate
per seed so that both meet the same neighbours. The table gives, per row, the medians of the paired runs, the
CPU ratio rltrain / peer of each pair, each seed's final evaluation (10 deterministic episodes: the mean return,
and the success rate on goal tasks) and its mean return over the last 100 training episodes (both libraries' own
bookkeeping; on Pendulum at rl-zoo3's settings half of those 100 are the 10k random warm-up steps). Only ratios
from one run of this script mean anything on a shared machine; timings are never asserted.

Rows (each a function below returning its ``Row``s, so rows of other algorithms go beside them):
  td3-pendulum  TD3 on Pendulum-v1 at rl-baselines3-zoo's settings (rltrain's ``experiment=td3_pendulum``, the
                same values spelled out for SB3): 20k steps, 10k random, noise 0.1, gamma 0.98, 400x300.
  her-sac       SAC with hindsight relabelling (future, k = 4) on bench_envs:PointReach (scripts/peers/
                bench_envs.py: sparse reward, 50-step episodes), each library's SAC defaults otherwise.
The MuJoCo row at rl-zoo3's settings (1M steps) is not in this script: about a day of CPU per seed here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_offpolicy import PEERS, REPO, median, path_env, sb3_missing, timed  # noqa: E402

PEER = PEERS / "sb3_algorithms.py"
EVAL_EPISODES = 10  # the final evaluation of both sides (the peer script's EVAL_EPISODES)
COMMON = ["env.num_envs=1", "logger=quiet", "eval.every_env_steps=0", f"eval.episodes={EVAL_EPISODES}",
          "checkpoint.every_env_steps=0"]


@dataclass
class Row:
    name: str  # the --only key and the peer script's case
    title: str
    overrides: list[str]  # rltrain's side
    steps: int
    goal: bool = False  # a goal task: success rates beside the returns
    peer_args: list[str] = field(default_factory=list)  # the peer script's arguments after SEED STEPS


def td3_rows(args) -> list[Row]:
    starts = args.td3_learning_starts  # rl-zoo3's 10k; lower only for a quick run of the script
    return [Row("td3-pendulum", "TD3 Pendulum-v1, rl-zoo3 settings", ["experiment=td3_pendulum",
                                                                      f"algo.learning_starts={starts}"],
                args.td3_steps, peer_args=[str(starts)])]


def her_rows(args) -> list[Row]:
    return [Row("her-sac", "SAC + HER PointReach (sparse), defaults",
                ["experiment=none", "algo=sac", "env.id=bench_envs:PointReach", "algo.her=true"], args.her_steps,
                goal=True)]


ROW_GROUPS = (td3_rows, her_rows)


def run_rltrain(row: Row, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu, _ = timed([sys.executable, "-m", "rltrain", *row.overrides, *COMMON, f"seed={seed}",
                              f"total_env_steps={row.steps}", f"hydra.run.dir={tmp}/run"], cwd=Path(tmp),
                             env=path_env(REPO, PEERS))
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    return {"wall": wall, "cpu": cpu, "return": summary.get("train_return_last100"),
            "success": summary.get("train_success_rate_last100"), "eval": summary.get("final_eval_return"),
            "eval_success": summary.get("final_eval_success_rate")}


def run_peer(python: str, row: Row, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu, proc = timed([python, str(PEER), row.name, str(seed), str(row.steps), *row.peer_args],
                                cwd=Path(tmp), env=path_env(PEERS))
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall": wall, "cpu": cpu, "return": out["train_return_last100"],
            "success": out["train_success_rate_last100"], "eval": out["final_eval_return"],
            "eval_success": out["final_eval_success_rate"]}


def per_seed(runs: list[dict], key: str, fmt: str) -> str:
    """Each seed's value, then their mean."""
    values = [r[key] for r in runs if r[key] is not None]
    return (", ".join(format(v, fmt) for v in values) + f" (mean {format(statistics.mean(values), fmt)})") \
        if values else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated row names (default: every row)")
    ap.add_argument("--runs", type=int, default=3, help="paired runs per row (seeds 1..N)")
    ap.add_argument("--td3-steps", type=int, default=20_000, help="rl-zoo3's Pendulum budget")
    ap.add_argument("--td3-learning-starts", type=int, default=10_000, help="rl-zoo3's random steps on Pendulum")
    ap.add_argument("--her-steps", type=int, default=8_000)
    ap.add_argument("--sb3-python", default=sys.executable, help="a Python with stable-baselines3 installed")
    args = ap.parse_args()

    rows = [row for group in ROW_GROUPS for row in group(args)]
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(only) - {r.name for r in rows})
    if unknown:
        sys.exit(f"bench_td3_her.py: unknown --only {unknown} (rows: {', '.join(r.name for r in rows)})")
    rows = [r for r in rows if not only or r.name in only]
    # rltrain's modules compiled, as an installed package has them (see bench_offpolicy.py)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "rltrain")], check=False)
    missing = sb3_missing(args.sb3_python)
    if missing:
        print(f"SB3 side skipped: {missing}")
    table = []
    for row in rows:
        ours, peer = [], []
        for seed in range(1, args.runs + 1):
            ours.append(run_rltrain(row, seed))
            if not missing:
                peer.append(run_peer(args.sb3_python, row, seed))
            for side, res in (("rltrain", ours[-1]), ("SB3", peer[-1] if peer else None)):
                if res is not None:
                    print(f"{row.title} seed {seed}: {side} {res['cpu']:.1f} s CPU, final eval {res['eval']} "
                          f"(success {res['eval_success']}), last 100 training episodes {res['return']}",
                          file=sys.stderr, flush=True)
        ratios = [o["cpu"] / p["cpu"] for o, p in zip(ours, peer, strict=False)]
        success = (per_seed(ours, "eval_success", ".2f"), per_seed(peer, "eval_success", ".2f")) if row.goal \
            else ("-", "-")
        table.append((f"{row.title}, {row.steps} steps", median([o["cpu"] for o in ours]),
                      median([p["cpu"] for p in peer]), median(ratios, 2),
                      ", ".join(f"{r:.2f}" for r in ratios) or "-", per_seed(ours, "eval", ".1f"),
                      per_seed(peer, "eval", ".1f"), *success, per_seed(ours, "return", ".1f"),
                      per_seed(peer, "return", ".1f")))
    print(f"\n{args.runs} paired runs per row (seeds 1..{args.runs}), medians; CPU = the whole process (user + "
          "system, its final evaluation included); ratios are rltrain / SB3 per seed, from this one invocation; "
          f"final eval: {EVAL_EPISODES} deterministic episodes; last 100: the training episodes' mean return\n")
    print("| row | rltrain CPU s | SB3 CPU s | CPU ratio | ratio per seed | rltrain final eval | SB3 final eval | "
          "rltrain eval success | SB3 eval success | rltrain last 100 | SB3 last 100 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for cells in table:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
