"""Presets for the standard suites (MuJoCo, Box2D, classic control) and the note that names the closest one."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import yaml

from rltrain.cli.build import run
from rltrain.cli.presets import family, preset_note, presets, resolve_experiment
from tests.conftest import CONF_DIR, compose_cfg

needs_mujoco = pytest.mark.skipif(importlib.util.find_spec("mujoco") is None, reason="needs rltrain[mujoco]")


def test_every_experiment_file_is_read_with_its_algo_and_env():
    found = {p.name: p for p in presets()}
    assert set(found) == {f.stem for f in (CONF_DIR / "experiment").glob("*.yaml")}
    mujoco = found["ppo_mujoco"]
    assert (mujoco.algo, mujoco.family, mujoco.generic) == ("ppo", "mujoco", True)
    assert found["sac_lunarlander_continuous"].env_id == "LunarLanderContinuous-v3"  # the preset's own env.id
    assert found["dqn_lunarlander"].env_id == "LunarLander-v3" and not found["dqn_lunarlander"].generic


@pytest.mark.parametrize(("env_id", "expected"), [
    ("Hopper-v5", "mujoco"), ("LunarLanderContinuous-v3", "box2d"), ("Acrobot-v1", "classic"),
    ("ALE/Pong-v5", "atari"), ("MinAtar/Breakout-v1", "minatar"), ("tests.helpers.faulty_envs:X", "other"),
    ("NotRegistered-v0", "other")])
def test_family_comes_from_the_registry_without_building_the_env(env_id, expected):
    assert family(env_id) == expected


@pytest.mark.parametrize(("algo", "env_id", "says"), [
    ("ppo", "LunarLander-v3", "the tuned preset for it: rltrain experiment=ppo_lunarlander"),
    ("ppo", "Ant-v5", "the tuned preset for it: rltrain experiment=ppo_mujoco env.id=Ant-v5"),
    ("sac", "LunarLanderContinuous-v3", "the tuned preset for it: rltrain experiment=sac_lunarlander_continuous"),
    ("sac", "MountainCarContinuous-v0", "experiment=sac_mountaincar_continuous"),
    ("dqn", "Hopper-v5", "the closest preset: rltrain experiment=ppo_mujoco env.id=Hopper-v5 (algo=ppo on any mujoco"),
    ("a2c", "Acrobot-v1", "the closest preset: rltrain experiment=a2c_cartpole (algo=a2c on CartPole-v1)"),
    ("impala", "ALE/Pong-v5", "experiment=impala_atari env.id=ALE/Pong-v5"),
    ("ppo", "tests.helpers.faulty_envs:X", "no preset is close"),
])
def test_note_names_the_defaults_used_and_the_closest_preset(algo, env_id, says):
    note = preset_note(algo, env_id, None)
    assert f"algo={algo}'s generic defaults are used on {env_id}" in note and says in note, note


def test_no_note_when_a_preset_is_chosen():
    assert preset_note("ppo", "LunarLander-v3", "ppo_lunarlander") is None
    assert preset_note("ppo", "Ant-v5", "ppo_cartpole") is None


@pytest.mark.parametrize(("overrides", "added", "says"), [
    ([], "experiment=ppo_cartpole", "preset experiment=ppo_cartpole (tuned for algo=ppo on CartPole-v1)"),
    (["algo=dqn"], "experiment=dqn_cartpole", "preset experiment=dqn_cartpole"),
    (["experiment=auto", "env=pendulum"], "experiment=ppo_pendulum", "preset experiment=ppo_pendulum"),
    (["algo=sac", "env.id=Walker2d-v5"], "experiment=sac_mujoco", "algo=sac on any mujoco task"),
    (["env=cartpole_novel"], "experiment=ppo_lstm_cartpole_novel", "with wrappers ['VelocityMask']"),
])
def test_experiment_auto_adds_the_preset_made_for_the_algo_and_env(overrides, added, says):
    resolved, line = resolve_experiment(overrides)
    rest = [o for o in overrides if not o.startswith("experiment=")]
    assert resolved == [added, *rest]  # before the user's overrides: Hydra's parser reads them as one run
    assert says in line and line.endswith("experiment=none for the generic defaults"), line


def test_a_v4_atari_id_is_told_it_is_played_with_sticky_actions():
    """The atari env group plays every game with v5's sticky actions; a -v4 id registers none, so its preset line
    says so (and not once the user sets them, nor for an ALE/ id)."""
    _, line = resolve_experiment(["env.id=BreakoutNoFrameskip-v4"])
    assert line.startswith("preset experiment=ppo_atari") and "repeat_action_probability=0.25" in line, line
    assert line.endswith("where the id registers 0: set it to 0 for the 2015 protocol"), line
    for overrides in (["env.id=BreakoutNoFrameskip-v4", "env.kwargs.repeat_action_probability=0"],
                      ["env.id=ALE/Breakout-v5"]):
        _, line = resolve_experiment(overrides)
        assert line.startswith("preset experiment=ppo_atari") and "sticky" not in line, line


def test_the_preset_joins_the_overrides_not_a_flag_value():
    assert resolve_experiment(["algo=dqn", "--cfg", "job"])[0] == ["experiment=dqn_cartpole", "algo=dqn", "--cfg",
                                                                   "job"]
    assert resolve_experiment(["--cfg", "job", "algo=dqn"])[0] == ["--cfg", "job", "experiment=dqn_cartpole",
                                                                   "algo=dqn"]
    assert resolve_experiment(["--cfg", "job"])[0] == ["--cfg", "job", "experiment=ppo_cartpole"]


@pytest.mark.parametrize(("overrides", "says"), [
    (["experiment=none"], "algo=ppo's generic defaults are used on CartPole-v1 (published values: PPOSettings in "
                          "rltrain/algos/ppo.py); the tuned preset for it: rltrain experiment=ppo_cartpole"),
    (["env.id=Taxi-v3"], "algo=ppo's generic defaults are used on Taxi-v3"),
    (["algo=ppo,dqn", "-m"], "in a sweep over algo/env: the generic defaults are used"),
    (["-m", "+grid=ppo,sac", "+env.kwargs.size=3"], "with +grid=...: that group may choose the algo or the env"),
])
def test_experiment_none_and_no_match_keep_the_generic_defaults_and_say_so(overrides, says):
    resolved, line = resolve_experiment(overrides)
    assert not any(o.startswith("experiment=") for o in resolved) and says in line, (resolved, line)


def test_a_named_preset_is_left_alone():
    assert resolve_experiment(["experiment=ppo_cleanrl", "seed=2"]) == (["experiment=ppo_cleanrl", "seed=2"], None)


def test_generic_defaults_are_the_published_ones_and_the_cartpole_preset_keeps_the_tuning():
    """The settings dataclasses hold SB3's / the papers' values; `rltrain` with no arguments still runs the
    CartPole tuning."""
    generic = compose_cfg(["experiment=none"]).algo  # num_minibatches null: 32, or by env with a core
    assert (generic.rollout_len, generic.lr, generic.gamma, generic.gae_lambda, generic.num_minibatches,
            generic.anneal_lr, generic.target_kl) == (None, 3e-4, 0.99, 0.95, None, False, None)
    tuned = compose_cfg([]).algo
    assert (tuned.rollout_len, tuned.lr, tuned.gamma, tuned.gae_lambda, tuned.num_minibatches,
            tuned.target_kl) == (64, 2e-3, 0.98, 0.8, 1, 0.02)
    dqn = compose_cfg(["algo=dqn", "experiment=none"]).algo
    assert (dqn.lr, dqn.batch_size, dqn.train_frequency, dqn.loss, dqn.max_grad_norm, dqn.learning_starts) == \
        (1e-4, 32, 4, "huber", 10.0, 100)
    # IMPALA's generic defaults differ from the paper's where a small task needs it (IMPALASettings says why); the
    # Atari preset keeps the paper's values and the presets tuned with one pass per batch pin it
    impala = compose_cfg(["algo=impala", "experiment=none"]).algo
    assert (impala.num_epochs, impala.max_grad_norm, impala.optimizer_eps, impala.anneal_lr) == (2, 0.5, 1e-5, False)
    atari = compose_cfg(["experiment=impala_atari"]).algo
    assert (atari.num_epochs, atari.max_grad_norm, atari.optimizer_eps, atari.anneal_lr, atari.lr) == \
        (1, 40.0, 0.01, True, 6e-4)
    for preset in ("impala_cartpole", "impala_lstm_cartpole_novel", "impala_minatar"):
        assert compose_cfg([f"experiment={preset}"]).algo.num_epochs == 1, preset


def test_a_wrapped_task_is_another_task_than_the_bare_env():
    """Pendulum-v1 behind a VelocityMask (env=pendulum_novel) is PendulumNoVel: its presets fit only runs with
    that wrapper, the bare env keeps its own, and CartPoleNoVel gets a note although PPO's defaults are tuned
    for the bare CartPole-v1."""
    mask = [{"VelocityMask": {"indices": [2]}}]
    assert preset_note("ppo", "Pendulum-v1", None).endswith("experiment=ppo_pendulum")
    assert preset_note("ppo", "CartPole-v1", None).endswith("experiment=ppo_cartpole")
    assert preset_note("ppo", "Pendulum-v1", None, wrappers=mask).endswith("experiment=ppo_lstm_pendulum_novel")
    note = preset_note("ppo", "CartPole-v1", None, wrappers=[{"VelocityMask": {"indices": [1, 3]}}])
    assert "CartPole-v1 with wrappers ['VelocityMask']" in note and note.endswith("experiment=ppo_lstm_cartpole_novel")
    note = preset_note("impala", "CartPole-v1", None, wrappers=["VelocityMask"])
    assert note.endswith("the tuned preset for it: rltrain experiment=impala_lstm_cartpole_novel")


def test_cli_announces_the_preset_once_before_training(cli, tmp_path):
    res = cli("env=pendulum", "total_env_steps=2048", "logger=quiet", "eval.episodes=1", "hydra.run.dir=run")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if "experiment=" in ln]
    assert len(lines) == 1 and lines[0].startswith("[rltrain] preset experiment=ppo_pendulum"), res.stdout
    assert "experiment=" not in res.stderr  # stderr is for errors
    hydra = yaml.safe_load((tmp_path / "run" / ".hydra" / "overrides.yaml").read_text())
    assert "experiment=ppo_pendulum" in hydra, hydra  # composed with the preset, as announced
    generic = cli("env=pendulum", "experiment=none", "total_env_steps=2048", "logger=quiet", "eval.episodes=1",
                  "hydra.run.dir=run2")
    assert generic.returncode == 0, generic.stderr
    assert "[rltrain] algo=ppo's generic defaults are used on Pendulum-v1" in generic.stdout, generic.stdout
    quiet = cli("experiment=ppo_pendulum", "total_env_steps=2048", "logger=quiet", "eval.episodes=1",
                "hydra.run.dir=run3")
    assert quiet.returncode == 0 and "experiment=" not in quiet.stdout, quiet.stdout


@pytest.mark.parametrize("numpy_update", [True, False])
def test_ppo_with_one_env_and_continuous_actions(tmp_path, numpy_update):
    """One env (CleanRL's MuJoCo setting): rollouts [T, 1, ...] must still be flattened to T samples."""
    summary = run(compose_cfg(["env=pendulum", "env.num_envs=1", "algo.rollout_len=256", "algo.num_minibatches=8",
                               f"algo.numpy_update={numpy_update}", "algo.norm_obs=true", "algo.norm_reward=true",
                               "total_env_steps=768", "logger=quiet", "eval.episodes=1"]), tmp_path)
    assert summary["status"] == "completed" and summary["updates"] == 3
    assert np.isfinite(summary["final_eval_return"])


def test_summary_reports_the_mean_of_the_last_100_training_episodes(tmp_path):
    import csv

    summary = run(compose_cfg(["total_env_steps=20000", "logger=quiet", "eval.episodes=1"]), tmp_path)
    assert summary["episodes"] > 100
    last = summary["train_return_last100"]
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    # the metrics rows (and the display) keep following the last 20 episodes: a different, later window
    assert last is not None and np.isfinite(last)
    assert float(rows[-1]["rollout/episode_return"]) != pytest.approx(last)


@needs_mujoco
def test_sac_mujoco_trains_on_float64_observations(tmp_path):
    summary = run(compose_cfg(["experiment=sac_mujoco", "env.id=Hopper-v5", "total_env_steps=400",
                               "algo.learning_starts=200", "algo.batch_size=32", "logger=quiet",
                               "eval.episodes=1"]), tmp_path)
    assert summary["status"] == "completed" and np.isfinite(summary["final_eval_return"])


@pytest.mark.learning
@needs_mujoco
def test_ppo_mujoco_learns_inverted_pendulum(tmp_path):
    """The MuJoCo preset cut down to 40k steps on its easiest task (random play: ~5-10; the cap is 1000)."""
    summary = run(compose_cfg(["experiment=ppo_mujoco", "env.id=InvertedPendulum-v5", "total_env_steps=40960",
                               "logger=quiet", "seed=1"]), tmp_path)
    assert summary["final_eval_return"] >= 500, summary


def test_ornstein_uhlenbeck_noise_is_correlated_seeded_and_reset_per_env():
    from rltrain.models.heads import OrnsteinUhlenbeckNoise

    def draws(seed):
        noise, rng = OrnsteinUhlenbeckNoise(sigma=0.5), np.random.default_rng(seed)
        return noise, np.stack([noise.sample((2, 1), rng) for _ in range(2000)])

    noise, x = draws(0)
    assert np.array_equal(x, draws(0)[1]) and not np.array_equal(x, draws(1)[1])
    steps = x[:, 0, 0]
    assert np.corrcoef(steps[:-1], steps[1:])[0, 1] > 0.99  # white noise: ~0
    noise.reset(np.array([True, False]))
    assert noise.x[0, 0] == 0.0 and noise.x[1, 0] != 0.0


SAC_NOISE = ["experiment=sac_mountaincar_continuous", "algo.batch_size=32", "algo.train_frequency=8",
             "algo.gradient_steps=2", "checkpoint.replay_buffer=true", "logger=quiet", "eval.episodes=1",
             "eval.every_env_steps=0", "env.max_episode_steps=300"]


def test_sac_action_noise_is_applied_while_collecting_and_resumes_bitwise(tmp_path):
    from rltrain.run.checkpoint import load_checkpoint

    n = 1024
    run(compose_cfg(SAC_NOISE + [f"total_env_steps={2 * n}"]), tmp_path / "once")
    run(compose_cfg(SAC_NOISE + [f"total_env_steps={n}"]), tmp_path / "twice")
    run(compose_cfg(SAC_NOISE + [f"total_env_steps={2 * n}", "resume=auto"]), tmp_path / "twice")
    run(compose_cfg(SAC_NOISE + [f"total_env_steps={2 * n}", "algo.action_noise=0"]), tmp_path / "plain")
    once, twice, plain = (load_checkpoint(tmp_path / d / "checkpoints" / "final.pt")[0]
                          for d in ("once", "twice", "plain"))
    for k, v in once["algo"]["policy"].items():
        assert torch.equal(v, twice["algo"]["policy"][k]), k
    # the noise state travels with the collector (mid-episode here: 2048 steps, episodes of 300)
    assert once["collector"]["action_noise"].shape == (1, 1) and once["collector"]["action_noise"].abs().item() > 0
    assert plain["collector"]["action_noise"] is None

    def lag1(ckpt):  # autocorrelation of the stored actions after the uniform-random warm-up
        a = ckpt["algo"]["replay_buffer"]["actions"][: ckpt["algo"]["replay_buffer"]["size"], 0].numpy()
        return np.corrcoef(a[:-1], a[1:])[0, 1]

    assert lag1(once) > lag1(plain) + 0.2, (lag1(once), lag1(plain))
