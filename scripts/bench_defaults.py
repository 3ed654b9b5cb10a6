"""rltrain's defaults against a peer's on envs no preset was tuned for, same budget, same seeds.

    python scripts/bench_defaults.py --sb3-python PY --rllib-python PY   # every row, 3 seeds: the table the docs
                                                                         # quote (hours)
    python scripts/bench_defaults.py --envs taxi,frozenlake --seeds 1 --budget-scale 0.2
    python scripts/bench_defaults.py --envs dict-goal-impala --own-budget-scale 2   # compute-matched reading
    python scripts/bench_defaults.py --envs frozenlake-impala --peers rllib --rllib-python PY   # one peer only
    python scripts/bench_defaults.py --list

rltrain runs as a user would: ``python -m rltrain env.id=<task> [algo=<algo>]``, nothing else tuned
(``experiment=auto``: a preset applies only where one is made for the task, and the row says so; the Acrobot
rows pass ``experiment=none``). Each row names its peers:

- ``sb3``: SB3's same algorithm with its defaults, ``PPO/A2C/DQN/SAC(policy, env)`` (``scripts/peers/sb3_defaults.py``;
  sb3-contrib is not used, so on a row with ``model.core=lstm`` SB3's column is its feed-forward policy);
- ``ppo``: rltrain's own PPO defaults on the same task (the row's overrides without its ``trainer`` ones), the
  yardstick for IMPALA, which SB3 does not have;
- ``rllib``: RLlib's same algorithm with its defaults (``scripts/peers/rllib_defaults.py``; an LSTM where the row
  has ``model.core=lstm``), run by ``--rllib-python``; skipped, and said so, without it.

Both evaluate 10 episodes deterministic and 10 stochastic at the end. Each run is a whole process; CPU seconds
are the child's user + system time (rusage, its actor processes included), so start-up, training and evaluation
all count. rltrain and its peers alternate per seed so that they meet the same neighbours on a shared machine;
only ratios from one run of this script mean anything (a VM's speed drifts between runs).

``--own-budget-scale X`` gives rltrain's runs X times the peers' env steps: the compute-matched reading of a goal
set as "the peer's return at <= 0.8x its CPU" (an algorithm that spends less per step may take more steps within
that CPU). The steps column then shows both budgets (rltrain / peer), and the CPU ratio is still whole process
against whole process, so a row under it is judged on the same two goals, never on equal steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEERS = REPO / "scripts" / "peers"
PEERS_KNOWN = ("sb3", "ppo", "rllib")  # the peers a row may name (--peers picks among them)
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
    peers: tuple[str, ...] = ("sb3",)  # of PEERS_KNOWN: sb3 | ppo (rltrain's PPO defaults) | rllib

    @property
    def lstm(self) -> bool:
        return "model.core=lstm" in self.extra


MEMORY = "bench_envs:CueRecall"  # a cue, 5 blank steps, then the question: memoryless best 0, best 1


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
    # A2C against SB3's A2C, IMPALA against rltrain's PPO and RLlib's IMPALA: a memory task (LSTM), a sparse reward
    # (FrozenLake: 1 at the goal only) and a Dict observation
    Row("memory-a2c", "a2c", MEMORY, 100_000, extra=("model.core=lstm",), note="SB3 column: feed-forward A2C"),
    Row("frozenlake-a2c", "a2c", "FrozenLake-v1", 50_000, note="slippery"),
    Row("dict-goal-a2c", "a2c", "bench_envs:GoalDict", 50_000, note="40x40 image + position"),
    Row("memory-impala-actors", "impala", MEMORY, 200_000,
        extra=("model.core=lstm", "trainer=subprocess_actors", "trainer.num_actors=2"), peers=("ppo", "rllib"),
        note="2 actor processes"),
    Row("memory-impala", "impala", MEMORY, 200_000, extra=("model.core=lstm",), peers=("ppo", "rllib"),
        note="sequential"),
    Row("frozenlake-impala", "impala", "FrozenLake-v1", 50_000, peers=("ppo", "rllib"), note="slippery"),
    Row("dict-goal-impala", "impala", "bench_envs:GoalDict", 50_000, peers=("ppo", "rllib"),
        note="40x40 image + position"),
]


# Runs the command as a child subreaper (Linux prctl PR_SET_CHILD_SUBREAPER): a process that its parent leaves
# behind (multiprocessing's forkserver with rltrain's actors below it, Ray's workers) is re-parented to this one
# instead of init, and is waited for here, so the CPU of every process the command started adds up in this
# process's children's rusage, which it writes to the file named first. Whatever is still running 60 s after the
# command exits is terminated (it was started by this run).
REAPER = """
import ctypes, json, os, resource, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1)
code = subprocess.call(sys.argv[2:])
deadline = time.monotonic() + 60
while True:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid == 0:
        if time.monotonic() > deadline:
            for left in open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split():
                os.kill(int(left), signal.SIGTERM)
            deadline = float("inf")
        time.sleep(0.05)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
json.dump({"cpu": r.ru_utime + r.ru_stime}, open(sys.argv[1], "w"))
sys.exit(code)
"""


def timed(cmd: list[str], *, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    """(CPU seconds of the command and of every process it started, its completed process)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        proc = subprocess.run([sys.executable, "-c", REAPER, out.name, *cmd], cwd=cwd, capture_output=True, text=True,
                              timeout=4 * 3600, env={**os.environ, "PYTHONPATH": str(PEERS)})
        cpu = json.loads(Path(out.name).read_text() or "{}").get("cpu")
    if cpu is None:
        raise SystemExit(f"the CPU of {' '.join(cmd[:4])} ... was not recorded: {proc.stderr.strip()[-800:]}")
    return cpu, proc


def run_rltrain(row: Row, steps: int, seed: int, tmp: Path, *, algo: str | None = None,
                extra: tuple[str, ...] | None = None) -> dict:
    run_dir = tmp / f"{row.name}-{algo or row.algo}-{seed}"
    cmd = [sys.executable, "-m", "rltrain", f"algo={algo or row.algo}", f"env.id={row.env}", f"total_env_steps={steps}",
           f"seed={seed}", "logger=quiet", f"eval.episodes={EPISODES}", "eval.every_env_steps=0",
           "checkpoint.every_env_steps=0", f"hydra.run.dir={run_dir}", *(row.extra if extra is None else extra)]
    cmd += [f"+env.kwargs.{k}={v}" for k, v in row.kwargs.items()]
    cpu, proc = timed(cmd, cwd=PEERS)
    if proc.returncode != 0:
        raise SystemExit(f"rltrain failed on {row.name}: {proc.stderr.strip()[-800:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"deterministic": summary["final_eval_return_deterministic"],
            "stochastic": summary["final_eval_return_stochastic"], "cpu": cpu}


_PEER_RUNS: dict[tuple, dict | None] = {}


def run_peer(peer: str, row: Row, steps: int, seed: int, tmp: Path, pythons: dict[str, str | None]) -> dict | None:
    """One peer run (None: that peer's Python was not given). Rows that differ only in rltrain's trainer (IMPALA
    under subprocess_actors and sequential) share their peers' runs: the same command, run once."""
    key = (peer, row.algo, row.env, json.dumps(row.kwargs), row.lstm, steps, seed)
    if key not in _PEER_RUNS:
        _PEER_RUNS[key] = _run_peer(peer, row, steps, seed, tmp, pythons)
    return _PEER_RUNS[key]


def _run_peer(peer: str, row: Row, steps: int, seed: int, tmp: Path, pythons: dict[str, str | None]) -> dict | None:
    if peer == "ppo":  # rltrain's PPO defaults, on the row's model but in one process
        return run_rltrain(row, steps, seed, tmp, algo="ppo",
                           extra=tuple(e for e in row.extra if not e.startswith("trainer")))
    python = pythons[peer]
    if python is None:
        return None
    script = {"sb3": "sb3_defaults.py", "rllib": "rllib_defaults.py"}[peer]
    cmd = [python, str(PEERS / script), "--algo", row.algo, "--env", row.env, "--kwargs", json.dumps(row.kwargs),
           "--steps", str(steps), "--seed", str(seed), "--episodes", str(EPISODES)]
    if peer == "rllib" and row.lstm:
        cmd.append("--lstm")
    cpu, proc = timed(cmd, cwd=PEERS)
    if proc.returncode != 0:
        raise SystemExit(f"{peer} failed on {row.name}: {proc.stderr.strip()[-800:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "cpu": cpu}


def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:8.2f} ±{statistics.pstdev(values):5.2f}" if len(values) > 1 else f"{mean:8.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", default=",".join(r.name for r in ROWS), help="comma-separated row names")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="multiply every row's env-step budget")
    ap.add_argument("--own-budget-scale", type=float, default=1.0,
                    help="rltrain's env steps as a multiple of its peers' (compute-matched rows; printed beside them)")
    ap.add_argument("--sb3-python", default=sys.executable, help="a Python with stable-baselines3 (and minigrid)")
    ap.add_argument("--rllib-python", help="a Python with ray[rllib] for the rllib peer (none: that peer is skipped)")
    ap.add_argument("--peers", default=",".join(PEERS_KNOWN),
                    help="comma-separated: the peers to run where a row names them (e.g. rllib alone)")
    ap.add_argument("--list", action="store_true", help="print the rows and exit")
    ap.add_argument("--log", type=Path, help="append one JSON line per finished run (kept if the script is cut off)")
    args = ap.parse_args()
    if args.list:
        for r in ROWS:
            print(f"{r.name:20} {r.algo:6} {r.env} {r.kwargs or ''} {r.steps:,} steps {' '.join(r.extra)} "
                  f"vs {', '.join(r.peers)} {r.note}")
        return
    wanted = args.envs.split(",")
    unknown = [w for w in wanted if w not in {r.name for r in ROWS}]
    if unknown:
        raise SystemExit(f"unknown --envs {unknown}; rows: {', '.join(r.name for r in ROWS)}")
    if not args.budget_scale > 0 or not args.own_budget_scale > 0:
        raise SystemExit("--budget-scale and --own-budget-scale must be > 0")
    seeds = [int(s) for s in args.seeds.split(",")]
    chosen = set(args.peers.split(","))
    if chosen - set(PEERS_KNOWN):
        raise SystemExit(f"unknown --peers {sorted(chosen - set(PEERS_KNOWN))}; peers: {', '.join(PEERS_KNOWN)}")
    pythons = {"sb3": args.sb3_python, "rllib": args.rllib_python}
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    print(f"measured at commit {head.stdout.strip() or 'unknown'}", flush=True)  # figures quoted from it name it
    if args.own_budget_scale != 1:
        print(f"compute-matched: rltrain runs {args.own_budget_scale:g}x its peers' env steps (steps column: "
              "rltrain / peer)", flush=True)
    print(f"{'row':20} {'algo':6} {'peer':6} {'steps':>8}  {'rltrain det':>15} {'rltrain stoch':>15} {'peer det':>15} "
          f"{'peer stoch':>15} {'CPU s rl':>9} {'CPU s peer':>10} {'ratio':>6}", flush=True)
    totals: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-defaults-") as tmp:
        for row in [r for r in ROWS if r.name in wanted]:
            steps = max(1, int(row.steps * args.budget_scale))
            own = max(1, int(steps * args.own_budget_scale))
            ours: list[dict] = []
            theirs: dict[str, list[dict]] = {p: [] for p in row.peers if p in chosen}
            for seed in seeds:  # alternate: rltrain and its peers meet the same neighbours
                ours.append(run_rltrain(row, own, seed, Path(tmp)))
                _log(args.log, row, own, seed, "rltrain", ours[-1])
                for peer in theirs:
                    res = run_peer(peer, row, steps, seed, Path(tmp), pythons)
                    if res is not None:
                        theirs[peer].append(res)
                        _log(args.log, row, steps, seed, peer, res)
            for peer, runs in theirs.items():
                _print_row(row, peer, steps if own == steps else f"{own:,}/{steps:,}", ours, runs, totals)
    for peer, (ours_cpu, theirs_cpu) in totals.items():
        print(f"{'total vs ' + peer:20} {'':6} {'':6} {'':8}  {'':15} {'':15} {'':15} {'':15} {ours_cpu:9.1f} "
              f"{theirs_cpu:10.1f} {ours_cpu / max(theirs_cpu, 1e-9):6.2f}")
    print("returns: mean ± std over seeds of each seed's 10-episode mean; CPU s: summed over seeds, whole processes")


def _log(log: Path | None, row: Row, steps: int, seed: int, who: str, res: dict) -> None:
    if log:
        with log.open("a") as f:
            f.write(json.dumps({"row": row.name, "steps": steps, "seed": seed, "who": who, **res}) + "\n")


def _steps(steps: int | str) -> str:
    """The steps column: one budget, or rltrain's / the peer's under --own-budget-scale."""
    return f"{steps:8,}" if isinstance(steps, int) else f"{steps:>8}"


def _print_row(row: Row, peer: str, steps: int | str, ours: list[dict], runs: list[dict], totals: dict) -> None:
    cpu = sum(o["cpu"] for o in ours)
    if not runs:
        print(f"{row.name:20} {row.algo:6} {peer:6} {_steps(steps)}  {spread([o['deterministic'] for o in ours]):>15} "
              f"{spread([o['stochastic'] for o in ours]):>15} {'skipped: no --' + peer + '-python':>31} {cpu:9.1f}",
              flush=True)
        return
    peer_cpu = sum(t["cpu"] for t in runs)
    acc = totals.setdefault(peer, [0.0, 0.0])
    acc[0], acc[1] = acc[0] + cpu, acc[1] + peer_cpu
    print(f"{row.name:20} {row.algo:6} {peer:6} {_steps(steps)}  {spread([o['deterministic'] for o in ours]):>15} "
          f"{spread([o['stochastic'] for o in ours]):>15} {spread([t['deterministic'] for t in runs]):>15} "
          f"{spread([t['stochastic'] for t in runs]):>15} {cpu:9.1f} {peer_cpu:10.1f} {cpu / peer_cpu:6.2f}  "
          f"{row.note}", flush=True)


if __name__ == "__main__":
    main()
