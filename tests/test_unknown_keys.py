"""An unknown key is one line: the closest real key, or the rltrain key behind another library's name for it
(SB3, CleanRL, rl-baselines3-zoo, torchbeast), the same line whether Hydra refused it (``algo.x=1``: "not in
struct") or the schema check did (``+algo.x=1``), and never "add it with +" inside a typed group."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rltrain.cli.aliases import COMMON, PER_ALGO, unknown_key
from rltrain.cli.build import check_config
from rltrain.cli.train import one_line
from rltrain.errors import ConfigError
from tests.conftest import compose_cfg, run_cli


def _has(cfg: dict, path: str) -> bool:
    node = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


ALIASES = [(algo, key, target) for algo, table in PER_ALGO.items() for key, (target, _, _) in table.items()]


@pytest.mark.parametrize(("algo", "key", "target"), ALIASES, ids=[f"{a}:{k}" for a, k, _ in ALIASES])
def test_every_other_librarys_name_points_at_a_real_key(algo, key, target):
    trainer = ["trainer=subprocess_actors"] if target and target.startswith("trainer.") else []
    cfg = OmegaConf.to_container(compose_cfg([f"algo={algo}", "experiment=none", *trainer]), resolve=True)
    assert key not in cfg["algo"]  # else it is no alias: the key exists
    line = unknown_key(f"algo.{key}", list(cfg["algo"]), algo=algo)
    assert line.startswith(f"algo.{key}: unknown key; ") and "+" not in line.split(";")[1], line
    if target is not None:
        assert _has(cfg, target), target
        assert f" is {target} here" in line or f" is {target}=" in line, line  # =: the value to set
    else:
        assert "has no counterpart here" in line, line


@pytest.mark.parametrize("key", sorted(COMMON))
def test_every_common_name_points_at_a_real_key(key):
    target = COMMON[key][0]
    cfg = OmegaConf.to_container(compose_cfg(["experiment=none"]), resolve=True)
    if target is not None:
        assert _has(cfg, target), target
    assert not _has(cfg, key) or target == key  # seed, device: top-level keys typed inside a group


@pytest.mark.parametrize(("overrides", "line"), [
    # a DDPG user's policy_delay is TD3's own key, not SB3 TD3's name for SAC's policy_frequency
    (["algo=ddpg", "algo.policy_delay=2"], "algo.policy_delay: unknown key; policy_delay is a key of algo=td3, not "
                                           "of algo=ddpg"),
    # on a Q-learner SB3's n_steps is n-step returns, not PPO's rollout length
    (["algo=dqn", "algo.n_steps=3"], "algo.n_steps: unknown key; SB3's n_steps is algo.n_step here (n-step returns)"),
    (["algo=rainbow", "algo.n_steps=3"], "algo.n_steps: unknown key; SB3's n_steps is algo.n_step here"),
    (["algo=td3", "algo.n_steps=3"], "algo.n_steps: unknown key; SB3's n_steps has no counterpart here: n-step "
                                     "returns are algo.n_step of algo=dqn and algo=rainbow"),
    (["algo=dqn", "algo.categorical=true"], "algo.categorical: unknown key; categorical DQN (C51) is "
                                            "algo.distributional=c51 here"),
    # another algorithm's alias whose key this algorithm has too: here, not "of algo=dqn"
    (["algo=pqn", "algo.learning_rate=1e-3"], "algo.learning_rate: unknown key; SB3 / CleanRL's learning_rate is "
                                              "algo.lr here"),
    (["algo=ppo", "algo.n_step=3"], "algo.n_step: unknown key; n_step is a key of algo=dqn, algo=rainbow, not of "
                                    "algo=ppo"),
    # this algorithm's close keys come before another algorithm's
    (["algo=sac", "algo.lr=1e-3"], "algo.lr: unknown key; did you mean 'q_lr'? (lr is a key of algo=ddpg, "
                                   "algo=td3"),
])
def test_the_hint_is_about_the_algorithm_the_user_runs(overrides, line):
    with pytest.raises(Exception) as err:
        compose_cfg(overrides)
    assert one_line(err.value).startswith(line), one_line(err.value)


@pytest.mark.parametrize(("overrides", "line"), [
    (["algo=dqn", "algo.target_update_interval=500"],
     "algo.target_update_interval: unknown key; SB3's target_update_interval is algo.target_network_frequency here "
     "(in env steps)"),
    (["algo.target_update_interval=500"],  # PPO: another algorithm's setting, named with it
     "algo.target_update_interval: unknown key; SB3's target_update_interval is algo.target_network_frequency of "
     "algo=dqn (in env steps)"),
    (["algo.n_steps=128"], "algo.n_steps: unknown key; SB3's n_steps is algo.rollout_len here"),
    (["algo.num_steps=128"], "algo.num_steps: unknown key; CleanRL's num_steps is algo.rollout_len here"),
    (["algo.learning_rate=1e-3"], "algo.learning_rate: unknown key; SB3 / CleanRL's learning_rate is algo.lr here"),
    (["algo=sac", "algo.ent_coef=0.1"], "algo.ent_coef: unknown key; SB3's ent_coef is algo.alpha here"),
    (["algo=impala", "algo.entropy_cost=0.01"], "algo.entropy_cost: unknown key; torchbeast's entropy_cost is "
                                                 "algo.ent_coef here"),
    (["algo.hidden_sizes=[32]"], "algo.hidden_sizes: unknown key; the MLP width is model.hidden_sizes, one setting "
                                 "for every algorithm"),
    (["algo.lrr=0.1"], "algo.lrr: unknown key; did you mean 'lr'? (valid: action_mask, rollout_len, "),
    (["total_timesteps=1000"], "total_timesteps: unknown key; SB3 learn() / CleanRL's total_timesteps is "
                               "total_env_steps here"),
    (["eval.episode=3"], "eval.episode: unknown key; did you mean 'episodes'? (valid: every_env_steps, episodes"),
    (["trainer=subprocess_actors", "trainer.preemption.fraction=1"],
     "trainer.preemption.fraction: unknown key; did you mean 'fraction_workers', 'fraction_samples'?"),
])
def test_hydra_and_the_schema_check_say_the_same_line(overrides, line):
    """Without ``+`` Hydra refuses the key while composing; with it the key reaches cli/build.py: one line."""
    with pytest.raises(Exception) as err:
        compose_cfg(overrides)
    from_hydra = one_line(err.value)
    added = [f"+{o}" if o == overrides[-1] else o for o in overrides]
    cfg = OmegaConf.to_container(compose_cfg(added), resolve=True)
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert from_hydra == str(err.value) and from_hydra.startswith(line), (from_hydra, str(err.value))
    assert "+" not in from_hydra and "\n" not in from_hydra


def test_a_missing_group_key_and_a_free_form_mapping():
    """A key under a group that has none (trainer=sequential's preemption) names that key; a new key inside a
    free-form mapping (env.kwargs) is fine: it takes ``+``."""
    with pytest.raises(Exception) as err:
        compose_cfg(["trainer.preemption.fraction_workers=0.5"])
    assert one_line(err.value) == "trainer.preemption: unknown key (trainer takes no keys here)"
    with pytest.raises(Exception) as err:
        compose_cfg(["env.kwargs.size=3"])
    assert one_line(err.value) == ("env.kwargs.size: env.kwargs has no key 'size' yet; it is a free-form mapping: "
                                   "add one with +env.kwargs.size=...")
    assert compose_cfg(["+env.kwargs.size=3"]).env.kwargs.size == 3


def test_the_command_line_says_it_in_one_line_and_exits_2(tmp_path):
    for args in (["algo=dqn", "algo.target_update_interval=500"], ["algo=dqn", "+algo.target_update_interval=500"]):
        res = run_cli(["debug=smoke", *args], cwd=tmp_path, timeout=120)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert lines[0] == ("rltrain: error: algo.target_update_interval: unknown key; SB3's target_update_interval "
                            "is algo.target_network_frequency here (in env steps)")
