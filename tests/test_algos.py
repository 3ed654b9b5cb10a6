"""Every algorithm: act() shapes, one learn() on a synthetic rollout, bitwise checkpoint round trips,
build-time action-space checks and the Sync hook (the replay buffer: tests/test_replay.py)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from rltrain.algos.a2c import A2C
from rltrain.algos.base import Sync
from rltrain.algos.ddpg import DDPG
from rltrain.algos.dqn import DQN
from rltrain.algos.impala import IMPALA, IMPALASettings
from rltrain.algos.ppo import PPO
from rltrain.algos.sac import SAC
from rltrain.algos.td3 import TD3
from rltrain.data.structs import EnvSpec, Rollout
from rltrain.errors import ConfigError
from rltrain.models.settings import ModelSettings

CARTPOLE = EnvSpec("CartPole-v1", (4,), "discrete", (), n_actions=2)
PENDULUM = EnvSpec("Pendulum-v1", (3,), "box", (1,), action_low=(-2.0,), action_high=(2.0,))
CPU = torch.device("cpu")
T, N = 8, 3
# small, fast settings; off-policy algorithms update on the first learn() call
OFF = {"learning_starts": 0, "batch_size": 16, "train_frequency": 1, "buffer_size": 100, "hidden_sizes": [32, 32]}
CASES = [
    ("ppo", PPO, CARTPOLE, {"rollout_len": T, "num_minibatches": 2}),
    ("ppo_box", PPO, PENDULUM, {"rollout_len": T, "num_minibatches": 2, "norm_obs": True}),
    ("a2c", A2C, CARTPOLE, {"rollout_len": T}),
    ("a2c_box_gae", A2C, PENDULUM, {"rollout_len": T, "gae_lambda": 0.95, "norm_obs": True, "norm_reward": True}),
    ("impala", IMPALA, CARTPOLE, {"rollout_len": T}),
    ("impala_box", IMPALA, PENDULUM, {"rollout_len": T, "optimizer": "adam", "norm_reward": True, "num_epochs": 2}),
    ("dqn", DQN, CARTPOLE, {**OFF, "rollout_len": T}),
    ("dqn_double_polyak", DQN, CARTPOLE, {**OFF, "rollout_len": T, "double_dqn": True, "tau": 0.5,
                                          "target_network_frequency": 1, "max_grad_norm": 10.0}),
    ("sac", SAC, PENDULUM, {**OFF, "rollout_len": T, "policy_frequency": 2}),
    ("sac_fixed_alpha", SAC, PENDULUM, {**OFF, "rollout_len": T, "autotune": False}),
    ("td3", TD3, PENDULUM, {**OFF, "rollout_len": T}),
    ("ddpg", DDPG, PENDULUM, {**OFF, "rollout_len": T}),
]
OFF_POLICY = (DQN, SAC, TD3, DDPG)
IDS = [c[0] for c in CASES]


def make(cls, spec, kw, seed=0, sync=None, **settings):
    torch.manual_seed(seed)
    kw = {**kw, **settings}
    model = ModelSettings(hidden_sizes=tuple(kw.pop("hidden_sizes"))) if "hidden_sizes" in kw else None
    return cls(spec, cls.settings_class(**kw), num_envs=N, device=CPU, sync=sync, model=model)


def synthetic_rollout(algo, spec: EnvSpec, seed: int = 0) -> Rollout:
    """A rollout acted by ``algo.policy`` on random observations, with a termination and a truncation."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(T, N, *spec.obs_shape)).astype(np.float32)
    with torch.no_grad():
        out = algo.policy.act(torch.from_numpy(obs.reshape(T * N, *spec.obs_shape)))
    terminated = np.zeros((T, N), bool)
    truncated = np.zeros((T, N), bool)
    terminated[2, 0], truncated[5, 1] = True, True
    return Rollout(obs=obs, actions=out.action.numpy().reshape(T, N, *spec.action_shape),
                   log_probs=out.log_prob.numpy().reshape(T, N), rewards=rng.normal(size=(T, N)).astype(np.float32),
                   terminated=terminated, truncated=truncated,
                   next_obs=rng.normal(size=(T, N, *spec.obs_shape)).astype(np.float32),
                   policy_version=np.zeros(T, np.int64))


def flat_params(algo) -> list[torch.Tensor]:
    return [p.detach().clone() for p in algo.policy.parameters()]


@pytest.mark.parametrize(("name", "cls", "spec", "kw"), CASES, ids=IDS)
def test_act_shapes(name, cls, spec, kw):
    algo = make(cls, spec, kw)
    for batch in (5, 1):
        obs = torch.randn(batch, *spec.obs_shape)
        for det in (False, True):
            out = algo.policy.act(obs, deterministic=det, generator=torch.Generator().manual_seed(0))
            assert out.action.shape == (batch, *spec.action_shape)
            assert out.log_prob.shape == (batch,)
            assert torch.isfinite(out.log_prob).all()
            if spec.action_kind == "discrete":
                assert out.action.dtype == torch.int64 and ((out.action >= 0) & (out.action < spec.n_actions)).all()
            if name.startswith(("sac", "td3", "ddpg")):  # squashed into the bounds
                assert (out.action.abs() <= 2.0).all()
            if name in ("td3", "ddpg"):  # deterministic: exploration noise is the collector's
                assert torch.equal(out.action, algo.policy.act(obs, deterministic=True).action)


@pytest.mark.parametrize(("name", "cls", "spec", "kw"), CASES, ids=IDS)
def test_one_learn_is_finite_and_changes_parameters(name, cls, spec, kw):
    algo = make(cls, spec, kw)
    before = flat_params(algo)
    metrics = algo.learn(synthetic_rollout(algo, spec), progress=0.1)
    assert metrics and all(np.isfinite(v) for v in metrics.values()), metrics
    after = flat_params(algo)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True)), "no parameter moved"


def _roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _assert_same(a, b, path="state"):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b or (isinstance(a, float) and np.isnan(a) and np.isnan(b)), path


@pytest.mark.parametrize(("name", "cls", "spec", "kw"), CASES, ids=IDS)
def test_checkpoint_roundtrip_is_bitwise_and_resumes_identically(name, cls, spec, kw):
    extra = {"checkpoint_buffer": True} if cls in OFF_POLICY else {}
    a = make(cls, spec, kw, seed=0, **extra)
    a.learn(synthetic_rollout(a, spec, seed=1), progress=0.1)
    state = _roundtrip(a.state_dict())
    b = make(cls, spec, kw, seed=123, **extra)  # different init: everything must come from the state
    b.load_state_dict(state)
    _assert_same(a.state_dict(), b.state_dict())
    if extra:
        assert state["replay_buffer"]["size"] == T * N
    # the same next update from both (same RNG) gives bitwise identical weights
    ro = synthetic_rollout(a, spec, seed=2)
    for algo in (a, b):
        torch.manual_seed(7)
        np.random.seed(7)
        algo.learn(ro, progress=0.2)
    for p, q in zip(a.policy.state_dict().values(), b.policy.state_dict().values(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("cls", OFF_POLICY, ids=lambda c: c.name)
def test_replay_buffer_leaves_checkpoint_unless_enabled(cls):
    spec = CARTPOLE if cls is DQN else PENDULUM
    a = make(cls, spec, {**OFF, "rollout_len": T})
    a.learn(synthetic_rollout(a, spec), progress=0.0)
    assert "replay_buffer" not in a.state_dict()
    b = make(cls, spec, {**OFF, "rollout_len": T})
    b.load_state_dict(_roundtrip(a.state_dict()))
    assert len(b.buffer) == 0  # resumed without data: learn() waits until a batch is there again
    assert b.learn(synthetic_rollout(b, spec), progress=0.0)


def test_action_space_mismatch_names_the_fix():
    # the fix on one's own env is an algorithm that takes its actions; on a built-in one, perhaps another env
    with pytest.raises(ConfigError, match=r"^algo=dqn needs a Discrete action space; env.id=Pendulum-v1 is "
                                          r"Box\(shape=\(1,\)\): choose an algorithm that takes its actions "
                                          r"\(algo=ppo, algo=a2c and algo=impala take every kind\), or try "
                                          r"algo=dqn on env=cartpole$"):
        DQN(PENDULUM, num_envs=1, device=CPU)
    with pytest.raises(ConfigError, match=r"^algo=sac needs a Box action space; env.id=CartPole-v1 is "
                                          r"Discrete\(2\): choose .* or try algo=sac on env=pendulum$"):
        SAC(CARTPOLE, num_envs=1, device=CPU)
    for cls in (TD3, DDPG):
        with pytest.raises(ConfigError, match=rf"^algo={cls.name} needs a Box action space; env.id=CartPole-v1 is "):
            cls(CARTPOLE, num_envs=1, device=CPU)
    assert DQN.on_policy is False and SAC.on_policy is False and A2C.on_policy and IMPALA.on_policy


class CountingSync(Sync):
    def __init__(self):
        self.grad_calls = 0

    def grads(self, params):
        assert all(p.grad is not None for p in params if p.requires_grad)
        self.grad_calls += 1


@pytest.mark.parametrize(("name", "cls", "spec", "kw"),
                         [c for c in CASES if c[0] in ("a2c", "impala", "dqn", "sac", "td3", "ddpg")],
                         ids=["a2c", "impala", "dqn", "sac", "td3", "ddpg"])
def test_gradients_go_through_the_sync_hook(name, cls, spec, kw):
    sync = CountingSync()
    algo = make(cls, spec, kw, sync=sync)
    algo.learn(synthetic_rollout(algo, spec), progress=0.0)
    assert sync.grad_calls >= 1


def test_impala_is_on_policy_under_its_own_rollout():
    """Fresh rollout from the learner's own weights: every importance ratio is 1 (V-trace = n-step)."""
    algo = make(IMPALA, CARTPOLE, {"rollout_len": T})
    metrics = algo.learn(synthetic_rollout(algo, CARTPOLE), progress=0.0)
    assert metrics["train/rho_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["train/rho_clip_frac"] == 0.0


def test_impala_num_epochs_are_gradient_steps_on_the_same_batch():
    """``num_epochs=2`` is two whole-batch steps, each recomputing V-trace against the weights it starts from:
    bitwise the same weights as learning twice from the same rollout with one epoch; the rho statistics are the
    first pass's (1: the learner's own rollout), though the second pass runs off-policy."""
    sync = CountingSync()
    twice = make(IMPALA, CARTPOLE, {"rollout_len": T, "num_epochs": 2}, sync=sync)
    once = make(IMPALA, CARTPOLE, {"rollout_len": T, "num_epochs": 1})
    rollout = synthetic_rollout(twice, CARTPOLE)
    metrics = twice.learn(rollout, progress=0.0)
    assert sync.grad_calls == 2
    assert metrics["train/rho_mean"] == pytest.approx(1.0, abs=1e-5)
    once.learn(rollout, progress=0.0)
    second = once.learn(rollout, progress=0.0)
    assert second["train/rho_mean"] != pytest.approx(1.0, abs=1e-5)  # the weights moved: pass 2 is off-policy
    for a, b in zip(twice.params, once.params, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="algo.num_epochs=0 must be > 0"):
        IMPALASettings(num_epochs=0)


def test_dqn_epsilon_schedule_and_warmup():
    algo = make(DQN, CARTPOLE, {**OFF, "rollout_len": T, "learning_starts": 50, "exploration_fraction": 0.5,
                                "start_e": 1.0, "end_e": 0.1})
    assert algo.wants_random_actions(49) and not algo.wants_random_actions(50)
    assert algo.learn(synthetic_rollout(algo, CARTPOLE), progress=0.25)["train/epsilon"] == pytest.approx(0.55)
    assert "loss/q" not in algo.learn(synthetic_rollout(algo, CARTPOLE), progress=0.25)  # 48 < 50 steps
    assert algo.learn(synthetic_rollout(algo, CARTPOLE), progress=0.9)["train/epsilon"] == pytest.approx(0.1)


def test_dqn_huber_loss_is_smooth_l1_and_a_bad_loss_is_one_line():
    """algo.loss=huber (SB3, the DQN paper's error clipping) takes the same step as MSE on small TD errors
    and a bounded one on large errors; anything else is refused by name."""
    losses = {}
    for loss in ("mse", "huber"):
        torch.manual_seed(0)
        algo = make(DQN, CARTPOLE, {**OFF, "rollout_len": T, "loss": loss})
        ro = synthetic_rollout(algo, CARTPOLE)
        ro.rewards[:] = 50.0  # TD errors far above 1: Huber's gradient is clipped to +-1 per sample
        losses[loss] = algo.learn(ro, progress=0.0)["loss/q"]
    assert losses["huber"] < losses["mse"] / 10
    with pytest.raises(ConfigError, match="algo.loss='l1': choose mse or huber"):
        make(DQN, CARTPOLE, {**OFF, "rollout_len": T, "loss": "l1"})


def test_on_policy_learners_share_one_model_and_checkpoint_layout():
    """ppo (numpy or torch update), a2c and impala act through ``ActorCritic`` and checkpoint the same
    ``ActorCriticState`` layout: the same policy tensors, and the optimiser state indexed by
    ``ActorCritic.param_list()`` (so a PPO checkpoint's policy and Adam state load into a2c / impala).
    a2c and impala import nothing of PPO's."""
    import ast
    import inspect

    import rltrain.algos.a2c
    import rltrain.algos.impala

    cases = {"ppo": (PPO, {"rollout_len": T, "num_minibatches": 2}),
             "ppo_torch": (PPO, {"rollout_len": T, "num_minibatches": 2, "numpy_update": False}),
             "a2c": (A2C, {"rollout_len": T, "optimizer": "adam"}),
             "impala": (IMPALA, {"rollout_len": T, "optimizer": "adam"})}
    algos, states = {}, {}
    for name, (cls, kw) in cases.items():
        algos[name] = algo = make(cls, PENDULUM, kw)
        algo.learn(synthetic_rollout(algo, PENDULUM), progress=0.0)
        states[name] = _roundtrip(algo.state_dict())
    shapes = {k: v.shape for k, v in states["ppo"]["policy"].items()}
    for name, state in states.items():
        assert state.keys() == {"policy", "optimizer"}, name
        assert {k: v.shape for k, v in state["policy"].items()} == shapes, name
        params = algos[name].policy.param_list()
        assert algos[name].params == params, name
        assert state["optimizer"]["param_groups"][0]["params"] == list(range(len(params))), name
        for i, p in enumerate(params):
            assert state["optimizer"]["state"][i]["exp_avg"].shape == p.shape, (name, i)
    for name in ("a2c", "impala"):
        algos[name].load_state_dict(states["ppo"])
        _assert_same(algos[name].state_dict()["policy"], states["ppo"]["policy"])
        assert algos[name].learn(synthetic_rollout(algos[name], PENDULUM), progress=0.1)
    for module in (rltrain.algos.a2c, rltrain.algos.impala):
        tree = ast.parse(inspect.getsource(module))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in imported if m and ("ppo" in m or "surrogate" in m or "numpy_mlp" in m)}, imported


@pytest.mark.parametrize("consistent", [True, False], ids=["next_obs is obs[t+1]", "assembled otherwise"])
@pytest.mark.parametrize("cls", [A2C, IMPALA], ids=["a2c", "impala"])
def test_feedforward_successor_values_forward_only_the_rows_they_need(cls, consistent):
    """A2C and IMPALA bootstrap from V(next_obs): equal to valuing every next_obs (0 after a termination),
    with a forward of their own only for the last step and truncations when next_obs[t] is obs[t+1]."""
    from rltrain.algos.sequences import successor_values

    algo = make(cls, CARTPOLE, {"rollout_len": T})
    ro = synthetic_rollout(algo, CARTPOLE)
    if consistent:  # inside an episode the successor is the next row, as the collector writes it
        cont = ~(ro.terminated | ro.truncated)
        ro.next_obs[:-1][cont[:-1]] = ro.obs[1:][cont[:-1]]
    with torch.no_grad():
        values = algo.policy.value(torch.from_numpy(ro.obs.reshape(T * N, 4))).numpy().reshape(T, N)
        every = algo.policy.value(torch.from_numpy(ro.next_obs.reshape(T * N, 4))).numpy().reshape(T, N)
    every[ro.terminated] = 0.0
    rows, value = [], algo.policy.value
    algo.policy.value = lambda obs: rows.append(len(obs)) or value(obs)
    got = successor_values(algo.policy, ro, values, None, CPU)
    np.testing.assert_allclose(got, every, rtol=1e-5, atol=1e-6)
    assert rows == ([N + 1] if consistent else [T * N - 1])  # last step of each env + one truncation


@pytest.mark.parametrize("cls", [PPO, A2C, IMPALA, DQN, SAC, TD3, DDPG], ids=lambda c: c.name)
def test_settings_are_one_frozen_typed_object_whose_defaults_are_the_algo_group(cls):
    """Each algorithm's hyper-parameters are one frozen keyword-only dataclass, the only place their defaults
    are written: the algo=<name> config node is generated from it (cli/schema.py), and the CLI builds it from
    the group in one place (cli/build.py algo_settings); a bad value is one line naming it."""
    import dataclasses

    from rltrain.cli.build import algo_settings
    from rltrain.cli.schema import algo_node

    settings_cls = cls.settings_class
    assert dataclasses.is_dataclass(settings_cls) and settings_cls.__dataclass_params__.frozen
    with pytest.raises(TypeError):
        settings_cls(1)  # keyword-only
    node = algo_node(cls.name)["algo"]
    assert algo_settings({"algo": node}) == settings_cls()
    with pytest.raises(ConfigError, match=r"^algo\.rollout_len=0 must be > 0$"):
        settings_cls(rollout_len=0)
    with pytest.raises(ConfigError, match=r"^algo\.rollout_lenn: unknown key"):
        algo_settings({"algo": {"_target_": node["_target_"], "rollout_lenn": 3}})
