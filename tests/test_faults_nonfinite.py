"""A failure is never reported as success (design 6): NaN / inf reaching the learner stops the run.

Real runs on envs that turn bad after a few hundred steps per env (``tests/helpers/bad_envs.py``): each must
end with exit code 2, exactly one ``rltrain: error: non-finite ...`` line naming the quantity, the update and
the env step, ``summary.json`` saying ``failed``, and the checkpoint the line names still loading with finite
weights (no checkpoint written after the fault).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from rltrain.run.checkpoint import load_checkpoint
from rltrain.trainers.finite import metrics_problem, named_tensors, rollout_problem, tensors_problem
from tests.test_faults import _stderr_lines, _train

BAD = "env.id=tests.helpers.bad_envs:"
LINE = re.compile(r"rltrain: error: non-finite (?P<what>\S+?=\S+).* at update (?P<update>\d+) \(env step "
                  r"(?P<step>\d+)\); the last finite checkpoint is (?P<ckpt>\S+\.pt)$")


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _assert_failed_with_finite_checkpoint(res, run_dir: Path, what: str) -> dict:
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [ln for ln in _stderr_lines(res) if not ln.startswith("[")]  # progress lines start with [training]
    assert len(lines) == 1, lines
    found = LINE.match(lines[0])
    assert found, lines[0]
    assert found["what"].startswith(what), lines[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "non-finite" in summary["error"]
    ckpt = Path(found["ckpt"])
    assert summary["last_checkpoint"] == str(ckpt)
    state, _ = load_checkpoint(ckpt)
    assert all(torch.isfinite(t).all() for t in _tensors(state["algo"]) if t.is_floating_point())
    assert state["counters"]["env_steps"] < int(found["step"])
    # nothing was checkpointed after the fault: no final.pt, no later step
    names = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt"))
    assert "final.pt" not in names
    assert max(int(n[5:-3]) for n in names if n.startswith("step_")) == state["counters"]["env_steps"]
    return {**found.groupdict(), "summary": summary}


@pytest.mark.parametrize(("env", "extra", "what"), [
    ("NaNObservation", [], "observation=nan"),
    ("NaNReward", [], "reward=nan"),
    # finite rewards near float32's max: the returns overflow, so the first non-finite value is the loss
    ("NaNReward", ["+env.kwargs.value=3e38"], "loss/"),
], ids=["nan-observation", "nan-reward", "inf-loss"])
def test_non_finite_input_or_loss_fails_the_run_and_keeps_the_last_finite_checkpoint(tmp_path, env, extra, what):
    run_dir = tmp_path / "run"
    res = _train(run_dir, f"{BAD}{env}", "+env.kwargs.after=300", *extra)
    got = _assert_failed_with_finite_checkpoint(res, run_dir, what)
    # 4 envs x 64 steps per update: env step 300 of each env falls in update 5 (env steps 1025-1280)
    assert (got["update"], got["step"]) == ("5", "1280")
    assert got["ckpt"].endswith("step_000000001024.pt")


@pytest.mark.parametrize("trainer", [
    # ranks agree before stopping (else one waits in the all-reduce forever); two spawned ranks: ~25 s when busy
    pytest.param(["trainer=distributed_simulator"], marks=pytest.mark.slow),
    ["algo=impala", "trainer=subprocess_actors", "trainer.start_method=fork"],  # rollouts from actor processes
], ids=["distributed", "actors"])
def test_non_finite_reward_stops_every_trainer(tmp_path, trainer):
    run_dir = tmp_path / "run"
    res = _train(run_dir, f"{BAD}NaNReward", "+env.kwargs.after=150", "checkpoint.every_env_steps=512", *trainer)
    got = _assert_failed_with_finite_checkpoint(res, run_dir, "reward=nan")
    assert got["summary"]["status"] == "failed"


def test_without_a_checkpoint_the_line_says_so(tmp_path):
    run_dir = tmp_path / "run"
    res = _train(run_dir, f"{BAD}NaNReward", "+env.kwargs.after=10")
    assert res.returncode == 2
    lines = [ln for ln in _stderr_lines(res) if not ln.startswith("[")]
    assert lines == ["rltrain: error: non-finite reward=nan (rollout step 10, env 0) from the env at update 1 "
                     "(env step 256); no checkpoint was written before it"]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert not list(run_dir.glob("checkpoints/*.pt"))


# -- the checks themselves, on crafted values -------------------------------------------------------------------
def test_checks_name_the_first_offending_quantity():
    import numpy as np

    from rltrain.data.structs import Rollout

    T, N = 3, 2
    obs = {"pos": np.zeros((T, N, 2), np.float32), "pixels": np.zeros((T, N, 4), np.uint8)}  # Dict observations
    obs["pos"][2, 1, 0] = np.inf
    rollout = Rollout(obs=obs, actions=np.zeros((T, N), np.int64), log_probs=np.zeros((T, N), np.float32),
                      rewards=np.zeros((T, N), np.float32), terminated=np.zeros((T, N), bool),
                      truncated=np.zeros((T, N), bool), next_obs=obs, policy_version=np.zeros(T, np.int64))
    assert rollout_problem(rollout) == "observation.pos=inf (rollout step 2, env 1, element [0]) from the env"
    obs["pos"][2, 1, 0] = 0.0
    assert rollout_problem(rollout) is None
    assert metrics_problem({"loss/policy": 0.1, "loss/value": math.nan}) == "loss/value=nan"

    class Owner:
        def __init__(self):
            self.net = torch.nn.Linear(2, 2)
            self.log_alpha = torch.zeros((), requires_grad=True)

    owner = Owner()
    tensors = named_tensors(owner)
    assert [n for n, _ in tensors] == ["net.weight", "net.bias", "log_alpha"]
    assert tensors_problem(tensors) is None
    owner.net(torch.ones(1, 2)).sum().mul(math.inf).backward()  # inf gradients, finite weights
    assert tensors_problem(tensors) == "gradient/net.weight=inf"
    owner.net.weight.grad = None
    owner.net.bias.grad = None
    with torch.no_grad():
        owner.log_alpha.fill_(math.nan)
    assert tensors_problem(tensors) == "parameter/log_alpha=nan"
