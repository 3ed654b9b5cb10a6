"""The off-policy schedule written once (algos/off_policy.py) under DQN and SAC: the gradient steps owed per env
step against a hand count, target syncs, a run that collects several rollouts per learn() against one that
collects one at a time, and the numpy epsilon-greedy actor against the torch one."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from rltrain.algos.base import Sync
from rltrain.algos.dqn import DQN, DQNSettings
from rltrain.algos.off_policy import OffPolicy, UpdateSchedule
from rltrain.algos.sac import SAC, SACSettings
from rltrain.cli.build import run
from rltrain.data.replay import Batch
from rltrain.data.structs import MASK_KEY, EnvSpec, ObsSpace, Rollout
from rltrain.models.factory import ModelSettings
from rltrain.models.heads import LOG_STD_MAX, LOG_STD_MIN, SquashedGaussianHead, squashed_gaussian_sample
from tests.conftest import compose_cfg

CPU = torch.device("cpu")
CARTPOLE = EnvSpec("CartPole-v1", (4,), "discrete", (), n_actions=2)
PENDULUM = EnvSpec("Pendulum-v1", (3,), "box", (1,), action_low=(-2.0,), action_high=(2.0,))
SMALL = ModelSettings(hidden_sizes=(8,))


class Workers(Sync):
    """The env-step arithmetic of ``world_size`` workers (each contributes its rollout's steps)."""

    def __init__(self, world_size: int):
        self.world_size = world_size


def stream(spec: EnvSpec, T: int, N: int, rng: np.random.Generator, last: np.ndarray | None) -> Rollout:
    """T steps of N never-ending env streams (each rollout continues the previous one's last observations)."""
    obs = rng.normal(size=(T + 1, N, *spec.obs_shape)).astype(np.float32)
    if last is not None:
        obs[0] = last
    actions = rng.integers(0, 2, (T, N)) if spec.action_kind == "discrete" else \
        rng.uniform(-2, 2, (T, N, *spec.action_shape)).astype(np.float32)
    none = np.zeros((T, N), bool)
    return Rollout(obs=obs[:-1], actions=actions, log_probs=np.zeros((T, N), np.float32),
                   rewards=np.ones((T, N), np.float32), terminated=none, truncated=none.copy(), next_obs=obs[1:],
                   policy_version=np.zeros(T, np.int64))


@pytest.mark.parametrize("num_envs,rollout_len,world_size", [(1, 1, 1), (3, 1, 1), (4, 2, 1), (2, 3, 2), (1, 5, 3)])
@pytest.mark.parametrize("train_frequency,gradient_steps,learning_starts", [(1, 1, 40), (4, 1, 40), (3, 2, 47),
                                                                             (10, 3, 63)])
def test_gradient_steps_owed_match_a_hand_count(num_envs, rollout_len, world_size, train_frequency, gradient_steps,
                                                learning_starts):
    """After E env steps over all envs and workers, ``gradient_steps`` for every ``train_frequency`` env steps
    past ``learning_starts``: floor((E - learning_starts) / train_frequency) rounds, whatever the envs, rollout
    length and world size (no rounding loss with frequencies like 3, whose 1/3 a float count would lose)."""
    settings = DQNSettings(rollout_len=rollout_len, train_frequency=train_frequency, gradient_steps=gradient_steps,
                           learning_starts=learning_starts, batch_size=4, buffer_size=5000,
                           target_network_frequency=10**9)
    dqn = DQN(CARTPOLE, settings, num_envs=num_envs, device=CPU, sync=Workers(world_size), model=SMALL)
    rng, last, env_steps = np.random.default_rng(0), None, 0
    while env_steps < learning_starts + 4 * train_frequency:
        rollout = stream(CARTPOLE, rollout_len, num_envs, rng, last)
        last = rollout.next_obs[-1]
        dqn.learn(rollout, progress=0.5)
        env_steps += rollout_len * num_envs * world_size
        hand = gradient_steps * (max(env_steps - learning_starts, 0) // train_frequency)
        assert dqn.gradient_steps_taken == hand, env_steps
    assert dqn.env_steps == env_steps and hand > 0


def test_the_schedule_keeps_its_remainder_in_whole_env_steps():
    schedule = UpdateSchedule(train_frequency=3, gradient_steps=2)
    assert [schedule.owe(2) for _ in range(6)] == [0, 2, 2, 0, 2, 2] and schedule.owed_steps == 0


def test_the_target_network_syncs_every_target_frequency_env_steps():
    """Hard copies at env steps 200, 400, ... (the first call at or past each multiple after the last sync)."""
    settings = DQNSettings(rollout_len=5, train_frequency=4, learning_starts=30, batch_size=4, buffer_size=2000,
                           target_network_frequency=200)
    dqn = DQN(CARTPOLE, settings, num_envs=2, device=CPU, model=SMALL)
    rng, last, synced = np.random.default_rng(0), None, []
    for _ in range(100):  # 10 env steps per call
        rollout = stream(CARTPOLE, 5, 2, rng, last)
        last = rollout.next_obs[-1]
        before = dqn.last_target_sync
        dqn.learn(rollout, progress=0.5)
        if dqn.last_target_sync != before:
            synced.append(dqn.env_steps)
            assert all(torch.equal(p, q) for p, q in zip(dqn.policy.parameters(), dqn.target.parameters(), strict=True))
    assert synced == [200, 400, 600, 800, 1000]


def test_a_resumed_learner_owes_what_the_uninterrupted_one_does():
    def learner():
        torch.manual_seed(0)
        return SAC(PENDULUM, SACSettings(rollout_len=1, train_frequency=3, gradient_steps=2, learning_starts=5,
                                         batch_size=4, buffer_size=500, checkpoint_buffer=True),
                   num_envs=2, device=CPU, model=SMALL)

    rng = np.random.default_rng(0)
    rollouts, last = [], None
    for _ in range(20):
        rollouts.append(stream(PENDULUM, 1, 2, rng, last))
        last = rollouts[-1].next_obs[-1]
    np.random.seed(0)
    through = learner()
    for r in rollouts:
        through.learn(r, progress=0.5)
    np.random.seed(0)
    first = learner()
    for r in rollouts[:7]:  # 14 env steps: 9 past learning_starts, 3 rounds, 0 owed
        first.learn(r, progress=0.5)
    state, rng_state, torch_state = first.state_dict(), np.random.get_state(), torch.get_rng_state()
    second = learner()
    second.load_state_dict(state)
    np.random.set_state(rng_state)  # what a resume restores (run/seeding.py): the replay's and the actor's draws
    torch.set_rng_state(torch_state)
    for r in rollouts[7:]:
        second.learn(r, progress=0.5)
    assert second.gradient_steps_taken == through.gradient_steps_taken == 2 * ((40 - 5) // 3)
    for p, q in zip(second.policy.parameters(), through.policy.parameters(), strict=True):
        assert torch.equal(p, q)


RUN = ["debug=smoke", "logger=quiet", "experiment=none", "algo=dqn", "env=cartpole", "env.num_envs=2",
       "total_env_steps=1500", "algo.rollout_len=1", "algo.learning_starts=300", "algo.train_frequency=8",
       "algo.target_network_frequency=250", "algo.exploration_fraction=0.05", "algo.batch_size=16",
       "log.every_env_steps=250", "eval.every_env_steps=500", "checkpoint.every_env_steps=700", "seed=4"]


def test_collecting_rollouts_in_one_go_gives_the_run_one_rollout_at_a_time_gives(tmp_path, monkeypatch):
    """The loop collects up to the next update (or its own next log / evaluation / checkpoint) in one call:
    the same metrics rows and the same final weights as one learn() per rollout, in fewer collector calls."""
    from rltrain.trainers.collector import RolloutCollector

    calls = {"n": 0}
    collect = RolloutCollector.collect

    def counted(self, *args, **kwargs):
        calls["n"] += 1
        return collect(self, *args, **kwargs)

    monkeypatch.setattr(RolloutCollector, "collect", counted)
    results = {}
    for mode in ("in_one_go", "one_at_a_time"):
        if mode == "one_at_a_time":
            monkeypatch.setattr(OffPolicy, "rollouts_to_collect", lambda self, *a, **k: 1)
        calls["n"] = 0
        run_dir = tmp_path / mode
        run(compose_cfg(RUN), run_dir)
        with open(run_dir / "metrics.csv") as f:
            rows = [{k: v for k, v in row.items() if not k.startswith("time/")} for row in csv.DictReader(f)]
        final = torch.load(run_dir / "checkpoints" / "final.pt", weights_only=True)["algo"]["policy"]
        results[mode] = (rows, final, calls["n"])
    (rows, final, n), (rows1, final1, n1) = results["in_one_go"], results["one_at_a_time"]
    assert rows == rows1 and len(rows) >= 6
    assert final.keys() == final1.keys() and all(torch.equal(final[k], final1[k]) for k in final)
    assert n < n1 / 3  # after the epsilon decay (75 env steps), 4 rollouts of 2 envs per collect


def test_numpy_epsilon_greedy_actor_acts_as_the_torch_policy():
    """The collector's numpy actor (QPolicy.numpy_actor) gives the torch forward's greedy actions, explores with
    probability epsilon, uniformly, and reports the epsilon-greedy log-probabilities."""
    torch.manual_seed(0)
    dqn = DQN(CARTPOLE, DQNSettings(), num_envs=1, device=CPU)
    obs = np.random.default_rng(0).normal(size=(2000, 4)).astype(np.float32)
    dqn.policy.epsilon.fill_(0.0)
    actor = dqn.policy.numpy_actor()
    with torch.no_grad():
        q = dqn.policy(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(actor.forward(obs), q, rtol=1e-5, atol=1e-6)
    noise = np.random.default_rng(1).random((1, 2000, 2)).astype(np.float32)  # one step of 2000 envs
    assert np.array_equal(actor.action(actor.forward(obs), actor.perturb(noise)[0]), q.argmax(-1))
    dqn.policy.epsilon.fill_(0.3)
    actor = dqn.policy.numpy_actor()
    out = actor.forward(obs)
    actions = actor.action(out, actor.perturb(noise)[0])
    noise = noise[0]
    explored = noise[:, 0] < np.float32(0.3)
    assert np.array_equal(actions[~explored], out.argmax(-1)[~explored])
    assert np.array_equal(actions[explored], (noise[explored, 1] * 2).astype(np.int64))
    assert 0.27 < explored.mean() < 0.33 and 0.4 < actions[explored].mean() < 0.6
    greedy = actions == out.argmax(-1)
    np.testing.assert_allclose(actor.log_prob(out, actions, noise), np.log(np.where(greedy, 0.85, 0.15)), rtol=1e-6)
    # an action mask in the observation: the torch policy acts, which applies it (None: no numpy actor)
    dict_obs = ObsSpace("dict", parts=(("obs", ObsSpace("box", (4,))), (MASK_KEY, ObsSpace("multi_binary", (2,),
                                                                                            "int8"))))
    masked = DQN(EnvSpec("Masked", (), "discrete", (), n_actions=2, obs_dtype="", obs_space=dict_obs), DQNSettings(),
                 num_envs=1, device=CPU)
    assert masked.policy.numpy_actor() is None


def test_numpy_actor_of_a_quantile_head_acts_on_the_mean_quantile():
    """QR-DQN on float vectors acts through the numpy actor too: Q is the mean of each action's K quantiles, as
    the torch policy's; heads with more than one Linear (dueling, noisy) or C51's atoms keep the torch path. (The
    update is numpy's too: tests/test_rainbow.py checks it against autograd.)"""
    torch.manual_seed(0)
    qr = DQN(CARTPOLE, DQNSettings(distributional="qr", n_quantiles=7), num_envs=1, device=CPU)
    assert qr.numpy_step is not None
    obs = np.random.default_rng(0).normal(size=(2000, 4)).astype(np.float32)
    qr.policy.epsilon.fill_(0.0)
    actor = qr.policy.numpy_actor()
    with torch.no_grad():
        q = qr.policy(torch.from_numpy(obs)).numpy()
    out = actor.forward(obs)
    assert out.shape == (2000, 2) and actor.out_dim == 2
    np.testing.assert_allclose(out, q, rtol=1e-5, atol=1e-6)
    noise = np.random.default_rng(1).random((1, 2000, 2)).astype(np.float32)
    assert np.array_equal(actor.action(out, actor.perturb(noise)[0]), q.argmax(-1))
    for other in (DQNSettings(distributional="qr", n_quantiles=7, dueling=True), DQNSettings(distributional="c51")):
        assert DQN(CARTPOLE, other, num_envs=1, device=CPU).policy.numpy_actor() is None


@pytest.mark.parametrize("loss,double_dqn,activation,max_grad_norm", [
    ("huber", False, "relu", 0.5), ("mse", True, "tanh", None), ("huber", True, "elu", 10.0),
    ("mse", False, "silu", 0.5)])
def test_numpy_td_step_is_autograds(loss, double_dqn, activation, max_grad_norm):
    """The TD step a plain MLP Q-network takes on CPU (numpy, algos/td_numpy.py) against autograd's
    (numpy_update=false) from the same weights on the same batches: the same statistics, weights and Adam
    state after several steps (clipped or not), and checkpoints that cross between the two."""
    def make(numpy_update):
        torch.manual_seed(0)
        settings = DQNSettings(numpy_update=numpy_update, loss=loss, double_dqn=double_dqn, lr=3e-3,
                               max_grad_norm=max_grad_norm, buffer_size=100)
        return DQN(CARTPOLE, settings, num_envs=1, device=CPU, model=ModelSettings(hidden_sizes=(16, 8),
                                                                                    activation=activation))

    fast, slow = make(True), make(False)
    assert fast.numpy_step is not None and slow.numpy_step is None
    rng = np.random.default_rng(0)
    for _ in range(6):
        batch = Batch(obs=torch.from_numpy(rng.normal(size=(32, 4)).astype(np.float32)),
                      actions=torch.from_numpy(rng.integers(0, 2, 32)),
                      rewards=torch.from_numpy(rng.normal(size=32).astype(np.float32) * 3),
                      next_obs=torch.from_numpy(rng.normal(size=(32, 4)).astype(np.float32)),
                      terminated=torch.from_numpy((rng.random(32) < 0.2).astype(np.float32)))
        torch.testing.assert_close(fast.update(batch), slow.update(batch), rtol=1e-4, atol=1e-5)
    for p, q in zip(fast.policy.parameters(), slow.policy.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    crossed = make(False)
    crossed.load_state_dict(fast.state_dict())
    for name, (a, b) in {"policy": (crossed.policy, fast.policy)}.items():
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(p, q), name
    back = make(True)
    back.load_state_dict(slow.state_dict())
    ours, theirs = back.optimizer.state_dict()["state"], slow.optimizer.state_dict()["state"]
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[i]["exp_avg"], theirs[i]["exp_avg"]) for i in ours)


def test_numpy_squashed_gaussian_actor_acts_as_the_torch_one():
    """SAC's actor in numpy (the collector's fast path on float vectors) gives the torch actor's actions and
    log-probabilities for the same noise; with action noise (added by the torch path) there is none."""
    torch.manual_seed(0)
    sac = SAC(PENDULUM, SACSettings(), num_envs=1, device=CPU, model=SMALL)
    actor = sac.policy.numpy_actor()
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    noise = np.random.default_rng(1).standard_normal((1, 64, 2)).astype(np.float32)
    out = actor.forward(obs)
    action = actor.action(out, actor.perturb(noise)[0])
    with torch.no_grad():
        features = sac.policy.encoder(torch.from_numpy(obs))
        head = sac.policy.head
        eps = torch.from_numpy(noise[0, :, :1])
        mu, raw = head.mean(features), head.log_std(features)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw) + 1)
        u = mu + log_std.exp() * eps
        expected = torch.tanh(u) * head.scale + head.bias
    np.testing.assert_allclose(action, expected.numpy(), rtol=1e-5, atol=1e-6)
    assert action.dtype == np.float32 and (np.abs(action) <= 2.0).all()
    logp = actor.log_prob(out[None], action[None], noise)[0]
    torch_logp = (-0.5 * eps**2 - log_std - 0.5 * np.log(2 * np.pi)).sum(-1) - \
        (2.0 * (np.log(2.0) - u - torch.nn.functional.softplus(-2.0 * u))).sum(-1) - torch.log(head.scale).sum()
    np.testing.assert_allclose(logp, torch_logp.numpy(), rtol=1e-4, atol=1e-4)
    noisy = SAC(PENDULUM, SACSettings(action_noise=0.3), num_envs=1, device=CPU, model=SMALL)
    assert noisy.policy.numpy_actor() is None


def test_squashed_gaussian_log_prob_is_torch_distributions_tanh_normal():
    """The sample's log pi(a|s) against torch.distributions' own change of variables (a Normal through tanh, then
    the affine map onto the bounds), on bounds that are not symmetric and three action dimensions; the action is the
    same map of the same noise; gradients reach mu and the raw log-std; the deterministic action is the mean's."""
    from torch.distributions import Normal, TransformedDistribution
    from torch.distributions.transforms import AffineTransform, TanhTransform

    g = torch.Generator().manual_seed(0)
    low, high = torch.tensor([-2.0, 0.0, -0.5]), torch.tensor([2.0, 3.0, 0.5])
    scale, bias = (high - low) / 2, (high + low) / 2
    mu = (torch.randn(64, 3, generator=g) * 0.5).requires_grad_()
    raw = torch.randn(64, 3, generator=g).requires_grad_()
    action, logp = squashed_gaussian_sample(mu, raw, scale, bias, generator=torch.Generator().manual_seed(1))
    eps = torch.randn(64, 3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        sigma = torch.exp(LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw) + 1))
        u = mu + sigma * eps
        tanh, affine = TanhTransform(), AffineTransform(bias, scale)
        a = affine(tanh(u))
        # the change of variables at u itself (a saturated tanh has no stable inverse) ...
        expected = (Normal(mu, sigma).log_prob(u) - tanh.log_abs_det_jacobian(u, tanh(u))
                    - affine.log_abs_det_jacobian(tanh(u), a)).sum(-1)
        # ... and, where tanh is not saturated, the distribution's own log_prob of the action
        inside = (u.abs() < 3).all(-1)
        by_inverse = TransformedDistribution(Normal(mu, sigma), [tanh, affine]).log_prob(a).sum(-1)
    assert inside.sum() >= 16
    torch.testing.assert_close(action.detach(), a)
    torch.testing.assert_close(logp.detach(), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logp.detach()[inside], by_inverse[inside], rtol=1e-3, atol=1e-3)
    logp.sum().backward()
    assert mu.grad.abs().sum() > 0 and raw.grad.abs().sum() > 0
    # the head's constant sum(log scale) follows the bounds it holds, also after loading another head's state
    head = SquashedGaussianHead(4, 3, low, high)
    other = SquashedGaussianHead(4, 3, torch.full((3,), -1.0), torch.full((3,), 1.0))
    assert head.log_scale_sum == pytest.approx(float(torch.log(scale).sum()))
    head.load_state_dict(other.state_dict())
    assert head.log_scale_sum == pytest.approx(0.0)
    det, _ = squashed_gaussian_sample(mu, raw, scale, bias, deterministic=True)
    torch.testing.assert_close(det.detach(), torch.tanh(mu.detach()) * scale + bias)


def test_sac_trains_on_a_box_with_a_dimension_whose_bounds_are_equal():
    """A Box dimension with low == high (a fixed joint: Box([0, -5], [0, 5])) holds one action. Its log(scale) was
    log(0) = -inf, so every log-probability was +inf and the first update's losses NaN (the run stopped at a
    "non-finite loss/q"); its density is now taken in the squashed space: finite, and the action stays fixed."""
    spec = EnvSpec("Fixed", (3,), "box", (2,), action_low=(0.0, -5.0), action_high=(0.0, 5.0))
    torch.manual_seed(0)
    sac = SAC(spec, SACSettings(rollout_len=1, learning_starts=4, batch_size=4, buffer_size=100), num_envs=2,
              device=CPU, model=SMALL)
    rng, last, metrics = np.random.default_rng(0), None, {}
    for _ in range(8):
        rollout = stream(spec, 1, 2, rng, last)
        rollout.actions[..., 0] = 0.0  # what the env was stepped with: inside its bounds
        last = rollout.next_obs[-1]
        metrics = {**metrics, **sac.learn(rollout, progress=0.5)}
    assert sac.gradient_steps_taken > 0 and all(np.isfinite(v) for v in metrics.values()), metrics
    action, logp = sac.policy.head(torch.zeros(5, 8))
    assert torch.isfinite(logp).all() and (action[:, 0] == 0).all()


def _batch(spec: EnvSpec, B: int, seed: int) -> Batch:
    rng = np.random.default_rng(seed)
    t = lambda x: torch.from_numpy(np.asarray(x, np.float32))  # noqa: E731
    return Batch(obs=t(rng.normal(size=(B, 3))), actions=t(rng.uniform(-2, 2, (B, 1))), rewards=t(rng.normal(size=B)),
                 next_obs=t(rng.normal(size=(B, 3))), terminated=t(rng.random(B) < 0.2))


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_td3_and_ddpg_updates_are_the_papers(algo):
    """One critic step against the target computed by hand: TD3's clipped double-Q over the target actor's
    action plus clipped Gaussian noise (0.2, clipped at 0.5, in half action ranges), DDPG's one target critic on
    the bare target action; TD3's actor and targets move on every 2nd critic step only, DDPG's on every one, the
    targets by tau toward the online networks."""
    from rltrain.algos.ddpg import DDPG, DDPGSettings
    from rltrain.algos.td3 import TD3, TD3Settings

    torch.manual_seed(0)
    cls, settings = (TD3, TD3Settings(tau=0.1)) if algo == "td3" else (DDPG, DDPGSettings(tau=0.1))
    learner = cls(PENDULUM, settings, num_envs=1, device=CPU, model=SMALL)
    delay = 2 if algo == "td3" else 1
    for step in (1, 2, 3, 4):
        batch = _batch(PENDULUM, 32, step)
        actor = [p.clone() for p in learner.policy.parameters()]
        targets = [p.clone() for p in (*learner.actor_target.parameters(), *learner.critic_target.parameters())]
        online = [p.clone() for p in (*learner.policy.parameters(), *learner.critic.parameters())]
        torch.manual_seed(step)
        with torch.no_grad():
            next_a = learner.actor_target.action(batch.next_obs)
            if algo == "td3":
                noise = (torch.randn_like(next_a) * 0.2).clamp(-0.5, 0.5) * 2.0  # half range of [-2, 2]
                next_a = (next_a + noise).clamp(-2.0, 2.0)
            next_q = torch.stack(learner.critic_target(batch.next_obs, next_a)).min(0).values
            y = batch.rewards + 0.99 * (1 - batch.terminated) * next_q
            expected = sum(torch.nn.functional.mse_loss(q, y) for q in learner.critic(batch.obs, batch.actions))
        assert len(learner.critic(batch.obs, batch.actions)) == (2 if algo == "td3" else 1)
        torch.manual_seed(step)
        learner.gradient_steps_taken = step  # as the base counts them (this step included)
        stats = learner.update(batch)
        torch.testing.assert_close(stats[0], expected, rtol=1e-5, atol=1e-6)
        moved = any(not torch.equal(a, b) for a, b in zip(actor, learner.policy.parameters(), strict=True))
        assert moved == (step % delay == 0), step
        after = [*learner.actor_target.parameters(), *learner.critic_target.parameters()]
        if step % delay:
            assert all(torch.equal(a, b) for a, b in zip(targets, after, strict=True))
        else:  # Polyak toward the online networks as they are after this step's updates
            now = [*learner.policy.parameters(), *learner.critic.parameters()]
            for before, target, net in zip(targets, after, now, strict=True):
                torch.testing.assert_close(target, before + 0.1 * (net - before))
        assert len(online) == len(targets)


def test_numpy_deterministic_actor_acts_as_the_torch_one():
    """TD3's actor in numpy (the collector's fast path) gives mu(s) and moves it by the exploration noise the
    torch path's GaussianActionNoise adds for the same draws: sigma times the half action range."""
    from rltrain.algos.td3 import TD3, TD3Settings

    torch.manual_seed(0)
    td3 = TD3(PENDULUM, TD3Settings(exploration_noise=0.3), num_envs=1, device=CPU, model=SMALL)
    actor = td3.policy.numpy_actor()
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    out = actor.forward(obs)
    with torch.no_grad():
        mu = td3.policy.act(torch.from_numpy(obs)).action.numpy()
    np.testing.assert_allclose(out, mu, rtol=1e-5, atol=1e-6)
    draws = np.random.default_rng(1).standard_normal((64, 1)).astype(np.float32)
    torch_noise = td3.policy.action_noise.sample((64, 1), np.random.default_rng(1))
    np.testing.assert_allclose(actor.action(out, actor.perturb(draws)), mu + torch_noise, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(torch_noise, draws * 0.3 * 2.0, rtol=1e-6)


def test_every_row_after_the_first_update_shows_the_latest_loss(tmp_path):
    """dqn_cartpole's rounds of gradient steps fall at 1000 + 128 k env steps, never on a row's step (a multiple
    of 1000): each row shows the loss of the last round before it, as SB3 logs it (the rows had no loss at all:
    the learn() on a row's step took no gradient step and reported its epsilon alone)."""
    cfg = compose_cfg(["experiment=dqn_cartpole", "total_env_steps=3000", "log.every_env_steps=1000",
                       "eval.every_env_steps=0", "eval.episodes=1", "checkpoint.every_env_steps=0", "logger=quiet",
                       "model.hidden_sizes=[16]"])
    run(cfg, tmp_path / "run")
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(float(r["env_steps"])) for r in rows] == [1000, 2000, 3000]
    assert rows[0]["loss/q"] == "" and rows[0]["train/epsilon"] != ""  # the warm-up: no gradient step yet
    assert all(r["loss/q"] != "" and r["train/q_mean"] != "" and r["train/epsilon"] != "" for r in rows[1:]), rows
