"""A setting that is meaningless, or that silently disables part of the algorithm, is refused in one line naming
the key, its value and what would work: the ranges of the settings classes (every algorithm's discount alike), and
an off-policy run that could never take a gradient step (a batch its replay never holds, a budget too short to
fill one), refused at start by ``rltrain`` and ``rltrain-check`` alike, before a run dir exists."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from rich.console import Console

from rltrain.algos.ddpg import DDPGSettings
from rltrain.algos.dqn import DQNSettings, RainbowSettings
from rltrain.algos.pqn import PQNSettings
from rltrain.algos.sac import SACSettings
from rltrain.algos.td3 import TD3Settings
from rltrain.cli import build, check, schema
from rltrain.cli.presets import resolve_experiment
from rltrain.errors import ConfigError
from tests.conftest import compose_cfg, run_cli
from tests.test_faults import _pythonpath

REPLAY = [DQNSettings, RainbowSettings, SACSettings, TD3Settings, DDPGSettings]
PEERS = str(Path(__file__).resolve().parents[1] / "scripts" / "peers")


def settings_classes() -> dict[str, type]:
    """Every ``algo=<name>`` the schema finds -> its settings class (a new algorithm is covered on its own)."""
    out = {}
    for name, info in schema.options("algos").items():
        module, cls = info["settings"]
        out[name] = getattr(importlib.import_module(module), cls)
    return out


@pytest.mark.parametrize("gamma", [1.5, -0.1, float("nan")])
def test_every_algorithm_refuses_a_discount_outside_0_1_alike(gamma):
    for name, cls in settings_classes().items():
        with pytest.raises(ConfigError) as err:
            cls(gamma=gamma)
        assert str(err.value) == f"algo.gamma={gamma} must lie in [0, 1]", name
    for cls in settings_classes().values():  # both ends are discounts (a bandit's 0, an episodic task's 1)
        cls(gamma=0.0), cls(gamma=1.0)


@pytest.mark.parametrize("cls", REPLAY, ids=lambda c: c.__name__)
def test_a_batch_larger_than_the_replay_is_refused_by_every_replay_learner(cls):
    with pytest.raises(ConfigError) as err:
        cls(batch_size=1000, buffer_size=500, her=cls is not RainbowSettings)  # with hindsight relabelling too
    assert str(err.value) == ("algo.batch_size=1000 > algo.buffer_size=500: the replay never holds one batch, so no "
                              "gradient step would ever be taken; lower algo.batch_size (e.g. 250) or raise "
                              "algo.buffer_size (e.g. 2000)")
    cls(batch_size=500, buffer_size=500)  # the settings alone cannot know the env streams: preflight's to say


# (settings class, refused values, its line, a legitimate neighbour kept): a rising epsilon (start_e < end_e) is odd
# but a schedule all the same; exploration_fraction=1 ends the decay with the run; noise_theta x noise_dt = 1 pulls
# the noise back to 0 each step (white noise), theta = 0 lets it walk; no smoothing noise needs no clip
RANGES = [
    (DQNSettings, {"start_e": 1.5}, "algo.start_e=1.5 must lie in [0, 1]: a probability of acting at random",
     {"start_e": 0.05, "end_e": 1.0}),
    (DQNSettings, {"end_e": -0.1}, "algo.end_e=-0.1 must lie in [0, 1]: a probability of acting at random",
     {"start_e": 0.1, "end_e": 0.1}),
    (DQNSettings, {"exploration_fraction": 5}, "algo.exploration_fraction=5 must lie in (0, 1]: the share of "
     "total_env_steps over which epsilon goes from algo.start_e to algo.end_e; past 1 the run ends before epsilon "
     "reaches algo.end_e=0.05", {"exploration_fraction": 1.0}),
    (PQNSettings, {"exploration_fraction": 1.5}, "algo.exploration_fraction=1.5 must lie in (0, 1]",
     {"exploration_fraction": 1.0}),
    (PQNSettings, {"start_e": -1}, "algo.start_e=-1 must lie in [0, 1]", {"start_e": 0.0}),
    (RainbowSettings, {"noisy_sigma0": -0.5}, "algo.noisy_sigma0=-0.5 must be > 0", {"noisy_sigma0": 0.1}),
    (RainbowSettings, {"noisy_sigma0": 0}, "algo.noisy_sigma0=0 must be > 0", {"noisy": False}),
    (DQNSettings, {"max_grad_norm": 0}, "algo.max_grad_norm=0 must be > 0", {"max_grad_norm": None}),
    # a stack of one frame is the observation itself: refused as the message's own range says (0 stores it whole)
    (DQNSettings, {"frame_stack": 1}, "algo.frame_stack=1: K >= 2, 0 (whole stacks stored) or null (inferred)",
     {"frame_stack": 0}),
    (RainbowSettings, {"priority_alpha": 1.5}, "algo.priority_alpha=1.5 must lie in [0, 1]", {"priority_alpha": 0}),
    (RainbowSettings, {"priority_beta0": -0.5}, "algo.priority_beta0=-0.5 must lie in [0, 1]",
     {"priority_beta0": 1}),
    *[(cls, {"tau": 0}, "algo.tau=0 must lie in (0, 1]", {"tau": 1.0}) for cls in REPLAY],
    (DQNSettings, {"tau": 1.5}, "algo.tau=1.5 must lie in (0, 1]", {"tau": 0.005}),
    (SACSettings, {"noise_dt": 0}, "algo.noise_dt=0 must be > 0", {"noise_dt": 1.0, "noise_theta": 1.0}),
    (SACSettings, {"noise_theta": -0.15}, "algo.noise_theta=-0.15 must be >= 0", {"noise_theta": 0.0}),
    (SACSettings, {"noise_theta": 200}, "algo.noise_theta=200 x algo.noise_dt=0.01 = 2 must be <= 1 (the share of "
     "the way back to 0 the noise moves each step); lower either (SB3's: 0.15 and 0.01)", {"noise_theta": 100}),
    (SACSettings, {"target_entropy_scale": float("inf")}, "algo.target_entropy_scale=inf must be a finite number",
     {"target_entropy_scale": -0.5}),
    (TD3Settings, {"target_noise_clip": 0}, "algo.target_noise_clip=0 clips the target smoothing noise "
     "(algo.target_policy_noise=0.2) to nothing; set algo.target_noise_clip > 0 (TD3's 0.5), or "
     "algo.target_policy_noise=0 to turn smoothing off", {"target_noise_clip": 0, "target_policy_noise": 0}),
]


@pytest.mark.parametrize(("cls", "values", "message", "kept"), RANGES,
                         ids=[f"{c.__name__}-{next(iter(v))}={next(iter(v.values()))}" for c, v, _, _ in RANGES])
def test_a_value_outside_its_range_is_one_line_naming_key_value_and_range(cls, values, message, kept):
    with pytest.raises(ConfigError) as err:
        cls(**values)
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
    cls(**kept)  # its legitimate neighbour


SMOKE = ["debug=smoke", "logger=quiet"]
GOALS = [f"env.search_path={PEERS}", "algo.her=true"]  # goal-conditioned tasks: BitFlip's bits, PointReach's Box
# (overrides, the line): debug=smoke's updates are algo.rollout_len (64) x env.num_envs (4) = 256 env steps
NEVER_A_STEP = [
    (["algo=dqn", "algo.learning_starts=0", "algo.batch_size=10000", "algo.buffer_size=20000", "total_env_steps=3000"],
     "total_env_steps=3000 puts 3072 transitions into the replay (3068 sampleable: the newest of each env stream (4) "
     "waits for its successor), fewer than algo.batch_size=10000: no gradient step would ever be taken; set "
     "total_env_steps >= 10240 or algo.batch_size <= 3068"),
    # as many transitions as a batch: each env stream's newest waits for its successor, so the replay never has one
    (["algo=sac", "env=pendulum", "experiment=none", "algo.learning_starts=0", "total_env_steps=256"],
     "total_env_steps=256 puts 256 transitions into the replay (252 sampleable: the newest of each env stream (4) "
     "waits for its successor), fewer than algo.batch_size=256: no gradient step would ever be taken; set "
     "total_env_steps >= 512 or algo.batch_size <= 252"),
    (["algo=td3", "env=pendulum", "algo.learning_starts=0", "total_env_steps=256"],
     "(255 sampleable: the newest of each env stream (1) waits for its successor), fewer than algo.batch_size=256"),
    (["algo=ddpg", "env=pendulum", "algo.learning_starts=0", "total_env_steps=256"],
     "(255 sampleable: the newest of each env stream (1) waits for its successor), fewer than algo.batch_size=256"),
    (["algo=rainbow", "experiment=none", "algo.learning_starts=0", "algo.batch_size=600", "total_env_steps=512"],
     "total_env_steps=512 puts 512 transitions into the replay (508 sampleable: the newest of each env stream (4) "
     "waits for its successor), fewer than algo.batch_size=600"),
    # behind actors the learner's replay takes every actor's streams: each holds its newest row back, at most
    (["algo=dqn", *GOALS, "env.id=bench_envs:BitFlip", "trainer=subprocess_actors", "trainer.num_actors=2",
      "algo.learning_starts=0", "algo.batch_size=1024", "total_env_steps=512"],
     "total_env_steps=512 puts 512 transitions into the replay, fewer than algo.batch_size=1024: no gradient step "
     "would ever be taken; set total_env_steps >= 1"),
    (["algo=td3", *GOALS, "env.id=bench_envs:PointReach", "algo.learning_starts=0", "total_env_steps=256"],
     "total_env_steps=256 puts 256 transitions into the replay (252 sampleable"),
    # a replay as large as a batch never holds one: each env stream's newest row waits for its successor
    (["algo=dqn", "algo.learning_starts=0", "algo.batch_size=1000", "algo.buffer_size=1000"],
     "algo.batch_size=1000 > the 996 transitions the replay can offer at most: algo.buffer_size=1000 rows less the "
     "newest of each env stream (4), whose successor is not there yet, so no gradient step would ever be taken; "
     "lower algo.batch_size (e.g. 500) or raise algo.buffer_size (e.g. 2004)"),
    (["algo=dqn", "algo.batch_size=1000", "algo.buffer_size=500", "total_env_steps=5000"],
     "algo.batch_size=1000 > algo.buffer_size=500: the replay never holds one batch"),
    (["trainer=parallel", "trainer.num_agents=2", "algo=sac", "env=pendulum", "algo.learning_starts=0",
      "total_env_steps=512"], "trainer=parallel: agent 0 of 2 gets 256 of total_env_steps=512: total_env_steps=256 "
                              "puts 256 transitions into the replay (255 sampleable"),
]


@pytest.mark.parametrize(("overrides", "message"), NEVER_A_STEP, ids=[" ".join(o) for o, _ in NEVER_A_STEP])
def test_a_run_that_could_never_take_a_gradient_step_is_refused_by_rltrain_and_rltrain_check(tmp_path, overrides,
                                                                                                message):
    resolved, _ = resolve_experiment([*SMOKE, *overrides])  # the preset each tool picks (experiment=auto)
    with pytest.raises(ConfigError) as err:
        build.run(compose_cfg([*SMOKE, *overrides]), tmp_path / "run")  # compose_cfg resolves it as rltrain does
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "run" / "summary.json").exists()
    console = Console(record=True, width=600)
    assert check.check(resolved, console) == 2
    assert message in console.export_text().replace("\n", "")


def test_the_values_the_lines_suggest_are_kept(tmp_path):
    """The budget or the batch a line names, accepted where the line's own run was refused."""
    base = ["algo=dqn", "algo.learning_starts=0", "algo.buffer_size=20000"]
    for overrides, works in ((["algo.batch_size=10000", "total_env_steps=3000"], ["total_env_steps=10240"]),
                             (["algo.batch_size=10000", "total_env_steps=3000"], ["algo.batch_size=3068"]),
                             (["algo.batch_size=20000", "total_env_steps=50000"], ["algo.batch_size=19996"]),
                             (["algo.batch_size=20000", "total_env_steps=50000"], ["algo.buffer_size=40004"])):
        with pytest.raises(ConfigError, match="no gradient step would ever be taken"):
            build.build_trainer(build.prepare(compose_cfg([*SMOKE, *base, *overrides])), tmp_path / "run")
        build.build_trainer(build.prepare(compose_cfg([*SMOKE, *base, *overrides, *works])), tmp_path / "run")


def test_a_suggested_budget_takes_a_gradient_step(tmp_path):
    """The budget the line names is one that trains: its run logs a TD loss (no update ran without one)."""
    from rltrain.run.metrics import read_metrics

    base = [*SMOKE, "algo=dqn", "experiment=none", "env.num_envs=1", "algo.rollout_len=1", "algo.learning_starts=0",
            "algo.batch_size=300", "algo.train_frequency=4", "log.every_env_steps=4", "eval.every_env_steps=0",
            "eval.episodes=1", "checkpoint.every_env_steps=0", "model.hidden_sizes=[16]"]
    with pytest.raises(ConfigError, match=r"total_env_steps=299 puts 299 transitions .* set total_env_steps >= 304 "):
        build.run(compose_cfg([*base, "total_env_steps=299"]), tmp_path / "short")
    build.run(compose_cfg([*base, "total_env_steps=304"]), tmp_path / "run")
    assert any(row.get("loss/q") not in (None, "") for row in read_metrics(tmp_path / "run" / "metrics.csv"))


def test_the_cli_says_it_in_one_line_exits_2_and_leaves_no_run_dir(tmp_path):
    res = run_cli(["algo=dqn", "algo.batch_size=10000", "total_env_steps=3000", "hydra.run.dir=run"], cwd=tmp_path,
                  timeout=120, env={"PYTHONPATH": _pythonpath()})  # this checkout's rltrain, whatever is installed
    assert res.returncode == 2, res.stderr[-3000:]
    assert [line for line in res.stderr.splitlines() if line.strip()] == [
        "rltrain: error: total_env_steps=3000 puts 3000 transitions into the replay (2996 sampleable: the newest of "
        "each env stream (4) waits for its successor), fewer than algo.batch_size=10000: no gradient step would ever "
        "be taken; set total_env_steps >= 10128 or algo.batch_size <= 2872"]
    assert not (tmp_path / "run").exists() and not (tmp_path / "outputs").exists()
