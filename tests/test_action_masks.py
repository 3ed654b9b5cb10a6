"""Invalid-action masking (Huang & Ontanon 2022).

``tests/helpers/space_envs.py``'s MaskedEnv ends an episode with -10 at the first illegal action, so an
episode's return is its length (20) exactly when no illegal action was taken: every trainer's episode
returns show it. Gymnasium's Taxi offers its mask in ``info["action_mask"]``.
"""

from __future__ import annotations

import csv

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrain.cli.build import run
from rltrain.data.structs import MASK_KEY
from rltrain.envs.make import EnvFactory, probe_env
from rltrain.errors import ConfigError
from rltrain.models.distributions import mask_logits
from rltrain.models.factory import ModelSettings, build
from rltrain.trainers.collector import RolloutCollector
from rltrain.trainers.episodes import evaluate
from tests.conftest import REPO, compose_cfg, run_cli

torch.set_num_threads(1)
MASKED = "tests.helpers.space_envs:MaskedEnv"
TAXI = next(i for i in ("Taxi-v4", "Taxi-v3") if i in gym.registry)
TINY = ["debug=smoke", "logger=quiet", "env.num_envs=2", "eval.every_env_steps=0", "checkpoint.every_env_steps=0",
        "eval.episodes=3", "log.every_env_steps=128"]
CPU = torch.device("cpu")


def _masked_factory(env_id: str = MASKED, mode: str = "auto", **kwargs) -> EnvFactory:
    return probe_env(EnvFactory(id=env_id, num_envs=3, kwargs=kwargs), mode).factory


def _legal(obs_mask: np.ndarray, actions: np.ndarray, sizes: list[int]) -> bool:
    """Every action of [T, N] (or [T, N, C]) legal under the stored masks [T, N, sum(sizes)]."""
    acts = actions.reshape(*actions.shape[:2], -1)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    picked = np.take_along_axis(obs_mask, acts + offsets, axis=-1)
    return bool(picked.all())


def test_masked_logits_give_illegal_actions_no_probability_entropy_or_gradient():
    logits = torch.randn(4, 5, requires_grad=True)
    mask = torch.tensor([[1, 0, 1, 0, 0], [0, 0, 0, 0, 1], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.int8)
    masked = mask_logits(logits, mask)
    probs = masked.softmax(-1)
    assert (probs[mask == 0] == 0).all()
    ref = [torch.distributions.Categorical(logits=logits[i][mask[i].bool()]).entropy() for i in range(4)]
    logp = masked.log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(entropy, torch.stack(ref), atol=1e-6)
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[mask == 0] == 0).all()


@pytest.mark.parametrize("source,multi,core", [("info", False, "identity"), ("method", True, "identity"),
                                                ("key", False, "lstm"), ("info", True, "gru")])
def test_collector_and_evaluation_never_take_an_illegal_action(source, multi, core):
    factory = _masked_factory(source=source, multi=multi)
    spec = factory.spec()
    assert spec.masked and spec.action_kind == ("multi_discrete" if multi else "discrete")
    policy = build(spec, ModelSettings(core=core, hidden_sizes=(16,)), "actor_critic")
    col = RolloutCollector(factory.vector([0, 1, 2]), policy, spec, device=CPU)
    try:
        r = col.collect(200)
    finally:
        col.close()
    sizes = [6, 4] if multi else [6]
    assert r.obs[MASK_KEY].shape == (200, 3, sum(sizes)) and _legal(r.obs[MASK_KEY], r.actions, sizes)
    assert min(col.recent_returns) == 20.0  # no episode cut short by an illegal action
    returns = evaluate(policy, factory.make, episodes=4, eval_seed=7, deterministic=False, device=CPU)
    assert (returns == 20.0).all()


def _episode_min_returns(run_dir) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(row["rollout/episode_return_min"]) for row in csv.DictReader(f)
                if row.get("rollout/episode_return_min")]


@pytest.mark.parametrize("algo,trainer", [("ppo", "sequential"), ("impala", "subprocess_actors"),
                                          ("dqn", "sequential"), ("a2c", "subprocess_actors")])
def test_training_never_takes_an_illegal_action(tmp_path, algo, trainer):
    extra = ["trainer.num_actors=2"] if trainer == "subprocess_actors" else []
    if algo == "dqn":  # random warm-up and epsilon-greedy exploration are masked too
        extra += ["algo.learning_starts=128", "algo.train_frequency=4", "algo.batch_size=32"]
    summary = run(compose_cfg([*TINY, f"env.id={MASKED}", f"algo={algo}", f"trainer={trainer}",
                               "total_env_steps=1024", *extra]), tmp_path / "run")
    assert summary["status"] == "completed"
    mins = _episode_min_returns(tmp_path / "run")
    assert mins and all(m == 20.0 for m in mins), mins
    assert summary["final_eval_return"] == 20.0 and summary["final_eval_return_std"] == 0.0


def test_masked_ppo_learns_faster_than_unmasked(tmp_path, capsys):
    base = [*TINY, f"env.id={MASKED}", "total_env_steps=2048"]
    masked = run(compose_cfg([*base, "algo.action_mask=on"]), tmp_path / "masked")
    assert "action masking on" in capsys.readouterr().err
    unmasked = run(compose_cfg([*base, "algo.action_mask=off"]), tmp_path / "unmasked")
    assert "offers an action mask (info['action_mask']); ignored: algo.action_mask=off" in capsys.readouterr().err
    assert masked["train_return_last100"] == 20.0
    assert unmasked["train_return_last100"] < 15.0, unmasked  # illegal actions still end most of its episodes


def test_dqn_target_and_greedy_actions_are_masked():
    spec = _masked_factory().spec()
    policy = build(spec, ModelSettings(), "q")
    obs = {"obs": torch.randn(64, 6), MASK_KEY: (torch.rand(64, 6) < 0.3).to(torch.int8)}
    obs[MASK_KEY][:, 2] = 1
    q = policy(obs)
    legal = obs[MASK_KEY].bool()
    assert legal.gather(1, q.argmax(-1, keepdim=True)).all()  # the target's max and Double DQN's argmax
    policy.epsilon.fill_(1.0)  # all exploration: uniform over the legal actions
    actions = policy.act(obs, generator=torch.Generator().manual_seed(0)).action
    assert legal.gather(1, actions[:, None]).all()
    assert legal.gather(1, policy.export_module()(obs)[:, None]).all()


def test_taxi_info_mask_is_used():
    factory = _masked_factory(TAXI)
    assert factory.action_mask == "info"
    spec = factory.spec()
    policy = build(spec, ModelSettings(), "actor_critic")
    col = RolloutCollector(factory.vector([0, 1, 2]), policy, spec, device=CPU)
    try:
        r = col.collect(100)
    finally:
        col.close()
    assert _legal(r.obs[MASK_KEY], r.actions, [6])
    assert not r.obs[MASK_KEY].all()  # Taxi forbids some moves: the masks are not all-ones


def test_taxi_trains_with_its_mask(tmp_path, capsys):
    summary = run(compose_cfg([*TINY, f"env.id={TAXI}", "total_env_steps=512"]), tmp_path / "run")
    assert summary["status"] == "completed"
    assert "the mask comes from info['action_mask']" in capsys.readouterr().err


def test_on_without_a_mask_refuses_and_modes_are_checked():
    with pytest.raises(ConfigError, match="offers no action mask"):
        probe_env(EnvFactory(id="CartPole-v1"), "on")
    with pytest.raises(ConfigError, match="one of auto, on, off"):
        probe_env(EnvFactory(id="CartPole-v1"), "yes")
    probed = probe_env(EnvFactory(id="CartPole-v1"), "auto")
    assert probed.factory.action_mask == "off" and probed.line is None
    dropped = probe_env(EnvFactory(id=MASKED, kwargs={"source": "key"}), "off")
    assert dropped.factory.action_mask == "drop" and MASK_KEY not in dict(dropped.spec.observation.parts)
    assert dropped.spec == dropped.factory.spec()  # the probe describes the env as the run builds it


def test_a_mask_with_no_legal_action_stops_the_run_naming_env_and_step(tmp_path):
    res = run_cli([*TINY, f"env.id={MASKED}", "+env.kwargs.empty_at=5", "total_env_steps=512",
                   f"hydra.run.dir={tmp_path / 'out'}"], cwd=REPO)
    assert res.returncode != 0
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "env 0 failed in step() at its step 5" in errors[0], res.stderr
    assert "action mask has no legal action" in errors[0]


def test_acting_without_the_mask_key_is_one_error_naming_it_and_how_to_pass_it():
    from pathlib import Path

    from rltrain.api import LoadedPolicy

    probed = probe_env(EnvFactory(id=MASKED), "auto")
    module = build(probed.spec, ModelSettings(), "actor_critic")
    policy = LoadedPolicy(module, spec=probed.spec, config={}, checkpoint=Path("final.pt"))
    env = probed.factory.make()
    obs, _ = env.reset(seed=0)
    assert int(policy.act(obs)[0]) in np.flatnonzero(obs[MASK_KEY])  # the whole observation acts, legally
    for partial, found in (({"obs": obs["obs"]}, "its keys are ['obs']"), (obs["obs"], "it is a ndarray")):
        with pytest.raises(ValueError) as err:
            policy.act(partial)
        text = str(err.value)
        assert "needs the key 'action_mask'" in text and found in text and "\n" not in text
        assert "pass a dict with the keys ['action_mask', 'obs']" in text
    with pytest.raises(ValueError, match="needs the key 'action_mask'.*its keys are \\['obs'\\]"):
        module.act({"obs": torch.as_tensor(obs["obs"])[None]})  # the torch policy says the same
