"""``trainer=subprocess_actors`` with ``trainer.backend=local`` vs ``ray``, same script run: steps/s, and time to 475.

Every configuration is one real ``rltrain`` run. First table (steps/s; IMPALA on CartPole-v1, the same learner
batch): local actor processes, Ray actors on a private Ray instance (one node), and Ray actors on a one-host
two-node Ray cluster (``ray.cluster_utils.Cluster``, actors kept off the head by a custom resource), with 1, 2
and 4 actors. Two figures per run: ``sps`` over the whole loop (actor start-up included: Ray's workers start
slower) and ``steady sps``, the median of the logged rows after the first (actors running).

Second table (``--to-475``): time and env steps to CartPole's 475. rltrain: ``experiment=impala_cartpole`` under
``trainer=subprocess_actors`` (2 actors), local and on Ray (a private instance), stopped by
``eval.target_return=475`` (the first greedy evaluation, 10 episodes every 10k steps, that reaches 475; the
preset reaches it within 200k steps on every seed measured, docs/benchmarks.md "IMPALA on CartPole"), per seed. RLlib
(``--rllib-python``): APPO at its defaults (``APPOConfig()`` on CartPole-v1: 2 env runners, 1 env each, 500-step
train batches, lr 5e-4), stopped when RLlib's own
``env_runners/episode_return_mean`` (its training return) reaches 475 or after ``--rllib-budget-s``. Times are
the training loop's (start-up excluded: rltrain's ``solved_at_seconds``, RLlib's from after ``build_algo``).

The ratios are the point: the machine's speed drifts between runs, so compare rows of one script run only.

    python scripts/bench_actor_backends.py                  # 1/2/4 actors, 60k steps each
    python scripts/bench_actor_backends.py --actors 2 --steps 20000 --no-cluster
    python scripts/bench_actor_backends.py --skip-sps --to-475 --rllib-python rllib-venv/bin/python

RLlib is not an rltrain dependency, and ``ray[rllib]`` pins an older gymnasium than rltrain's: install it in a
venv of its own, with the Ray version rltrain uses (``python -c 'import ray; print(ray.__version__)'``)::

    python -m venv rllib-venv && rllib-venv/bin/pip install torch "ray[rllib]==2.60.0"

RLlib's APPO asks Ray for more CPUs than a 2-core machine has (its env runners, learner and aggregator actors
wait for each other's CPUs forever); the RLlib run therefore starts its Ray instance advertising 8 logical CPUs,
as rltrain's private instance advertises enough for its actors.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_one(backend: str, actors: int, steps: int, *, address: str | None = None) -> dict:
    args = ["algo=impala", "trainer=subprocess_actors", f"trainer.num_actors={actors}", "trainer.batch_rollouts=4",
            "env.num_envs=4", f"total_env_steps={steps}", "eval.every_env_steps=0", "eval.episodes=1",
            "checkpoint.every_env_steps=0", f"log.every_env_steps={max(steps // 10, 1000)}", "logger.progress=off",
            "seed=1", f"trainer.backend={backend}", "hydra.run.dir=run"]
    if backend == "local":
        args.append("trainer.start_method=fork")
    if address:
        args += [f"trainer.ray.address={address}", "trainer.ray.actor_resources={num_cpus:1,actor_host:1}"]
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([sys.executable, "-m", "rltrain", *args], cwd=tmp, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{backend} with {actors} actors failed:\n{res.stderr[-2000:]}")
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
        with open(Path(tmp) / "run" / "metrics.csv") as f:
            rows = [float(r["time/sps"]) for r in csv.DictReader(f) if r.get("time/sps")]
    steady = statistics.median(rows[1:]) if len(rows) > 1 else float("nan")
    return {"backend": backend + (" (2-node cluster)" if address else ""), "actors": actors,
            "sps": summary["sps"], "steady_sps": steady}


RLLIB = """
import json, sys, time
import ray
from ray.rllib.algorithms.appo import APPOConfig

budget_s = float(sys.argv[1])
ray.init(address="local", include_dashboard=False, log_to_driver=False, num_cpus=8, object_store_memory=1 << 30)
algo = APPOConfig().environment("CartPole-v1").build_algo()
t0, steps, ret = time.perf_counter(), 0, None
while time.perf_counter() - t0 < budget_s and (ret is None or ret < 475):
    result = algo.train()
    ret = result["env_runners"].get("episode_return_mean")
    steps = result.get("num_env_steps_sampled_lifetime") or \
        result["env_runners"].get("num_env_steps_sampled_lifetime") or steps
ret = None if ret is None else float(ret)  # numpy scalars: json takes Python numbers only
print("RLLIB=" + json.dumps({"steps": int(steps), "seconds": time.perf_counter() - t0, "return": ret,
                             "reached": ret is not None and ret >= 475}), flush=True)
algo.stop()
ray.shutdown()
"""


def to_475(backend: str, seed: int, budget: int = 300_000) -> dict:
    """rltrain's IMPALA preset, 2 actors, until the first evaluation of 475 (or the budget)."""
    args = ["experiment=impala_cartpole", "trainer=subprocess_actors", f"trainer.backend={backend}",
            f"total_env_steps={budget}", "eval.target_return=475", "eval.every_env_steps=10000",
            "log.every_env_steps=10000", "eval.both_modes=false", "checkpoint.every_env_steps=0",
            "logger.progress=off", f"seed={seed}", "hydra.run.dir=run"]
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([sys.executable, "-m", "rltrain", *args], cwd=tmp, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{backend} to 475 (seed {seed}) failed:\n{res.stderr[-2000:]}")
        s = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    reached = s["solved_at_env_steps"] is not None
    return {"who": f"rltrain IMPALA, {backend}" + (", private instance" if backend == "ray" else ""),
            "seed": seed, "reached": reached, "steps": s["solved_at_env_steps"] or s["total_env_steps"],
            "seconds": s["solved_at_seconds"] if reached else s["wall_time_s"], "return": s["best_eval_return"]}


def rllib_to_475(python: str, budget_s: float) -> dict:
    res = subprocess.run([python, "-c", RLLIB, str(budget_s)], capture_output=True, text=True)
    line = next((x for x in res.stdout.splitlines() if x.startswith("RLLIB=")), None)
    if line is None:
        raise SystemExit(f"the RLlib run failed ({python}):\n{res.stderr[-2000:]}")
    return {"who": "RLlib APPO, defaults", "seed": "-", **json.loads(line.removeprefix("RLLIB="))}


HEADER_475 = ("\n| run | seed | reached 475 | env steps | seconds | return (best eval / RLlib train) |\n"
              "|---|---|---|---|---|---|")


def print_row_475(r: dict) -> None:
    mark = "yes" if r["reached"] else "no (budget)"
    ret = "-" if r["return"] is None else f"{r['return']:.1f}"
    print(f"| {r['who']} | {r['seed']} | {mark} | {r['steps']:,} | {r['seconds']:.1f} | {ret} |", flush=True)


def print_ratio_475(rows: list[dict]) -> None:
    rllib = next((r for r in rows if r["who"].startswith("RLlib")), None)
    ours = [r for r in rows if r["who"].startswith("rltrain IMPALA, ray") and r["reached"]]
    if rllib and ours:
        worst = max(r["seconds"] for r in ours)
        bound = "" if rllib["reached"] else \
            " (RLlib did not reach 475: its time is a lower bound, the ratio an upper one)"
        print(f"\nrltrain on Ray / RLlib time to 475: <= {worst / rllib['seconds']:.3f} (slowest seed that reached "
              f"it){bound}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--actors", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=60_000)
    p.add_argument("--no-cluster", action="store_true", help="skip the one-host two-node cluster rows")
    p.add_argument("--skip-sps", action="store_true", help="skip the steps/s table")
    p.add_argument("--to-475", action="store_true", help="time and steps to 475 (rltrain local and on Ray)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="rltrain seeds for --to-475")
    p.add_argument("--backends", nargs="+", default=["local", "ray"], choices=["local", "ray"],
                   help="rltrain backends for --to-475")
    p.add_argument("--rllib-python", help="a python with ray[rllib] installed: adds RLlib's APPO to --to-475")
    p.add_argument("--rllib-budget-s", type=float, default=600.0, help="RLlib's training time limit")
    args = p.parse_args()
    print(f"# {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} (a shared machine makes this noisy)")
    if not args.skip_sps:
        sps_table(args)
    if args.to_475:
        print(HEADER_475, flush=True)
        rows = []
        for backend, seed in [(b, s) for b in args.backends for s in args.seeds]:
            rows.append(to_475(backend, seed))
            print_row_475(rows[-1])
        if args.rllib_python:
            rows.append(rllib_to_475(args.rllib_python, args.rllib_budget_s))
            print_row_475(rows[-1])
        print_ratio_475(rows)


def sps_table(args) -> None:
    rows = []
    for actors in args.actors:
        local = run_one("local", actors, args.steps)
        rows += [local, run_one("ray", actors, args.steps)]
    if not args.no_cluster:
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        try:
            for _ in range(2):
                cluster.add_node(num_cpus=2, resources={"actor_host": 2})
            cluster.wait_for_nodes()
            rows += [run_one("ray", a, args.steps, address=cluster.address) for a in args.actors]
        finally:
            cluster.shutdown()
    base = {r["actors"]: r for r in rows if r["backend"] == "local"}
    print("| backend | actors | sps (whole run) | steady sps | steady vs local |\n|---|---|---|---|---|")
    for r in rows:
        ratio = r["steady_sps"] / base[r["actors"]]["steady_sps"] if r["actors"] in base else float("nan")
        print(f"| {r['backend']} | {r['actors']} | {r['sps']:,.0f} | {r['steady_sps']:,.0f} | x{ratio:.2f} |")


if __name__ == "__main__":
    main()
