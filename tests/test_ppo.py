"""PPO: acting shapes, one learn() on a synthetic rollout, and the numpy fast paths against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rltrain.algos.minibatches import RowMinibatches
from rltrain.algos.ppo import PPO, PPOSettings
from rltrain.data.structs import EnvSpec, Rollout
from rltrain.models.layers import categorical_sample, gaussian_sample
from rltrain.models.settings import ModelSettings

DISCRETE = EnvSpec("Synthetic-discrete", (4,), "discrete", (), n_actions=3)
BOX = EnvSpec("Synthetic-box", (3,), "box", (2,), action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
CPU = torch.device("cpu")


def make(spec: EnvSpec, seed: int = 0, **kw) -> PPO:
    torch.manual_seed(seed)
    # an annealed learning rate, so that the schedule is exercised (the generic default is constant)
    kw = {"hidden_sizes": (16, 16), "lr": 2.5e-4, "anneal_lr": True, "update_epochs": 4, **kw}
    model = ModelSettings(hidden_sizes=kw.pop("hidden_sizes"), activation=kw.pop("activation", None))
    return PPO(spec, PPOSettings(rollout_len=16, num_minibatches=4, **kw), num_envs=4, device=CPU, model=model)


def synthetic_rollout(spec: EnvSpec, T: int = 16, N: int = 4, seed: int = 0) -> Rollout:
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((T, N, *spec.obs_shape)).astype(np.float32)
    if spec.action_kind == "discrete":
        actions = rng.integers(0, spec.n_actions, (T, N))
    else:
        actions = rng.standard_normal((T, N, *spec.action_shape)).astype(np.float32)
    done = rng.random((T, N)) < 0.1
    return Rollout(obs=obs, actions=actions, log_probs=rng.normal(-1.0, 0.3, (T, N)).astype(np.float32),
                   rewards=rng.standard_normal((T, N)).astype(np.float32), terminated=done & (rng.random((T, N)) < 0.5),
                   truncated=done, next_obs=rng.standard_normal(obs.shape).astype(np.float32),
                   policy_version=np.zeros(T, np.int64))


@pytest.mark.parametrize("spec", [DISCRETE, BOX], ids=["discrete", "box"])
def test_act_shapes_batch_and_single(spec):
    pol = make(spec).policy
    for n in (5, 1):
        out = pol.act(torch.randn(n, *spec.obs_shape))
        assert out.action.shape == (n, *spec.action_shape)
        assert out.log_prob.shape == (n,) and torch.isfinite(out.log_prob).all()
        det = pol.act(torch.randn(n, *spec.obs_shape), deterministic=True)
        assert det.action.shape == (n, *spec.action_shape)
    if spec.action_kind == "discrete":
        assert out.action.dtype == torch.int64


@pytest.mark.parametrize("numpy_update", [True, False], ids=["numpy", "torch"])
@pytest.mark.parametrize("spec", [DISCRETE, BOX], ids=["discrete", "box"])
def test_learn_changes_params_and_gives_finite_metrics(spec, numpy_update):
    algo = make(spec, numpy_update=numpy_update, norm_obs=True)
    assert algo.numpy_update == numpy_update
    before = [p.detach().clone() for p in algo.params]
    metrics = algo.learn(synthetic_rollout(spec), progress=0.25)
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert metrics["train/lr"] == pytest.approx(2.5e-4 * 0.75)
    assert any(not torch.equal(b, p) for b, p in zip(before, algo.params, strict=True))
    # a state dict round trip restores the weights exactly (the numpy path keeps them in a flat buffer)
    other = make(spec, seed=1, numpy_update=numpy_update, norm_obs=True)
    other.load_state_dict(algo.state_dict())
    for a, b in zip(algo.params, other.params, strict=True):
        assert torch.equal(a, b)


def _assert_same_optimizer_state(fast: dict, ref: dict, *, exact: bool) -> None:
    """Two torch-Adam-format state dicts: same groups and keys, ``step`` equal with torch's type, moments
    equal (``exact``) or allclose."""
    assert fast["param_groups"] == ref["param_groups"]
    assert fast["state"].keys() == ref["state"].keys() == set(range(len(ref["param_groups"][0]["params"])))
    for i, r in ref["state"].items():
        f = fast["state"][i]
        assert f.keys() == r.keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert type(f["step"]) is type(r["step"]) and f["step"].dtype == r["step"].dtype and f["step"] == r["step"]
        for key in ("exp_avg", "exp_avg_sq"):
            assert f[key].shape == r[key].shape and f[key].dtype == r[key].dtype
            if exact:
                assert torch.equal(f[key], r[key]), (i, key)
            else:
                np.testing.assert_allclose(f[key].numpy(), r[key].numpy(), rtol=2e-3, atol=1e-9, err_msg=f"{i} {key}")


def _minibatches(algo: PPO, rollout: Rollout, adv: np.ndarray, ret: np.ndarray, values: np.ndarray
                 ) -> RowMinibatches:
    """What learn() builds for ``algo``'s backend (the rows it reads, arrays or tensors), from seed 5."""
    torch.manual_seed(5)
    return RowMinibatches(algo.update.rows(rollout.obs), rollout, adv, ret, values, epochs=4, minibatches=4,
                          norm_adv=True, device=algo.update.device)


def _check_numpy_step_matches_autograd(spec: EnvSpec, **kw) -> None:
    """The numpy backend (hand-written backward, clipping and Adam) equals the torch one (autograd on
    ``ppo_loss``, clip_grad_norm_, torch Adam) for a few steps on the same minibatches: losses, gradients,
    parameters and the optimiser state (torch Adam's format)."""
    kw = dict(ent_coef=0.05, vf_coef=0.7, max_grad_norm=0.05, **kw)
    fast, ref = make(spec, numpy_update=True, **kw), make(spec, numpy_update=False, **kw)
    assert fast.numpy_update and not ref.numpy_update
    assert type(fast.update).__name__ == "NumpyUpdate" and type(ref.update).__name__ == "TorchUpdate"
    rollout = synthetic_rollout(spec)
    if kw.get("norm_obs"):  # statistics far from (0, 1), so normalisation and its clip matter
        moments = fast.policy.obs_norm.moments(np.random.default_rng(4).normal(0.5, 0.3, (64, *spec.obs_shape)), 1)
        fast.policy.obs_norm.update_from_moments(moments)
    ref.policy.load_state_dict(fast.policy.state_dict())
    adv = np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32)
    ret = np.random.default_rng(2).standard_normal((16, 4)).astype(np.float32)
    with torch.no_grad():
        values = ref.policy.value(torch.from_numpy(rollout.obs.reshape(64, -1))).numpy().reshape(16, 4)
    values = values + np.random.default_rng(3).normal(0, 0.3, values.shape).astype(np.float32)  # clip some
    np_batches, t_batches = _minibatches(fast, rollout, adv, ret, values), _minibatches(ref, rollout, adv, ret, values)
    for k in range(4):  # a few steps: Adam moments and a moved policy (ratios != 1, clipping active)
        np_mb, t_mb = np_batches[k], t_batches[k]
        np.testing.assert_array_equal(np_mb.adv, t_mb.adv.numpy())  # the same minibatch on both backends
        s_np = fast.update.step(np_mb)
        s_t = ref.update.step(t_mb).numpy()
        np.testing.assert_allclose(s_np, s_t, rtol=1e-4, atol=1e-6)
        for p_np, p_t in zip(fast.params, ref.params, strict=True):
            np.testing.assert_allclose(p_np.grad.numpy(), p_t.grad.numpy(), rtol=1e-3, atol=1e-7)
            np.testing.assert_allclose(p_np.detach().numpy(), p_t.detach().numpy(), rtol=1e-4, atol=1e-6)
    assert s_t[4] > 0  # the clipped branch was exercised
    _assert_same_optimizer_state(fast.optimizer.state_dict(), ref.optimizer.state_dict(), exact=False)
    assert int(ref.optimizer.state_dict()["state"][0]["step"]) == 4


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("activation", ["tanh", "relu", "elu", "silu"])
@pytest.mark.parametrize("spec", [DISCRETE, BOX], ids=["discrete", "box"])
def test_numpy_step_matches_autograd(spec, activation, depth):
    _check_numpy_step_matches_autograd(spec, activation=activation, hidden_sizes=(16,) * depth)


@pytest.mark.parametrize("norm_obs", [False, True], ids=["raw_obs", "norm_obs"])
@pytest.mark.parametrize("clip_vloss", [True, False], ids=["clip_vloss", "plain_vloss"])
@pytest.mark.parametrize("spec", [DISCRETE, BOX], ids=["discrete", "box"])
def test_numpy_step_matches_autograd_loss_options(spec, clip_vloss, norm_obs):
    _check_numpy_step_matches_autograd(spec, clip_vloss=clip_vloss, norm_obs=norm_obs)


@pytest.mark.parametrize("numpy_update", [True, False], ids=["numpy", "torch"])
def test_a_step_makes_actions_with_positive_advantage_likelier(numpy_update):
    """The surrogate takes the advantage as the paper writes it: one step on a minibatch whose ratios are 1
    (old log-probs from the current weights) raises log pi(a|s) where A > 0 and lowers it where A < 0, and
    reports the policy loss -mean(r A) = -mean(A) (no clipping and no KL at r = 1)."""
    from rltrain.algos.minibatches import Minibatch

    algo = make(DISCRETE, numpy_update=numpy_update, ent_coef=0.0, max_grad_norm=100.0, lr=1e-2)
    rng = np.random.default_rng(0)
    obs = np.repeat(rng.standard_normal((1, 4)).astype(np.float32), 16, 0)  # one state, each action 8 times
    actions = np.array([0, 1] * 8)
    adv = np.where(actions == 0, 2.0, -1.0).astype(np.float32)
    with torch.no_grad():
        logp = algo.policy.evaluate(torch.from_numpy(obs), torch.from_numpy(actions))[0].numpy()
    values, zeros = np.zeros(16, np.float32), np.zeros(16, np.float32)
    arrays = [actions, logp, adv, zeros, values]
    if numpy_update:
        mb = Minibatch(algo.update.rows(obs[None]), *arrays)
    else:
        mb = Minibatch(torch.from_numpy(obs), *(torch.from_numpy(a) for a in arrays))
    stats = np.asarray(algo.update.step(mb))
    assert stats[0] == pytest.approx(-adv.mean(), abs=1e-5) and stats[3] == pytest.approx(0, abs=1e-6)
    assert stats[4] == 0.0
    with torch.no_grad():
        after = algo.policy.evaluate(torch.from_numpy(obs), torch.from_numpy(actions))[0].numpy()
    assert (after[actions == 0] > logp[actions == 0]).all() and (after[actions == 1] < logp[actions == 1]).all()


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu", "silu"])
def test_numpy_activation_derivatives_match_autograd(activation):
    """f and f' of the numpy hidden layers against torch's activation and autograd, kinks and tails included."""
    from rltrain.models.layers import TORCH_ACTIVATIONS
    from rltrain.models.numpy_mlp import ACTIVATION_BACKWARD, ACTIVATION_FORWARD

    z = np.concatenate([np.random.default_rng(0).normal(0, 3, 200), [0.0, -0.0, 1e-7, -1e-7, 40.0, -40.0, -100.0]])
    z = z.astype(np.float32)
    g = np.random.default_rng(1).standard_normal(z.shape).astype(np.float32)
    zt = torch.from_numpy(z.copy()).requires_grad_(True)
    at = TORCH_ACTIVATIONS[activation](zt)
    at.backward(torch.from_numpy(g))
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # no overflow or nan in the tails
        a = ACTIVATION_FORWARD[activation](z)
        grad = g.copy()
        ACTIVATION_BACKWARD[activation](grad, a, z)
    assert a.dtype == np.float32 and grad.dtype == np.float32
    np.testing.assert_allclose(a, at.detach().numpy(), rtol=1e-6, atol=1e-7)
    # 1 - a^2 (tanh) loses digits as |a| -> 1, in torch as here: an absolute tolerance at the grads' scale (~1)
    np.testing.assert_allclose(grad, zt.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec", [DISCRETE, BOX], ids=["discrete", "box"])
def test_numpy_actor_matches_torch_given_the_same_noise(spec):
    algo = make(spec, norm_obs=True)
    pol = algo.policy
    sample = np.random.default_rng(0).normal(1, 2, (50, *spec.obs_shape))
    pol.obs_norm.update_from_moments(pol.obs_norm.moments(sample, 1))
    actor = pol.numpy_actor()
    obs = np.random.default_rng(1).standard_normal((6, *spec.obs_shape)).astype(np.float32)
    rng = np.random.default_rng(2)
    noise = (rng.random((6, actor.out_dim)) if actor.discrete else rng.standard_normal((6, actor.out_dim)))
    noise = noise.astype(np.float32)
    out = actor.forward(obs)
    action = actor.action(out, actor.perturb(noise))
    logp = actor.log_prob(out, action, noise)
    with torch.no_grad():
        t_out, _ = pol(torch.from_numpy(obs))
        np.testing.assert_allclose(out, t_out.numpy(), rtol=1e-5, atol=1e-6)
        if spec.action_kind == "discrete":
            t_act, t_logp = categorical_sample(t_out, False, noise=torch.from_numpy(noise))
            np.testing.assert_array_equal(action, t_act.numpy())
        else:
            t_act, t_logp = gaussian_sample(t_out, pol.dist.log_std, False, noise=torch.from_numpy(noise))
            np.testing.assert_allclose(action, t_act.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(logp, t_logp.numpy(), rtol=1e-5, atol=1e-6)
        # and the behaviour log-prob the learner recomputes agrees with the collector's
        np.testing.assert_allclose(pol.evaluate(torch.from_numpy(obs), torch.from_numpy(action))[0].numpy(), logp,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", [DISCRETE, BOX], ids=["discrete", "box"])
def test_inference_act_numpy_matches_torch_and_sees_weight_changes(spec):
    """act() under inference mode on CPU goes through a cached numpy actor: same actions, same RNG use,
    and the cache notices weights changed behind its back (numpy update, copy_ into .data)."""
    fast, ref = make(spec), make(spec, numpy_update=False)
    obs = torch.randn(7, *spec.obs_shape)
    for step in range(2):
        ref.policy.load_state_dict(fast.policy.state_dict())
        for det in (True, False):
            g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
            with torch.inference_mode():
                a = fast.policy.act(obs, deterministic=det, generator=g1)
                b = ref.policy.act(obs, deterministic=det, generator=g2)
            torch.testing.assert_close(a.action, b.action)
            torch.testing.assert_close(a.log_prob, b.log_prob, rtol=1e-5, atol=1e-5)
            assert torch.equal(g1.get_state(), g2.get_state())
        if step == 0:
            fast.learn(synthetic_rollout(spec), progress=0.0)
    with torch.no_grad():
        for p in fast.params:
            p.data.copy_(torch.randn_like(p))  # does not bump p._version: the cache must still notice
    ref.policy.load_state_dict(fast.policy.state_dict())
    with torch.inference_mode():
        np.testing.assert_allclose(fast.policy.act(obs, deterministic=True).log_prob.numpy(),
                                   ref.policy.act(obs, deterministic=True).log_prob.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("numpy_update", [True, False], ids=["numpy", "torch"])
def test_values_reuse_obs_and_match_a_full_forward(numpy_update):
    """learn()'s V(obs) / V(next_obs) evaluate only the successors that are not the next row's obs (rollout
    end, truncations) and still equal a forward over every obs and every next_obs; a rollout where next_obs
    is not obs shifted (the synthetic one) takes the full path and agrees too."""
    from rltrain.envs.make import env_spec, make_env, make_vector_env
    from rltrain.trainers.collector import RolloutCollector

    spec = env_spec(make_env("CartPole-v1"), "CartPole-v1")
    torch.manual_seed(0)
    algo = PPO(spec, PPOSettings(rollout_len=64, num_minibatches=4, norm_obs=True, numpy_update=numpy_update),
               num_envs=4, device=CPU, model=ModelSettings(hidden_sizes=(16, 16)))
    algo.policy.obs_norm.update_from_moments(algo.policy.obs_norm.moments(
        np.random.default_rng(0).normal(0, 0.5, (50, 4)), 1))
    venv = make_vector_env("CartPole-v1", 4, [1, 2, 3, 4], max_episode_steps=20)  # truncations every 20 steps
    real = RolloutCollector(venv, algo.policy, spec, device=CPU).collect(64)
    venv.close()
    assert real.truncated.any() and real.terminated.any()
    for rollout in (real, synthetic_rollout(spec, T=64)):
        T, N = rollout.rewards.shape
        with torch.no_grad():
            both = np.concatenate([rollout.obs, rollout.next_obs]).reshape(2 * T * N, 4)
            full = algo.policy.value(torch.from_numpy(both))
        full = full.numpy().reshape(2, T, N)
        values, next_values = algo._values(rollout, None)
        np.testing.assert_allclose(values, full[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(next_values, np.where(rollout.terminated, 0.0, full[1]), rtol=1e-5, atol=1e-6)


def test_target_kl_decision_is_taken_on_the_workers_mean():
    """Early stopping on approx KL uses the KL averaged over workers (Sync.mean), never a rank's own: ranks
    that stopped at different epochs would wait on each other's gradient all-reduce forever."""
    from rltrain.algos.base import Sync

    class FixedKL(Sync):
        def __init__(self, kl: float):
            self.kl, self.asked = kl, 0

        def mean(self, x):
            if np.size(x) == 1:  # the KL decision (metrics are a longer vector)
                self.asked += 1
                return np.full_like(x, self.kl)
            return x

    for kl, epochs in ((1.0, 1), (0.0, 3)):
        torch.manual_seed(0)
        sync = FixedKL(kl)
        algo = PPO(DISCRETE, PPOSettings(rollout_len=16, num_minibatches=2, update_epochs=3, target_kl=0.01),
                   num_envs=4, device=CPU, sync=sync, model=ModelSettings(hidden_sizes=(16, 16)))
        steps = []
        inner = algo.update.step
        algo.update.step = lambda mb, inner=inner, steps=steps: steps.append(1) or inner(mb)
        algo.learn(synthetic_rollout(DISCRETE), progress=0.0)
        assert len(steps) == 2 * epochs and sync.asked == epochs


def _roundtrip(state: dict) -> dict:
    """Through torch.save / torch.load(weights_only=True), as a checkpoint file."""
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _assert_equal_states(a, b, path="state"):
    if isinstance(a, torch.Tensor):
        assert type(a) is type(b) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_equal_states(a[k], b[k], f"{path}.{k}")
    else:
        assert a == b, path


@pytest.mark.parametrize("first", [True, False], ids=["numpy_then_torch", "torch_then_numpy"])
@pytest.mark.parametrize("spec", [DISCRETE, BOX], ids=["discrete", "box"])
def test_checkpoint_from_one_update_path_resumes_on_the_other(spec, first):
    """Train k updates on path A, checkpoint, load into path B, continue m updates: the same weights and
    optimiser state (to float tolerance) as continuing on path A. The loaded state is B's state bit for bit."""
    kw = dict(norm_obs=True, norm_reward=True, activation="silu")
    a = make(spec, numpy_update=first, **kw)
    for k in range(2):
        a.learn(synthetic_rollout(spec, seed=k), progress=0.1 * k)
    state = _roundtrip(a.state_dict())
    b = make(spec, seed=1, numpy_update=not first, **kw)  # another init: everything must come from the state
    b.load_state_dict(state)
    _assert_equal_states(b.state_dict(), state)
    assert int(state["optimizer"]["state"][0]["step"]) == 2 * 4 * 4  # updates x epochs x minibatches
    for algo in (a, b):
        torch.manual_seed(9)
        for k in range(2, 4):
            algo.learn(synthetic_rollout(spec, seed=k), progress=0.1 * k)
    for p, q in zip(a.params, b.params, strict=True):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-6)
    _assert_same_optimizer_state(a.optimizer.state_dict(), b.optimizer.state_dict(), exact=False)


@pytest.mark.slow  # two rltrain subprocesses: ~20 s on a busy machine
def test_cli_run_on_the_numpy_path_resumes_on_the_torch_path(cli, tmp_path):
    """End to end: a default (numpy update) CPU run's final checkpoint resumes with algo.numpy_update=false
    (a plain override: the key is a PPOSettings field) and its counters continue."""
    import json

    from rltrain.run.checkpoint import load_checkpoint

    base = ["debug=smoke", "logger.progress=plain", "seed=4", "eval.every_env_steps=0"]
    first = cli(*base, "total_env_steps=512", "hydra.run.dir=first", timeout=180)
    assert first.returncode == 0, first.stderr
    ckpt = tmp_path / "first" / "checkpoints" / "final.pt"
    saved, _ = load_checkpoint(ckpt)
    assert {"state", "param_groups"} <= saved["algo"]["optimizer"].keys()
    second = cli(*base, "total_env_steps=1024", f"resume={ckpt}", "algo.numpy_update=false",
                 "hydra.run.dir=second", timeout=180)
    assert second.returncode == 0, second.stderr
    summary = json.loads((tmp_path / "second" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["total_env_steps"] == 1024, summary
    resumed, _ = load_checkpoint(tmp_path / "second" / "checkpoints" / "final.pt")
    assert resumed["counters"]["updates"] == 2 * saved["counters"]["updates"] > 0
    steps = [int(e["step"]) for e in resumed["algo"]["optimizer"]["state"].values()]
    assert len(set(steps)) == 1 and steps[0] > int(saved["algo"]["optimizer"]["state"][0]["step"])


@pytest.mark.parametrize("numpy_update", [True, False], ids=["numpy", "torch"])
def test_checkpoint_with_the_old_flat_optimizer_state_still_loads(numpy_update):
    """Checkpoints written before FlatAdam took torch Adam's format ({step, exp_avg, exp_avg_sq, lr} over the
    flat buffer) load on both paths as the equivalent torch-format state."""
    a = make(BOX, activation="elu")
    a.learn(synthetic_rollout(BOX), progress=0.3)
    opt = a.optimizer
    old = {**a.state_dict(), "optimizer": {"step": opt.steps, "exp_avg": opt.exp_avg.clone(),
                                           "exp_avg_sq": opt.exp_avg_sq.clone(), "lr": opt.lr}}
    b = make(BOX, seed=1, activation="elu", numpy_update=numpy_update)
    b.load_state_dict(_roundtrip(old))
    _assert_equal_states(b.state_dict(), a.state_dict())


def test_flat_adam_group_is_torch_adams_without_building_one():
    """The numpy path's param group is exactly make_adam's; building the default PPO constructs no torch
    optimiser (the first one imports torch._dynamo: seconds of start-up on every CartPole solve)."""
    import subprocess
    import sys

    from rltrain.algos.adam import make_adam
    from rltrain.models.numpy_mlp import adam_group

    params = [torch.nn.Parameter(torch.zeros(3))]
    torch_group = {k: v for k, v in make_adam(params, 2e-3, eps=1e-5).param_groups[0].items() if k != "params"}
    assert adam_group(2e-3, 1e-5) == torch_group
    code = ("import sys, torch\nfrom rltrain.algos.ppo import PPO\nfrom rltrain.envs.make import EnvFactory\n"
            "PPO(EnvFactory(id='CartPole-v1').spec(), num_envs=4, device=torch.device('cpu'))\n"
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("shared", [True, False], ids=["shared-torso", "separate-torsos"])
def test_rollout_values_from_acting_are_the_learners(shared):
    """A torso shared with the critic gives V(obs) with the action (ActOutput.value); the loop's collector
    keeps it in Rollout.values and learn() uses it instead of a second forward: the values and successor
    values agree with a fresh forward. Separate torsos, and collectors not told to record (actors, which act
    with lagged copies), leave Rollout.values None."""
    from rltrain.envs.make import env_spec, make_env, make_vector_env
    from rltrain.trainers.collector import RolloutCollector

    env_id = "tests.helpers.obs_envs:ImageEnv"
    kwargs = {"shape": (12, 12, 2)}
    spec = env_spec(make_env(env_id, kwargs=kwargs), env_id)
    torch.manual_seed(0)
    algo = PPO(spec, PPOSettings(rollout_len=20, num_minibatches=2), num_envs=3, device=CPU,
               model=ModelSettings(encoder="minatar", cnn_features=16, shared=shared, hidden_sizes=(8,)))
    venv = make_vector_env(env_id, 3, [1, 2, 3], kwargs=kwargs)  # 8-step episodes: truncations inside
    rollout = RolloutCollector(venv, algo.policy, spec, device=CPU, record_values=True).collect(20)
    untold = RolloutCollector(venv, algo.policy, spec, device=CPU).collect(20)
    venv.close()
    assert untold.values is None
    if not shared:
        assert rollout.values is None
        return
    assert rollout.values is not None and rollout.values.shape == (20, 3) and rollout.truncated.any()
    T, N = rollout.shape
    with torch.no_grad():
        full = algo.policy.value(torch.from_numpy(np.concatenate([rollout.obs, rollout.next_obs]).reshape(
            2 * T * N, *spec.obs_shape))).numpy().reshape(2, T, N)
    values, next_values = algo._values(rollout, None)
    assert values is rollout.values
    np.testing.assert_allclose(values, full[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(next_values, np.where(rollout.terminated, 0.0, full[1]), rtol=1e-5, atol=1e-6)


def test_pixel_minibatches_are_gathered_on_demand_and_channels_last():
    """The torch path lays a CHW pixel rollout out channels-last once (models.encoders.batch_layout) and
    gathers each minibatch only when a step asks for it (not all epochs' pixels up front): minibatch k holds
    the rollout rows of the seeded permutation, in order, still uint8 and channels-last, so the encoder's
    layout step is a no-op."""
    from rltrain.algos.minibatches import MinibatchRows

    T, N, E, M = 8, 4, 3, 2
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (T, N, 4, 12, 12), dtype=np.uint8)
    algo = PPO(EnvSpec("Synthetic-pixels", (4, 12, 12), "discrete", (), n_actions=3, obs_dtype="uint8"),
               PPOSettings(rollout_len=T, num_minibatches=M, update_epochs=E, numpy_update=False), num_envs=N,
               device=CPU)
    rollout = Rollout(obs=obs, actions=rng.integers(0, 3, (T, N)), log_probs=np.zeros((T, N), np.float32),
                      rewards=np.zeros((T, N), np.float32), terminated=np.zeros((T, N), bool),
                      truncated=np.zeros((T, N), bool), next_obs=obs, policy_version=np.zeros(T, np.int64))
    flat = algo.update.rows(rollout.obs)  # what learn() gathers the torch backend's minibatches from
    assert flat.shape == (T * N, 4, 12, 12) and flat.dtype == torch.uint8
    assert flat.is_contiguous(memory_format=torch.channels_last)
    zeros = np.zeros((T, N), np.float32)
    torch.manual_seed(3)
    batches = RowMinibatches(flat, rollout, zeros, zeros, zeros, epochs=E, minibatches=M, norm_adv=True,
                             device=algo.update.device).columns
    torch.manual_seed(3)
    order = torch.argsort(torch.rand(E, T * N), dim=1).reshape(E * M, -1).numpy()
    assert isinstance(batches[0], MinibatchRows) and len(batches[0]) == E * M
    for k in range(E * M):
        mb = batches[0][k]
        assert mb.dtype == torch.uint8 and mb.is_contiguous(memory_format=torch.channels_last)
        np.testing.assert_array_equal(mb.numpy(), obs.reshape(T * N, 4, 12, 12)[order[k]])
        np.testing.assert_array_equal(batches[1][k].squeeze(-1).numpy(), rollout.actions.reshape(-1)[order[k]])
