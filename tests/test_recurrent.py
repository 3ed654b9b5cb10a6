"""Recurrent cores (model.core=lstm|gru) for PPO: state handling in the collector, sequence recomputation in
the learner, evaluation, resume, every trainer, refusals and a cut-down learning check."""

from __future__ import annotations

import dataclasses
import functools

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrain.algos.ppo import PPO, PPOSettings
from rltrain.cli.build import run
from rltrain.envs.make import env_spec, make_env
from rltrain.envs.vector import VecEnv
from rltrain.envs.wrappers import VelocityMask
from rltrain.errors import ConfigError
from rltrain.models.actor_critic import EncoderTorso, TwinMLPTorso
from rltrain.models.cores import reset_state
from rltrain.models.factory import ModelSettings
from rltrain.run.checkpoint import load_checkpoint
from rltrain.run.metrics import WALL_CLOCK_PREFIX, read_metrics
from rltrain.trainers.collector import RolloutCollector
from rltrain.trainers.episodes import evaluate
from tests.conftest import compose_cfg
from tests.helpers.faulty_envs import CountingEnv

CPU = torch.device("cpu")
TERM_LEN, TRUNC_LEN = 3, 4


class Counting(CountingEnv):
    """CountingEnv whose first observation is not all zeros (a zero input through zero-bias layers would
    leave the first state at exactly zero, hiding whether a reset happened)."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(3, 0.5, np.float32), {}


def _mixed_envs() -> VecEnv:
    """Envs 0, 1 terminate every 3 and 4 steps, envs 2, 3 are truncated every 4 and 6 (distinct sequences)."""
    fns = [functools.partial(Counting, TERM_LEN), functools.partial(Counting, TERM_LEN + 1)] + \
          [functools.partial(lambda k: gym.wrappers.TimeLimit(Counting(100), max_episode_steps=k), k)
           for k in (TRUNC_LEN, TRUNC_LEN + 2)]
    return VecEnv(fns, seeds=[0, 1, 2, 3])


def _recurrent_ppo(core: str = "lstm", *, num_envs: int = 4, num_minibatches: int = 1, shared: bool = False,
                   **kw) -> PPO:
    torch.manual_seed(0)
    spec = env_spec(Counting(TERM_LEN), "counting")
    return PPO(spec, PPOSettings(rollout_len=12, num_minibatches=num_minibatches, **kw), num_envs=num_envs,
               device=CPU, model=ModelSettings(core=core, core_size=6, shared=shared, hidden_sizes=(8,)))


def _recording(policy, given: list | None = None) -> list:
    """Wraps ``policy.act`` so that every step's returned (pre-reset) core state is kept, in order (and, in
    ``given``, the state each step was called with)."""
    states, act = [], policy.act

    def recording_act(obs, state=None, **kw):
        if given is not None:
            given.append(tuple(s.clone() for s in state))
        out = act(obs, state, **kw)
        states.append(tuple(s.clone() for s in out.state))
        return out

    policy.act = recording_act
    return states


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_state_is_reset_at_termination_and_truncation(core):
    algo = _recurrent_ppo(core)
    collector = RolloutCollector(_mixed_envs(), algo.policy, algo.spec, device=CPU)
    given: list = []
    recorded = _recording(algo.policy, given)
    ro = collector.collect(12)  # every env ends at step 12
    assert ro.terminated[:, :2].any() and ro.truncated[:, 2:].any() and not ro.terminated[:, 2:].any()
    assert len(ro.core_state) == (2 if core == "lstm" else 1) * 2  # actor core, then critic core
    assert all(s.shape == (1, 4, 6) for s in ro.core_state)
    assert all(torch.count_nonzero(s) == 0 for s in ro.core_state)  # the first rollout starts from zero
    done = ro.terminated | ro.truncated
    assert done[-1].all()
    # after the last step every env starts a new episode: the carried state is zero, though the step ended
    # in a non-zero state
    assert all(torch.count_nonzero(s) == 0 for s in collector.core_state)
    assert all(torch.count_nonzero(s) > 0 for s in recorded[-1])
    # mid-rollout: the state acted on at t + 1 is the state step t ended in, zeroed exactly in the envs
    # whose episode ended at t (terminated: envs 0, 1; truncated: envs 2, 3)
    for t in range(ro.shape[0] - 1):
        for n in range(4):
            for before, after in zip(given[t + 1], recorded[t], strict=True):
                if done[t, n]:
                    assert torch.count_nonzero(before[:, n]) == 0 and torch.count_nonzero(after[:, n]) > 0
                else:
                    assert torch.equal(before[:, n], after[:, n])
    second = collector.collect(4)
    assert all(torch.count_nonzero(s) == 0 for s in second.core_state)


@pytest.mark.parametrize("shared", [False, True], ids=["actor+critic cores", "shared core"])
def test_sequence_recomputation_matches_acting_and_truncated_bootstrap_uses_pre_reset_state(shared):
    algo = _recurrent_ppo("lstm", norm_obs=True, shared=shared)
    assert len(algo.policy.initial_state(4)) == (2 if shared else 4)
    algo.policy.obs_norm.update_from_moments(algo.policy.obs_norm.moments(np.random.default_rng(0).random(
        (50, 4, 3)).astype(np.float32), 1))  # a non-trivial normaliser: both forms must apply it
    collector = RolloutCollector(_mixed_envs(), algo.policy, algo.spec, device=CPU)
    collector.collect(7)  # start the recorded rollout mid-episode, from a non-zero state
    recorded = _recording(algo.policy)
    ro = collector.collect(13)
    assert any(torch.count_nonzero(s) > 0 for s in ro.core_state)
    done = ro.terminated | ro.truncated
    mask = torch.ones(ro.shape)
    mask[1:] = torch.from_numpy(~done[:-1]).float()
    with torch.no_grad():
        out, values, states = algo.policy.unroll(torch.from_numpy(ro.obs), ro.core_state, mask)
        logp, _ = algo.policy.dist.log_prob_entropy(out, torch.from_numpy(ro.actions))
    np.testing.assert_allclose(logp.numpy(), ro.log_probs, rtol=1e-5, atol=1e-5)
    for t in range(ro.shape[0]):  # the states after each step are the ones acting produced
        for a, b in zip(states[t], recorded[t], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # values step by step, with the state each step started from
    state = ro.core_state
    for t in range(ro.shape[0]):
        with torch.no_grad():
            v = algo.policy.value(torch.from_numpy(ro.obs[t]), state)
        np.testing.assert_allclose(values[t].numpy(), v.numpy(), rtol=1e-5, atol=1e-5)
        state = reset_state(recorded[t], done[t])
    # the learner's bootstrap: a truncated step's successor is valued with the state the step ended in
    from rltrain.algos.sequences import successor_values

    with torch.no_grad():
        _, seq_values, seq_states = algo.policy.unroll(torch.from_numpy(ro.obs), ro.core_state, mask)
    next_vals = successor_values(algo.policy, ro, seq_values.numpy(), seq_states, CPU)
    truncated = list(zip(*np.nonzero(ro.truncated), strict=True))
    assert truncated
    for t, n in truncated:
        succ = torch.from_numpy(ro.next_obs[t, n][None])
        with torch.no_grad():
            pre_reset = algo.policy.value(succ, tuple(s[:, n:n + 1] for s in recorded[t]))
            zero = algo.policy.value(succ, algo.policy.initial_state(1))
        assert next_vals[t, n] == pytest.approx(float(pre_reset), abs=1e-5)
        assert abs(float(pre_reset) - float(zero)) > 1e-4  # the check would notice a reset state
    assert (next_vals[ro.terminated] == 0).all()
    np.testing.assert_allclose(seq_values.numpy(), values.numpy(), rtol=1e-5, atol=1e-6)


def test_minibatches_keep_sequences_whole():
    algo = _recurrent_ppo("gru", num_minibatches=2, update_epochs=3)
    collector = RolloutCollector(_mixed_envs(), algo.policy, algo.spec, device=CPU)
    ro = collector.collect(12)
    calls, unroll = [], algo.policy.unroll

    def recording_unroll(obs, state, mask, **kw):
        calls.append((obs.clone(), mask.clone()))
        return unroll(obs, state, mask, **kw)

    algo.policy.unroll = recording_unroll
    metrics = algo.learn(ro, progress=0.0)
    assert np.isfinite(list(metrics.values())).all()
    assert len(calls) == 1 + 3 * 2  # one value unroll, then 3 epochs x 2 minibatches
    assert calls[0][0].shape == (12, 4, 3)
    full = torch.from_numpy(ro.obs)
    for epoch in range(3):
        seen = []
        for obs, mask in calls[1 + 2 * epoch: 3 + 2 * epoch]:
            assert obs.shape == (12, 2, 3)  # all T steps of 2 envs: sequences are never cut in time
            for j in range(2):
                cols = [n for n in range(4) if torch.equal(obs[:, j], full[:, n])]
                assert len(cols) == 1
                seen.append(cols[0])
                assert mask[0, j] == 1 and torch.equal(mask[1:, j].bool(), torch.from_numpy(
                    ~(ro.terminated | ro.truncated)[:-1, cols[0]]))
        assert sorted(seen) == [0, 1, 2, 3]  # each epoch covers every env once


def test_minibatches_must_divide_the_envs():
    with pytest.raises(ConfigError, match="algo.num_minibatches=3: a recurrent core splits minibatches by env"):
        _recurrent_ppo(num_minibatches=3, num_envs=4)  # 12 x 4 = 48 rows divide by 3, 4 envs do not


def test_feed_forward_policy_is_unchanged():
    algo = PPO(env_spec(Counting(), "c"), num_envs=4, device=CPU)
    assert isinstance(algo.policy.torso, TwinMLPTorso) and algo.numpy_update and algo.policy.initial_state(4) is None
    rec = _recurrent_ppo()
    assert isinstance(rec.policy.torso, EncoderTorso) and not rec.numpy_update
    collector = RolloutCollector(_mixed_envs(), algo.policy, algo.spec, device=CPU)
    assert collector.collect(4).core_state is None and collector.state_dict()["core_state"] is None


def test_evaluation_runs_the_core_with_a_fresh_state_per_episode():
    algo = _recurrent_ppo("lstm")
    returns = evaluate(algo.policy, lambda render_mode=None: Counting(TERM_LEN), episodes=5, eval_seed=3,
                       max_parallel=2)
    assert returns.shape == (5,)
    # every episode starts from the zero state on the same observations: deterministic play is the same
    assert len(set(returns.tolist())) == 1
    seen = []
    act = algo.policy.act

    def checking_act(obs, state=None, **kw):
        seen.append(state)
        return act(obs, state, **kw)

    algo.policy.act = checking_act
    evaluate(algo.policy, lambda render_mode=None: Counting(TERM_LEN), episodes=2, eval_seed=3, max_parallel=2)
    assert len(seen) == TERM_LEN and all(torch.count_nonzero(s) == 0 for s in seen[0])
    assert all(torch.count_nonzero(s) > 0 for s in seen[1])


def test_velocity_mask_zeroes_the_velocities():
    env = make_env("CartPole-v1", wrappers=[{"VelocityMask": {"indices": [1, 3]}}])
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        obs, *_ = env.step(env.action_space.sample())
        assert obs[1] == 0 and obs[3] == 0 and obs[0] != 0 and obs[2] != 0
    with pytest.raises(ConfigError, match="VelocityMask indices=\\[7\\]"):
        VelocityMask(gym.make("Pendulum-v1"), indices=[7])
    cfg = compose_cfg(["env=pendulum_novel"])
    assert list(cfg.env.wrappers) == [{"VelocityMask": {"indices": [2]}}]


RESUME = ["debug=smoke", "logger=quiet", "algo.anneal_lr=false", "env=cartpole_novel", "env.num_envs=4",
          "model.core=lstm",
          "model.core_size=16",
          "algo.rollout_len=16", "algo.num_minibatches=2", "algo.update_epochs=2", "algo.norm_obs=true",
          "eval.every_env_steps=512", "checkpoint.every_env_steps=512", "log.every_env_steps=256"]


def _rows(path):
    return [{k: v for k, v in r.items() if not k.startswith(WALL_CLOCK_PREFIX)} for r in read_metrics(path)]


def test_recurrent_resume_is_bitwise_identical(tmp_path):
    n = 512
    run(compose_cfg(RESUME + [f"total_env_steps={2 * n}"]), tmp_path / "once")
    run(compose_cfg(RESUME + [f"total_env_steps={n}"]), tmp_path / "twice")
    middle = torch.load(tmp_path / "twice" / "checkpoints" / "final.pt", weights_only=True)
    states = middle["collector"]["core_state"]
    assert len(states) == 4 and all(s.shape == (1, 4, 16) for s in states)
    assert any(torch.count_nonzero(s) > 0 for s in states)  # saved mid-episode, not a fresh state
    summary = run(compose_cfg(RESUME + [f"total_env_steps={2 * n}", "resume=auto"]), tmp_path / "twice")
    assert summary["total_env_steps"] == 2 * n
    once, _ = load_checkpoint(tmp_path / "once" / "checkpoints" / "final.pt")
    twice, _ = load_checkpoint(tmp_path / "twice" / "checkpoints" / "final.pt")
    for k, v in once["algo"]["policy"].items():
        assert torch.equal(v, twice["algo"]["policy"][k]), k
    for a, b in zip(once["collector"]["core_state"], twice["collector"]["core_state"], strict=True):
        assert torch.equal(a, b)
    a, b = _rows(tmp_path / "once" / "metrics.csv"), _rows(tmp_path / "twice" / "metrics.csv")
    assert [r["env_steps"] for r in a] == [r["env_steps"] for r in b] and a[-2] == b[-2]
    # the checkpoint loads into a fresh algorithm (weights_only) with the recurrent weights
    from rltrain.cli.build import algo_factory

    algo = algo_factory(once["meta"]["config"])(env_spec(make_env("CartPole-v1"), "CartPole-v1"), num_envs=4,
                                                device=CPU)
    algo.load_state_dict(once["algo"])
    assert any("core.cell" in k for k in algo.state_dict()["policy"])


@pytest.mark.parametrize("override, where", [
    (["algo=dqn"], "algo=dqn (off-policy)"), (["algo=sac", "env=pendulum"], "algo=sac (off-policy)")])
def test_off_policy_algorithms_refuse_a_recurrent_core(tmp_path, override, where):
    cfg = compose_cfg(["debug=smoke", "logger=quiet", "model.core=gru", *override])
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path)
    assert str(err.value) == (f"model.core=gru: {where} does not support a recurrent core (replay of sequences "
                              "is not implemented: use algo=ppo, a2c or impala); set model.core=identity")


@pytest.mark.parametrize("override, where, why", [
    (["algo=rainbow"], "algo=rainbow (off-policy)", "replay of sequences is not implemented"),
    (["algo=pqn"], "algo=pqn", "its update learns from shuffled single steps, not sequences")])
def test_a_recurrent_core_refusal_names_the_algorithm_typed_and_its_reason(tmp_path, override, where, why):
    """algo=rainbow was refused as "algo=dqn", and PQN, which has no replay buffer, for "replay of sequences"."""
    cfg = compose_cfg(["debug=smoke", "logger=quiet", "model.core=gru", *override])
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path)
    assert str(err.value) == (f"model.core=gru: {where} does not support a recurrent core ({why}: use algo=ppo, "
                              "a2c or impala); set model.core=identity")


@pytest.mark.parametrize("algo", ["a2c", "impala"])
def test_single_step_learners_recompute_the_sequence_from_the_stored_state(algo):
    """A2C and IMPALA on a recurrent core: one unroll from Rollout.core_state; with unchanged weights the
    recomputed log-probs equal what the actor recorded (so IMPALA's rho is exactly 1 under sequential)."""
    from rltrain.algos.a2c import A2C
    from rltrain.algos.impala import IMPALA
    from rltrain.algos.sequences import evaluate_sequences

    cls = {"a2c": A2C, "impala": IMPALA}[algo]
    venv = VecEnv([functools.partial(make_env, "CartPole-v1") for _ in range(3)], [0, 1, 2])
    spec = env_spec(make_env("CartPole-v1"), "CartPole-v1")
    learner = cls(spec, cls.settings_class(rollout_len=12), num_envs=3, device=CPU,
                  model=ModelSettings(core="lstm", core_size=8))
    collector = RolloutCollector(venv, learner.policy, spec, device=CPU)
    collector.collect(7)  # a rollout that does not start from the zero state
    ro = collector.collect(12)
    assert ro.core_state is not None and bool(ro.core_state[0].abs().sum() > 0)
    actions = torch.from_numpy(ro.actions.reshape(-1))
    logp, _, _, values, next_values = evaluate_sequences(learner.policy, ro, actions, CPU)
    np.testing.assert_allclose(logp.detach().numpy().reshape(12, 3), ro.log_probs, rtol=1e-5, atol=1e-5)
    assert values.shape == next_values.shape == (12, 3)
    metrics = learner.learn(ro, progress=0.0)
    assert np.isfinite(metrics["loss/policy"])
    if algo == "impala":
        assert metrics["train/rho_mean"] == pytest.approx(1.0, abs=1e-5)
    venv.close()


RECURRENT_RUN = ["experiment=ppo_lstm_cartpole_novel", "model.core_size=16", "algo.update_epochs=2",
                 "total_env_steps=2048", "logger=quiet", "eval.episodes=2"]
RECURRENT_OTHER = ["env=cartpole_novel", "model.core=lstm", "model.core_size=16", "total_env_steps=2048",
                   "logger=quiet", "eval.episodes=2"]


@pytest.mark.parametrize("trainer", [["trainer=parallel", "trainer.num_agents=2"],
                                     ["trainer=distributed_simulator", "trainer.world_size=2"],
                                     ["trainer=subprocess_actors", "trainer.num_actors=2"],
                                     [*RECURRENT_OTHER, "algo=a2c", "algo.rollout_len=8"],
                                     [*RECURRENT_OTHER, "algo=impala", "algo.num_epochs=2", "trainer=subprocess_actors",
                                      "trainer.num_actors=2"]],
                         ids=["parallel", "distributed_simulator", "subprocess_actors", "a2c", "impala-actors"])
def test_recurrent_ppo_runs_under_every_trainer(cli, tmp_path, trainer):
    """Every trainer places the same collector (which carries the core state) and the same PPO learner
    (which recomputes sequences from the stored start states); the run ends with the state checkpointed."""
    base = [] if "env=cartpole_novel" in trainer else RECURRENT_RUN
    res = cli(*base, *trainer, "hydra.run.dir=run", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    finals = sorted((tmp_path / "run").rglob("final.pt"))
    assert finals, res.stdout[-2000:]
    for path in finals:
        state, _ = load_checkpoint(path)
        assert any("core.cell" in k for k in state["algo"]["policy"]), path
        if "core_state" in state.get("collector", {}):  # subprocess_actors: the actors carry it, not the learner
            assert state["collector"]["core_state"] is not None and state["collector"]["core_state"][0].shape[-1] == 16


def test_learner_joins_the_actors_start_states_like_their_envs():
    from rltrain.data.structs import Rollout
    from rltrain.trainers.actors.rollouts import merge_rollouts

    def rollout(n, fill):
        z = np.zeros((3, n), np.float32)
        return Rollout(obs=np.zeros((3, n, 2), np.float32), actions=z.astype(np.int64), log_probs=z, rewards=z,
                       terminated=z.astype(bool), truncated=z.astype(bool), next_obs=np.zeros((3, n, 2), np.float32),
                       policy_version=np.zeros(3, np.int64), episode_returns=[], episode_lengths=[],
                       core_state=(torch.full((1, n, 4), fill), torch.full((1, n, 4), -fill)))

    merged = merge_rollouts([rollout(2, 1.0), rollout(3, 2.0)])
    h, c = merged.core_state
    assert h.shape == c.shape == (1, 5, 4) and merged.shape == (3, 5)
    assert torch.equal(h[0, :, 0], torch.tensor([1.0, 1.0, 2.0, 2.0, 2.0])) and torch.equal(c, -h)
    stateless = dataclasses.replace(rollout(2, 1.0), core_state=None)
    assert merge_rollouts([rollout(2, 1.0), stateless]).core_state is None


def test_cli_refusal_is_one_line(cli):
    res = cli("algo=dqn", "model.core=lstm", "debug=smoke", "logger=quiet")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "model.core=lstm: algo=dqn (off-policy) does not support a recurrent core" in lines[0]


@pytest.mark.learning
@pytest.mark.slow
def test_recurrent_ppo_learns_cartpole_without_velocities(tmp_path):
    """Cut-down experiment=ppo_lstm_cartpole_novel: within 12k steps the LSTM's training return passes a level
    that the same preset with a feed-forward policy (model.core=identity) does not reach: without the
    velocities a memoryless policy plateaus around 40-55 even after 200k steps (docs/benchmarks.md)."""
    common = ["experiment=ppo_lstm_cartpole_novel", "logger=quiet", "seed=1", "total_env_steps=12288",
              "algo.anneal_lr=false", "eval.episodes=2"]
    returns = {}
    for core in ("lstm", "identity"):
        run(compose_cfg(common + [f"model.core={core}"]), tmp_path / core)
        returns[core] = float(read_metrics(tmp_path / core / "metrics.csv")[-1]["rollout/episode_return"])
    assert returns["lstm"] >= 100.0 > 70.0 > returns["identity"], returns


def _reset_masks() -> dict[str, torch.Tensor]:
    """mask [T, N] cases (0: the state is zeroed before step t): random resets at several rates (Blackjack-like
    ~1.5-step episodes to long ones), none, all, a single env, restarts at step 0 and at the last step."""
    g = torch.Generator().manual_seed(1)
    masks = {f"random p={p}": (torch.rand(24, 5, generator=g) >= p).float() for p in (0.7, 0.3, 0.05)}
    masks["no reset"] = torch.ones(24, 5)
    masks["all reset"] = torch.zeros(24, 5)
    masks["single env"] = (torch.rand(24, 1, generator=g) >= 0.4).float()
    masks["single env, single step"] = torch.zeros(1, 1)
    edges = torch.ones(24, 5)
    edges[0, 1] = edges[-1, 2] = edges[3, 0] = edges[3, 2] = 0  # step 0, the last step, two envs at once
    masks["edges"] = edges
    return masks


def _unroll(core, x, state, mask, *, keep_states):
    """(outputs, the gradients of the parameters, of x and of the start state) of a weighted sum of the outputs."""
    core.zero_grad()
    x, state = x.clone().requires_grad_(True), tuple(s.clone().requires_grad_(True) for s in state)
    y, states = core.sequence(x, state, mask, keep_states=keep_states)
    (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    return y.detach(), [p.grad.clone() for p in core.parameters()] + [x.grad] + [s.grad for s in state], states


@pytest.mark.parametrize("plan", ["spans", "segments", "auto"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_fused_unroll_matches_the_cell_by_cell_unroll(kind, plan, monkeypatch):
    """PPO's fused unroll, in either plan (one kernel call per span between restarts, or the envs' episode
    segments side by side in a few padded calls), computes what stepping the cell does: outputs (the last of
    which is the final h), gradients of the weights, the inputs and the stored start state, on every mask."""
    from rltrain.models.cores import RecurrentCore

    monkeypatch.setattr(RecurrentCore, "unroll_plan", plan)
    for name, mask in _reset_masks().items():
        torch.manual_seed(0)
        T, N = mask.shape
        core = RecurrentCore(6, kind=kind, size=5)
        x = torch.randn(T, N, 6)
        state = tuple(torch.randn(1, N, 5) for _ in range(2 if kind == "lstm" else 1))
        y1, g1, states = _unroll(core, x, state, mask, keep_states=True)
        y2, g2, none = _unroll(core, x, state, mask, keep_states=False)
        assert len(states) == T and none == [], name
        torch.testing.assert_close(y2, y1, rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(y2[-1], states[-1][0][0], rtol=1e-5, atol=1e-6, msg=name)  # final h
        for a, b in zip(g2, g1, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_segments_that_reset_wrongly_would_fail_the_equality_check(kind):
    """The equality check above catches a wrong reset: a segment plan whose later segments start from the
    carried state instead of zero, or a reset dropped from the mask, moves outputs far past its tolerance."""
    import dataclasses

    from rltrain.models.cores import RecurrentCore, plan_unroll, unroll_costs

    torch.manual_seed(0)
    mask = _reset_masks()["random p=0.3"]
    T, N = mask.shape
    core = RecurrentCore(6, kind=kind, size=5)
    x, state = torch.randn(T, N, 6), tuple(torch.randn(1, N, 5) for _ in range(2 if kind == "lstm" else 1))
    with torch.no_grad():
        reference, _ = core.sequence(x, state, mask)
        plan = plan_unroll((mask == 0).numpy().tobytes(), T, N, unroll_costs("cpu", kind), "segments")
        assert not plan.opens.all()  # some rows start an episode from zero
        carried = dataclasses.replace(plan, opens=torch.ones_like(plan.opens))  # every row from the carried state
        wrong = core._segments(x, state, carried)
        assert (wrong - reference).abs().max() > 1e-2
        dropped = mask.clone()
        dropped[torch.nonzero(mask[1:] == 0)[0][0] + 1, torch.nonzero(mask[1:] == 0)[0][1]] = 1
        y, _ = core.sequence(x, state, dropped, keep_states=False)
        assert (y - reference).abs().max() > 1e-2


def test_the_plan_follows_the_episode_lengths():
    """Short episodes (~1.5 steps, as Blackjack's) run as a few padded segment calls instead of a call per step;
    a rollout without restarts stays one call over all T steps; long episodes on the CPU LSTM keep the spans;
    on an accelerator, where a launch costs more than rows, segments share one [L, S] call; the choice is a
    function of the mask (the same mask, the same plan: runs stay reproducible)."""
    from rltrain.models.cores import SegmentPlan, plan_unroll, unroll_costs

    g = torch.Generator().manual_seed(0)
    short = (torch.rand(128, 4, generator=g) >= 0.65).numpy()  # ~1.5-step episodes
    short[0] = True
    T, N = short.shape
    cpu, cuda = unroll_costs("cpu", "lstm"), unroll_costs("cuda", "lstm")
    spans = plan_unroll((~short).tobytes(), T, N, cpu, "spans")
    assert len(spans) > 100  # the old plan: a kernel call per step, nearly
    plan = plan_unroll((~short).tobytes(), T, N, cpu)
    assert isinstance(plan, SegmentPlan) and len(plan.calls) <= 4
    padded = sum(length * width for length, width in plan.calls)
    assert T * N <= padded <= 2 * T * N  # bands of lengths: padding at most doubles the work
    assert sum(width for _, width in plan.calls) == int((~short[1:]).sum()) + N  # one row per segment
    assert plan_unroll((~short).tobytes(), T, N, cpu) is plan
    one = plan_unroll((~short).tobytes(), T, N, cuda)
    assert isinstance(one, SegmentPlan) and len(one.calls) == 1 and one.calls[0][1] == len(one.first)
    assert plan_unroll(np.zeros((T, N), bool).tobytes(), T, N, cpu) == ()
    long = np.zeros((T, N), bool)
    long[60, 1] = True
    assert plan_unroll(long.tobytes(), T, N, cpu) == (60,)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_short_episodes_take_a_few_kernel_calls(kind, monkeypatch):
    """The unroll of a Blackjack-like minibatch calls the multi-step kernel a few times, not once per step."""
    from rltrain.models.cores import RecurrentCore

    core = RecurrentCore(6, kind=kind, size=5)
    calls, kernel = [], core._kernel
    monkeypatch.setattr(core, "_kernel", lambda x, state: calls.append(x.shape) or kernel(x, state))
    mask = (torch.rand(128, 4, generator=torch.Generator().manual_seed(0)) >= 0.65).float()
    state = core.initial_state(4)
    core.sequence(torch.randn(128, 4, 6), state, mask, keep_states=False)
    assert 1 <= len(calls) <= 4, calls
    calls.clear()
    monkeypatch.setattr(RecurrentCore, "unroll_plan", "spans")
    core.sequence(torch.randn(128, 4, 6), state, mask, keep_states=False)
    assert len(calls) > 100
