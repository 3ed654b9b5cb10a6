"""Learning: the default run solves CartPole-v1 (a return threshold within a step budget)."""

from __future__ import annotations

import pytest

from rltrain.build import run
from tests.conftest import compose_cfg


@pytest.mark.learning
@pytest.mark.slow
def test_default_ppo_solves_cartpole(tmp_path):
    summary = run(compose_cfg(["logger=quiet", "seed=1"]), tmp_path)
    assert summary["status"] == "completed"
    assert summary["final_eval_return"] >= 475, summary


@pytest.mark.learning
def test_target_return_stops_early_and_records_when(tmp_path):
    summary = run(compose_cfg(["logger=quiet", "seed=2", "target_return=150"]), tmp_path)
    assert summary["solved_at_env_steps"] is not None
    assert summary["total_env_steps"] == summary["solved_at_env_steps"] < 100_000
    assert summary["solved_at_seconds"] > 0
    assert summary["final_eval_return"] is not None  # the final evaluation still runs
