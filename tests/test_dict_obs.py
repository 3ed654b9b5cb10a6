"""Dict observations end to end: vector envs, the collector's per-key buffers, the replay buffer, actor
batches, evaluation, checkpoints and resume; and SAC over any encoder.

Real envs throughout: ``tests/helpers/obs_envs.py``'s DictEnv (an image, a float vector, a Discrete, a
MultiBinary key; optionally a Text key and a nested Dict), built through ``rltrain.envs.make``.
"""

from __future__ import annotations

import dataclasses
import io
import pickle

import numpy as np
import pytest
import torch

from rltrain.algos.sac import SAC, SACSettings
from rltrain.cli.build import run
from rltrain.data.replay import ReplayBuffer
from rltrain.data.structs import EnvSpec, Rollout, obs_leaves, obs_map
from rltrain.envs.make import env_spec, make_env, make_vector_env
from rltrain.errors import ConfigError
from rltrain.models.encoders import make_encoder
from rltrain.models.factory import ModelSettings, build
from rltrain.models.q_networks import ContinuousQNetwork
from rltrain.models.sac_networks import SeparateTwinQ
from rltrain.models.squashed_actor import SquashedGaussianActor
from rltrain.run.checkpoint import load_checkpoint
from rltrain.trainers.actors.rollouts import merge_rollouts
from rltrain.trainers.collector import RolloutCollector
from rltrain.trainers.episodes import evaluate
from tests.conftest import compose_cfg

torch.set_num_threads(1)
DICT_ENV = "tests.helpers.obs_envs:DictEnv"
KW = {"image_shape": (10, 10, 3), "nested": True}
STORED = {"pixels": np.uint8, "state": np.float32, "mode": np.int64, "flags": np.int8,
          "arm": {"joints": np.float32, "gripper": np.int64}}
CPU = torch.device("cpu")


def dict_spec(**kw) -> EnvSpec:
    return env_spec(make_env(DICT_ENV, {**KW, **kw}), DICT_ENV)


def collector(n: int = 2, vectorization: str = "sync", **kw) -> RolloutCollector:
    spec = dict_spec(**kw)
    settings = ModelSettings(hidden_sizes=(16,), ignore_keys=("mission",) if kw.get("text") else ())
    policy = build(spec, settings, "actor_critic")
    venv = make_vector_env(DICT_ENV, n, list(range(n)), kwargs={**KW, **kw}, vectorization=vectorization)
    return RolloutCollector(venv, policy, spec, device=CPU)


def dtypes(obs) -> dict:
    return obs_map(lambda x: x.dtype.type, obs)


def test_collector_stores_one_time_major_buffer_per_key_in_its_storage_dtype():
    col = collector(text=True)  # the Text key is not stored: no encoder reads it (dropped by model.ignore_keys)
    try:
        r = col.collect(12)
    finally:
        col.close()
    assert dtypes(r.obs) == dtypes(r.next_obs) == STORED
    assert obs_map(lambda x: x.shape[:2], r.obs) == obs_map(lambda _: (12, 2), STORED)
    assert r.obs["pixels"].shape == (12, 2, 10, 10, 3) and r.obs["arm"]["joints"].shape == (12, 2, 3)
    # every step of an 8-step episode is a real transition: next_obs[t] is obs[t+1] inside an episode only
    done = r.terminated | r.truncated
    assert done[7].all() and done.sum() == 2
    for o, n in zip(obs_leaves(r.obs), obs_leaves(r.next_obs), strict=True):
        assert np.array_equal(n[:7], o[1:8]) and np.array_equal(n[8:-1], o[9:])
        assert not np.array_equal(n[7], o[8])  # the final observation, not the reset one
    back = pickle.loads(pickle.dumps(r))  # what the actor pipes carry
    assert all(np.array_equal(a, b) for a, b in zip(obs_leaves(r.obs), obs_leaves(back.obs), strict=True))


def test_async_vector_env_gives_the_same_dict_batches_as_the_sync_one():
    rollouts = []
    for vectorization in ("sync", "async"):
        col = collector(vectorization=vectorization)
        np.random.seed(0)  # uniform random actions come from numpy's global generator
        try:
            rollouts.append(col.collect(10, random_actions=True))
        finally:
            col.close()
    a, b = rollouts
    for x, y in zip(obs_leaves(a.obs) + obs_leaves(a.next_obs), obs_leaves(b.obs) + obs_leaves(b.next_obs),
                    strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y)


def test_merge_rollouts_concatenates_every_key_along_the_env_axis():
    col = collector()
    try:
        r1, r2 = col.collect(4), col.collect(4)
    finally:
        col.close()
    merged = merge_rollouts([r1, r2])
    assert merged.obs["arm"]["gripper"].shape == (4, 4)
    assert np.array_equal(merged.next_obs["pixels"][:, 2:], r2.next_obs["pixels"])
    assert dtypes(merged.obs) == STORED


def _buffer(spec: EnvSpec, **kw) -> ReplayBuffer:
    return ReplayBuffer(500, spec.obs_shape, spec.action_shape, spec.action_dtype, device=CPU,
                        obs_dtype=spec.obs_dtype, obs_space=spec.observation, **kw)


def test_replay_buffer_stores_dict_observations_per_key_and_round_trips_a_checkpoint():
    spec = dict_spec()
    col = collector()
    try:
        first, second = col.collect(6), col.collect(6)
    finally:
        col.close()
    buf = _buffer(spec)
    buf.add_rollout(first)
    buf.add_rollout(second)  # continues each stream: first's last rows link to second's first rows
    # row gid t * N + n of the first rollout: its transition and its successor
    slots = np.array([0, 3, 10, 11])  # (t, n) = (0, 0), (1, 1), (5, 0), (5, 1)
    b = buf.batch(slots)
    assert obs_map(lambda x: x.dtype, b.obs) == obs_map(lambda x: torch.from_numpy(x).dtype, first.obs)
    for key in ("pixels", "mode"):
        assert np.array_equal(b.obs[key].numpy(), first.obs[key][[0, 1, 5, 5], [0, 1, 0, 1]])
        assert np.array_equal(b.next_obs[key].numpy(), first.next_obs[key][[0, 1, 5, 5], [0, 1, 0, 1]])
    assert np.array_equal(b.next_obs["arm"]["joints"][2:].numpy(), second.obs["arm"]["joints"][0])
    state = torch.load(io.BytesIO(_saved(buf.state_dict())), weights_only=True)
    again = _buffer(spec)
    again.load_state_dict(state)
    c = again.batch(slots)
    for x, y in zip(obs_leaves(b.obs) + obs_leaves(b.next_obs), obs_leaves(c.obs) + obs_leaves(c.next_obs),
                    strict=True):
        assert torch.equal(x, y)
    assert (again.written, again.ready, again.tails.keys()) == (buf.written, buf.ready, buf.tails.keys())


def _saved(state: dict) -> bytes:
    out = io.BytesIO()
    torch.save(state, out)
    return out.getvalue()


def test_replay_buffer_refuses_frame_stacks_of_dict_observations_in_one_line():
    with pytest.raises(ConfigError, match=r"^algo.frame_stack=4: frames are stored once only for array "
                                          r"observations, not for the Dict .*; set algo.frame_stack=null$"):
        _buffer(dict_spec(), frame_stack=4)


def test_evaluation_stacks_dict_observations_per_key():
    spec = dict_spec()
    policy = build(spec, ModelSettings(hidden_sizes=(16,)), "actor_critic")
    returns = evaluate(policy, lambda render_mode=None: make_env(DICT_ENV, KW), episodes=3, eval_seed=5)
    assert returns.tolist() == [8.0, 8.0, 8.0]


TINY = ["total_env_steps=256", "env.num_envs=2", "eval.every_env_steps=128", "eval.episodes=1", "logger=quiet",
        "logger.progress=off", "checkpoint.every_env_steps=128", "model.hidden_sizes=[16]", "model.cnn_features=16",
        f"env.id={DICT_ENV}", "+env.kwargs.image_shape=[10,10,3]", "+env.kwargs.nested=true"]


def test_a_text_key_is_refused_in_one_line_naming_it_or_dropped_with_ignore_keys(tmp_path):
    base = ["algo=ppo", "algo.rollout_len=16", "algo.num_minibatches=2", *TINY, "+env.kwargs.text=true"]
    with pytest.raises(ConfigError) as err:
        run(compose_cfg(base), tmp_path / "refused")
    text = str(err.value)
    assert "\n" not in text and "'mission'" in text and "model.ignore_keys=[mission]" in text
    summary = run(compose_cfg([*base, "model.ignore_keys=[mission]"]), tmp_path / "dropped")
    assert summary["status"] == "completed"


@pytest.mark.parametrize("algo", ["ppo", "dqn", "sac"])
def test_dict_obs_runs_resume_bitwise(tmp_path, algo):
    """2N steps at once == N steps, then resume to 2N (DQN and SAC with their replay buffer in the checkpoint;
    SAC's critic encoder shared with its actor)."""
    # schedules over the budget (lr annealing, epsilon) would differ between a 2N and an N run: fixed here
    replay = ["algo.rollout_len=8", "algo.learning_starts=64", "algo.buffer_size=1000", "algo.batch_size=16",
              "algo.train_frequency=16", "checkpoint.replay_buffer=true"]
    extra = {"ppo": ["algo.rollout_len=16", "algo.num_minibatches=2", "algo.anneal_lr=false"],
             "dqn": [*replay, "algo.start_e=0.3", "algo.end_e=0.3"],
             "sac": [*replay, "+env.kwargs.continuous=true"]}[algo]
    base = [f"algo={algo}", *TINY, *extra]
    run(compose_cfg([*base, "total_env_steps=512"]), tmp_path / "once")
    run(compose_cfg([*base, "total_env_steps=256"]), tmp_path / "twice")
    run(compose_cfg([*base, "total_env_steps=512", "resume=auto"]), tmp_path / "twice")
    once, _ = load_checkpoint(tmp_path / "once" / "checkpoints" / "final.pt")
    twice, _ = load_checkpoint(tmp_path / "twice" / "checkpoints" / "final.pt")
    assert once["collector"]["obs"].keys() == STORED.keys()  # the collector's current observations, per key
    for net in ("policy", "critic", "critic_target") if algo == "sac" else ("policy",):
        p1, p2 = once["algo"][net], twice["algo"][net]
        assert p1.keys() == p2.keys() and all(torch.equal(p1[k], p2[k]) for k in p1), net
    drop_wall = lambda c: {k: v for k, v in c.items() if k != "wall_time"}  # noqa: E731
    assert drop_wall(once["counters"]) == drop_wall(twice["counters"])


# ---- SAC over any observation -------------------------------------------------------------------------------

def test_sac_reads_float_vectors_through_cleanrls_mlps():
    spec = env_spec(make_env("Pendulum-v1"), "Pendulum-v1")
    sac = SAC(spec, SACSettings(), num_envs=1, device=CPU, model=ModelSettings(hidden_sizes=(8, 8)))
    assert type(sac.policy) is SquashedGaussianActor and type(sac.critic) is SeparateTwinQ
    assert type(sac.critic.qf1) is ContinuousQNetwork
    # the actor's MLP (two hidden layers, then mean and log-std), the critic's MLP over obs ++ action
    assert sorted(sac.policy.state_dict()) == ["encoder.mlp.0.bias", "encoder.mlp.0.weight", "encoder.mlp.2.bias",
                                               "encoder.mlp.2.weight", "head.bias", "head.log_std.bias",
                                               "head.log_std.weight", "head.mean.bias", "head.mean.weight",
                                               "head.scale"]
    assert sorted(sac.critic.qf1.state_dict()) == ["q.0.bias", "q.0.weight", "q.2.bias", "q.2.weight", "q.4.bias",
                                                   "q.4.weight"]
    # the checkpoint keeps the names it had before the layouts (qf1, qf2 and their targets)
    assert [k for k in sac.state_dict() if k.startswith("qf")] == ["qf1", "qf2", "qf1_target", "qf2_target"]


@pytest.mark.parametrize("env_id,kwargs", [("tests.helpers.obs_envs:ImageEnv", {"shape": (10, 10, 3)}),
                                           (DICT_ENV, KW)], ids=["image", "dict"])
def test_sac_on_images_and_dicts_actor_reads_the_twin_critics_one_encoder(env_id, kwargs):
    env = make_env(env_id, {**kwargs, "continuous": True})
    spec = env_spec(env, env_id)
    sac = SAC(spec, SACSettings(learning_starts=0, batch_size=8, buffer_size=100), num_envs=1,
              device=CPU, model=ModelSettings(cnn_features=16, hidden_sizes=(16,)))
    assert sac.policy.encoder is sac.critic.encoder and sac.critic_target.encoder is not sac.critic.encoder
    obs = [env.reset(seed=0)[0]] + [env.step(env.action_space.sample())[0] for _ in range(3)]
    stacked = obs_map(lambda *xs: np.stack(xs), *obs)
    batch = obs_map(torch.from_numpy, stacked)
    action, logp = sac.policy.sample(batch)
    low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
    assert action.shape == (4, 2) and logp.shape == (4,) and ((action >= low) & (action <= high)).all()
    q1, q2 = sac.critic(batch, action)
    q1.sum().backward()
    assert q1.shape == q2.shape == (4,) and all(p.grad is not None for p in sac.critic.encoder.parameters())
    r = Rollout(obs=obs_map(lambda x: x[:, None], stacked), actions=action.detach().numpy()[:, None],
                log_probs=np.zeros((4, 1), np.float32), rewards=np.ones((4, 1), np.float32),
                terminated=np.zeros((4, 1), bool), truncated=np.zeros((4, 1), bool),
                next_obs=obs_map(lambda x: np.roll(x, -1, 0)[:, None], stacked), policy_version=np.zeros(4, np.int64))
    before = [p.detach().clone() for p in sac.critic.q2.parameters()]
    for _ in range(3):
        sac.learn(r, progress=0.0)
    assert any(not torch.equal(a, b) for a, b in zip(before, sac.critic.q2.parameters(), strict=True))


VECTOR_DICT = "tests.helpers.obs_envs:VectorDictEnv"


def test_sac_reads_a_dict_of_vectors_concatenated_into_each_networks_mlp():
    """No image: each critic's MLP reads obs ++ action with the Dict's keys flattened (Discrete one-hot) and
    concatenated, no encoder weights before it (SB3's layout), and the actor's MLP the same concatenation.
    model.shared=false keeps one encoder MLP per network (the layout before); a checkpoint of either layout is
    refused by the other in one line naming the setting that resumes it."""
    env = make_env(VECTOR_DICT)
    spec = env_spec(env, VECTOR_DICT)
    settings = SACSettings(learning_starts=0, batch_size=4, buffer_size=100)
    model = ModelSettings(hidden_sizes=(16, 16))
    sac = SAC(spec, settings, num_envs=1, device=CPU, model=model)
    width = 6 + 3 + 3 + 2
    assert sum(p.numel() for p in sac.critic.qf1.encoder.parameters()) == 0 and sac.critic.qf1.encoder.out_dim == width
    assert sac.critic.qf1.q[0].in_features == width + 2 and sac.policy.encoder.mlp[0].in_features == width
    obs = [env.reset(seed=0)[0]] + [env.step(env.action_space.sample())[0] for _ in range(4)]
    batch = obs_map(lambda *xs: torch.from_numpy(np.stack(xs)), *obs)
    keys = [k for k, _ in spec.observation.parts]
    flat = torch.cat([torch.nn.functional.one_hot(batch[k], 2).float() if k == "phase" else batch[k] for k in keys], 1)
    action = torch.rand(5, 2)
    q1, q2 = sac.critic(batch, action)
    torch.testing.assert_close(q1, sac.critic.qf1.q(torch.cat([flat, action], 1)).squeeze(-1))
    torch.testing.assert_close(sac.policy.sample(batch, deterministic=True)[0],
                               sac.policy.head(sac.policy.encoder.mlp(flat), deterministic=True)[0])
    per_network = SAC(spec, settings, num_envs=1, device=CPU, model=dataclasses.replace(model, shared=False))
    assert sum(p.numel() for p in per_network.critic.qf1.encoder.parameters()) > 0
    with pytest.raises(ConfigError, match=r"each hold an encoder .* resume it with model.shared=false "):
        sac.load_state_dict(per_network.state_dict())
    with pytest.raises(ConfigError, match=r"hold no encoder .* resume it with model.shared=auto "):
        per_network.load_state_dict(sac.state_dict())
    # an image anywhere needs its encoder: asking for the flat input is a programming error
    with pytest.raises(ValueError, match="not read flat"):
        make_encoder(env_spec(make_env(DICT_ENV, KW), DICT_ENV).observation, model, flat=True)
