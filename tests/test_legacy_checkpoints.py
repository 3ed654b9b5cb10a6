"""Checkpoints written before the model family was one (commit 8a87101: ``ActorCritic`` / ``ModularActorCritic``,
DQN's flat ``q.<i>`` MLP, SAC's ``torso.<i>`` actor) still load, act as they did, resume and export.

``tests/data/legacy_checkpoints/*.pt`` are real ``final.pt`` files of ``debug=smoke`` runs made with that
commit; ``expected_actions.json`` holds the deterministic actions its own export module computed for fixed
observations (recurrent: three steps from a zero state).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rltrain.cli.build import algo_factory, env_factory
from rltrain.cli.loading import load_policy
from rltrain.run.checkpoint import load_checkpoint

DATA = Path(__file__).parent / "data" / "legacy_checkpoints"
EXPECTED = json.loads((DATA / "expected_actions.json").read_text())
RUNS = sorted(EXPECTED)


@pytest.mark.parametrize("run", RUNS)
def test_legacy_checkpoint_acts_as_it_did(run):
    actor = load_policy(DATA / f"{run}.pt").policy.export_module().eval()
    obs = torch.tensor(EXPECTED[run]["obs"], dtype=torch.float32)
    expected = EXPECTED[run]["action"]
    with torch.no_grad():
        if actor.state_names:
            state = [torch.zeros(1, obs.shape[0], actor.state_size) for _ in actor.state_names]
            got = []
            for t in range(len(expected)):
                action, *state = actor(obs * (t + 1), *state)
                got.append(action.tolist())
        else:
            got = actor(obs).tolist()
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(expected, np.float64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("run", RUNS)
def test_legacy_checkpoint_restores_the_whole_algorithm(run):
    """Policy, targets and every optimiser state (index order included) load into today's classes."""
    state, _ = load_checkpoint(DATA / f"{run}.pt", key="checkpoint")
    cfg = state["meta"]["config"]
    spec = env_factory(cfg["env"]).spec()
    algo = algo_factory(cfg)(spec, num_envs=cfg["env"]["num_envs"], device=torch.device("cpu"))
    algo.load_state_dict(state["algo"])
    again = algo.state_dict()
    for key, value in state["algo"].items():
        if key.endswith("optimizer"):
            old, new = value["state"], again[key]["state"]
            assert old.keys() == new.keys()
            for i in old:
                for name in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(new[i][name], old[i][name])


def test_legacy_run_resumes_from_the_cli(tmp_path):
    """``resume=<legacy checkpoint>`` continues training with today's code and writes a new-format checkpoint."""
    ckpt = tmp_path / "old.pt"
    shutil.copy(DATA / "ppo_cartpole_shared.pt", ckpt)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "rltrain", "debug=smoke", "logger=quiet", "env=cartpole", "model.shared=true",
           "model.hidden_sizes=[8]", "total_env_steps=3072", f"resume={ckpt}", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_env_steps"] == 2048
    new, _ = load_checkpoint(run_dir / "checkpoints" / "final.pt", key="checkpoint")
    assert any(k.startswith("torso.") for k in new["algo"]["policy"])
