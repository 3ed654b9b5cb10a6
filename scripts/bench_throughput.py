"""Throughput and time-to-solve, side by side, as one markdown table.

    python scripts/bench_throughput.py                  # every section
    python scripts/bench_throughput.py --only env,train # some sections
    python scripts/bench_throughput.py --quick          # smaller budgets, one seed (a smoke check)

Sections (add yours: write ``def section_<name>(args) -> list[Row]`` and register it in ``SECTIONS``):
  env    the raw env ceiling: our ``VecEnv`` (same env id and num_envs as the training case), random actions
  train  rltrain's PPO at CleanRL's CartPole settings (experiment=ppo_cleanrl) through the real ``TrainLoop``,
         steps/s measured over a fixed number of steps after a warm-up, and its ratio to the env ceiling
  solve  whole-process ``rltrain target_return=475 seed=s`` for seeds 1 2 3: wall time (median) and when
         the rolling mean of 20 training episodes reached 475
  parallel     2 agents under ``trainer=parallel`` vs the same agents one after the other (wall-time ratio)
  distributed  ``trainer=distributed_simulator`` SPS at world_size 1 and 2, equal work per rank (scaling)
  actors       ``trainer=subprocess_actors`` IMPALA SPS with 1/2/4 actors, CartPole and a 200 us/step CartPole
  sb3          Stable-Baselines3 at the same moment (needs --sb3-python): time to solve (zoo settings) and
               PPO SPS at CleanRL settings, side by side; not in the default set
  pixels       PPO from pixels: ALE/Breakout-v5 with env=atari and the Nature CNN at CleanRL's ppo_atari settings
               (8 envs x 128, 4 epochs x 4 minibatches) beside SB3's CnnPolicy + AtariWrapper + 4-frame stack
               (needs --sb3-python with ale-py); subprocess_actors IMPALA on Breakout with 2 actors vs 1;
               PPO on MinAtar Breakout (experiment=ppo_minatar); not in the default set
  rnn_plans    PPO-LSTM on Blackjack / Taxi / CartPole with the recurrent unroll split at every episode start
               (the plan before segment batching) vs the cost model's plan, paired in one run; not in the default set

Both wall-clock and CPU-time (this process) rates are printed: on a shared machine wall time measures the
neighbours too, CPU time is the cost of our own code. Timings are not asserted anywhere; compare ratios.
The measurements the sections make rows of (the TrainLoop timed in this process, a whole ``rltrain`` process,
the SB3 peer's script) are ``scripts/timed_runs.py``; this file holds the sections, the table and the flags.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timed_runs import REPO, clock, measure_train, run_cli, run_peer  # noqa: E402  (the rows' measurements)

ENV_ID, NUM_ENVS = "CartPole-v1", 4


@dataclass
class Row:
    """One line of the table. ``wall_sps`` / ``cpu_sps`` in env steps per second; ``ratio`` vs the ceiling."""

    section: str
    case: str
    wall_sps: float | None = None
    cpu_sps: float | None = None
    ratio: str = ""
    notes: str = ""
    extra: dict = field(default_factory=dict)


# -- env: the ceiling ------------------------------------------------------------------------------------
def section_env(args) -> list[Row]:
    import numpy as np

    from rltrain.envs.make import make_vector_env

    steps = 20_000 if args.quick else 100_000
    venv = make_vector_env(ENV_ID, NUM_ENVS, list(range(NUM_ENVS)))
    venv.reset()
    actions = np.random.default_rng(0).integers(0, 2, (steps // NUM_ENVS, NUM_ENVS))
    for a in actions[:500]:  # warm-up
        venv.step(a)
    (w0, c0) = clock()
    for a in actions:
        venv.step(a)
    (w1, c1) = clock()
    venv.close()
    n = len(actions) * NUM_ENVS
    args.ceiling = (n / (w1 - w0), n / (c1 - c0))
    return [Row("env", f"VecEnv {ENV_ID} x{NUM_ENVS}, random actions", n / (w1 - w0), n / (c1 - c0), "1.00",
                f"{n} steps")]


# -- train: PPO at CleanRL's settings through the TrainLoop -----------------------------------------------
def section_train(args) -> list[Row]:
    warmup, measure = (4096, 20_480) if args.quick else (10_240, 102_400)
    wall, cpu, _ = measure_train(["experiment=ppo_cleanrl"], warmup=warmup, measure=measure)
    ceiling = getattr(args, "ceiling", None)
    ratio = f"{wall / ceiling[0]:.2f} (cpu {cpu / ceiling[1]:.2f})" if ceiling else ""
    return [Row("train", "PPO experiment=ppo_cleanrl (4 envs x 128, 4 epochs x 4 mb, 64x64 tanh)", wall, cpu, ratio,
                f"{measure} steps after {warmup} warm-up")]


# -- solve: whole-process time to a rolling-20 return of 475 ------------------------------------------------
def section_solve(args) -> list[Row]:
    seeds = [1] if args.quick else [1, 2, 3]
    rows, walls, cpus = [], [], []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            wall, cpu, s = run_cli(["target_return=475", f"seed={seed}", "logger=quiet", *args.solve_args], Path(tmp))
        walls.append(wall)
        cpus.append(cpu)
        solved = s["solved_at_env_steps"]
        rows.append(Row("solve", f"rltrain target_return=475 seed={seed}", notes=(
            f"whole process {wall:.1f} s wall / {cpu:.1f} s CPU; solved at "
            + (f"{solved} steps, {s['solved_at_seconds']:.1f} s in the loop" if solved else "NOT solved")
            + f"; final eval {s['final_eval_return']:.1f}")))
    rows.append(Row("solve", f"median over seeds {seeds}",
                    notes=f"**{statistics.median(walls):.1f} s wall / {statistics.median(cpus):.1f} s CPU**"))
    return rows


# -- the multi-process trainers (their own scripts hold the details; these rows put them side by side) --------
def _script(name: str):
    sys.path.insert(0, str(REPO / "scripts"))
    return __import__(name)


def section_parallel(args) -> list[Row]:
    """trainer=parallel with 2 agents vs the same 2 agents one after the other (whole processes)."""
    bp = _script("bench_parallel")
    ceiling = bp.cpu_ceiling(agents=2, seconds=2.0 if args.quick else 5.0)
    # long enough that start-up (each spawned agent imports torch, ~2 s here) does not dominate: see docs/benchmarks.md
    r = bp.bench_parallel(agents=2, steps=20_000 if args.quick else 500_000)
    return [Row("parallel", f"2 agents x {r['steps_per_agent']} steps, trainer=parallel vs one after the other",
                ratio=f"{r['ratio']:.2f} (target <= 0.6)",
                notes=(f"{r['parallel_s']:.1f} s vs {r['one_after_another_s']:.1f} s wall; per-agent train SPS "
                       f"{r['train_sps_parallel_agents']} vs {r['train_sps_sequential']}; same results: "
                       f"{r['same_results']}; busy-loop ceiling of this machine now {ceiling:.2f}"))]


def section_distributed(args) -> list[Row]:
    """trainer=distributed_simulator, world_size 1 and 2 at equal work per rank (SPS inside the loop)."""
    bd = _script("bench_distributed")
    ns = argparse.Namespace(num_envs=4, rollout_len=128, steps_per_rank=10_240 if args.quick else 40_960)
    rows, base = [], None
    for world in (1, 2):
        s = bd.run(world, ns)
        base = base or float(s["sps"])
        rows.append(Row("distributed", f"world_size={world} ({s['backend']}), 4 envs x 128 steps per rank",
                        wall_sps=float(s["sps"]), ratio=f"x{float(s['sps']) / base:.2f} vs 1 rank (target >= 1.6 at 2)",
                        notes="per rank: " + ", ".join(f"{v:,.0f}" for v in s["rank_sps"])))
    return rows


def section_actors(args) -> list[Row]:
    """trainer=subprocess_actors (IMPALA), 1/2/4 actors on CartPole-v1 and on a CartPole with 200 us/step."""
    ba = _script("bench_actors")
    steps = {"cartpole": 20_000, "busy": 8_000} if args.quick else None
    rows = []
    for r in ba.bench("impala", ("cartpole", "busy"), (1, 2, 4), steps):
        target = " (target >= 1.5 at 2 actors)" if r["env"] == "busy" and r["actors"] == 2 else ""
        rows.append(Row("actors", f"impala, {r['env']}, {r['actors']} actor(s)", wall_sps=r["sps"],
                        ratio=f"x{r['scaling_vs_1']:.2f} vs 1 actor{target}",
                        notes=f"{r['steps']} steps, {r['wall_s']:.1f} s wall"))
    return rows


def section_pixels(args) -> list[Row]:
    """PPO from pixels side by side with SB3 in this run; actors 2 vs 1 on Atari; the MinAtar PPO SPS."""
    warmup, measure = (1024, 2048) if args.quick else (2048, 6144)
    rows = []
    ours, our_cpu, _ = measure_train(["experiment=ppo_atari", "env.id=ALE/Breakout-v5"], warmup=warmup,
                                     measure=measure)
    if args.sb3_python:
        theirs = run_peer(args.sb3_python, "pixels", "BreakoutNoFrameskip-v4", str(warmup), str(measure))[1]["sps"]
        rows.append(Row("pixels", "PPO Breakout, Nature CNN, 8 x 128, 4 x 4 mb: rltrain vs SB3 CnnPolicy", ours,
                        our_cpu, f"x{ours / theirs:.2f} SB3 (target >= 1.5)",
                        f"SB3 {theirs:,.0f} steps/s; {measure} steps after {warmup} warm-up each"))
    else:
        rows.append(Row("pixels", "PPO Breakout, Nature CNN (SB3 skipped: pass --sb3-python)", ours, our_cpu))
    steps = 4096 if args.quick else 12288
    actor_sps = {}
    for n in (1, 2):
        with tempfile.TemporaryDirectory() as tmp:
            _, _, s = run_cli(["experiment=impala_atari", f"trainer.num_actors={n}", f"total_env_steps={steps}",
                               "logger=quiet", "eval.episodes=1", "eval.every_env_steps=0",
                               "checkpoint.every_env_steps=0"], Path(tmp))
        actor_sps[n] = float(s["sps"])
        rows.append(Row("pixels", f"IMPALA Breakout (impala CNN), subprocess_actors, {n} actor(s)", actor_sps[n],
                        ratio=f"x{actor_sps[n] / actor_sps[1]:.2f} vs 1 actor" + (" (target >= 1.5)" if n == 2 else ""),
                        notes=f"{steps} steps, loop SPS from summary.json"))
    mw, mc, _ = measure_train(["experiment=ppo_minatar"], warmup=2048, measure=8192 if args.quick else 20480)
    rows.append(Row("pixels", "PPO MinAtar Breakout (experiment=ppo_minatar: MinAtar CNN, 16 x 128)", mw, mc))
    return rows


def section_recurrent(args) -> list[Row]:
    """Recurrent PPO on CartPoleNoVel at rl-zoo3's ppo_lstm settings (8 envs x 32 steps, 20 epochs, batch 256,
    LSTM 64) beside sb3-contrib's RecurrentPPO in this run: training SPS, then time to a rolling-20 training
    return of 475 (whole process, seed by seed, interleaved; rltrain with its preset, sb3-contrib with the zoo's
    settings, as the sb3 section compares defaults). Needs ``--sb3-python`` with sb3-contrib."""
    warmup, measure = (1024, 4096) if args.quick else (2048, 16384)
    # SPS at the zoo's settings (the preset trains 10 epochs per rollout, the zoo 20); time to 475 with the preset
    ours, our_cpu, _ = measure_train(["experiment=ppo_lstm_cartpole_novel", "algo.update_epochs=20"],
                                     warmup=warmup, measure=measure)
    if not args.sb3_python:
        return [Row("recurrent", "PPO-LSTM CartPoleNoVel (sb3-contrib skipped: pass --sb3-python)", ours, our_cpu)]
    peer = functools.partial(run_peer, args.sb3_python)
    _, theirs = peer("recurrent-sps", str(warmup), str(measure))
    rows = [Row("recurrent", "PPO-LSTM CartPoleNoVel, zoo settings: rltrain vs sb3-contrib RecurrentPPO", ours,
                our_cpu, f"x{ours / theirs['sps']:.2f} sb3-contrib (target >= 2)",
                f"sb3-contrib {theirs['sps']:,.0f} steps/s; {measure} steps after {warmup} warm-up each")]
    walls: dict[str, list[float]] = {"rltrain": [], "sb3-contrib": []}
    for seed in [1] if args.quick else [1, 2, 3]:
        with tempfile.TemporaryDirectory() as tmp:
            wall, _, s = run_cli(["experiment=ppo_lstm_cartpole_novel", "target_return=475", f"seed={seed}",
                                  "logger=quiet"], Path(tmp))
        t_wall, t = peer("recurrent-solve", str(seed))
        walls["rltrain"].append(wall)
        walls["sb3-contrib"].append(t_wall)
        rows.append(Row("recurrent", f"time to 475, seed={seed}", notes=(
            f"rltrain {wall:.1f} s (solved at {s['solved_at_env_steps']} steps) vs sb3-contrib {t_wall:.1f} s "
            f"(solved at {t['solved_at_env_steps']} steps)")))
    mo, mt = statistics.median(walls["rltrain"]), statistics.median(walls["sb3-contrib"])
    rows.append(Row("recurrent", "time to 475, median over seeds (whole process)", ratio=f"x{mo / mt:.2f} "
                    "sb3-contrib (target <= 0.5)", notes=f"rltrain {mo:.1f} s vs sb3-contrib {mt:.1f} s"))
    return rows


def section_rnn_plans(args) -> list[Row]:
    """Recurrent PPO (``model.core=lstm``, the defaults otherwise) on short (Blackjack-v1, ~1.4 steps), mixed
    (Taxi-v4) and long (CartPole-v1) episodes, learning with the fused unroll split at every episode start
    (``RecurrentCore.unroll_plan="spans"``, the plan before segment batching) and as the cost model picks
    (``"auto"``): paired, interleaved in this run, since this machine's speed drifts between hours."""
    from rltrain.models.cores import RecurrentCore

    rounds = 1 if args.quick else 2
    cases = [("Blackjack-v1", 512, 1024 if args.quick else 3072), ("Taxi-v4", 1024, 2048 if args.quick else 8192),
             ("CartPole-v1", 1024, 2048 if args.quick else 8192)]
    rows = []
    for env_id, warmup, measure in cases:
        sps: dict[str, list[tuple[float, float]]] = {"spans": [], "auto": []}
        for _ in range(rounds):
            for plan in sps:
                RecurrentCore.unroll_plan = plan
                try:
                    wall, cpu, _ = measure_train([f"env.id={env_id}", "model.core=lstm"], warmup=warmup,
                                                 measure=measure)
                finally:
                    RecurrentCore.unroll_plan = "auto"
                sps[plan].append((wall, cpu))
        (sw, sc), (aw, ac) = ((statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
                              for v in sps.values())
        rows.append(Row("rnn_plans", f"PPO-LSTM {env_id}: spans (before) -> auto", aw, ac,
                        f"x{aw / sw:.2f} wall, x{ac / sc:.2f} cpu",
                        f"spans {sw:,.0f} wall / {sc:,.0f} cpu steps/s; median of {rounds}, {measure} steps after "
                        f"{warmup} warm-up"))
    return rows


def section_sb3(args) -> list[Row]:
    """Stable-Baselines3 beside rltrain at the same moment (this machine's speed drifts ~2x over a day):
    time to solve, interleaved seed by seed (SB3 with rl-baselines3-zoo's CartPole settings, rltrain with its
    defaults), and PPO SPS at CleanRL's settings. Needs ``--sb3-python``: a Python with stable-baselines3."""
    if not args.sb3_python:
        return [Row("sb3", "skipped", notes="pass --sb3-python /path/to/python (a venv with stable-baselines3)")]
    sb3 = functools.partial(run_peer, args.sb3_python, timeout=900)
    seeds = [1] if args.quick else [1, 2, 3]
    ours, theirs, rows = [], [], []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            wall, _, s = run_cli(["target_return=475", f"seed={seed}", "logger=quiet"], Path(tmp))
        ours.append(wall)
        t_wall, t = sb3("solve", str(seed))
        theirs.append(t_wall)
        rows.append(Row("sb3", f"time to solve, seed={seed}", notes=(
            f"rltrain {wall:.1f} s (solved at {s['solved_at_env_steps']} steps) vs SB3 zoo {t_wall:.1f} s "
            f"(solved at {t['solved_at_env_steps']} steps, {t['loop_s']:.1f} s in learn)")))
    mo, mt = statistics.median(ours), statistics.median(theirs)
    rows.append(Row("sb3", "time to solve, median (whole process)", ratio=f"{mo / mt:.2f} (rltrain / SB3)",
                    notes=f"**rltrain {mo:.1f} s vs SB3 zoo {mt:.1f} s**"))
    warmup, measure = (4096, 20_480) if args.quick else (10_240, 102_400)
    our_sps, _, _ = measure_train(["experiment=ppo_cleanrl"], warmup=warmup, measure=measure)
    _, t = sb3("sps")
    rows.append(Row("sb3", "PPO SPS at CleanRL settings: rltrain vs SB3", wall_sps=our_sps,
                    ratio=f"x{our_sps / t['sps']:.2f} vs SB3", notes=f"SB3 {t['sps']:,.0f} steps/s"))
    return rows


SECTIONS: dict[str, Callable[[argparse.Namespace], list[Row]]] = {
    "env": section_env,
    "train": section_train,
    "solve": section_solve,
    "parallel": section_parallel,
    "distributed": section_distributed,
    "actors": section_actors,
    "sb3": section_sb3,
    "pixels": section_pixels,
    "recurrent": section_recurrent,
    "rnn_plans": section_rnn_plans,
}


def commit() -> str:
    """The checkout's commit, with ``+changes`` when files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True)
    return (head.stdout.strip() or "unknown") + ("+changes" if dirty.stdout.strip() else "")


def fmt(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}"


def print_table(rows: list[Row]) -> None:
    print("| section | case | steps/s (wall) | steps/s (CPU) | ratio to env ceiling | notes |")
    print("|---|---|---:|---:|---|---|")
    for r in rows:
        print(f"| {r.section} | {r.case} | {fmt(r.wall_sps)} | {fmt(r.cpu_sps)} | {r.ratio} | {r.notes} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(k for k in SECTIONS if k not in ("sb3", "pixels", "recurrent",
                                                                              "rnn_plans")),
                   help=f"comma-separated sections: {', '.join(SECTIONS)}")
    p.add_argument("--quick", action="store_true", help="smaller budgets and one seed")
    p.add_argument("--solve-args", nargs="*", default=[], help="extra overrides for the solve runs")
    p.add_argument("--sb3-python", default=os.environ.get("RLTRAIN_SB3_PYTHON"),
                   help="a Python with stable-baselines3, for the sb3 section (or set RLTRAIN_SB3_PYTHON)")
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        p.error(f"unknown section(s) {unknown}; valid: {', '.join(SECTIONS)}")
    import torch

    torch.set_num_threads(1)
    print(f"measured at commit {commit()}", flush=True)  # figures quoted from this table name it
    rows: list[Row] = []
    if "train" in only and "env" not in only:
        section_env(argparse.Namespace(**{**vars(args), "quick": True}))  # the ceiling for the ratio only
    for name in only:
        t0 = time.perf_counter()
        new = SECTIONS[name](args)
        print(f"[{name}] done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        rows += new
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
