"""SAC and DQN on images: one encoder per network family.

SAC on an image, or a Dict holding one, builds two CNNs: the critic's (read by both Q heads and, detached, by
the actor) and the target critic's copy; the actor's loss never reaches the encoder; each batch goes through
each encoder once. DQN's Q and target networks hold one encoder each. Float-vector SAC keeps its layout, networks
and checkpoint names (tests/test_dict_obs.py) and its older checkpoints load (tests/test_legacy_checkpoints.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from rltrain.algos.dqn import DQN
from rltrain.algos.sac import SAC
from rltrain.cli.build import run
from rltrain.cli.loading import load_policy
from rltrain.data.structs import Rollout, obs_map
from rltrain.envs.make import env_spec, make_env
from rltrain.models.describe import describe_model, networks_of
from rltrain.models.encoders import ImageEncoder
from rltrain.models.factory import ModelSettings
from tests.conftest import compose_cfg

torch.set_num_threads(1)
CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[1]
LEGACY = REPO / "tests" / "data" / "legacy_checkpoints" / "sac_image_separate_encoders.pt"
IMAGE = ("tests.helpers.obs_envs:ImageEnv", {"shape": (40, 40, 3)})  # >= 36x36: the Nature CNN
DICT = ("tests.helpers.obs_envs:DictEnv", {"image_shape": (40, 40, 3)})
KINDS = pytest.mark.parametrize("env_id,kwargs", [IMAGE, DICT], ids=["image", "dict"])


def cnns(algo) -> set[int]:
    """The distinct CNN modules an algorithm's networks hold (targets included)."""
    return {id(m) for net in vars(algo).values() if isinstance(net, nn.Module) for m in net.modules()
            if isinstance(m, ImageEncoder)}


def sac_and_rollout(env_id: str, kwargs: dict, *, discrete: bool = False, **hparams):
    env = make_env(env_id, {**kwargs, "continuous": not discrete})
    spec = env_spec(env, env_id)
    cls = DQN if discrete else SAC
    model = ModelSettings(**{"hidden_sizes": (16,), **hparams.pop("model", {})})
    settings = cls.settings_class(learning_starts=0, batch_size=4, buffer_size=100, **hparams)
    algo = cls(spec, settings, num_envs=1, device=CPU, model=model)
    obs = [env.reset(seed=0)[0]] + [env.step(env.action_space.sample())[0] for _ in range(8)]
    stacked = obs_map(lambda *xs: np.stack(xs), *obs)
    actions = np.stack([env.action_space.sample() for _ in obs])
    r = Rollout(obs=obs_map(lambda x: x[:-1, None], stacked), actions=actions[:-1, None],
                log_probs=np.zeros((8, 1), np.float32), rewards=np.ones((8, 1), np.float32),
                terminated=np.zeros((8, 1), bool), truncated=np.zeros((8, 1), bool),
                next_obs=obs_map(lambda x: x[1:, None], stacked), policy_version=np.zeros(8, np.int64))
    return algo, r, obs_map(torch.from_numpy, stacked)


@KINDS
def test_sac_on_images_builds_two_cnns_online_and_target(env_id, kwargs):
    sac, _, _ = sac_and_rollout(env_id, kwargs)
    assert len(cnns(sac)) == 2
    assert sac.policy.encoder is sac.critic.encoder and sac.critic_target.encoder is not sac.critic.encoder
    # the actor's optimiser holds its trunk and head only; the critic's holds the encoder
    enc = {id(p) for p in sac.critic.encoder.parameters()}
    assert not enc & {id(p) for p in sac.actor_params} and enc <= {id(p) for p in sac.q_params}
    # model.shared=false keeps one encoder per network: actor, both critics, both targets
    separate, _, _ = sac_and_rollout(env_id, kwargs, model={"shared": False})
    assert len(cnns(separate)) == 5


@KINDS
def test_dqn_on_images_builds_one_cnn_in_q_and_one_in_its_target(env_id, kwargs):
    dqn, _, _ = sac_and_rollout(env_id, kwargs, discrete=True)
    assert len(cnns(dqn)) == 2
    assert sum(isinstance(m, ImageEncoder) for m in dqn.policy.modules()) == 1
    assert sum(isinstance(m, ImageEncoder) for m in dqn.target.modules()) == 1


@KINDS
def test_the_actors_loss_leaves_the_encoder_untouched(env_id, kwargs):
    sac, r, batch = sac_and_rollout(env_id, kwargs)
    action, logp = sac.policy.sample(batch)  # from the observation: through the critic's encoder
    (logp + action.sum(-1)).mean().backward()
    assert all(p.grad is None for p in sac.critic.encoder.parameters())
    assert all(p.grad is not None for p in sac.policy.actor_parameters())
    sac.critic.zero_grad(set_to_none=True)
    sac.policy.zero_grad(set_to_none=True)
    # and inside a real update: each encoder weight receives one gradient (the critic's), the actor's trunk one
    received: dict[str, int] = {}

    def count(name):
        return lambda p: received.__setitem__(name, received.get(name, 0) + 1)

    hooks = [p.register_post_accumulate_grad_hook(count(f"encoder.{n}"))
             for n, p in sac.critic.encoder.named_parameters()]
    hooks += [p.register_post_accumulate_grad_hook(count(f"trunk.{n}")) for n, p in sac.policy.trunk.named_parameters()]
    sac.learn(r, progress=0.0)  # 8 env steps: 8 updates
    for h in hooks:
        h.remove()
    updates = sac.gradient_steps_taken
    assert updates == 8 and set(received.values()) == {updates}, received


@KINDS
def test_each_batch_goes_through_each_encoder_once(env_id, kwargs):
    """Per update: obs and next_obs through the online encoder (next_obs for the actor's next action), next_obs
    through the target's; both Q heads and the actor read those features (no forward per head)."""
    sac, r, _ = sac_and_rollout(env_id, kwargs)
    calls = {"online": 0, "target": 0}

    def hook(name):
        return lambda *_: calls.__setitem__(name, calls[name] + 1)

    sac.critic.encoder.register_forward_hook(hook("online"))
    sac.critic_target.encoder.register_forward_hook(hook("target"))
    sac.learn(r, progress=0.0)
    assert sac.gradient_steps_taken == 8 and calls == {"online": 2 * 8, "target": 8}


def test_the_target_encoder_is_polyak_averaged_at_tau():
    sac, r, _ = sac_and_rollout(*IMAGE, tau=0.25)
    sac.learn(r, progress=0.0)  # fills the buffer and runs 8 updates; then one more, watched
    online = dict(sac.critic.encoder.named_parameters())
    before = {n: p.detach().clone() for n, p in sac.critic_target.encoder.named_parameters()}
    sac.update(sac.buffer.sample(sac.batch_size))
    for name, p in sac.critic_target.encoder.named_parameters():
        torch.testing.assert_close(p, before[name] + 0.25 * (online[name].detach() - before[name]))


def test_model_print_shows_the_shared_encoder_once():
    sac, _, _ = sac_and_rollout(*IMAGE)
    text = describe_model(networks_of(sac))
    assert list(networks_of(sac)) == ["policy", "critic"]  # the target critic is a copy, not shown
    assert text.count("NatureCNN ->") == 1
    assert "encoder: NatureCNN -> 512 features" in text and "the critic's, read detached" in text
    assert "  encoder: policy.encoder's (shared: one set of weights, counted once in the total)" in text
    unique = {id(p): p.numel() for net in (sac.policy, sac.critic) for p in net.parameters()}
    assert text.endswith(f"total: {sum(unique.values()):,} parameters")


@pytest.mark.learning
def test_sac_learns_a_task_only_the_pixels_solve(tmp_path):
    """PixelSign: the frame's lit half says which way to act; random acting scores 0 on average, a policy that
    ignores the frame cannot beat 0 either. The shared-encoder SAC must reach 0.5 (best: 1) in 640 steps."""
    summary = run(compose_cfg(["debug=smoke", "algo=sac", "env.id=tests.helpers.obs_envs:PixelSign", "seed=1",
                               "env.num_envs=1", "model.cnn_features=16", "model.hidden_sizes=[32]",
                               "algo.learning_starts=64", "algo.batch_size=32", "algo.buffer_size=1000",
                               "algo.q_lr=1e-3", "algo.policy_lr=1e-3", "total_env_steps=640", "logger=quiet",
                               "eval.every_env_steps=0", "eval.episodes=20", "checkpoint.every_env_steps=0"]),
                  tmp_path)
    assert summary["status"] == "completed", summary
    assert summary["final_eval_return_deterministic"] >= 0.5, summary
    assert "MinAtarCNN" in (tmp_path / "model.txt").read_text()


LEGACY_RUN = ["debug=smoke", "algo=sac", "env.id=tests.helpers.obs_envs:ImageEnv", "+env.kwargs.continuous=true",
              "+env.kwargs.shape=[5,5,3]", "model.encoder=minatar", "model.cnn_features=8", "model.hidden_sizes=[8]",
              "algo.learning_starts=32", "algo.batch_size=16", "algo.buffer_size=200", "env.num_envs=1",
              "logger=quiet", "eval.episodes=1"]  # the overrides the legacy file was written with


def test_a_checkpoint_with_one_encoder_per_network_loads_and_resumes_with_model_shared_false(tmp_path):
    """SAC on images written up to commit 30d8480 (actor, both critics and both targets each with a CNN):
    rltrain.load_policy and rltrain-eval build the layout the file holds and act; a resume with the run's own
    settings refuses in one line naming that commit and the fix, and with the fix resumes."""
    loaded = load_policy(LEGACY, allow_import=True)
    policy, cfg = loaded.policy, loaded.config
    assert cfg["model"]["shared"] is False and len([m for m in policy.modules() if isinstance(m, ImageEncoder)]) == 1
    obs = (torch.arange(3 * 75).reshape(3, 5, 5, 3) * 37 % 256).to(torch.uint8)
    # the actions commit 30d8480's own load_policy computes for these observations
    torch.testing.assert_close(policy.act(obs, deterministic=True).action, torch.tensor(
        [[-0.4781718850135803, 0.2964819371700287], [-0.4430185854434967, 0.2848094701766968],
         [-0.41708794236183167, 0.26641929149627686]]))
    evaluated = subprocess.run([sys.executable, "-m", "rltrain.cli.evaluate", str(LEGACY), "--allow-import",
                                "--episodes", "1"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr

    def resume(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rltrain", *LEGACY_RUN, "total_env_steps=128", f"resume={LEGACY}",
                               "resume_allow_changes=[algo,env,model]", f"hydra.run.dir={tmp_path / 'run'}", *extra],
                              capture_output=True, text=True, cwd=REPO, timeout=300)

    refused = resume()
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "rltrain up to commit 30d8480" in refused.stderr and "model.shared=false" in refused.stderr
    resumed = resume("model.shared=false")
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_env_steps"] == 64


@KINDS
@pytest.mark.parametrize("name", ["td3", "ddpg"])
def test_td3_and_ddpg_on_images_share_the_critics_encoder_as_sac(env_id, kwargs, name):
    """TD3 and DDPG in SAC's shared layout (DrQ-v2): one CNN online, one in the target networks (the target
    actor reads the target critic's); the actor's loss never reaches the encoder, whose weights take one
    gradient per critic step; the actor's trunk one per delayed actor step (TD3: every 2nd)."""
    from rltrain.algos.ddpg import DDPG
    from rltrain.algos.td3 import TD3

    cls = TD3 if name == "td3" else DDPG
    env = make_env(env_id, {**kwargs, "continuous": True})
    spec = env_spec(env, env_id)
    algo = cls(spec, cls.settings_class(learning_starts=0, batch_size=4, buffer_size=100), num_envs=1, device=CPU,
               model=ModelSettings(hidden_sizes=(16,)))
    assert len(cnns(algo)) == 2
    assert algo.policy.encoder is algo.critic.encoder and algo.actor_target.encoder is algo.critic_target.encoder
    assert algo.critic_target.encoder is not algo.critic.encoder
    enc = {id(p) for p in algo.critic.encoder.parameters()}
    assert not enc & {id(p) for p in algo.actor_params} and enc <= {id(p) for p in algo.q_params}
    _, r, _ = sac_and_rollout(env_id, kwargs)
    received: dict[str, int] = {}

    def count(name):
        return lambda p: received.__setitem__(name, received.get(name, 0) + 1)

    hooks = [p.register_post_accumulate_grad_hook(count(f"{part}.{n}"))
             for part, net in (("encoder", algo.critic.encoder), ("trunk", algo.policy.trunk))
             for n, p in net.named_parameters()]
    algo.learn(r, progress=0.0)  # 8 env steps: 8 updates
    for h in hooks:
        h.remove()
    actor_steps = 4 if name == "td3" else 8
    assert {v for k, v in received.items() if k.startswith("encoder.")} == {8}
    assert {v for k, v in received.items() if k.startswith("trunk.")} == {actor_steps}, received
