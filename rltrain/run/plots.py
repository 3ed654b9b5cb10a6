"""Learning-curve figures (matplotlib, Agg backend: works on headless machines and in workers).

``plot_learning_curves`` draws every run thin and the mean across runs thick with a shaded band (the
bootstrap 95% CI of the mean at each step, or +-1 std). Used by the ``parallel`` trainer (one PNG per
experiment) and by ``rltrain-report``. Every subplot has its own y axis (envs' returns differ by orders of
magnitude), and a band from fewer than ``MIN_SEEDS_FOR_CI`` runs says so in its legend.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from rltrain.run.metrics import read_metrics
from rltrain.run.stats import align_curves

# below this many runs a bootstrap interval is mostly the resampling of a handful of numbers (Agarwal et al.
# 2021 report 5 or more seeds with intervals); still drawn, but labelled as few-seed
MIN_SEEDS_FOR_CI = 5


def band_label(band: str, n: int) -> str:
    """The legend text of a band over ``n`` runs: '95% CI of mean', or '... (n=2 < 5 seeds: rough)'."""
    text = "95% CI of mean" if band == "ci" else "+-1 std"
    return f"{text} (n={n} < {MIN_SEEDS_FOR_CI} seeds: rough)" if n < MIN_SEEDS_FOR_CI else text


def few_seeds_note(n: int) -> str:
    """What follows an interval over ``n`` runs in a printed line: '' or '; n=2 < 5 seeds: rough'."""
    return f"; n={n} < {MIN_SEEDS_FOR_CI} seeds: rough" if n < MIN_SEEDS_FOR_CI else ""


def read_curve(metrics_csv: Path, column: str) -> tuple[np.ndarray, np.ndarray]:
    """``(env_steps, values)`` of one metrics.csv column, rows where it is empty skipped."""
    if not Path(metrics_csv).exists():
        return np.zeros(0), np.zeros(0)
    xs, ys = [], []
    for row in read_metrics(metrics_csv):
        value = row.get(column, "")
        if value not in ("", None):
            xs.append(float(row["env_steps"]))
            ys.append(float(value))
    return np.asarray(xs), np.asarray(ys)


def _band(values: np.ndarray, band: str) -> tuple[np.ndarray, np.ndarray]:
    """Lower/upper band at each grid point over runs (NaN-aware): 'std' or 'ci' (bootstrap 95% of the mean)."""
    mean = np.nanmean(values, axis=0)
    if band == "std":
        std = np.nanstd(values, axis=0)
        return mean - std, mean + std
    rng = np.random.default_rng(0)
    lo, hi = np.full(mean.shape, np.nan), np.full(mean.shape, np.nan)
    for j in range(values.shape[1]):
        col = values[:, j][np.isfinite(values[:, j])]
        if col.size:
            boots = col[rng.integers(0, col.size, size=(1000, col.size))].mean(axis=1)
            lo[j], hi[j] = np.quantile(boots, [0.025, 0.975])
    return lo, hi


def _draw_panel(ax, runs: Mapping[str, tuple[np.ndarray, np.ndarray]], band: str) -> None:
    for label, (x, y) in runs.items():
        if len(x):
            ax.plot(x, y, lw=0.9, alpha=0.6, label=label)
    curves: Sequence[tuple[np.ndarray, np.ndarray]] = [c for c in runs.values() if len(c[0])]
    if len(curves) > 1:
        grid, values = align_curves(curves)
        # the mean and band only where some run has data: runs logged at slightly different steps (a multi-agent
        # env's turns) leave grid points between their rows that no run covers, and a mean of nothing is NaN
        covered = np.isfinite(values).any(axis=0) if values.size else np.zeros(0, bool)
        grid, values = grid[covered], values[:, covered]
        if values.size:
            lo, hi = _band(values, band)
            ax.plot(grid, np.nanmean(values, axis=0), color="black", lw=2, label=f"mean (n={len(curves)})")
            ax.fill_between(grid, lo, hi, color="black", alpha=0.15, label=band_label(band, len(curves)))
    ax.set_xlabel("env steps", fontsize=8)
    ax.set_ylabel("return", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)


def plot_learning_curves(panels: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]], out: Path, *,
                         title: str = "", band: str = "ci") -> Path:
    """One subplot per panel (e.g. {"training return": {"agent_0": (x, y), ...}, "eval return": {...}}).

    Each run is a thin line; the mean over runs a thick black line with its ``band`` ('ci' or 'std').
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    # a grid of at most 4 columns: 12 panels stay 4 x 3 readable subplots instead of one 66-inch row
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    # sharey=False: each panel scales to its own returns (CartPole's 500 beside a MuJoCo env's 3,000)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.7 * nrows + 0.6), squeeze=False,
                             sharex=False, sharey=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (name, runs) in zip(axes.flat, panels.items(), strict=False):
        _draw_panel(ax, runs, band)
        # long labels wrap instead of running into the neighbouring subplot's title
        ax.set_title("\n".join(textwrap.wrap(name, 38)) or " ", fontsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.97) if title else None)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
