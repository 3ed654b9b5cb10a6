"""Learning benchmark: benchmarks x seeds as Hydra multiruns, then a markdown table and a learning-curve PNG.

    python scripts/bench_learning.py                                   # every benchmark of the algorithms table
    python scripts/bench_learning.py --presets ppo_cartpole dqn_cartpole --seeds 1 2 3
    python scripts/bench_learning.py --presets ppo_mujoco:Hopper-v5 ppo_mujoco:Walker2d-v5   # preset:env.id
    python scripts/bench_learning.py --collect outputs/bench/<dir>     # re-summarise a finished sweep

A benchmark is an ``experiment=`` preset, optionally ``preset:ENV_ID`` to run it on another env. Writes
``<out>/learning.md`` (median and IQR of the benchmark's metric and of the wall time, the threshold and
whether the median meets it, and the published reference where there is one) and ``<out>/learning.png``
(training episode return vs env steps: mean across seeds with a min-max band). The metric is the run's
final deterministic evaluation (10 episodes, the run's own eval seeds) unless the reference reports another:
CleanRL's MuJoCo numbers are the mean of the last 100 training episodes, so those rows use that
(``train_return_last100`` in summary.json). Timings depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

# benchmark -> (env steps, threshold on the median of its metric), as in the issues
THRESHOLDS: dict[str, tuple[int, float]] = {
    "ppo_cartpole": (100_000, 475), "a2c_cartpole": (200_000, 400), "dqn_cartpole": (100_000, 400),
    "impala_cartpole": (200_000, 400), "sac_pendulum": (20_000, -250), "ppo_acrobot": (200_000, -100),
    "dqn_acrobot": (200_000, -100), "ppo_pendulum": (300_000, -300),
    # MinAtar from pixels: PPO aims at its published figures; DQN / IMPALA: well above random play (0.4)
    "ppo_minatar": (2_000_000, 15), "ppo_minatar_spaceinvaders": (2_000_000, 60),
    "dqn_minatar": (1_000_000, 5), "impala_minatar": (2_000_000, 5),
    # partially observed: rl-zoo3 RecurrentPPO reaches 500 at 100k on CartPoleNoVel
    "ppo_lstm_cartpole_novel": (200_000, 475), "ppo_lstm_pendulum_novel": (300_000, -300),
    "impala_lstm_cartpole_novel": (500_000, 400), "ppo_lstm_minatar": (1_000_000, float("nan")),
    # MuJoCo: at or above CleanRL ppo_continuous_action's latest benchmark (v4 tasks, 3 seeds)
    "ppo_mujoco:Hopper-v5": (1_000_000, 2383), "ppo_mujoco:Walker2d-v5": (1_000_000, 2288),
    "ppo_mujoco:HalfCheetah-v5": (1_000_000, 1443),
    "sac_mujoco:Hopper-v5": (50_000, float("nan")), "sac_mujoco:HalfCheetah-v5": (50_000, float("nan")),
    # Box2D / classic control presets: the conventional "solved" scores
    "ppo_lunarlander": (1_000_000, 200), "dqn_lunarlander": (150_000, 200),
    "ppo_lunarlander_continuous": (1_000_000, 200), "sac_lunarlander_continuous": (200_000, 200),
    "sac_mountaincar_continuous": (50_000, 90),
}
# benchmark -> (metric in summary.json, published reference shown beside it)
METRICS: dict[str, tuple[str, str]] = {
    "ppo_mujoco:Hopper-v5": ("train_return_last100", "CleanRL 2383 +- 272 (older release 2052)"),
    "ppo_mujoco:Walker2d-v5": ("train_return_last100", "CleanRL 2288 +- 572 (older release 2891)"),
    "ppo_mujoco:HalfCheetah-v5": ("train_return_last100", "CleanRL 1443 +- 46 (older release 2906)"),
    "sac_mujoco:Hopper-v5": ("train_return_last100", "short run: 50k of CleanRL's 1M steps"),
    "sac_mujoco:HalfCheetah-v5": ("train_return_last100", "short run: 50k of CleanRL's 1M steps"),
}


def metric_of(bench: str) -> tuple[str, str]:
    """(summary.json key, reference): the MuJoCo presets on any task use CleanRL's metric."""
    if bench in METRICS:
        return METRICS[bench]
    if bench.partition(":")[0] in ("ppo_mujoco", "sac_mujoco"):
        return "train_return_last100", ""
    return "final_eval_return", ""


def run_sweep(benches: list[str], seeds: list[int], out: Path, extra: list[str]) -> None:
    """One multirun per env override (a preset list shares one); job dirs are <out>/<k>_<job number>."""
    groups: dict[str, list[str]] = {}
    for b in benches:
        groups.setdefault(b.partition(":")[2], []).append(b.partition(":")[0])
    for k, (env_id, presets) in enumerate(groups.items()):
        cmd = [sys.executable, "-m", "rltrain", "-m", f"experiment={','.join(presets)}",
               *([f"env.id={env_id}"] if env_id else []),
               f"seed={','.join(map(str, seeds))}", "logger=quiet", "eval.every_env_steps=0",
               f"hydra.sweep.dir={out}", f"hydra.sweep.subdir={k}_${{hydra.job.num}}", *extra]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def collect(out: Path) -> dict[str, list[dict]]:
    """preset -> one record per finished run: summary.json + the learning curve from metrics.csv."""
    runs: dict[str, list[dict]] = {}
    for job in sorted(p for p in out.iterdir() if (p / "summary.json").exists()):
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        preset = next(o.split("=", 1)[1] for o in overrides if o.startswith("experiment="))
        env_id = next((o.split("=", 1)[1] for o in overrides if o.startswith("env.id=")), "")
        preset = f"{preset}:{env_id}" if env_id else preset
        summary = json.loads((job / "summary.json").read_text())
        steps, rets = [], []
        import csv

        with open(job / "metrics.csv") as f:
            for row in csv.DictReader(f):
                value = row.get("rollout/episode_return", "")
                if value not in ("", "nan"):
                    steps.append(int(float(row["env_steps"] if "env_steps" in row else row["step"])))
                    rets.append(float(value))
        runs.setdefault(preset, []).append({"summary": summary, "steps": steps, "returns": rets})
    return runs


def table(runs: dict[str, list[dict]]) -> str:
    lines = ["| benchmark | env steps | seeds | metric | median [IQR] | mean +- std | per seed | threshold | met | "
             "reference | wall time s: median [IQR] |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for bench, rs in runs.items():
        key, ref = metric_of(bench)
        values = np.array([r["summary"][key] if r["summary"].get(key) is not None else np.nan for r in rs], float)
        walls = np.array([r["summary"]["wall_time_s"] for r in rs], float)
        q = np.percentile(values, [25, 50, 75])
        w = np.percentile(walls, [25, 50, 75])
        thr = THRESHOLDS.get(bench, (0, float("nan")))[1]
        per_seed = ", ".join(f"{r['summary']['seed']}: {v:.1f}" for r, v in zip(rs, values, strict=True))
        met = "-" if np.isnan(thr) else ("yes" if q[1] >= thr else "no")
        metric = "last 100 train episodes" if key == "train_return_last100" else "final eval (10 ep)"
        lines.append(f"| {bench} | {rs[0]['summary']['total_env_steps']} | {len(rs)} | {metric} | {q[1]:.1f} "
                     f"[{q[0]:.1f}, {q[2]:.1f}] | {np.mean(values):.0f} +- {np.std(values):.0f} | {per_seed} | "
                     f">= {thr:g} | {met} | {ref} | "
                     f"{w[1]:.0f} [{w[0]:.0f}, {w[2]:.0f}] |")
    return "\n".join(lines) + "\n"


def plot(runs: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(runs)
    cols = min(n, 4)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(4 * cols, 3 * ((n + cols - 1) // cols)),
                             squeeze=False)
    for ax, (preset, rs) in zip(axes.flat, runs.items(), strict=False):
        grid = np.linspace(0, max(max(r["steps"], default=1) for r in rs), 100)
        curves = np.array([np.interp(grid, r["steps"], r["returns"]) for r in rs if r["steps"]])
        if len(curves):
            ax.plot(grid, curves.mean(0), label="mean")
            ax.fill_between(grid, curves.min(0), curves.max(0), alpha=0.3, label="min-max")
        thr = THRESHOLDS.get(preset, (0, None))[1]
        if thr is not None and not np.isnan(thr):
            ax.axhline(thr, color="grey", ls="--", lw=1)
        ax.set_title(f"{preset} ({len(rs)} seeds)")
        ax.set_xlabel("env steps")
        ax.set_ylabel("episode return (train)")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=list(THRESHOLDS), help="preset or preset:ENV_ID")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--out", type=Path, default=None, help="sweep dir (default outputs/bench/learning-<time>)")
    p.add_argument("--collect", type=Path, default=None, help="only summarise an existing sweep dir")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. trainer=sequential device=cpu")
    args = p.parse_args()
    out = args.collect or args.out or Path("outputs/bench") / time.strftime("learning-%Y%m%d-%H%M%S")
    if args.collect is None:
        run_sweep(args.presets, args.seeds, out.resolve(), args.overrides)
    runs = collect(out)
    md = table(runs)
    (out / "learning.md").write_text(md)
    plot(runs, out / "learning.png")
    print(md)
    print(f"wrote {out / 'learning.md'} and {out / 'learning.png'}")


if __name__ == "__main__":
    main()
