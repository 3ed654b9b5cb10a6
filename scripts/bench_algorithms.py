"""The second round of algorithms against their peers: final return and whole-process CPU, one invocation.

    python scripts/bench_algorithms.py --peer-python /work/peers-venv/bin/python     # every row, 3 seeds
    python scripts/bench_algorithms.py --only td3-pendulum,qrdqn-cartpole --seeds 2
    python scripts/bench_algorithms.py --only td3-mujoco --budget td3-mujoco=30000   # a cut MuJoCo run

Rows (each a ``Row``: rltrain's overrides, the budget, and the peer: a process of another library run at the
same settings, or a published number quoted with its source):

  td3-pendulum    TD3 on Pendulum-v1 at rl-baselines3-zoo's settings (rltrain's ``experiment=td3_pendulum``; the
                  same values spelled out for SB3 in scripts/peers/sb3_algorithms.py): 20k steps, 10k random,
                  Gaussian noise 0.1, gamma 0.98, 400x300, beside SB3's TD3.
  td3-mujoco      TD3 on Hopper-v5 at rl-baselines3-zoo's MuJoCo recipe (``experiment=td3_mujoco``: 1M steps, 10k
                  random; the rest are SB3's TD3 defaults) beside SB3's TD3. 1M steps of 400x300 updates is about
                  a day of CPU per seed on a 2-core machine: run it cut with ``--budget td3-mujoco=STEPS`` (the
                  table says which budget ran; the CPU ratio at equal steps is the comparison it can make).
  her-sac         SAC with hindsight relabelling ("future", k = 4) on bench_envs:PointReach (scripts/peers/
                  bench_envs.py: a goal Dict, sparse reward, 50-step episodes), each library's SAC defaults
                  otherwise, beside SB3's SAC + HerReplayBuffer; success rates beside the returns.
  qrdqn-cartpole  QR-DQN on CartPole-v1 at rl-baselines3-zoo's QR-DQN settings (10 quantiles, 256x256, lr 2.3e-3,
                  batch 64, 128 gradient steps every 256 env steps, target every 10, epsilon to 0.04 over 16%),
                  50k steps (the zoo's budget) beside sb3-contrib's QRDQN (scripts/peers/sb3_qrdqn.py).
  qrdqn-minatar   QR-DQN (200 quantiles, sb3-contrib's default) on MinAtar/Breakout-v1 with an MLP (120, 84) on
                  the flattened planes on both sides (SB3's CnnPolicy needs frames of 36x36 or more), at the MinAtar
                  paper's DQN schedule with one gradient step per 4 env steps (rltrain's dqn_minatar), beside
                  sb3-contrib's QRDQN.
  c51-cartpole    C51 on CartPole-v1 at CleanRL's c51.py settings (101 atoms in [-100, 100], lr 2.5e-4, Adam eps
                  0.01 / 128, batch 128, replay 10k, target every 500, train every 10 after 10k steps, epsilon to
                  0.05 over 50%, 120x84) beside CleanRL's published final evaluation (500k steps, one seed).
  pqn-cartpole    PQN's CartPole preset (experiment=pqn_cartpole); no other library has PQN but CleanRL, whose
                  pqn.py publishes no CartPole number.
  pqn-minatar     PQN on MinAtar/Breakout-v1: CleanRL's pqn.py settings, 16 envs, the MinAtar CNN + LayerNorm.

Each run is a whole process, timed by the CPU its process tree used (user + system, this process's children
rusage; start-up, training and the final evaluation all count); rltrain and the peer alternate per seed so that
both meet the same neighbours. The table gives per row each seed's final evaluation (10 deterministic
episodes: both libraries evaluate; sb3-contrib's QR-DQN peer reports training returns only), the mean return of
the last 100 training episodes (each library's own bookkeeping), success rates on goal tasks, and the CPU of
both with the ratio rltrain / peer per seed. Only ratios from one invocation mean anything on a shared machine;
nothing here is asserted. ``--scale`` multiplies every budget (the test suite runs this script at a tiny one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_offpolicy import PEERS, REPO, path_env, timed  # noqa: E402

EVAL_EPISODES = 10  # both sides' final evaluation (scripts/peers/sb3_algorithms.py's EVAL_EPISODES)
COMMON = ["logger=quiet", "eval.every_env_steps=0", f"eval.episodes={EVAL_EPISODES}", "checkpoint.every_env_steps=0"]
# what each peer script imports: a row's peer column is skipped (and said so) where its Python lacks them
NEEDS = {"sb3_algorithms.py": "stable_baselines3", "sb3_qrdqn.py": "sb3_contrib, minatar"}


@dataclass(frozen=True)
class Row:
    name: str  # the --only key, and the peer script's case
    title: str
    overrides: list[str]  # rltrain's side (COMMON, the seed and the budget are added)
    steps: int
    peer: str | None = None  # the peer script in scripts/peers/, run as ``SCRIPT NAME SEED STEPS [LEARNING_STARTS]``
    learning_starts: int | None = None  # random steps, given to both sides (``--learning-starts`` cuts them)
    goal: bool = False  # a goal task: success rates beside the returns
    published: str | None = None  # a peer's published number, quoted with its source, when none is run


def td3_and_her_rows() -> list[Row]:
    """TD3 at rl-zoo3's settings and SAC + HER against Stable-Baselines3's."""
    return [
        Row("td3-pendulum", "TD3 Pendulum-v1, rl-zoo3 settings", ["experiment=td3_pendulum"], 20_000,
            peer="sb3_algorithms.py", learning_starts=10_000),
        Row("td3-mujoco", "TD3 Hopper-v5, rl-zoo3 MuJoCo settings", ["experiment=td3_mujoco", "env.id=Hopper-v5"],
            1_000_000, peer="sb3_algorithms.py", learning_starts=10_000),
        Row("her-sac", "SAC + HER PointReach (sparse), defaults",
            ["experiment=none", "algo=sac", "env.id=bench_envs:PointReach", "env.num_envs=1", "algo.her=true"],
            8_000, peer="sb3_algorithms.py", goal=True),
    ]


def dqn_family_rows() -> list[Row]:
    """QR-DQN against sb3-contrib, C51 against CleanRL's published number, PQN (rltrain only)."""
    qr_cartpole = ["experiment=none", "algo=dqn", "env=cartpole", "env.num_envs=1", "algo.distributional=qr",
                   "algo.n_quantiles=10", "algo.lr=2.3e-3", "algo.batch_size=64", "algo.buffer_size=100000",
                   "algo.learning_starts=1000", "algo.gamma=0.99", "algo.target_network_frequency=10",
                   "algo.train_frequency=256", "algo.gradient_steps=128", "algo.exploration_fraction=0.16",
                   "algo.start_e=1.0", "algo.end_e=0.04", "algo.max_grad_norm=null", "model.hidden_sizes=[256,256]",
                   "model.activation=relu"]
    qr_minatar = ["experiment=none", "algo=dqn", "env=minatar", "env.num_envs=1", "model.encoder=mlp",
                  "algo.distributional=qr", "algo.n_quantiles=200", "algo.lr=2.5e-4", "algo.batch_size=32",
                  "algo.buffer_size=100000", "algo.learning_starts=5000", "algo.target_network_frequency=1000",
                  "algo.train_frequency=4", "algo.gradient_steps=1", "algo.exploration_fraction=0.1",
                  "algo.start_e=1.0", "algo.end_e=0.1", "algo.max_grad_norm=null", "model.hidden_sizes=[120,84]",
                  "model.activation=relu"]
    c51 = ["experiment=none", "algo=dqn", "env=cartpole", "env.num_envs=1", "algo.distributional=c51",
           "algo.n_atoms=101", "algo.v_min=-100", "algo.v_max=100", "algo.lr=2.5e-4", "algo.adam_eps=7.8125e-5",
           "algo.batch_size=128", "algo.buffer_size=10000", "algo.learning_starts=10000",
           "algo.target_network_frequency=500", "algo.train_frequency=10", "algo.exploration_fraction=0.5",
           "algo.start_e=1.0", "algo.end_e=0.05", "algo.max_grad_norm=null", "model.hidden_sizes=[120,84]",
           "model.activation=relu"]
    pqn_minatar = ["experiment=none", "algo=pqn", "env=minatar", "env.num_envs=16", "algo.rollout_len=32"]
    return [
        Row("qrdqn-cartpole", "QR-DQN CartPole-v1, rl-zoo3 settings", qr_cartpole, 50_000, peer="sb3_qrdqn.py"),
        Row("qrdqn-minatar", "QR-DQN MinAtar Breakout, MLP", qr_minatar, 100_000, peer="sb3_qrdqn.py"),
        Row("c51-cartpole", "C51 CartPole-v1, CleanRL c51.py settings", c51, 500_000,
            published="CleanRL c51.py, 500k steps, seed 1: 500.0 +/- 0.0 (final model's evaluation; "
                      "huggingface.co/cleanrl/CartPole-v1-c51-seed1)"),
        Row("pqn-cartpole", "PQN CartPole-v1, pqn_cartpole preset", ["experiment=pqn_cartpole"], 100_000),
        Row("pqn-minatar", "PQN MinAtar Breakout, CleanRL pqn.py settings, 16 envs", pqn_minatar, 500_000),
    ]


def all_rows() -> list[Row]:
    return [*td3_and_her_rows(), *dqn_family_rows()]


def cpu_timed(cmd: list[str], *, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    """bench_offpolicy's ``timed`` with this checkout and scripts/peers importable, one thread, no time limit a
    MuJoCo row's million steps would hit: (CPU s of the process tree, the completed process)."""
    _, cpu, proc = timed(cmd, cwd=cwd, env={**path_env(REPO, PEERS), "OMP_NUM_THREADS": "1"}, timeout=4 * 86400)
    return cpu, proc


def run_rltrain(row: Row, seed: int, steps: int, learning_starts: int | None) -> dict:
    starts = [f"algo.learning_starts={learning_starts}"] if learning_starts is not None else []
    with tempfile.TemporaryDirectory() as tmp:
        cpu, _ = cpu_timed([sys.executable, "-m", "rltrain", *row.overrides, *starts, *COMMON, f"seed={seed}",
                        f"total_env_steps={steps}", f"hydra.run.dir={tmp}/run"], cwd=Path(tmp))
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    return {"cpu": cpu, "return": summary.get("train_return_last100"), "eval": summary.get("final_eval_return"),
            "eval_success": summary.get("final_eval_success_rate")}


def run_peer(python: str, row: Row, seed: int, steps: int, learning_starts: int | None) -> dict:
    starts = [str(learning_starts)] if learning_starts is not None else []
    with tempfile.TemporaryDirectory() as tmp:
        cpu, proc = cpu_timed([python, str(PEERS / row.peer), row.name, str(seed), str(steps), *starts], cwd=Path(tmp))
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"cpu": cpu, "return": out.get("train_return_last100"), "eval": out.get("final_eval_return"),
            "eval_success": out.get("final_eval_success_rate")}


def peer_missing(python: str, script: str) -> str | None:
    """Why ``script`` cannot run under ``python`` (one line), or None."""
    try:
        probe = subprocess.run([python, "-c", f"import {NEEDS[script]}"], capture_output=True, text=True)
    except OSError:  # no such interpreter
        probe = None
    if probe is None or probe.returncode != 0:
        return f"{NEEDS[script]} not importable by {python}: the peer column of {script}'s rows is skipped " \
               "(--peer-python)"
    return None


def fmt(values: list, digits: int = 1) -> str:
    """Mean +/- std over the seeds, then each seed's value."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    spread = f" +/- {statistics.stdev(vals):.{digits}f}" if len(vals) > 1 else ""
    return f"{statistics.mean(vals):.{digits}f}{spread} ({', '.join(f'{v:.{digits}f}' for v in vals)})"


def keyed(pairs: list[str], rows: dict, what: str) -> dict[str, int]:
    """``ROW=N`` arguments as {row: N}; an unknown row or a bad number is one line and exit 2."""
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in rows or not value.isdigit():
            print(f"bench_algorithms.py: {what} takes ROW=N with a known row; got {pair!r} "
                  f"(rows: {', '.join(rows)})", file=sys.stderr)
            sys.exit(2)
        out[name] = int(value)
    return out


def main() -> None:
    rows = {row.name: row for row in all_rows()}
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(r for r in rows if r != "td3-mujoco"),
                    help=f"comma-separated rows (default: all but td3-mujoco): {', '.join(rows)}")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 1..N per row")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every budget (1: the budgets above)")
    ap.add_argument("--budget", action="append", default=[], metavar="ROW=STEPS",
                    help="this row's env steps instead of its budget above (repeatable)")
    ap.add_argument("--learning-starts", action="append", default=[], metavar="ROW=STEPS",
                    help="a TD3 / HER row's random warm-up steps on both sides instead of the row's (quick runs)")
    ap.add_argument("--peer-python", "--sb3-python", default=sys.executable,
                    help="a Python with stable-baselines3, sb3-contrib, MinAtar and MuJoCo (the peers' side)")
    args = ap.parse_args()
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in only if n not in rows]
    if unknown:
        print(f"bench_algorithms.py: unknown rows {unknown}; rows: {', '.join(rows)}", file=sys.stderr)
        sys.exit(2)
    budgets = keyed(args.budget, rows, "--budget")
    starts = keyed(args.learning_starts, rows, "--learning-starts")
    # rltrain's modules compiled, as an installed package has them
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "rltrain")], check=False)
    missing = {script: peer_missing(args.peer_python, script) for script in NEEDS}
    for why in filter(None, missing.values()):
        print(why, file=sys.stderr)
    table = []
    for name in only:
        row = rows[name]
        learning_starts = starts.get(name, row.learning_starts)
        # a scaled budget still trains: 1000 steps past the warm-up at least
        warmup = max([int(o.split("=")[1]) for o in row.overrides if o.startswith("algo.learning_starts=")]
                     + [learning_starts or 0])
        steps = max(warmup + 1000, int(budgets.get(name, row.steps) * args.scale))
        with_peer = row.peer is not None and not missing[row.peer]
        ours, peer = [], []
        for seed in range(1, args.seeds + 1):
            ours.append(run_rltrain(row, seed, steps, learning_starts))
            if with_peer:
                peer.append(run_peer(args.peer_python, row, seed, steps, learning_starts))
            print(f"{name} seed {seed}: rltrain {ours[-1]}" + (f"; peer {peer[-1]}" if peer else ""),
                  file=sys.stderr, flush=True)
        ratios = [o["cpu"] / p["cpu"] for o, p in zip(ours, peer, strict=False)]
        success = (fmt([o["eval_success"] for o in ours], 2), fmt([p["eval_success"] for p in peer], 2)) \
            if row.goal else ("-", "-")
        table.append((row.title, f"{steps}", fmt([o["eval"] for o in ours]),
                      fmt([p["eval"] for p in peer]) if peer else (row.published or "-"),
                      fmt([o["return"] for o in ours]), fmt([p["return"] for p in peer]), *success,
                      fmt([o["cpu"] for o in ours], 0), fmt([p["cpu"] for p in peer], 0), fmt(ratios, 2)))
    print(f"\nseeds 1..{args.seeds}; mean +/- std (each seed); eval = the final deterministic evaluation "
          f"({EVAL_EPISODES} episodes), last 100 = mean return of the last 100 training episodes; CPU = whole "
          "process (user + system) in s; ratio = rltrain / peer per seed, from this one invocation (same-run "
          "ratios; shared VM)\n")
    print("| row | env steps | rltrain eval | peer eval | rltrain last 100 | peer last 100 | rltrain eval success | "
          "peer eval success | rltrain CPU s | peer CPU s | CPU ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for cells in table:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
