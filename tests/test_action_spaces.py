"""MultiDiscrete and MultiBinary actions and Tuple observations.

The distributions against ``torch.distributions`` (log-probs and entropies summed over the components); PPO,
A2C and IMPALA end to end on ``tests/helpers/space_envs.py``'s envs, feed-forward and recurrent, under every
trainer; resume, evaluation and export as for Discrete; DQN and SAC refuse in one line; Blackjack-v1's Tuple
observation trains without a wrapper and a space no encoder reads is refused naming its path.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rltrain.algos.ddpg import DDPG
from rltrain.algos.dqn import DQN
from rltrain.algos.sac import SAC
from rltrain.algos.td3 import TD3
from rltrain.api import load_policy
from rltrain.cli.build import run
from rltrain.data.structs import EnvSpec
from rltrain.envs.make import EnvFactory, env_spec, make_env
from rltrain.errors import ConfigError
from rltrain.models.distributions import Bernoulli, MultiCategorical
from rltrain.models.factory import ModelSettings, build
from rltrain.run.checkpoint import load_checkpoint
from tests.conftest import compose_cfg

torch.set_num_threads(1)
MD = "tests.helpers.space_envs:MultiDiscreteEnv"
MB = "tests.helpers.space_envs:MultiBinaryEnv"
TINY = ["debug=smoke", "logger=quiet", "env.num_envs=2", "algo.rollout_len=32", "eval.every_env_steps=0",
        "checkpoint.every_env_steps=0", "eval.episodes=2"]


def _spec(kind: str) -> EnvSpec:
    return env_spec(make_env(MD if kind == "md" else MB), "test")


def test_multi_categorical_sums_the_components_log_probs_and_entropies():
    spec = _spec("md")
    dist = MultiCategorical(spec)
    params = torch.randn(5, 7)
    action, logp = dist.sample(params, False, torch.Generator().manual_seed(0))
    assert action.shape == (5, 2) and action.dtype == torch.int64
    assert (action[:, 0] < 3).all() and (action[:, 1] < 4).all()
    parts = [torch.distributions.Categorical(logits=x) for x in params.split((3, 4), -1)]
    want_logp = sum(d.log_prob(action[:, i]) for i, d in enumerate(parts))
    want_ent = sum(d.entropy() for d in parts)
    got_logp, got_ent = dist.log_prob_entropy(params, action)
    assert torch.allclose(logp, want_logp, atol=1e-6) and torch.allclose(got_logp, want_logp, atol=1e-6)
    assert torch.allclose(got_ent, want_ent, atol=1e-6)
    assert torch.equal(dist.mode(params), torch.stack([x.argmax(-1) for x in params.split((3, 4), -1)], -1))


def test_multi_discrete_start_offsets_the_actions():
    spec = EnvSpec("t", (2,), "multi_discrete", (2,), nvec=(3, 2), action_start=(-1, 5))
    dist = MultiCategorical(spec)
    params = torch.tensor([[0.0, 9.0, 0.0, -9.0, 9.0]])
    assert dist.mode(params).tolist() == [[0, 6]]
    logp, _ = dist.log_prob_entropy(params, dist.mode(params))
    assert logp.item() > -1e-3


def test_bernoulli_matches_torch_distributions():
    spec = EnvSpec("t", (2,), "multi_binary", (2, 3))
    dist = Bernoulli(spec)
    params = torch.randn(4, 6) * 3
    action, logp = dist.sample(params, False, torch.Generator().manual_seed(1))
    assert action.shape == (4, 2, 3) and action.dtype == torch.int8
    ref = torch.distributions.Bernoulli(logits=params)
    want = ref.log_prob(action.reshape(4, 6).float()).sum(-1)
    got_logp, got_ent = dist.log_prob_entropy(params, action)
    assert torch.allclose(logp, want, atol=1e-5) and torch.allclose(got_logp, want, atol=1e-5)
    assert torch.allclose(got_ent, ref.entropy().sum(-1), atol=1e-5)
    assert torch.equal(dist.mode(params).reshape(4, 6), (params > 0).to(torch.int8))


@pytest.mark.parametrize("kind", ["md", "mb"])
def test_numpy_fast_path_falls_back_to_torch(kind):
    """No numpy sampler for these distributions: the policy acts (and PPO learns) through torch."""
    policy = build(_spec(kind), ModelSettings(), "actor_critic")
    assert policy.numpy_actor() is None


@pytest.mark.parametrize("env,algo,trainer,core", [
    (MD, "ppo", "sequential", "identity"),
    (MD, "a2c", "sequential", "lstm"),
    (MB, "impala", "subprocess_actors", "identity"),
    (MD, "ppo", "subprocess_actors", "gru"),
    (MB, "ppo", "parallel", "identity"),
    (MD, "a2c", "distributed_simulator", "identity"),
])
def test_multi_actions_train_under_every_trainer(tmp_path, env, algo, trainer, core):
    extra = {"subprocess_actors": ["trainer.num_actors=1"], "parallel": ["trainer.num_agents=2"],
             "distributed_simulator": ["trainer.world_size=2"]}.get(trainer, [])
    summary = run(compose_cfg([*TINY, f"env.id={env}", f"algo={algo}", f"trainer={trainer}", f"model.core={core}",
                               "total_env_steps=512", *extra]), tmp_path / "run")
    assert summary["status"] == "completed", summary
    assert np.isfinite(summary["final_eval_return"])


def test_multi_discrete_learns_resumes_bitwise_evaluates_and_exports(tmp_path):
    # anneal_lr=false: a schedule over the budget would differ between a 2N and an N run
    # 4 minibatches of 16 rows: the default 32 would split this 64-row batch into pairs
    base = [*TINY, f"env.id={MD}", "algo=ppo", "algo.lr=3e-3", "algo.anneal_lr=false", "algo.num_minibatches=4"]
    once = run(compose_cfg([*base, "total_env_steps=2048"]), tmp_path / "once")
    assert once["final_eval_return"] >= 6.0, once  # 8 steps x 1 when every component is right; random: ~2.3
    run(compose_cfg([*base, "total_env_steps=1024"]), tmp_path / "twice")
    run(compose_cfg([*base, "total_env_steps=2048", "resume=auto"]), tmp_path / "twice")
    p1 = load_checkpoint(tmp_path / "once" / "checkpoints" / "final.pt")[0]["algo"]["policy"]
    p2 = load_checkpoint(tmp_path / "twice" / "checkpoints" / "final.pt")[0]["algo"]["policy"]
    assert all(torch.equal(p1[k], p2[k]) for k in p1)

    policy = load_policy(tmp_path / "once", allow_import=True)
    env = make_env(MD)
    obs, _ = env.reset(seed=3)
    action, _ = policy.act(obs)
    assert action.shape == (2,) and env.action_space.contains(action)

    from rltrain.cli.export import export

    path = export(tmp_path / "once", fmt="torchscript", out=tmp_path / "export", allow_import=True)
    traced = torch.jit.load(str(path))
    batch = torch.from_numpy(np.stack([env.reset(seed=s)[0] for s in range(4)]))
    want = np.stack([policy.act(o.numpy())[0] for o in batch])
    assert np.array_equal(traced(batch).numpy(), want)


@pytest.mark.parametrize("algo_cls", [DQN, SAC, TD3, DDPG], ids=lambda c: c.name)
def test_dqn_and_sac_refuse_multi_actions_naming_the_algorithms_that_take_them(algo_cls):
    for kind in ("md", "mb"):
        with pytest.raises(ConfigError) as err:
            algo_cls.check_spec(_spec(kind))
        message = str(err.value)
        assert "\n" not in message and "algo=ppo, algo=a2c and algo=impala" in message


def test_blackjack_tuple_observation_trains_without_a_wrapper(tmp_path):
    spec = EnvFactory(id="Blackjack-v1").spec()
    assert spec.observation.kind == "dict" and [k for k, _ in spec.observation.parts] == ["0", "1", "2"]
    summary = run(compose_cfg([*TINY, "env.id=Blackjack-v1", "total_env_steps=512"]), tmp_path / "run")
    assert summary["status"] == "completed" and np.isfinite(summary["final_eval_return"])


class _NestedEnv(gym.Env):
    """A Tuple holding a Dict, a nested Tuple with MultiDiscrete and MultiBinary parts, and (``bad``) a
    Sequence, which no encoder reads."""

    def __init__(self, bad: bool = False):
        inner = spaces.Tuple((spaces.MultiBinary(2), spaces.MultiDiscrete([2, 3])))
        parts = [spaces.Discrete(3), spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32)}), inner]
        if bad:
            parts.append(spaces.Sequence(spaces.Discrete(2)))
        self.observation_space = spaces.Tuple(parts)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 1.0, False, True, {}


def test_nested_tuples_are_encoded_and_an_unreadable_part_is_refused_by_path(monkeypatch):
    import sys
    import types

    module = types.ModuleType("nested_space_env")
    module.NestedEnv = _NestedEnv
    monkeypatch.setitem(sys.modules, "nested_space_env", module)
    env = make_env("nested_space_env:NestedEnv")
    spec = env_spec(env, "nested")
    policy = build(spec, ModelSettings(), "actor_critic")
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"0", "1", "2"} and set(obs["2"]) == {"0", "1"}
    batch = {"0": torch.tensor([obs["0"]]), "1": {"pos": torch.from_numpy(obs["1"]["pos"][None])},
             "2": {"0": torch.from_numpy(obs["2"]["0"][None]), "1": torch.from_numpy(obs["2"]["1"][None])}}
    assert policy.act(batch).action.shape == (1,)

    bad = env_spec(make_env("nested_space_env:NestedEnv", {"bad": True}), "nested")
    with pytest.raises(ConfigError) as err:
        build(bad, ModelSettings(), "actor_critic")
    message = str(err.value)
    assert "\n" not in message and "'3'" in message and "FlattenObservation" in message
    assert "model.ignore_keys=[3]" in message


@pytest.mark.parametrize("kind,dtype,shape", [("md", np.int64, (2,)), ("mb", np.int8, (4,))])
def test_rollouts_and_actor_batches_keep_the_action_dtype_and_shape(kind, dtype, shape):
    import pickle

    from rltrain.envs.make import make_vector_env
    from rltrain.trainers.actors.rollouts import merge_rollouts
    from rltrain.trainers.collector import RolloutCollector

    spec = _spec(kind)
    policy = build(spec, ModelSettings(hidden_sizes=(8,)), "actor_critic")
    venv = make_vector_env(MD if kind == "md" else MB, 2, [0, 1])
    col = RolloutCollector(venv, policy, spec, device=torch.device("cpu"))
    try:
        rollouts = [pickle.loads(pickle.dumps(col.collect(5))) for _ in range(2)]  # as an actor's pipe ships it
    finally:
        col.close()
    merged = merge_rollouts(rollouts)
    for r in (*rollouts, merged):
        assert r.actions.dtype == dtype and r.actions.shape[2:] == shape
    logp, _, _ = policy.evaluate(torch.from_numpy(merged.obs.reshape(-1, merged.obs.shape[-1])),
                                 torch.from_numpy(merged.actions.reshape(-1, *shape)))
    assert torch.allclose(logp, torch.from_numpy(merged.log_probs.reshape(-1)), atol=1e-5)


SD = "tests.helpers.space_envs:StartDiscreteEnv"  # Discrete(3, start=-2); step raises on an action outside it
EXPORTED = """
import sys, numpy as np, torch
torch.set_num_threads(1)
fmt, model, obs = sys.argv[1], sys.argv[2], torch.from_numpy(np.load(sys.argv[3]))
net = torch.export.load(model).module() if fmt == "export" else torch.jit.load(model)
np.save(sys.argv[4], net(obs).numpy())
"""


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_discrete_start_is_added_by_training_evaluation_the_api_and_the_export(tmp_path, algo):
    import json
    import subprocess
    import sys

    from rltrain.cli.evaluate import main as evaluate
    from rltrain.cli.export import export

    extra = ["algo.learning_starts=64", "algo.buffer_size=500", "algo.batch_size=16"] if algo == "dqn" else []
    summary = run(compose_cfg([*TINY, f"env.id={SD}", f"algo={algo}", "total_env_steps=256", *extra]),
                  tmp_path / "run")
    assert summary["status"] == "completed", summary  # the env raises on an index handed on unshifted
    assert evaluate([str(tmp_path / "run"), "--episodes", "2", "--allow-import"]) == 0

    policy = load_policy(tmp_path / "run", allow_import=True)
    assert policy.spec.action_start == (-2,) and policy.spec.n_actions == 3
    env = make_env(SD)
    obs = np.eye(3, dtype=np.float32)
    actions, _ = policy.act(obs)  # a batch: the raw env's own values
    assert all(env.unwrapped.action_space.contains(a) for a in actions), actions
    single, _ = policy.act(obs[0])
    assert env.unwrapped.action_space.contains(single) and single == actions[0]

    fmt = "export" if algo == "ppo" else "torchscript"  # torch.export's .pt2 and the traced .pt
    path = export(tmp_path / "run", fmt=fmt, out=tmp_path / "export" / f"policy.pt{'2' if algo == 'ppo' else ''}",
                  allow_import=True)
    assert json.loads(path.with_suffix(".json").read_text())["action"] == {
        "kind": "discrete", "shape": [], "dtype": "int64", "n": 3, "start": -2}
    np.save(tmp_path / "obs.npy", obs)
    env_vars = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", EXPORTED, fmt, str(path), str(tmp_path / "obs.npy"),
                          str(tmp_path / "act.npy")], capture_output=True, text=True, cwd=tmp_path, env=env_vars,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert np.array_equal(np.load(tmp_path / "act.npy"), actions)


def test_a_discrete_start_is_wrapped_at_the_env_boundary_and_recorded():
    import pickle

    from rltrain.data.structs import PolicySpaces

    env = make_env(SD)
    assert env.action_space == spaces.Discrete(3) and env.unwrapped.action_space == spaces.Discrete(3, start=-2)
    env.reset(seed=0)
    env.step(0)  # index 0 steps the raw env with -2
    assert pickle.loads(pickle.dumps(env)).action_space == spaces.Discrete(3)  # async workers, sidecars
    spec = env_spec(env, "t")
    assert spec.action_start == (-2,) and spec.mask_size == 3  # a mask stays indexed 0..n-1
    assert env_spec(make_env("CartPole-v1"), "t").action_start == ()  # start 0: recorded as before
    back = PolicySpaces.from_record(PolicySpaces(spec).to_record())
    assert back.spec.action_start == (-2,)
    old = PolicySpaces(spec).to_record()
    old["env"]["action_start"] = []  # a checkpoint written before: start 0
    assert PolicySpaces.from_record(old).spec.action_start == ()
    with pytest.raises(ConfigError, match="start=-2"):  # a raw env nothing wrapped: refused, not shifted wrong
        env_spec(env.unwrapped, "t")


def test_an_integer_box_action_space_is_refused_in_one_line():
    class IntBox(gym.Env):
        observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
        action_space = spaces.Box(-3, 3, (2,), np.int64)

    with pytest.raises(ConfigError) as err:
        env_spec(IntBox(), "t")
    message = str(err.value)
    assert "\n" not in message and "integer" in message and "MultiDiscrete" in message


STRICT = "tests.helpers.space_envs:StrictDtypeEnv"  # float64 Box actions; step raises on any other dtype


@pytest.mark.parametrize("algo,dtype", [("ppo", "float64"), ("sac", "float64"), ("ppo", "float16")])
def test_box_actions_reach_the_env_in_its_own_dtype_in_training_evaluation_and_the_api(tmp_path, algo, dtype):
    from rltrain.cli.evaluate import main as evaluate

    extra = ["algo.learning_starts=64", "algo.buffer_size=500", "algo.batch_size=16"] if algo == "sac" else []
    obs_dtype = "float32" if dtype == "float16" else "float64"
    summary = run(compose_cfg([*TINY, f"env.id={STRICT}", f"+env.kwargs.dtype={dtype}",
                               f"+env.kwargs.obs_dtype={obs_dtype}", f"algo={algo}", "total_env_steps=256", *extra]),
                  tmp_path / "run")
    assert summary["status"] == "completed", summary  # the env raises on a float32 action
    assert evaluate([str(tmp_path / "run"), "--episodes", "2", "--allow-import"]) == 0

    policy = load_policy(tmp_path / "run", allow_import=True)
    assert policy.spec.env_action_dtype == dtype
    raw = make_env(STRICT, {"dtype": dtype, "obs_dtype": obs_dtype}).unwrapped  # the user's own env, unwrapped
    obs, _ = raw.reset(seed=0)
    for _ in range(8):
        action, _ = policy.act(obs, deterministic=False)
        assert action.dtype == np.dtype(dtype)
        obs, *_ = raw.step(action)  # raises on a dtype or a value outside the space
    batch, _ = policy.act(np.stack([obs, obs]))
    assert batch.dtype == np.dtype(dtype) and batch.shape == (2, 2)


def test_an_action_dtype_is_cast_at_the_env_boundary_and_recorded():
    from rltrain.data.structs import PolicySpaces
    from rltrain.envs.wrappers import ActionDtype

    env = make_env(STRICT)
    assert env.action_space == spaces.Box(-0.1, 0.3, (2,), np.float64)  # the env's own space, shown as it is
    env.reset(seed=0)
    env.step(np.array([-0.1, 0.3], np.float32))  # float32 rounds -0.1 outward: cast, then clipped into the space
    spec = env_spec(env, "t")
    assert spec.env_action_dtype == "float64" and spec.action_dtype == np.float32  # stored as float32, as before
    assert PolicySpaces.from_record(PolicySpaces(spec).to_record()).spec.env_action_dtype == "float64"
    old = PolicySpaces(spec).to_record()
    del old["env"]["env_action_dtype"]  # a checkpoint written before: the storage dtype
    assert PolicySpaces.from_record(old).spec.env_action_dtype == ""
    assert env_spec(make_env("Pendulum-v1"), "t").env_action_dtype == ""  # float32: nothing recorded, no wrapper
    wrapped = make_env("Pendulum-v1")
    while wrapped is not None:
        assert not isinstance(wrapped, ActionDtype)
        wrapped = getattr(wrapped, "env", None)

    class IntMultiDiscrete(gym.Env):  # int32 values: stepped as int32, not rltrain's int64
        observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
        action_space = spaces.MultiDiscrete([3, 4], dtype=np.int32)

        def reset(self, *, seed=None, options=None):
            return np.zeros(2, np.float32), {}

        def step(self, action):
            assert action.dtype == np.int32, action.dtype
            return np.zeros(2, np.float32), 0.0, False, False, {}

    gym.register("rltrain-test/IntMultiDiscrete-v0", entry_point=IntMultiDiscrete)
    md = make_env("rltrain-test/IntMultiDiscrete-v0")
    md.reset(seed=0)
    md.step(np.array([2, 3], np.int64))
    assert env_spec(md, "t").env_action_dtype == "int32"


MATRIX = "tests.helpers.shaped_envs:MatrixEnv"  # a (2, 2) Box action (entry k in [k, k + 0.5]); strict steps


def test_a_shaped_box_is_flat_for_the_policy_shaped_at_the_env_boundary_and_recorded():
    """The policy acts on the 4 values of a (2, 2) Box (as SB3 and CleanRL do): make_env shows the flat Box and
    steps the env with the action in its own shape and dtype; the spec records the shape, which an older record
    (without it) reads as 1-D; a PettingZoo agent's raw space is translated alike (env_action)."""
    import pickle

    from rltrain.data.structs import PolicySpaces
    from rltrain.envs.wrappers import box_shape, env_action

    env = make_env(MATRIX, {"dtype": "float64"})
    low = np.arange(4.0)
    assert env.action_space == spaces.Box(low, low + 0.5, dtype=np.float64)  # flat, in the env's own dtype
    env.reset(seed=0)
    env.step(np.array([0.2, 1.2, 2.2, 3.2], np.float32))  # the env raises unless it gets its (2, 2) float64
    assert pickle.loads(pickle.dumps(env)).action_space.shape == (4,)  # async workers, sidecars
    spec = env_spec(env, "t")
    assert (spec.action_shape, spec.env_action_shape, spec.env_action_dtype) == ((4,), (2, 2), "float64")
    assert spec.own_action_shape == (2, 2) and spec.describe() == "Box(shape=(2, 2))"
    assert PolicySpaces.from_record(PolicySpaces(spec).to_record()).spec == spec
    old = PolicySpaces(spec).to_record()
    del old["env"]["env_action_shape"]  # a checkpoint written before: 1-D actions
    assert PolicySpaces.from_record(old).spec.env_action_shape is None
    pendulum = make_env("Pendulum-v1")  # a 1-D Box: no wrapper, nothing recorded
    assert env_spec(pendulum, "t").env_action_shape is None and box_shape(pendulum) is None
    raw = env.unwrapped.action_space
    assert env_spec(env.unwrapped, "t").env_action_shape == (2, 2)  # a raw space (a PettingZoo agent's): flat too
    assert env_action(raw)(np.array([0.2, 1.2, 2.2, 3.2], np.float32)).shape == (2, 2)


@pytest.mark.parametrize("algo,trainer,core", [
    ("ppo", "sequential", "lstm"),
    ("a2c", "distributed_simulator", "identity"),
    ("impala", "subprocess_actors", "identity"),
    ("sac", "sequential", "identity"),
    ("td3", "parallel", "identity"),
    ("ddpg", "sequential", "identity"),
])
def test_shaped_box_actions_train_evaluate_and_act_in_the_envs_own_shape(tmp_path, algo, trainer, core):
    """The env raises on an action of another shape, dtype or layout (disjoint ranges per entry): training,
    rltrain-eval and load_policy all hand it its own (2, 2) float64 action; a batch is [N, 2, 2]."""
    from rltrain.cli.evaluate import main as evaluate

    extra = {"distributed_simulator": ["trainer.world_size=2"], "subprocess_actors": ["trainer.num_actors=1"],
             "parallel": ["trainer.num_agents=2"]}.get(trainer, [])
    if algo in ("sac", "td3", "ddpg"):
        extra += ["algo.learning_starts=64", "algo.buffer_size=500", "algo.batch_size=16"]
    summary = run(compose_cfg([*TINY, f"env.id={MATRIX}", "+env.kwargs.dtype=float64", f"algo={algo}",
                               f"trainer={trainer}", f"model.core={core}", "total_env_steps=256", *extra]),
                  tmp_path / "run")
    assert summary["status"] == "completed", summary
    run_dir = tmp_path / "run" / "agent_0" if trainer == "parallel" else tmp_path / "run"
    assert evaluate([str(run_dir), "--episodes", "2", "--allow-import"]) == 0

    policy = load_policy(run_dir, allow_import=True)
    assert policy.spec.env_action_shape == (2, 2)
    raw = make_env(MATRIX, {"dtype": "float64"}).unwrapped  # the user's own env, unwrapped
    obs, _ = raw.reset(seed=0)
    state = None
    for _ in range(4):
        action, state = policy.act(obs, state, deterministic=False)
        assert action.shape == (2, 2) and action.dtype == np.float64
        obs, *_ = raw.step(action)
    batch, _ = policy.act(np.stack([obs, obs, obs]))
    assert batch.shape == (3, 2, 2) and all(raw.action_space.contains(a) for a in batch)
