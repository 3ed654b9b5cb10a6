"""Aggregate statistics over independent runs (seeds): mean, median, IQM and bootstrap confidence intervals.

A handful of seeds is the norm in RL, so point estimates alone mislead. Following Agarwal et al. 2021,
"Deep RL at the Edge of the Statistical Precipice" (rliable), we report the interquartile mean (robust to one
outlier run, more efficient than the median) and percentile-bootstrap 95% confidence intervals over runs.
Pure numpy; used by the ``parallel`` trainer and by ``rltrain-report``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def iqm(values: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% (drops floor(n/4) runs at each end, like trim_mean(0.25))."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    cut = int(0.25 * x.size)
    return float(x[cut: x.size - cut].mean())


STATISTICS: dict[str, Callable[[np.ndarray], float]] = {
    "mean": lambda x: float(np.mean(x)),
    "median": lambda x: float(np.median(x)),
    "iqm": iqm,
}


def bootstrap_ci(values: Sequence[float] | np.ndarray, statistic: str | Callable[[np.ndarray], float] = "mean", *,
                 confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of ``statistic`` over runs (resampling runs with replacement).

    Deterministic for a given ``seed``. With one run the interval collapses to that run's value.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    fn = STATISTICS[statistic] if isinstance(statistic, str) else statistic
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    stats = np.array([fn(x[row]) for row in idx])
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def aggregate(values: Sequence[float] | np.ndarray, *, confidence: float = 0.95, resamples: int = 2000,
              seed: int = 0) -> dict:
    """Summary of final returns over runs: n, mean, std, median, IQM, min, max and a bootstrap CI of the mean
    and of the IQM. Empty input gives ``{"n": 0}`` (every statistic None), never NaN."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if x.size == 0:
        return {"n": 0, "mean": None, "std": None, "median": None, "iqm": None, "min": None, "max": None,
                "ci95_mean": None, "ci95_iqm": None}
    return {
        "n": int(x.size),
        "mean": float(x.mean()),
        "std": float(x.std(ddof=1)) if x.size > 1 else 0.0,
        "median": float(np.median(x)),
        "iqm": iqm(x),
        "min": float(x.min()),
        "max": float(x.max()),
        "ci95_mean": list(bootstrap_ci(x, "mean", confidence=confidence, resamples=resamples, seed=seed)),
        "ci95_iqm": list(bootstrap_ci(x, "iqm", confidence=confidence, resamples=resamples, seed=seed)),
    }


def align_curves(curves: Sequence[tuple[np.ndarray, np.ndarray]], *,
                 points: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Put curves logged at different steps on one grid (linear interpolation inside each curve's range).

    Returns ``(grid [P], values [R, P])`` with NaN where a run has no data (before its first / after its last
    point), so a run that stopped early does not drag the mean with extrapolated values.
    """
    curves = [(np.asarray(x, float), np.asarray(y, float)) for x, y in curves if len(x)]
    if not curves:
        return np.zeros(0), np.zeros((0, 0))
    lo = min(float(x.min()) for x, _ in curves)
    hi = max(float(x.max()) for x, _ in curves)
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    out = np.full((len(curves), grid.size), np.nan)
    for i, (x, y) in enumerate(curves):
        keep = np.isfinite(y)
        if keep.sum() == 0:
            continue
        x, y = x[keep], y[keep]
        inside = (grid >= x.min()) & (grid <= x.max())
        out[i, inside] = np.interp(grid[inside], x, y)
    return grid, out
