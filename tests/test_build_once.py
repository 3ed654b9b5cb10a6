"""Each thing is built once per run: ONE env is built and reset before the run starts (its action mask, its
spaces) and its spec is handed on, to the loop and to actor processes, which build no env to read it; the
sequential loop trains the very algorithm the pre-flight checks built; the sizes of one update (PPO's
``rollout_len: null``) come from one function that the checks, ``rltrain-check`` and the loop share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from rich.console import Console

from rltrain.cli import build, check
from rltrain.cli.presets import resolve_experiment
from rltrain.errors import ConfigError
from tests.conftest import compose_cfg

torch.set_num_threads(1)
# two envs, the final evaluation's two episodes side by side (one mode), no periodic evaluation
SMALL = ["debug=smoke", "logger=quiet", "eval.every_env_steps=0", "eval.episodes=2", "eval.both_modes=false",
         "checkpoint.every_env_steps=0", "env.num_envs=2", "algo.rollout_len=16", "total_env_steps=64"]


def _counting_env(tmp_path: Path) -> tuple[list[str], Path]:
    log = tmp_path / "env_calls.log"
    return ["env.id=tests.helpers.counting_env:make", f"+env.kwargs.log={log}"], log


def _calls(log: Path) -> list[int]:
    return [int(pid) for pid in log.read_text().split()]


def test_a_sequential_run_builds_one_env_to_look_at_and_its_algorithm_once(tmp_path, monkeypatch):
    from rltrain.algos.ppo import PPO

    built: list[PPO] = []
    init = PPO.__init__

    def counted(self, *args, **kwargs):
        built.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(PPO, "__init__", counted)
    env, log = _counting_env(tmp_path)
    summary = build.run(compose_cfg(["algo=ppo", *SMALL, *env]), tmp_path / "run")
    assert summary["status"] == "completed"
    # the probe (mask, spaces, reset), the vector env's 2 envs, the final evaluation's 2 envs: nothing else
    assert _calls(log) == [os.getpid()] * (1 + 2 + 2)
    assert len(built) == 1  # model.txt describes, and the loop trains, the one instance
    assert (tmp_path / "run" / "model.txt").read_text().startswith("algo=ppo")


def test_actor_processes_get_the_probed_spec_instead_of_building_an_env_to_read_it(tmp_path):
    env, log = _counting_env(tmp_path)
    summary = build.run(compose_cfg(["algo=impala", *SMALL, *env, "trainer=subprocess_actors",
                                     "trainer.num_actors=1", "trainer.envs_per_actor=2"]), tmp_path / "run")
    assert summary["status"] == "completed"
    calls = _calls(log)
    here = [p for p in calls if p == os.getpid()]
    actor = [p for p in calls if p != os.getpid()]
    assert len(here) == 1 + 2  # the probe, the final evaluation's 2 envs
    assert len(actor) == 2 and len(set(actor)) == 1  # the actor's vector env: no probe of its own


def test_the_budget_check_counts_the_rollout_ppo_will_collect_when_rollout_len_is_null(tmp_path):
    """``experiment=none``: PPO's ``rollout_len: null`` is 512 steps per env over 4 envs; one update is 2048 env
    steps, so a budget of 1000 trains nothing it asked for (the loop would round it up to 2048)."""
    overrides = ["experiment=none", "env=cartpole", "env.num_envs=4", "total_env_steps=1000", "logger=quiet"]
    message = ("total_env_steps=1000 is less than one update: algo.rollout_len (512) x env.num_envs (4) = 2048 "
               "env steps; set total_env_steps >= 2048")
    with pytest.raises(ConfigError) as err:
        build.run(compose_cfg(overrides), tmp_path / "run")
    assert message in str(err.value)
    assert not (tmp_path / "run" / "summary.json").exists()
    console = Console(record=True, width=400)
    assert check.check(resolve_experiment(overrides)[0], console) == 2
    assert message in console.export_text().replace("\n", "")
    # at the budget of one update it builds, and every reader of the sizes agrees with the algorithm itself
    enough = [o for o in overrides if not o.startswith("total_env_steps")] + ["total_env_steps=2048"]
    trainer = build.build_trainer(build.prepare(compose_cfg(enough)), tmp_path / "ok",
                                  check_only=True)
    size = trainer.update_size()
    assert (size.rollout_len, size.num_minibatches, size.env_steps) == (512, 32, 2048)
    rows = dict(check.batch_rows(trainer.settings.config, trainer))
    assert rows["env steps per update"] == "4 envs x 512 rollout_len = 2048"
    assert rows["minibatch"].startswith("2048 / 32 minibatches = 64 samples")
