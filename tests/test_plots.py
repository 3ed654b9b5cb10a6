"""Learning-curve figures of runs logged at different env steps: the mean over runs is drawn where some run has
data, without a warning about the grid points between them."""

from __future__ import annotations

import warnings

import numpy as np

from rltrain.run.plots import _draw_panel, plot_learning_curves


def test_runs_logged_at_different_steps_draw_their_mean_where_there_is_data_and_warn_nothing(tmp_path):
    """A multi-agent env's runs log at slightly different env steps (turns): two runs with one row each leave the
    grid between their rows to neither, where a mean over runs would be a mean of nothing."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    runs = {"agent_0": (np.array([8184.0]), np.array([1.0])), "agent_1": (np.array([8213.0]), np.array([3.0]))}
    panels = {"training return": runs, "eval return": {"agent_0": (np.array([100.0, 200.0]), np.array([0.0, 2.0])),
                                                        "agent_1": (np.array([300.0, 400.0]), np.array([4.0, 6.0]))}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Mean of empty slice" / "Degrees of freedom <= 0" would fail here
        for band in ("ci", "std"):
            assert plot_learning_curves(panels, tmp_path / f"{band}.png", band=band).stat().st_size > 0
            fig, ax = plt.subplots()
            _draw_panel(ax, panels["eval return"], band)
            mean = next(line for line in ax.get_lines() if line.get_label().startswith("mean"))
            x, y = mean.get_xdata(), mean.get_ydata()
            assert np.isfinite(y).all() and x.min() == 100 and x.max() == 400
            assert not ((x > 200) & (x < 300)).any()  # the gap between the runs is left out, not drawn as NaN
            plt.close(fig)
