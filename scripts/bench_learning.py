"""Learning benchmark: presets x seeds as one Hydra multirun, then a markdown table and a learning-curve PNG.

    python scripts/bench_learning.py                                   # every preset of the algorithms table
    python scripts/bench_learning.py --presets ppo_cartpole dqn_cartpole --seeds 1 2 3
    python scripts/bench_learning.py --collect outputs/bench/<dir>     # re-summarise a finished sweep

Writes ``<out>/learning.md`` (median and IQR of the final eval return and of the wall time per preset,
plus the issue's threshold and whether the median meets it) and ``<out>/learning.png`` (training episode
return vs env steps: mean across seeds with a min-max band). Final returns are the run's final
deterministic evaluation (10 episodes, the run's own eval seeds); timings depend on the machine's load.
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

# preset -> (env steps, threshold on the median final eval return), as in the algorithms issue
THRESHOLDS: dict[str, tuple[int, float]] = {
    "ppo_cartpole": (100_000, 475), "a2c_cartpole": (200_000, 400), "dqn_cartpole": (100_000, 400),
    "impala_cartpole": (200_000, 400), "sac_pendulum": (20_000, -250), "ppo_acrobot": (200_000, -100),
    "dqn_acrobot": (200_000, -100), "ppo_pendulum": (300_000, -300),
    # MinAtar from pixels (issue 13): PPO aims from the issue; DQN / IMPALA: well above random play (0.4)
    "ppo_minatar": (2_000_000, 15), "ppo_minatar_spaceinvaders": (2_000_000, 60),
    "dqn_minatar": (1_000_000, 5), "impala_minatar": (2_000_000, 5),
}


def run_sweep(presets: list[str], seeds: list[int], out: Path, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "rltrain", "-m", f"experiment={','.join(presets)}",
           f"seed={','.join(map(str, seeds))}", "logger=quiet", "eval.every_env_steps=0",
           f"hydra.sweep.dir={out}", "hydra.sweep.subdir=${hydra.job.num}", *extra]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def collect(out: Path) -> dict[str, list[dict]]:
    """preset -> one record per finished run: summary.json + the learning curve from metrics.csv."""
    runs: dict[str, list[dict]] = {}
    for job in sorted(p for p in out.iterdir() if (p / "summary.json").exists()):
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        preset = next(o.split("=", 1)[1] for o in overrides if o.startswith("experiment="))
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
    lines = ["| preset | env steps | seeds | final eval return: median [IQR] | per seed | threshold | met | "
             "wall time s: median [IQR] |", "|---|---|---|---|---|---|---|---|"]
    for preset, rs in runs.items():
        finals = np.array([r["summary"]["final_eval_return"] for r in rs], float)
        walls = np.array([r["summary"]["wall_time_s"] for r in rs], float)
        q = np.percentile(finals, [25, 50, 75])
        w = np.percentile(walls, [25, 50, 75])
        budget, thr = THRESHOLDS.get(preset, (rs[0]["summary"]["total_env_steps"], float("nan")))
        per_seed = ", ".join(f"{r['summary']['seed']}: {r['summary']['final_eval_return']:.1f}" for r in rs)
        met = "yes" if q[1] >= thr else "no"
        lines.append(f"| {preset} | {rs[0]['summary']['total_env_steps']} | {len(rs)} | {q[1]:.1f} "
                     f"[{q[0]:.1f}, {q[2]:.1f}] | {per_seed} | >= {thr:g} | {met} | {w[1]:.0f} [{w[0]:.0f}, {w[2]:.0f}] |")
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
        if thr is not None:
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
    p.add_argument("--presets", nargs="+", default=list(THRESHOLDS))
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
