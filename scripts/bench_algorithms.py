"""The second round of algorithms against their peers: final return and whole-process CPU, one invocation.

    python scripts/bench_algorithms.py --peer-python /work/peers-venv/bin/python     # every row, 3 seeds
    python scripts/bench_algorithms.py --only qrdqn-cartpole,pqn-cartpole --seeds 1 --scale 0.1

Rows (each a ``Row``: rltrain's overrides, the budget, and the peer: a process of another library run at the
same settings, or a published number quoted with its source):

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
rusage); rltrain and the peer alternate per seed so that both meet the same neighbours. Only ratios from one
invocation mean anything on a shared machine; nothing here is asserted. ``--scale`` multiplies every budget
(the test suite runs this script at a tiny one); the table says which budget ran.
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
COMMON = ["logger=quiet", "eval.every_env_steps=0", "eval.episodes=10", "checkpoint.every_env_steps=0"]


@dataclass(frozen=True)
class Row:
    name: str
    title: str
    overrides: list[str]
    steps: int
    peer_cmd: list[str] = field(default_factory=list)  # argv after the peer Python (SEED STEPS appended)
    published: str | None = None  # a peer's published number, quoted with its source, when none is run


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
        Row("qrdqn-cartpole", "QR-DQN CartPole-v1, rl-zoo3 settings", qr_cartpole, 50_000,
            peer_cmd=[str(PEERS / "sb3_qrdqn.py"), "cartpole"]),
        Row("qrdqn-minatar", "QR-DQN MinAtar Breakout, MLP", qr_minatar, 100_000,
            peer_cmd=[str(PEERS / "sb3_qrdqn.py"), "minatar"]),
        Row("c51-cartpole", "C51 CartPole-v1, CleanRL c51.py settings", c51, 500_000,
            published="CleanRL c51.py, 500k steps, seed 1: 500.0 +/- 0.0 (final model's evaluation; "
                      "huggingface.co/cleanrl/CartPole-v1-c51-seed1)"),
        Row("pqn-cartpole", "PQN CartPole-v1, pqn_cartpole preset", ["experiment=pqn_cartpole"], 100_000),
        Row("pqn-minatar", "PQN MinAtar Breakout, CleanRL pqn.py settings, 16 envs", pqn_minatar, 500_000),
    ]


def all_rows() -> list[Row]:
    return dqn_family_rows()


def timed(cmd: list[str], *, cwd: Path, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``cmd`` to the end: (CPU s of the child process tree, the completed process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=7200)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def one_thread_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), str(PEERS)])}


def run_rltrain(row: Row, seed: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cpu, _ = timed([sys.executable, "-m", "rltrain", *row.overrides, *COMMON, f"seed={seed}",
                        f"total_env_steps={steps}", f"hydra.run.dir={tmp}/run"], cwd=Path(tmp), env=one_thread_env())
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    return {"cpu": cpu, "return": summary.get("train_return_last100"), "eval": summary.get("final_eval_return")}


def run_peer(python: str, row: Row, seed: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cpu, proc = timed([python, *row.peer_cmd, str(seed), str(steps)], cwd=Path(tmp), env=one_thread_env())
    return {"cpu": cpu, "return": json.loads(proc.stdout.strip().splitlines()[-1])["train_return_last100"]}


def peer_missing(python: str) -> str | None:
    try:
        probe = subprocess.run([python, "-c", "import sb3_contrib, minatar"], capture_output=True, text=True)
    except OSError:
        probe = None
    if probe is None or probe.returncode != 0:
        return f"sb3-contrib / MinAtar are not importable by {python}: the peer column is skipped (--peer-python)"
    return None


def fmt(values: list, digits: int = 1) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    spread = f" +/- {statistics.stdev(vals):.{digits}f}" if len(vals) > 1 else ""
    return f"{statistics.mean(vals):.{digits}f}{spread} ({', '.join(f'{v:.{digits}f}' for v in vals)})"


def main() -> None:
    rows = {row.name: row for row in all_rows()}
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(rows), help=f"comma-separated rows: {', '.join(rows)}")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 1..N per row")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every budget (1: the budgets above)")
    ap.add_argument("--budget", action="append", default=[], metavar="ROW=STEPS",
                    help="this row's env steps instead of its budget above (repeatable)")
    ap.add_argument("--peer-python", default=sys.executable, help="a Python with sb3-contrib and MinAtar")
    args = ap.parse_args()
    budgets = dict(b.split("=", 1) for b in args.budget)
    unknown = [n for n in [*args.only.split(","), *budgets] if n not in rows]
    if unknown:
        sys.exit(f"bench_algorithms.py: unknown rows {unknown}; rows: {', '.join(rows)}")
    # rltrain's modules compiled, as an installed package has them
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "rltrain")], check=False)
    missing = peer_missing(args.peer_python)
    if missing:
        print(missing, file=sys.stderr)
    table = []
    for name in args.only.split(","):
        row = rows[name]
        # a scaled budget still trains: 1000 steps past the warm-up at least
        warmup = max([int(o.split("=")[1]) for o in row.overrides if o.startswith("algo.learning_starts=")] + [0])
        steps = max(warmup + 1000, int(int(budgets.get(name, row.steps)) * args.scale))
        ours, peer = [], []
        for seed in range(1, args.seeds + 1):
            ours.append(run_rltrain(row, seed, steps))
            if row.peer_cmd and not missing:
                peer.append(run_peer(args.peer_python, row, seed, steps))
            print(f"{name} seed {seed}: rltrain {ours[-1]}" + (f"; peer {peer[-1]}" if peer else ""),
                  file=sys.stderr, flush=True)
        ratios = [o["cpu"] / p["cpu"] for o, p in zip(ours, peer, strict=False)]
        peer_return = fmt([p["return"] for p in peer]) if peer else (row.published or "-")
        table.append((row.title, f"{steps}", fmt([o["return"] for o in ours]), fmt([o["eval"] for o in ours]),
                      peer_return, fmt([o["cpu"] for o in ours], 0), fmt([p["cpu"] for p in peer], 0),
                      fmt(ratios, 2)))
    print(f"\nseeds 1..{args.seeds}; mean +/- std (per seed); return = mean of the last 100 training episodes, "
          "eval = final greedy evaluation (10 episodes); CPU = whole process (user + system) in s; ratio = rltrain / "
          "peer per seed, from this one invocation (same-run ratios; shared VM)\n")
    print("| row | env steps | rltrain return | rltrain eval | peer return | rltrain CPU s | peer CPU s | "
          "CPU ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for cells in table:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
