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
rltrain's); with ``--benchmarl-python``, BenchMARL's MAPPO on ``spread`` as scripts/peers/benchmarl_mappo.py
writes it (its defaults; that file says how to install it in a venv of its own, and why not in the peers'). Each
run is a whole process; CPU seconds are its user + system time (rusage), so start-up, training and evaluation all
count. Tools alternate per seed; only ratios from one run of this script mean anything.
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
# turns each (its generic defaults; a few more or less, as games end on either seat), and it refuses a budget under
# one. Connect four's budget is rounded up to a whole number of them, and skrl gets that many turns (a turn is one
# env step for both). rltrain stops at the first update that reaches its budget, so it is handed half an update
# less (at one update, the whole): it then runs the same whole number of updates whichever way the turns drift (its
# turns run are logged).
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
    unit = UPDATE_TURNS.get(env, 0)
    limit = max(unit, steps - unit // 2)  # one update's budget is taken whole: rltrain refuses less
    cmd = [sys.executable, "-m", "rltrain", f"algo={algo}", *ENVS[env]["args"], f"total_env_steps={limit}",
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


def run_benchmarl(python: str, steps: int, seed: int, tmp: Path) -> dict:
    out, folder = tmp / f"benchmarl-{seed}.json", tmp / f"benchmarl-{seed}"
    folder.mkdir()
    cmd = [python, str(PEERS / "benchmarl_mappo.py"), "--steps", str(steps), "--seed", str(seed), "--out", str(out),
           "--save-folder", str(folder)]
    cpu, proc = timed(cmd, PEERS)
    if proc.returncode != 0:
        raise SystemExit(f"BenchMARL failed on spread/mappo: {proc.stderr.strip()[-800:]}")
    return {**json.loads(out.read_text()), "cpu": cpu}


def peer_cells(ours: list[dict], theirs: list[dict] | None, missing: str) -> str:
    """A table row's peer return, both CPU means and their ratio (rltrain's over the peer's)."""
    cpu_ours = statistics.fmean(r["cpu"] for r in ours)
    if theirs is None:
        return f"{missing} | {cpu_ours:.0f} | - | -"
    cpu_theirs = statistics.fmean(r["cpu"] for r in theirs)
    return f"{cell(theirs)} | {cpu_ours:.0f} | {cpu_theirs:.0f} | {cpu_ours / cpu_theirs:.2f}"


BASELINE_EPISODES = 100


def spread_baselines(episodes: int = BASELINE_EPISODES) -> dict[str, tuple[float, float]]:
    """What simple_spread pays a policy that learnt nothing: uniformly random moves, and standing still (action
    0, no-op). A learnt return means something only above both: the agents are penalised by their distance to
    the landmarks at every step, and early learning mostly stops them wandering off. Mean over agents of each
    agent's return, episodes from seeds 0..episodes-1 (mean, std over episodes)."""
    import numpy as np
    from mpe2 import simple_spread_v3

    out = {}
    for name in ("random moves", "no-op (action 0)"):
        rng, returns = np.random.default_rng(0), []
        for seed in range(episodes):
            env = simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)
            env.reset(seed=seed)
            total = dict.fromkeys(env.possible_agents, 0.0)
            while env.agents:
                acts = {a: int(rng.integers(env.action_space(a).n)) if name.startswith("random") else 0
                        for a in env.agents}
                _, rewards, _, _, _ = env.step(acts)
                for a, r in rewards.items():
                    total[a] += r
            returns.append(float(np.mean(list(total.values()))))
            env.close()
        out[name] = (float(np.mean(returns)), float(np.std(returns)))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--envs", default="spread,c4")
    p.add_argument("--algos", default="ippo,mappo")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--budget-scale", type=float, default=1.0)
    p.add_argument("--benchmarl-python", default=None,
                   help="a python with BenchMARL (scripts/peers/benchmarl_mappo.py says how): adds its MAPPO on spread")
    p.add_argument("--log", type=Path, default=None, help="append one JSON line per finished run")
    args = p.parse_args()
    envs, algos = args.envs.split(","), args.algos.split(",")
    unknown = [e for e in envs if e not in ENVS] + [a for a in algos if a not in ("ippo", "mappo")]
    if unknown:
        p.error(f"unknown --envs/--algos {unknown}: envs {', '.join(ENVS)}; algos ippo, mappo")
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[tuple[str, str, str], list[dict]] = {}
    tools = [("rltrain", run_rltrain)] + ([("skrl", run_skrl)] if has_skrl() else [])
    with tempfile.TemporaryDirectory(prefix="bench-ma-") as tmp:
        for env in envs:
            steps = budget(env, args.budget_scale)
            for algo in algos:
                row = tools + ([("benchmarl", lambda e, a, n, s, t: run_benchmarl(args.benchmarl_python, n, s, t))]
                               if args.benchmarl_python and (env, algo) == ("spread", "mappo") else [])
                for k, seed in enumerate(seeds):
                    for tool, fn in row if k % 2 == 0 else row[::-1]:  # all meet the same neighbours
                        r = fn(env, algo, steps, seed, Path(tmp))
                        results.setdefault((env, algo, tool), []).append(r)
                        line = json.dumps({"env": env, "algo": algo, "tool": tool, "seed": seed, "steps": steps, **r})
                        print(line, flush=True)
                        if args.log:
                            with args.log.open("a") as f:
                                f.write(line + "\n")
    print("\n| env | algo | steps | rltrain return | skrl return | rltrain CPU s | skrl CPU s | CPU ratio |"
          "\n|---|---|---|---|---|---|---|---|")
    for env in envs:
        for algo in algos:
            ours = results[(env, algo, "rltrain")]
            skrl = peer_cells(ours, results.get((env, algo, "skrl")),
                              f"skipped (no skrl at {PEERS_PYTHON}; set PEERS_PYTHON)")
            print(f"| {env} | {algo} | {budget(env, args.budget_scale)} | {cell(ours)} | {skrl} |")
    if "spread" in envs:  # the floor a learnt return must clear, from the same env and protocol
        print("\n| spread baseline | return (mean +- std over episodes) |\n|---|---|")
        for name, (mean, std) in spread_baselines().items():
            print(f"| {name} | {mean:.1f} +- {std:.1f} ({BASELINE_EPISODES} episodes) |")
    if ("spread", "mappo", "benchmarl") in results:
        ours, theirs = results[("spread", "mappo", "rltrain")], results[("spread", "mappo", "benchmarl")]
        frames = sorted({r["steps_run"] for r in theirs})
        print("\n| env | algo | steps | rltrain return | BenchMARL return | rltrain CPU s | BenchMARL CPU s "
              "| CPU ratio |\n|---|---|---|---|---|---|---|---|")
        print(f"| spread | mappo | {budget('spread', args.budget_scale)} (BenchMARL: {frames[-1]} frames, whole "
              f"batches) | {cell(ours)} | {peer_cells(ours, theirs, '')} |")


if __name__ == "__main__":
    main()
