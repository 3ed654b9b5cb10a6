"""Benchmark: K agents with ``trainer=parallel`` vs the same K agents run one after the other.

Both sides are whole ``python -m rltrain`` processes timed end to end (imports, env creation, final eval and
all), because that is what a user waits for. The sequential side runs ``trainer=sequential seed=<agent k's
derived seed>`` for each k, i.e. exactly the agents the parallel run trains. On a machine with >= K free
cores the ratio should approach 1/K plus process start-up; the issue's target on 2 cores is <= 0.6.

    python scripts/bench_parallel.py --agents 2 --steps 50000
    python scripts/bench_parallel.py --agents 2 --steps 50000 --cpus 0,1   # pin to 2 cores (taskset)

``bench_parallel()`` is importable (e.g. from ``scripts/bench_throughput.py``) and returns a dict.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMON = ["logger=quiet", "eval.every_env_steps=0", "checkpoint.every_env_steps=0", "target_return=null"]


def _run(args: list[str], cwd: Path, cpus: str | None) -> float:
    cmd = [sys.executable, "-m", "rltrain", *COMMON, *args]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return wall


def cpu_ceiling(*, agents: int = 2, seconds: float = 5.0, cpus: str | None = None) -> float:
    """The best ratio this machine allows right now: K pure-Python busy loops at once vs one after another.

    On an idle machine with >= K cores it is ~1/K; on a shared one (other users, CFS autogroups giving one
    login session a fixed share) it can be near 1.0, and no parallel trainer can beat it.
    """
    loop = f"import time\nt=time.perf_counter()\nx=0\nfor i in range({int(seconds * 2e6)}): x+=i*i\n"
    cmd = [sys.executable, "-c", loop]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    t0 = time.perf_counter()
    for _ in range(agents):
        subprocess.run(cmd, check=True)
    t_seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd) for _ in range(agents)]
    for p in procs:
        p.wait()
    return (time.perf_counter() - t0) / t_seq


def bench_parallel(*, agents: int = 2, steps: int = 50_000, seed: int = 1, env: str = "cartpole",
                   cpus: str | None = None, extra: list[str] | None = None) -> dict:
    """Wall time of one ``trainer=parallel`` run of ``agents`` agents vs those agents one after the other."""
    extra = list(extra or [])
    work = Path(tempfile.mkdtemp(prefix="rltrain-bench-parallel-"))
    try:
        base = [f"env={env}", f"total_env_steps={steps}", f"seed={seed}", *extra]
        t_par = _run([*base, "trainer=parallel", f"trainer.num_agents={agents}", "hydra.run.dir=par"], work, cpus)
        seeds = json.loads((work / "par" / "seeds.json").read_text())["workers"]
        t_seq = 0.0
        for k in range(agents):
            t_seq += _run([*base[:2], f"seed={seeds[f'agent_{k}']['root']}", *extra, f"hydra.run.dir=seq{k}"], work, cpus)
        par = json.loads((work / "par" / "summary.json").read_text())
        seq = [json.loads((work / f"seq{k}" / "summary.json").read_text()) for k in range(agents)]
        seq_finals = [s["final_eval_return"] for s in seq]
        return {"agents": agents, "steps_per_agent": steps, "cpus": cpus or f"all ({os.cpu_count()})",
                "parallel_s": round(t_par, 2), "one_after_another_s": round(t_seq, 2),
                "ratio": round(t_par / t_seq, 3),
                "train_sps_parallel_agents": [round(a["sps"] or 0) for a in par["agents"]],
                "train_sps_sequential": [round(s["sps"] or 0) for s in seq],
                "same_results": [a["final_eval_return"] for a in par["agents"]] == seq_finals}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--env", default="cartpole")
    p.add_argument("--cpus", default=None, help="pin every process to these cores (taskset -c), e.g. 0,1")
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args()
    for _ in range(a.repeat):
        ceiling = cpu_ceiling(agents=a.agents, cpus=a.cpus)
        r = bench_parallel(agents=a.agents, steps=a.steps, env=a.env, cpus=a.cpus)
        r["machine_ceiling_ratio"] = round(ceiling, 3)
        print(json.dumps(r), flush=True)
        print(f"parallel/one-after-another wall-time ratio: {r['ratio']:.2f} (target <= 0.6 on 2 cores; "
              f"this machine's ceiling right now, busy loops: {ceiling:.2f})", flush=True)


if __name__ == "__main__":
    main()
