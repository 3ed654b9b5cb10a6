"""Aggregate statistics against hand-computed values; curve alignment; the plot file is a real PNG."""

from __future__ import annotations

import numpy as np
import pytest

from rltrain.run.plots import plot_learning_curves
from rltrain.run.stats import aggregate, align_curves, bootstrap_ci, iqm


def test_iqm_drops_a_quarter_at_each_end():
    assert iqm([1, 2, 3, 100]) == pytest.approx(2.5)  # middle two of four
    assert iqm([5.0, 7.0]) == pytest.approx(6.0)  # floor(2/4) = 0 dropped
    assert iqm(list(range(8))) == pytest.approx(np.mean([2, 3, 4, 5]))


def test_bootstrap_ci_brackets_the_mean_and_is_deterministic():
    x = np.random.default_rng(1).normal(10, 2, size=20)
    lo, hi = bootstrap_ci(x, "mean", seed=3)
    assert lo < x.mean() < hi and hi - lo < 4
    assert (lo, hi) == bootstrap_ci(x, "mean", seed=3)
    assert bootstrap_ci([4.0]) == (4.0, 4.0)


def test_aggregate_ignores_missing_runs_and_never_returns_nan():
    agg = aggregate([1.0, None, 3.0, float("nan")])
    assert agg["n"] == 2 and agg["mean"] == 2.0 and agg["median"] == 2.0
    assert agg["ci95_mean"][0] <= 2.0 <= agg["ci95_mean"][1]
    assert aggregate([])["mean"] is None


def test_align_curves_leaves_gaps_instead_of_extrapolating():
    grid, vals = align_curves([(np.array([0, 10]), np.array([0.0, 10.0])), (np.array([0, 5]), np.array([1.0, 1.0]))],
                              points=11)
    assert grid[-1] == 10 and vals[0, -1] == 10 and np.isnan(vals[1, -1]) and vals[1, 5] == 1.0


def test_plot_writes_a_png(tmp_path):
    x = np.arange(5) * 100.0
    path = plot_learning_curves({"return": {"a": (x, x / 10), "b": (x, x / 20)}}, tmp_path / "c.png", title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
