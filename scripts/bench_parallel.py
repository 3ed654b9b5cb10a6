"""Benchmark: K agents with ``trainer=parallel`` vs the same K agents run one after the other, per start method.

Both sides are whole ``python -m rltrain`` processes timed end to end (imports, env creation, final eval and
all), because that is what a user waits for. The sequential side runs ``trainer=sequential seed=<agent k's
derived seed>`` for each k, i.e. exactly the agents the parallel run trains. On a machine with >= K free
cores the ratio should approach 1/K plus process start-up; rltrain's target on 2 cores is <= 0.6.

Every repeat measures, back to back: the machine's busy-loop ceiling, the sequential pair, and one parallel
run per start method (their order rotates between repeats), so the ratios of one repeat share one moment of
a possibly busy machine. ``--startup`` adds the time from starting the workers to each worker's ``Started``
(its target's module imported) and to its first reported update, per start method, each in a fresh process
(a fork server lives as long as the process that started it).

    python scripts/bench_parallel.py --agents 2 --steps 150000 --repeat 3 --startup
    python scripts/bench_parallel.py --agents 2 --steps 50000 --cpus 0,1   # pin to 2 cores (taskset)

``bench_parallel()`` is importable (e.g. from ``scripts/bench_throughput.py``) and returns a dict.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMON = ["logger=quiet", "eval.every_env_steps=0", "checkpoint.every_env_steps=0", "target_return=null"]
METHODS = ("spawn", "forkserver", "fork")


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(args: list[str], cwd: Path, cpus: str | None, cpu: dict | None = None) -> float:
    """Wall seconds of one whole ``rltrain`` process; its CPU seconds (its waited-for process tree) are
    added to ``cpu["s"]``. CPU time hardly depends on how busy the machine is, so it shows start-up work
    saved even when the wall times are noise; a fork server's own import is not in it (nobody waits for it)."""
    cmd = [sys.executable, "-m", "rltrain", *COMMON, *args]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    t0, c0 = time.perf_counter(), _cpu_of_children()
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - t0
    if cpu is not None:
        cpu["s"] = cpu.get("s", 0.0) + _cpu_of_children() - c0
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
                   cpus: str | None = None, extra: list[str] | None = None, methods: tuple[str, ...] = ("default",)
                   ) -> dict:
    """Wall time of one ``trainer=parallel`` run of ``agents`` agents per start method in ``methods``
    (``default``: the trainer's configured one) vs those agents one after the other. The top-level
    ``parallel_s`` / ``ratio`` / ``train_sps_parallel_agents`` are the first method's; ``by_method`` has all."""
    extra = list(extra or [])
    work = Path(tempfile.mkdtemp(prefix="rltrain-bench-parallel-"))
    try:
        base = [f"env={env}", f"total_env_steps={steps}", f"seed={seed}", *extra]
        t_par: dict[str, float] = {}
        cpu: dict[str, dict] = {m: {} for m in (*methods, "sequential")}
        for m in methods:
            choice = [] if m == "default" else [f"trainer.start_method={m}"]
            t_par[m] = _run([*base, "trainer=parallel", f"trainer.num_agents={agents}", *choice,
                             f"hydra.run.dir=par_{m}"], work, cpus, cpu[m])
        seeds = json.loads((work / f"par_{methods[0]}" / "seeds.json").read_text())["workers"]
        t_seq = 0.0
        for k in range(agents):
            args = [*base[:2], f"seed={seeds[f'agent_{k}']['root']}", *extra, f"hydra.run.dir=seq{k}"]
            t_seq += _run(args, work, cpus, cpu["sequential"])
        seq = [json.loads((work / f"seq{k}" / "summary.json").read_text()) for k in range(agents)]
        seq_finals = [s["final_eval_return"] for s in seq]
        par = {m: json.loads((work / f"par_{m}" / "summary.json").read_text()) for m in methods}
        by_method = {m: {"parallel_s": round(t_par[m], 2), "ratio": round(t_par[m] / t_seq, 3),
                         "train_sps_parallel_agents": [round(a["sps"] or 0) for a in par[m]["agents"]],
                         # the fork server's tree is nobody's waited-for child: its CPU time is not seen
                         "cpu_s": None if m == "forkserver" else round(cpu[m]["s"], 2),
                         "start_method": par[m]["start_method"]} for m in methods}
        first = by_method[methods[0]]
        return {"agents": agents, "steps_per_agent": steps, "cpus": cpus or f"all ({os.cpu_count()})",
                "parallel_s": first["parallel_s"], "one_after_another_s": round(t_seq, 2), "ratio": first["ratio"],
                "train_sps_parallel_agents": first["train_sps_parallel_agents"],
                "train_sps_sequential": [round(s["sps"] or 0) for s in seq], "by_method": by_method,
                "one_after_another_cpu_s": round(cpu["sequential"]["s"], 2),
                "same_results": all([a["final_eval_return"] for a in p["agents"]] == seq_finals for p in par.values())}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def startup_in_this_process(method: str, *, agents: int = 2, env: str = "cartpole") -> dict:
    """Seconds from starting ``agents`` parallel-agent workers to each one's ``Started`` and first update.

    Run it in a fresh process per start method (``--startup-child``): the parent has already imported
    everything, as the ``parallel`` trainer's parent has by the time it starts its agents.
    """
    import torch

    from rltrain.trainers.parallel import AgentJob, AgentProgress, agent_main, compose_agent_overrides
    from rltrain.trainers.supervise import Started, WorkerGroup

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="rltrain-bench-startup-"))
    overrides = [f"env={env}", *COMMON, "total_env_steps=100000", "seed=1"]
    jobs = [AgentJob(k, cfg, str(work / f"agent_{k}"), 0.0) for k, cfg in
            enumerate(compose_agent_overrides([overrides] * agents))]
    started: dict[int, float] = {}
    first_update: dict[int, float] = {}
    try:
        t0 = time.perf_counter()
        with WorkerGroup(start_method=method, name="rltrain-agent") as group:
            for job in jobs:
                group.start(agent_main, job)
            while len(first_update) < agents and group.alive and time.perf_counter() - t0 < 300:
                for ev in group.poll(timeout=0.05):
                    now = time.perf_counter() - t0
                    if isinstance(ev, Started):
                        started.setdefault(ev.index, now)
                    elif isinstance(ev, AgentProgress):
                        first_update.setdefault(ev.index, now)
            group.shutdown(grace_s=10.0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"method": method, "started_s": [round(started[k], 2) for k in sorted(started)],
            "first_update_s": [round(first_update[k], 2) for k in sorted(first_update)]}


def startup(method: str, *, agents: int = 2, cpus: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--startup-child", method, "--agents", str(agents)]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--env", default="cartpole")
    p.add_argument("--cpus", default=None, help="pin every process to these cores (taskset -c), e.g. 0,1")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--methods", default=",".join(METHODS), help="start methods of the parallel runs")
    p.add_argument("--startup", action="store_true", help="also time the start of the workers, per method")
    p.add_argument("--startup-child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.startup_child:
        print(json.dumps(startup_in_this_process(a.startup_child, agents=a.agents, env=a.env)), flush=True)
        return
    methods = tuple(a.methods.split(","))
    for rep in range(a.repeat):
        order = methods[rep % len(methods):] + methods[:rep % len(methods)]  # interleave: rotate the order
        ceiling = cpu_ceiling(agents=a.agents, cpus=a.cpus)
        r = bench_parallel(agents=a.agents, steps=a.steps, env=a.env, cpus=a.cpus, methods=order)
        r["machine_ceiling_ratio"] = round(ceiling, 3)
        if a.startup:
            r["startup"] = [startup(m, agents=a.agents, cpus=a.cpus) for m in order]
        print(json.dumps(r), flush=True)
        ratios = ", ".join(f"{m} {v['ratio']:.2f}" for m, v in r["by_method"].items())
        print(f"parallel/one-after-another wall-time ratio: {ratios} (target <= 0.6 on 2 cores; this machine's "
              f"ceiling right now, busy loops: {ceiling:.2f})", flush=True)


if __name__ == "__main__":
    main()
