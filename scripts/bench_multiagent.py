"""rltrain's IPPO and MAPPO against skrl's on PettingZoo envs, same env-step budget, same seeds, one table.

    python scripts/bench_multiagent.py                           # both envs, 3 seeds, the README's table (long)
    python scripts/bench_multiagent.py --envs spread --seeds 1 --budget-scale 0.2

- ``spread``: MPE ``simple_spread_v3`` (mpe2; 3 agents, 25 steps, discrete actions): the final return is the mean
  over agents of each agent's return, 10 deterministic episodes.
- ``c4``: PettingZoo's ``connect_four_v3``: rltrain learns by self-play (``algo.self_play=true``: a pool of its
  past versions, seats alternating, action masks); skrl has neither masks nor self-play, so its two players
  learn against each other through ``turn_based_aec_to_parallel`` (scripts/peers/skrl_multiagent.py). The final
  return is the learner's against uniformly random legal moves over 10 games, seats alternating (win 1, loss -1).

rltrain runs as a user would (``python -m rltrain env.id=... algo=ippo|mappo``, its generic defaults, the envs'
kwargs); skrl as scripts/peers/skrl_multiagent.py writes it (skrl's defaults, 64x64 tanh networks like
rltrain's). BenchMARL is left out: installing it replaces the peers' torch with another release and its CUDA
wheels. Each run is a whole process; CPU seconds are its user + system time (rusage), so start-up, training and
evaluation all count. Tools alternate per seed; only ratios from one run of this script mean anything.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEERS = REPO / "scripts" / "peers"
PEERS_PYTHON = os.environ.get("PEERS_PYTHON", "/work/peers-venv/bin/python")
EPISODES = 10

ENVS = {
    "spread": {"steps": 100_000, "args": ["env.id=mpe2.simple_spread_v3:parallel_env", "+env.kwargs.N=3",
                                          "+env.kwargs.max_cycles=25", "+env.kwargs.continuous_actions=false"]},
    "c4": {"steps": 12 * 4096, "args": ["env.id=pettingzoo.classic.connect_four_v3:env", "algo.self_play=true"]},
}
# rltrain's self-play learns in whole updates of 512 rows x 4 envs, the learner moving every other turn: about 4,096
# turns each (its generic defaults), and it refuses a budget under one. Connect four's budget is rounded up to a
# whole number of them, and skrl gets the same number of turns (a turn is one env step for both).
UPDATE_TURNS = {"c4": 4096}


def budget(env: str, scale: float) -> int:
    steps = int(ENVS[env]["steps"] * scale)
    unit = UPDATE_TURNS.get(env, 1)
    return max(unit, -(-steps // unit) * unit)


def timed(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=6 * 3600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def run_rltrain(env: str, algo: str, steps: int, seed: int, tmp: Path) -> dict:
    run_dir = tmp / f"rltrain-{env}-{algo}-{seed}"
    cmd = [sys.executable, "-m", "rltrain", f"algo={algo}", *ENVS[env]["args"], f"total_env_steps={steps}",
           f"seed={seed}", "logger=quiet", f"eval.episodes={EPISODES}", "eval.every_env_steps=0",
           "checkpoint.every_env_steps=0", f"hydra.run.dir={run_dir}"]
    cpu, proc = timed(cmd, REPO)
    if proc.returncode != 0:
        raise SystemExit(f"rltrain failed on {env}/{algo}: {proc.stderr.strip()[-800:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    out = {"return": summary["final_eval_return"], "cpu": cpu, "steps_run": summary["total_env_steps"]}
    if "eval_vs_random" in summary:
        out.update(summary["eval_vs_random"])
    return out


def has_skrl() -> bool:
    """The peers' python exists and imports skrl, PettingZoo and mpe2 (else skrl's columns say skipped)."""
    try:
        return subprocess.run([PEERS_PYTHON, "-c", "import skrl, pettingzoo, mpe2"], capture_output=True,
                              timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_skrl(env: str, algo: str, steps: int, seed: int, tmp: Path) -> dict:
    out = tmp / f"skrl-{env}-{algo}-{seed}.json"
    cmd = [PEERS_PYTHON, str(PEERS / "skrl_multiagent.py"), "--env", env, "--algo", algo, "--steps", str(steps),
           "--seed", str(seed), "--out", str(out)]
    cpu, proc = timed(cmd, PEERS)
    if proc.returncode != 0:
        raise SystemExit(f"skrl failed on {env}/{algo}: {proc.stderr.strip()[-800:]}")
    return {**json.loads(out.read_text()), "cpu": cpu}


def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.2f} +- {statistics.pstdev(values):.2f}" if len(values) > 1 else f"{mean:.2f}"


def cell(runs: list[dict]) -> str:
    """The return's mean +- std over seeds; on a game, the mean win rate against random moves too."""
    text = spread([r["return"] for r in runs])
    return f"{text} (win {statistics.fmean(r['win'] for r in runs):.2f})" if "win" in runs[0] else text


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--envs", default="spread,c4")
    p.add_argument("--algos", default="ippo,mappo")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--budget-scale", type=float, default=1.0)
    p.add_argument("--log", type=Path, default=None, help="append one JSON line per finished run")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[tuple[str, str, str], list[dict]] = {}
    tools = [("rltrain", run_rltrain)] + ([("skrl", run_skrl)] if has_skrl() else [])
    with tempfile.TemporaryDirectory(prefix="bench-ma-") as tmp:
        for env in args.envs.split(","):
            steps = budget(env, args.budget_scale)
            for algo in args.algos.split(","):
                for k, seed in enumerate(seeds):
                    for tool, fn in tools if k % 2 == 0 else tools[::-1]:  # both meet the same neighbours
                        r = fn(env, algo, steps, seed, Path(tmp))
                        results.setdefault((env, algo, tool), []).append(r)
                        print(json.dumps({"env": env, "algo": algo, "tool": tool, "seed": seed, "steps": steps,
                                          **r}), flush=True)
                        if args.log:
                            with args.log.open("a") as f:
                                f.write(json.dumps({"env": env, "algo": algo, "tool": tool, "seed": seed,
                                                    "steps": steps, **r}) + "\n")
    print("\n| env | algo | steps | rltrain return | skrl return | rltrain CPU s | skrl CPU s | CPU ratio |"
          "\n|---|---|---|---|---|---|---|---|")
    for env in args.envs.split(","):
        for algo in args.algos.split(","):
            ours, theirs = results[(env, algo, "rltrain")], results.get((env, algo, "skrl"))
            cpu_ours = statistics.fmean(r["cpu"] for r in ours)
            if theirs is None:
                skrl = f"skipped (no skrl at {PEERS_PYTHON}; set PEERS_PYTHON) | {cpu_ours:.0f} | - | -"
            else:
                cpu_theirs = statistics.fmean(r["cpu"] for r in theirs)
                skrl = f"{cell(theirs)} | {cpu_ours:.0f} | {cpu_theirs:.0f} | " \
                       f"{cpu_ours / cpu_theirs:.2f}"
            print(f"| {env} | {algo} | {budget(env, args.budget_scale)} | "
                  f"{cell(ours)} | {skrl} |")


if __name__ == "__main__":
    main()
