"""``trainer=subprocess_actors`` steps/s with ``trainer.backend=local`` vs ``ray``, same script run, one table.

Every configuration is one real ``rltrain`` run (IMPALA on CartPole-v1, the same learner batch): local actor
processes, Ray actors on a private Ray instance (one node), and Ray actors on a one-host two-node Ray cluster
(``ray.cluster_utils.Cluster``, actors kept off the head by a custom resource), with 1, 2 and 4 actors.
Two figures per run: ``sps`` over the whole loop (actor start-up included: Ray's workers start slower) and
``steady sps``, the median of the logged rows after the first (actors running). The ratios to local are the
point: the machine's speed drifts between runs, so compare rows of one table only.

    python scripts/bench_actor_backends.py                  # 1/2/4 actors, 60k steps each
    python scripts/bench_actor_backends.py --actors 2 --steps 20000 --no-cluster

RLlib's APPO is not run here (``ray[rllib]`` is not an rltrain dependency).
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--actors", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=60_000)
    p.add_argument("--no-cluster", action="store_true", help="skip the one-host two-node cluster rows")
    args = p.parse_args()
    print(f"# {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} (a shared machine makes this noisy)")
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
