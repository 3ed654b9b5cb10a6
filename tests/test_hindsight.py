"""Hindsight experience replay (data/hindsight.py): relabelled goals come from later in the same episode, drawn
uniformly (the "future" strategy), rewards from the env's compute_reward (one vectorised call), the share k/(k+1)
of each batch; the env's compute_reward reaches the learner through the spec (envs/goals.py) and a task that is
not goal-conditioned is refused in one line."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from rltrain.algos.dqn import DQN, DQNSettings
from rltrain.algos.sac import SAC, SACSettings
from rltrain.algos.td3 import TD3, TD3Settings
from rltrain.data.hindsight import HindsightSampler
from rltrain.data.replay import ReplayBuffer
from rltrain.data.structs import EnvSpec, Rollout
from rltrain.envs.make import EnvFactory, probe_env
from rltrain.errors import ConfigError
from rltrain.models.factory import ModelSettings

PEERS = str(Path(__file__).resolve().parents[1] / "scripts" / "peers")
CPU = torch.device("cpu")
SMALL = ModelSettings(hidden_sizes=(8,))
L, N = 5, 2  # episode length, env streams


def reach_spec() -> EnvSpec:
    return probe_env(EnvFactory(id="bench_envs:PointReach", num_envs=1, search_path=PEERS)).spec


def episodes(spec: EnvSpec, count: int, *, open_last: bool = False) -> list[Rollout]:
    """Rollouts of one step of N streams; stream n's episode e has achieved_goal [1000 n + e, t, 0] after t
    steps, so a goal tells its episode and step. Every episode ends by truncation after L steps (the last one
    left running with ``open_last``)."""
    def obs(e: int, step: int) -> dict:
        return {"observation": np.zeros((1, N, 6), np.float32),
                "achieved_goal": np.array([[[1000 * n + e, step, 0] for n in range(N)]], np.float32),
                "desired_goal": np.full((1, N, 3), 7.0, np.float32)}

    out = []
    for e in range(count):
        for t in range(L):
            trunc = np.full((1, N), t == L - 1 and not (open_last and e == count - 1))
            out.append(Rollout(obs=obs(e, t), actions=np.zeros((1, N, 3), np.float32),
                               log_probs=np.zeros((1, N), np.float32), rewards=np.full((1, N), -1.0, np.float32),
                               terminated=np.zeros((1, N), bool), truncated=trunc, next_obs=obs(e, t + 1),
                               policy_version=np.zeros(1, np.int64)))
    return out


def test_relabelled_goals_are_future_achieved_goals_of_the_same_episode():
    spec = reach_spec()
    buf = ReplayBuffer(1000, spec.obs_shape, spec.action_shape, spec.action_dtype, device=CPU,
                       obs_space=spec.observation)
    buf.add_rollouts(episodes(spec, 6, open_last=True))
    calls = []

    def reward(achieved, desired, info):
        calls.append(len(achieved))
        return spec.goal_reward(achieved, desired, info)

    sampler = HindsightSampler(buf, k=4, reward=reward)
    np.random.seed(0)
    picks: dict[int, set] = {}
    for _ in range(40):
        b = sampler.sample(100)
        virtual = 80  # int(100 * (1 - 1 / 5)): SB3's her_ratio
        goal, obs_ag = b.obs["desired_goal"].numpy(), b.obs["achieved_goal"].numpy()
        assert np.array_equal(goal, b.next_obs["desired_goal"].numpy())
        assert (goal[virtual:] == 7.0).all() and (b.rewards[virtual:] == -1.0).all()  # the real ones untouched
        ep, t, g_ep, g_t = obs_ag[:virtual, 0], obs_ag[:virtual, 1], goal[:virtual, 0], goal[:virtual, 1]
        assert (g_ep == ep).all() and (g_t >= t + 1).all() and (g_t <= L).all()  # same episode, later on
        open_ = ep % 1000 == 5  # the running episode: its transitions so far (4 arrived successors at most)
        assert (g_t[open_] <= L - 1).all()
        dist = np.linalg.norm(b.next_obs["achieved_goal"].numpy()[:virtual] - goal[:virtual], axis=-1)
        np.testing.assert_array_equal(b.rewards[:virtual].numpy(), -(dist > 0.05).astype(np.float32))
        for s, g in zip(t[~open_], g_t[~open_], strict=True):
            picks.setdefault(int(s), set()).add(int(g))
    assert calls == [80] * 40  # one vectorised compute_reward call per batch
    assert picks[0] == {1, 2, 3, 4, 5} and picks[3] == {4, 5}  # uniform over the rest of the episode, inclusive


def test_a_compute_reward_that_takes_one_goal_is_called_per_row():
    spec = reach_spec()
    buf = ReplayBuffer(1000, spec.obs_shape, spec.action_shape, spec.action_dtype, device=CPU,
                       obs_space=spec.observation)
    buf.add_rollouts(episodes(spec, 2))

    def scalar_reward(achieved, desired, info):
        assert np.ndim(achieved) == 1, "called on a batch"
        return float(np.linalg.norm(achieved - desired) <= 0.05) - 1.0

    sampler = HindsightSampler(buf, k=1, reward=lambda a, d, i: scalar_reward(a, d, i))
    b = sampler.sample(10)
    assert sampler.vectorised is False and (b.rewards[5:] == -1.0).all()


def test_the_spec_carries_the_envs_compute_reward_to_every_process():
    spec = reach_spec()
    back = pickle.loads(pickle.dumps(spec))  # as sent to actors and ranks: the factory, not the env
    a, d = np.zeros((3, 3), np.float32), np.array([[0, 0, 0], [0.01, 0, 0], [1, 0, 0]], np.float32)
    np.testing.assert_array_equal(back.goal_reward(a, d, {}), [0.0, 0.0, -1.0])
    assert back == spec  # the reward is no part of what a spec compares


@pytest.mark.parametrize("cls,settings,env", [(SAC, SACSettings, "PointReach"), (TD3, TD3Settings, "PointReach"),
                                              (DQN, DQNSettings, "BitFlip")], ids=["sac", "td3", "dqn"])
def test_every_off_policy_learner_learns_from_relabelled_batches(cls, settings, env):
    probed = probe_env(EnvFactory(id=f"bench_envs:{env}", num_envs=1, search_path=PEERS))
    algo = cls(probed.spec, settings(her=True, learning_starts=0, batch_size=16, rollout_len=1), num_envs=1,
               device=CPU, model=SMALL)
    assert algo.hindsight is not None and algo.uniform_batch == algo.hindsight.sample
    from rltrain.trainers.collector import RolloutCollector

    collector = RolloutCollector(probed.factory.vector([0]), algo.policy, probed.spec, device=CPU)
    metrics = {}
    for _ in range(60):  # past the end of PointReach's first 50-step episode
        metrics.update(algo.learn(collector.collect(1), progress=0.5))
    assert "loss/q" in metrics and np.isfinite(metrics["loss/q"])
    assert len(collector.recent_successes) == len(collector.recent_returns) > 0


def test_hindsight_on_a_task_without_goals_is_one_line():
    pendulum = EnvSpec("Pendulum-v1", (3,), "box", (1,), action_low=(-2.0,), action_high=(2.0,))
    with pytest.raises(ConfigError, match=r"^algo.her=true \(algo=td3\): env.id=Pendulum-v1 is not a goal-conditioned "
                                          r"task: its observation is .* with no key 'achieved_goal'"):
        TD3(pendulum, TD3Settings(her=True), num_envs=1, device=CPU, model=SMALL)
    spec = reach_spec()
    import dataclasses

    with pytest.raises(ConfigError, match="it has no compute_reward"):
        SAC(dataclasses.replace(spec, goal_reward=None), SACSettings(her=True), num_envs=1, device=CPU, model=SMALL)
    with pytest.raises(ConfigError, match=r"algo.her_k=0 must be an integer >= 1"):
        SAC(spec, SACSettings(her=True, her_k=0), num_envs=1, device=CPU, model=SMALL)


SUCCESS_RUNS = {
    # an on-policy learner on async envs (Gymnasium's final_info), and relabelling behind subprocess actors
    "ppo-async": ["algo=ppo", "env.vectorization=async", "algo.rollout_len=32", "algo.num_minibatches=2"],
    "dqn-her-actors": ["algo=dqn", "algo.her=true", "trainer=subprocess_actors", "trainer.num_actors=1",
                       "algo.rollout_len=8", "algo.learning_starts=128", "algo.buffer_size=2000"],
}


@pytest.mark.parametrize("case", list(SUCCESS_RUNS))
def test_the_success_rate_reaches_metrics_evaluation_summary_and_rltrain_eval(tmp_path, case):
    """info["is_success"] at an episode's end: rollout/success_rate in the metrics, eval/success_rate in each
    evaluation, the summary's training and final evaluation rates, rltrain-eval's line; for any algorithm and
    trainer (BitFlip: 8-step episodes)."""
    import json

    from rltrain.run.metrics import read_metrics
    from tests.conftest import run_cli

    run_dir = tmp_path / "run"
    res = run_cli(["debug=smoke", "total_env_steps=512", "env.id=bench_envs:BitFlip", f"env.search_path={PEERS}",
                   "env.num_envs=2", "eval.every_env_steps=256", "eval.episodes=4", "log.every_env_steps=128",
                   "logger=quiet", *SUCCESS_RUNS[case], f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["train_success_rate_last100"] <= 1.0 and 0.0 <= summary["final_eval_success_rate"] <= 1.0
    rows = read_metrics(run_dir / "metrics.csv")
    assert all(r["rollout/success_rate"] != "" for r in rows[1:]), rows  # from the first finished episodes on
    evaluations = [r for r in rows if r["eval/return_mean"] != ""]
    assert len(evaluations) >= 2 and all(r["eval/success_rate"] != "" for r in evaluations)  # each one has one
    out = run_cli([str(run_dir), "--episodes", "3", "--allow-import"], cwd=tmp_path, module="rltrain.cli.evaluate")
    assert out.returncode == 0 and "success rate: " in out.stdout, out.stderr[-2000:]


def test_dqn_refuses_hindsight_with_prioritised_or_n_step_replay():
    """Relabelling draws uniform one-step rows: priorities and n-step chains were computed for the stored goal."""
    for bad in ({"prioritized": True}, {"n_step": 3}):
        with pytest.raises(ConfigError, match="algo.her=true relabels uniform one-step samples"):
            DQNSettings(her=True, **bad)
