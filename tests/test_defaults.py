"""Generic defaults that learn, the model a run built shown, settings the env implies inferred, and
evaluations in both modes. (The preset resolution itself: tests/test_presets.py.)"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rltrain.cli.build import run
from rltrain.data.structs import ObsSpace
from rltrain.envs.make import env_spec
from rltrain.errors import ConfigError
from rltrain.models.encoders import MinAtarCNN, NatureCNN, make_encoder
from rltrain.models.grid import GridEncoder, is_index_grid
from rltrain.models.settings import ModelSettings
from tests.conftest import compose_cfg

torch.set_num_threads(1)
QUIET = ["logger=quiet", "eval.every_env_steps=0", "checkpoint.every_env_steps=0"]
MLP = ModelSettings().with_mlp((16, 16), "tanh")


@pytest.mark.learning
def test_generic_ppo_defaults_learn_cartpole_cut_down(tmp_path):
    """experiment=none: SB3's PPO values (2048-step batches of 64-sample minibatches, lr 3e-4, 10 epochs) learn
    CartPole within 8 updates (random play: ~22)."""
    summary = run(compose_cfg(["experiment=none", "seed=1", "total_env_steps=16384", "eval.episodes=5", *QUIET]),
                  tmp_path)
    cfg = json.loads((tmp_path / "summary.json").read_text())
    assert cfg["status"] == "completed" and summary["updates"] == 8, summary  # 2048 // 4 envs = 512 steps each
    assert summary["final_eval_return_deterministic"] >= 200, summary


def test_ppo_minibatches_follow_the_core_and_rltrain_check_shows_the_resolved_batch(tmp_path):
    """num_minibatches=null: 32 minibatches feed-forward; a recurrent core's minibatches are whole env sequences,
    so the default divides env.num_envs (a generic recurrent run starts instead of refusing)."""
    from rltrain.algos.ppo import PPO, auto_minibatches

    assert auto_minibatches(4, recurrent=False) == 32
    assert [auto_minibatches(n, recurrent=True) for n in (1, 2, 3, 6, 8, 7)] == [1, 2, 3, 3, 4, 1]
    spec = env_spec(gym.make("CartPole-v1"), "CartPole-v1")
    lstm = PPO(spec, num_envs=6, device=torch.device("cpu"), model=ModelSettings(core="lstm"))
    assert (lstm.num_minibatches, lstm.rollout_len) == (3, 341)
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "rltrain.cli.check", "experiment=none", "model.core=gru"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "4 envs x 512 rollout_len = 2048" in res.stdout and "2048 / 4 minibatches" in res.stdout, res.stdout
    assert not (tmp_path / "model.txt").exists()  # a check shows the model and writes nothing


@pytest.mark.parametrize(("space", "grid"), [
    (spaces.Box(0, 255, (7, 7, 3), np.uint8), True),  # MiniGrid's view: uint8 bounds, but 7x7 cells
    (spaces.Box(0, 10, (3, 30, 30), np.int64), True),  # values <= 32: indices whatever the size
    (spaces.Box(0, 255, (84, 84, 4), np.uint8), False),  # Atari frames
    (spaces.Box(0, 1, (10, 10, 4), bool), False),  # MinAtar's bool planes
    (spaces.Box(0.0, 1.0, (7, 7, 3), np.float32), False),  # float images are never indices
    (spaces.Box(0, 255, (40, 40, 3), np.uint8), False),  # pixels above 16x16
])
def test_the_grid_rule_tells_index_grids_from_pixels(space, grid):
    from rltrain.envs.make import _describe_obs

    obs = _describe_obs(space)
    assert is_index_grid(obs) is grid
    assert isinstance(make_encoder(obs, MLP), GridEncoder) is grid


def test_grid_encoder_embeds_indices_and_the_rule_is_overridable_per_key():
    obs = ObsSpace("box", (7, 7, 3), "uint8", high=10)
    enc = make_encoder(obs, MLP)
    x = torch.randint(0, 11, (4, 7, 7, 3), dtype=torch.uint8)
    out = enc(x)
    assert out.shape == (4, enc.out_dim) and enc.vocab == 11
    changed = x.clone()
    changed[0, 3, 3, 0] = 1 if x[0, 3, 3, 0] != 1 else 2  # one index changed: a different object, other features
    assert not torch.allclose(enc(changed)[0], out[0]) and torch.allclose(enc(changed)[1:], out[1:])
    assert isinstance(make_encoder(obs, ModelSettings(encoder="minatar").with_mlp((16,), "tanh")), MinAtarCNN)
    both = ObsSpace("dict", parts=(("grid", obs), ("frame", ObsSpace("box", (40, 40, 3), "uint8", high=255))))
    enc = make_encoder(both, MLP)
    assert [type(p) for p in enc.parts] == [GridEncoder, NatureCNN]
    forced = make_encoder(both, ModelSettings(key_encoders={"grid": "minatar"}).with_mlp((16,), "tanh"))
    assert [type(p) for p in forced.parts] == [MinAtarCNN, NatureCNN]
    with pytest.raises(ConfigError, match="model.key_encoders: 'gird' is not an observation key"):
        make_encoder(both, ModelSettings(key_encoders={"gird": "grid"}).with_mlp((16,), "tanh"))
    with pytest.raises(ConfigError, match=r"model.key_encoders.grid=cnn: unknown"):
        ModelSettings(key_encoders={"grid": "cnn"})


def test_frame_stack_is_read_from_the_envs_frame_stack_wrapper():
    def spec(**kwargs):
        return env_spec(gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 4, **kwargs), "stacked")

    assert spec().frame_stack == 4 and spec().obs_shape == (4, 4)
    assert spec(padding_type="zero").frame_stack is None  # not what the replay rebuilds stacks from
    assert env_spec(gym.make("CartPole-v1"), "CartPole-v1").frame_stack is None


def test_dqn_stores_each_frame_once_without_being_told_and_the_run_shows_it(tmp_path, cli):
    """env.wrappers with a FrameStackObservation: the DQN replay keeps one frame per step on its own
    (algo.frame_stack=null), model.txt and the start-up print say so; algo.frame_stack=0 turns it off."""
    stack = ["algo=dqn", "env.wrappers=[{FrameStackObservation: {stack_size: 3}}]", "total_env_steps=256",
             "algo.learning_starts=64", "algo.batch_size=16", "algo.buffer_size=1000", "eval.episodes=1",
             "logger.progress=plain", "eval.every_env_steps=0", "checkpoint.every_env_steps=0"]
    res = cli(*stack, "hydra.run.dir=run")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "run" / "model.txt").read_text()
    assert "frame stack: 3 frames (read from the env's FrameStackObservation" in text, text
    assert "[rltrain] model:" in res.stdout and "frame stack: 3 frames" in res.stdout, res.stdout
    cfg = compose_cfg(stack[:-2] + ["algo.frame_stack=0", *QUIET])
    run(cfg, tmp_path / "off")
    off = (tmp_path / "off" / "model.txt").read_text()
    assert "stored once per frame" not in off and "frame stack: 3 frames (the env's" in off, off
    # an on-policy learner reads the stack as channels: its model.txt names the stack too (it said nothing)
    cfg = compose_cfg(["algo=ppo", *stack[1:2], "total_env_steps=256", "algo.rollout_len=32", "eval.episodes=1",
                       "eval.every_env_steps=0", "checkpoint.every_env_steps=0", *QUIET])
    run(cfg, tmp_path / "ppo")
    assert "frame stack: 3 frames (the env's FrameStackObservation" in (tmp_path / "ppo" / "model.txt").read_text()


def test_model_txt_names_each_keys_encoder_width_core_heads_and_parameters(tmp_path):
    run(compose_cfg(["env.id=tests.helpers.obs_envs:DictEnv", "algo.rollout_len=16", "algo.num_minibatches=2",
                     "env.num_envs=2", "total_env_steps=32", "eval.episodes=1", *QUIET]), tmp_path)
    text = (tmp_path / "model.txt").read_text()
    for line in ("algo=ppo", "actor_encoder: MultiInputEncoder -> 64 features", "key 'pixels': GridEncoder -> 128",
                 "key 'state': FlatInput (flattened) -> 5", "key 'mode': FlatInput (one-hot of 3) -> 3",
                 "after concatenation: MLP", "actor_core: identity", "actor_out: Linear 64 -> 3",
                 "critic: shares the actor's encoder and core (model.shared)", "total: "):
        assert line in text, (line, text)
    unshared = tmp_path / "unshared"
    run(compose_cfg(["env.id=tests.helpers.obs_envs:DictEnv", "model.shared=false", "model.core=lstm",
                     "model.core_size=8", "algo.rollout_len=16", "algo.num_minibatches=2", "env.num_envs=2",
                     "total_env_steps=32", "eval.episodes=1", *QUIET]), unshared)
    text = (unshared / "model.txt").read_text()
    assert "critic_encoder: MultiInputEncoder" in text and "shares" not in text, text
    assert "actor_core: lstm -> 8" in text and "critic_core: lstm -> 8" in text, text


def test_evaluations_record_both_modes_and_say_which_is_the_headline(tmp_path, cli):
    res = cli("total_env_steps=512", "eval.episodes=2", "eval.every_env_steps=256", "logger.progress=plain",
              "hydra.run.dir=run")
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_eval_mode"] == "deterministic"
    assert summary["final_eval_return"] == summary["final_eval_return_deterministic"]
    assert summary["final_eval_return_stochastic"] is not None
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("[summary]"))
    assert "final_eval_mode=deterministic" in line and "final_eval_return_stochastic=" in line, line
    header = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"eval/return_mean", "eval/return_mean_deterministic", "eval/return_mean_stochastic"} <= set(header)
    one = run(compose_cfg(["total_env_steps=256", "eval.episodes=1", "eval.both_modes=false",
                           "eval.deterministic=false", *QUIET]), tmp_path / "one")
    assert one["final_eval_mode"] == "stochastic" and one["final_eval_return_deterministic"] is None


@pytest.mark.parametrize(("algo", "modes"), [(["algo=td3", "env=pendulum", "algo.learning_starts=256"], 1),
                                             (["algo=sac", "env=pendulum", "algo.learning_starts=256"], 2), ([], 2)])
def test_a_policy_that_draws_nothing_is_evaluated_once_for_both_modes(tmp_path, monkeypatch, algo, modes):
    """TD3's mu(s) acts the same in both modes: eval.both_modes evaluates it once (it ran the same episodes twice),
    and both modes' means are that one; a sampling policy (SAC's, PPO's) is still evaluated in each mode."""
    from rltrain.trainers import evaluation

    calls = []
    real = evaluation.evaluate
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: calls.append(k["deterministic"]) or real(*a, **k))
    s = run(compose_cfg([*algo, "experiment=none", "debug=smoke", "total_env_steps=512", "eval.episodes=1",
                         *QUIET]), tmp_path / "run")
    assert calls == [True, False][:modes], calls  # the final evaluation: the headline mode first
    assert s["final_eval_return"] == s["final_eval_return_deterministic"]
    if modes == 1:  # one evaluation: both columns are its mean
        assert s["final_eval_return_stochastic"] == s["final_eval_return_deterministic"]
