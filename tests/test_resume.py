"""Determinism, checkpoint round trip and bitwise resume (sequential, CPU)."""

from __future__ import annotations

import pytest
import torch

from rltrain.cli.build import run
from rltrain.run.checkpoint import CheckpointManager, load_checkpoint
from rltrain.run.metrics import WALL_CLOCK_PREFIX, read_metrics
from tests.conftest import compose_cfg

BASE = ["debug=smoke", "logger=quiet", "algo.anneal_lr=false", "eval.every_env_steps=1024"]


def _without_wall_clock(rows):
    return [{k: v for k, v in r.items() if not k.startswith(WALL_CLOCK_PREFIX)} for r in rows]


def test_same_seed_same_metrics(tmp_path):
    for name in ("a", "b"):
        run(compose_cfg(BASE + ["seed=7"]), tmp_path / name)
    a, b = (read_metrics(tmp_path / n / "metrics.csv") for n in ("a", "b"))
    assert len(a) >= 4
    assert _without_wall_clock(a) == _without_wall_clock(b)
    c = read_metrics(run(compose_cfg(BASE + ["seed=8"]), tmp_path / "c") and tmp_path / "c" / "metrics.csv")
    assert _without_wall_clock(a) != _without_wall_clock(c)


@pytest.mark.parametrize("extra", [[], ["env=pendulum", "algo.norm_obs=true", "algo.norm_reward=true"]],
                         ids=["cartpole", "pendulum-normalised"])
def test_resume_is_bitwise_identical(tmp_path, extra):
    n = 2048
    run(compose_cfg(BASE + extra + [f"total_env_steps={2 * n}"]), tmp_path / "once")
    run(compose_cfg(BASE + extra + [f"total_env_steps={n}"]), tmp_path / "twice")
    summary = run(compose_cfg(BASE + extra + [f"total_env_steps={2 * n}", "resume=auto"]), tmp_path / "twice")
    assert summary["total_env_steps"] == 2 * n
    once, _ = load_checkpoint(tmp_path / "once" / "checkpoints" / "final.pt")
    twice, _ = load_checkpoint(tmp_path / "twice" / "checkpoints" / "final.pt")
    p1, p2 = once["algo"]["policy"], twice["algo"]["policy"]
    assert p1.keys() == p2.keys()
    for k in p1:
        assert torch.equal(p1[k], p2[k]), k
    assert once["counters"]["updates"] == twice["counters"]["updates"]
    # metrics continue where they stopped: same rows (bar wall clock) as the uninterrupted run
    a = _without_wall_clock(read_metrics(tmp_path / "once" / "metrics.csv"))
    b = _without_wall_clock(read_metrics(tmp_path / "twice" / "metrics.csv"))
    assert [r["env_steps"] for r in a] == [r["env_steps"] for r in b]
    assert a[-2] == b[-2]


def test_checkpoint_round_trip_loads_weights_only(tmp_path):
    run(compose_cfg(BASE), tmp_path)
    mgr = CheckpointManager(tmp_path / "checkpoints")
    latest = mgr.latest()
    assert latest is not None
    state = torch.load(latest, weights_only=True)  # plain containers only: RNG states included
    assert {"algo", "counters", "rng", "collector", "meta"} <= state.keys()
    assert isinstance(state["rng"]["numpy"], dict)
    assert state["counters"]["env_steps"] == 2048
    # keep_last prunes the periodic ones; best and final are kept
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert "final.pt" in names and "best.pt" in names
    assert len([n for n in names if n.startswith("step_")]) <= 3
    # loading into a fresh algorithm restores the same parameters
    from rltrain.cli.build import algo_factory
    from rltrain.envs.make import env_spec, make_env

    spec = env_spec(make_env("CartPole-v1"), "CartPole-v1")
    algo = algo_factory(state["meta"]["config"])(spec, num_envs=4, device=torch.device("cpu"))
    algo.load_state_dict(state["algo"])
    for k, v in algo.state_dict()["policy"].items():
        assert torch.equal(v, state["algo"]["policy"][k])
