"""A setting the user set that the run will not read is said at start, in one line (cli/unread.py): the settings
classes say which keys their values leave unread (``unread_keys``), only the user's own keys are said, and no
shipped preset sets a key its own run leaves unread."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from rltrain.algos.dqn import DQN, DQNSettings, RainbowSettings
from rltrain.algos.ippo import IPPOSettings
from rltrain.algos.ppo import PPOSettings
from rltrain.algos.sac import SAC, SACSettings
from rltrain.algos.td3 import TD3Settings
from rltrain.cli.presets import CONF
from rltrain.data.structs import EnvSpec, ObsSpace
from rltrain.errors import ConfigError
from rltrain.models.settings import ModelSettings
from tests.conftest import compose_cfg

PIXELS = ObsSpace("box", (4, 84, 84), "uint8", name="Box(0, 255, (4, 84, 84), uint8)")
VECTOR = ObsSpace("box", (4,), "float32", name="Box(-inf, inf, (4,), float32)")


def test_dqn_distributional_keys_are_read_only_under_their_head():
    plain = DQNSettings().unread_keys()
    assert plain["n_quantiles"] == "only algo.distributional=qr uses it (now none)"
    assert {"n_atoms", "v_min", "v_max"} <= plain.keys() and "loss" not in plain
    qr = DQNSettings(distributional="qr").unread_keys()
    assert "n_quantiles" not in qr and qr["n_atoms"] == "only algo.distributional=c51 uses it (now qr)"
    assert qr["loss"] == "only algo.distributional=none uses it (now qr)"
    c51 = DQNSettings(distributional="c51").unread_keys()
    assert not {"n_atoms", "v_min", "v_max"} & c51.keys() and "n_quantiles" in c51


def test_dqn_family_options_leave_their_own_settings_unread_when_off():
    dqn = DQNSettings().unread_keys()
    assert dqn["priority_alpha"] == "only algo.prioritized=true uses it (now false)"
    assert dqn["noisy_sigma0"] == "only algo.noisy=true uses it (now false)"
    assert dqn["her_k"] == "only algo.her=true uses it (now false)"
    rainbow = RainbowSettings().unread_keys()  # every option on: only the other head's keys and the TD loss
    assert set(rainbow) == {"n_quantiles", "loss", "her_k"}


def test_actor_critic_and_continuous_algorithms_say_their_conditional_keys():
    sac = SACSettings(autotune=False).unread_keys()
    assert sac["noise_theta"] == sac["noise_dt"] == "only algo.action_noise > 0 uses it (now 0)"
    assert sac["target_entropy_scale"] == "only algo.autotune=true uses it (now false)"
    assert not {"noise_theta", "target_entropy_scale"} & SACSettings(action_noise=0.2).unread_keys().keys()
    assert TD3Settings(target_policy_noise=0.0).unread_keys()["target_noise_clip"].startswith(
        "only algo.target_policy_noise > 0")
    assert "target_noise_clip" not in TD3Settings().unread_keys()
    assert PPOSettings().unread_keys(action_kind="discrete") == {
        "init_log_std": "only Box actions use it (the env's are discrete)"}
    assert PPOSettings().unread_keys(action_kind="box") == PPOSettings().unread_keys() == {}
    ippo = IPPOSettings(policies="per_agent").unread_keys()
    assert {"self_play_pool", "self_play_every", "self_play_sampling", "agent_id"} <= ippo.keys()
    assert not {"self_play_pool", "agent_id"} & IPPOSettings(self_play=True).unread_keys().keys()


def test_model_keys_follow_the_observation_and_the_algorithm_networks():
    model = ModelSettings(hidden_sizes=(128,))
    pixels = model.unread_keys(PIXELS, mlp_after_image=DQN.mlp_after_image)
    assert pixels["hidden_sizes"].startswith("the 4x84x84 uint8 image goes through the nature CNN alone")
    assert "activation" in pixels and "cnn_features" not in pixels
    assert "hidden_sizes" not in model.unread_keys(PIXELS, mlp_after_image=SAC.mlp_after_image)  # critic MLPs
    assert "hidden_sizes" not in ModelSettings(encoder="mlp").unread_keys(PIXELS)
    vector = model.unread_keys(VECTOR)
    assert "hidden_sizes" not in vector and vector["cnn_features"].startswith("only a CNN uses it")
    assert model.unread_keys()["core_size"] == "only model.core=lstm or gru uses it (now identity)"
    assert "core_size" not in ModelSettings(core="lstm").unread_keys()
    assert set(DQN.model_keys_unread) == {"shared", "critic_keys"} and set(SAC.model_keys_unread) == {"critic_keys"}


def _plain(overrides: list[str]) -> dict:
    return OmegaConf.to_container(compose_cfg(overrides), resolve=True)  # type: ignore[return-value]


def _run_settings(overrides: list[str], spec: EnvSpec):
    """A run's settings, the env spec given (what ``settings_from`` gives once it has probed the env)."""
    import dataclasses

    from rltrain.cli.build import validate

    return dataclasses.replace(validate(_plain(overrides)), env_spec=spec)


def test_only_the_keys_the_user_set_are_said():
    from rltrain.cli.unread import unread_lines, user_keys

    spec = EnvSpec(env_id="CartPole-v1", obs_shape=(4,), action_kind="discrete", action_shape=(), n_actions=2)
    overrides = ["algo=dqn", "experiment=none", "algo.n_quantiles=51", "algo.lr=0.001", "++model.core_size=64"]
    assert unread_lines(_run_settings(overrides, spec), overrides) == [
        "algo.n_quantiles=51 is not read: only algo.distributional=qr uses it (now none)",
        "model.core_size=64 is not read: only model.core=lstm or gru uses it (now identity)"]
    swept = ["algo=dqn", "experiment=none", "algo.distributional=qr", "algo.n_quantiles=51"]
    assert unread_lines(_run_settings(swept, spec), swept) == []  # read under qr: that job of a sweep is silent
    # what the user typed only: a preset's keys (experiment=auto picks one unasked), group choices, Hydra's own
    # keys and deletions are not the user's settings
    assert user_keys(["experiment=rainbow_cartpole", "algo=dqn"]) == set()
    assert user_keys(["hydra.run.dir=x", "~algo.lr", "++algo.n_atoms=3", "experiment=none"]) == {"algo.n_atoms"}


def test_rltrain_and_rltrain_check_say_a_user_set_unread_key_at_start(cli, tmp_path):
    res = cli("debug=smoke", "logger=quiet", "algo=dqn", "experiment=none", "algo.n_quantiles=51", "algo.lr=0.001",
              "total_env_steps=256", "algo.learning_starts=64", "eval.every_env_steps=0", "eval.episodes=1",
              "checkpoint.every_env_steps=0")
    assert res.returncode == 0, res.stderr[-2000:]
    said = [line for line in res.stdout.splitlines() if "is not read" in line]
    assert said == ["[rltrain] algo.n_quantiles=51 is not read: only algo.distributional=qr uses it (now none)"]
    # rltrain-check says it for each job of a sweep that leaves it unread, and the sweep stays valid
    check = subprocess.run([sys.executable, "-m", "rltrain.cli.check", "-m", "debug=smoke", "algo=dqn",
                            "experiment=none", "algo.distributional=none,qr", "algo.n_quantiles=51"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    said = [line for line in check.stdout.splitlines() if "is not read" in line]
    assert said == ["[rltrain-check] job 0: algo.n_quantiles=51 is not read: only algo.distributional=qr uses it "
                    "(now none)"]
    assert "2/2 job(s) valid" in check.stdout


def test_a_parallel_agents_own_overrides_are_checked_for_unread_keys(cli, tmp_path):
    """``trainer.agent_overrides`` were composed into each agent's settings without a word: agent 0's
    ``algo.n_quantiles`` (no QR head there) was silent. An agent's own unread key is said naming the agent; a
    command-line key is said once for the run, and again for an agent only where that agent says it otherwise."""
    args = ["debug=smoke", "logger=quiet", "algo=dqn", "experiment=none", "total_env_steps=512",
            "algo.learning_starts=64", "eval.every_env_steps=0", "eval.episodes=1", "checkpoint.every_env_steps=0",
            "algo.n_atoms=31", "trainer=parallel", "trainer.num_agents=2",
            'trainer.agent_overrides=[["algo.n_quantiles=51"],["algo.distributional=qr"]]']
    res = cli(*args)
    assert res.returncode == 0, res.stderr[-2000:]
    said = [line for line in res.stdout.splitlines() if "is not read" in line]
    assert said == [
        "[rltrain] algo.n_atoms=31 is not read: only algo.distributional=c51 uses it (now none)",
        "[rltrain] agent 0: algo.n_quantiles=51 is not read: only algo.distributional=qr uses it (now none)",
        "[rltrain] agent 1: algo.n_atoms=31 is not read: only algo.distributional=c51 uses it (now qr)",
    ], res.stdout[-3000:]
    check = subprocess.run([sys.executable, "-m", "rltrain.cli.check", *args], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    assert [line for line in check.stdout.splitlines() if "is not read" in line] == [
        line.replace("[rltrain]", "[rltrain-check]") for line in said]


def test_no_shipped_preset_sets_a_key_its_own_run_leaves_unread():
    from rltrain.algos.base import unread_keys as unread
    from rltrain.cli.build import algo_settings, make_settings, model_settings, resolve_target
    from rltrain.cli.presets import presets
    from rltrain.envs.make import EnvFactory, probe_env

    found = {}
    for preset in presets():
        plain = _plain([f"experiment={preset.name}"])
        try:
            spec = probe_env(make_settings(EnvFactory, plain["env"])).spec  # the observation the run gets
        except ConfigError:  # an optional extra not installed here (ale-py, MuJoCo): its settings alone then
            spec = None
        keys = preset_keys(preset.name)
        said = unread(resolve_target(plain["algo"], "algo"), algo_settings(plain), model_settings(plain), spec)
        found |= {f"{preset.name}: {key}": why for key, why in said.items() if key in keys}
    assert not found, found


def test_a_dqn_preset_run_recorded_before_the_unread_key_was_dropped_still_resumes():
    # experiment=dqn_atari / dqn_minatar recorded model.hidden_sizes [120, 84], which their CNN's Q head never read;
    # the presets dropped it, so a checkpoint of theirs must not be refused as a changed model
    from rltrain.run.resume_rules import config_changes, upgrade_config

    for preset in ("dqn_atari", "dqn_minatar"):
        current = _plain([f"experiment={preset}"])
        saved = {**current, "model": {**current["model"], "hidden_sizes": [120, 84]}}
        assert config_changes(saved, current)[0] == ["model.hidden_sizes: [120, 84] -> [64, 64]"]
        assert config_changes(upgrade_config(saved), current) == ([], [])
    # a run that read it (an MLP after the CNN: SAC) is still compared
    current = _plain(["algo=sac", "env=pendulum", "model.encoder=nature"])
    saved = {**current, "model": {**current["model"], "hidden_sizes": [120, 84]}}
    assert config_changes(upgrade_config(saved), current)[0]


def test_every_algorithm_that_builds_from_the_model_group_gets_it():
    """algo=rainbow (``Rainbow.__init__(..., **kwargs)``) dropped the whole model group: the factory read its
    own signature only. Every algorithm with a model-family network now builds the MLP width asked for."""
    import importlib

    import torch

    from rltrain.algos.base import takes_model
    from rltrain.cli.build import algo_factory
    from rltrain.cli.schema import options
    from rltrain.envs.make import EnvFactory, probe_env

    checked = []
    for name, info in options("algos").items():
        module, _, attr = info["target"].rpartition(".")
        cls = getattr(importlib.import_module(module), attr)
        if not takes_model(cls):
            continue
        env = "cartpole" if "discrete" in cls.action_kinds else "pendulum"
        plain = _plain([f"algo={name}", f"env={env}", "experiment=none", "model.hidden_sizes=[24]"])
        if name in ("ippo", "mappo"):  # a PettingZoo env's agents (their own tests build them from the group)
            continue
        spec = probe_env(EnvFactory(id=plain["env"]["id"])).spec
        algo = algo_factory(plain)(spec, num_envs=1, device=torch.device("cpu"))
        widths = {n for p in algo.policy.parameters() for n in p.shape}  # Linear and fused (TwinMLP) weights alike
        assert 24 in widths and 64 not in widths and 256 not in widths, (name, widths)
        checked.append(name)
    assert {"ppo", "dqn", "rainbow", "sac", "td3"} <= set(checked), checked


def preset_keys(name: str, conf: Path = CONF) -> set[str]:
    """The dotted keys an experiment preset sets (``model.hidden_sizes``), with those of the experiments it
    builds on (its ``defaults`` entries that are plain names); group choices (``override /algo``) are none."""
    path = conf / "experiment" / f"{name}.yaml"
    if not path.is_file():
        return set()
    doc = yaml.safe_load(path.read_text()) or {}
    keys: set[str] = set()
    for item in doc.get("defaults") or []:
        if isinstance(item, str) and item != "_self_":
            keys |= preset_keys(item, conf)
    return keys | set(_dotted({k: v for k, v in doc.items() if k != "defaults"}))


def _dotted(node: dict, prefix: str = "") -> Iterable[str]:
    for key, value in node.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, dict):
            yield from _dotted(value, path + ".")
