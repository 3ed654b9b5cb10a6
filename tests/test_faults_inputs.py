"""Every bad input is one line and a non-zero exit, or works where it is legitimate.

Build-time refusals run in-process through ``build.run`` (what ``rltrain`` calls) and ``check.check`` (what
``rltrain-check`` calls), so both say the same; a few run as real ``rltrain`` subprocesses to check the line on
stderr and the exit code; resume mismatches and the resume command run real training.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from rltrain.cli import build, check
from rltrain.errors import ConfigError
from rltrain.run.lock import RunDirLock
from rltrain.run.summary import hydra_quote, resume_command
from rltrain.sweeps.callbacks import record_failure, sweep_exit_code, this_sweeps_jobs
from tests.conftest import compose_cfg, run_cli
from tests.test_faults import _pythonpath, _stderr_lines, _train

SMOKE = ["debug=smoke", "logger=quiet"]
BAD_ENV = "env.id=tests.helpers.bad_envs:"

REFUSED = [
    (["algo.lr=nan"], "algo.lr=nan: must be a finite number"),
    (["algo.lr=inf"], "algo.lr=inf: must be a finite number"),
    (["algo.max_grad_norm=nan"], "algo.max_grad_norm=nan: must be a finite number"),
    (["algo=sac", "env=pendulum", "algo.tau=nan"], "algo.tau=nan: must be a finite number"),
    (["model.hidden_sizes=[0]"], "model.hidden_sizes=[0]: every width must be a positive integer"),
    (["algo.target_kl=-1"], "algo.target_kl=-1 must be > 0"),
    (["target_return=nan"], "target_return=nan must be a finite number or null"),
    (["eval.target_return=inf"], "eval.target_return=inf must be a finite number or null"),
    (["env.max_episode_steps=-5"], "env.max_episode_steps=-5 must be a positive integer"),
    (["env.max_episode_steps=0"], "env.max_episode_steps=0 must be a positive integer"),
    (["max_wall_time=0s"], "max_wall_time=0s must be > 0"),
    (["max_wall_time=0"], "max_wall_time=0 must be a finite number of seconds > 0"),
    (["algo=dqn", "algo.learning_starts=2048"],
     "total_env_steps=2048 <= algo.learning_starts=2048: no gradient step would ever be taken"),
    (["total_env_steps=100"], "total_env_steps=100 is less than one update: algo.rollout_len (64) x "
                              "env.num_envs (4) = 256 env steps; set total_env_steps >= 256"),
    (["trainer=distributed_simulator", "total_env_steps=300"],
     "algo.rollout_len (64) x env.num_envs (4) x trainer.world_size (2) = 512 env steps"),
    (["env.num_envs=1000000000"], "env.num_envs=1000000000 is more envs than one worker can step"),
    # 50000 envs x 1e7 steps of CartPole: 5e11 env steps x 50 bytes (2 x 16 obs + 8 action + 10): 23 TiB
    (["env.num_envs=50000", "algo.rollout_len=10000000", "total_env_steps=500000000000"],
     "one update's rollout needs 23283.1 GiB: algo.rollout_len (10000000) x env.num_envs (50000) = 500000000000 "
     "env steps x 50 bytes per step"),
    (["env.vectorization=async", "env.num_envs=4096", "total_env_steps=1000000"],
     "env.vectorization=async would start 4096 env processes"),
    (["trainer._target_=rltrain.trainers.nope.Trainer"], "trainer._target_='rltrain.trainers.nope.Trainer' cannot be "
                                                         "imported"),
    (["trainer._target_=os.system"], "trainer._target_='os.system' must name a class under 'rltrain.'"),
    ([f"{BAD_ENV}RaisingReset"], "reset() raised RuntimeError: simulator license server unreachable"),
    ([f"{BAD_ENV}needs_simulator"], 'needs a package that is not installed: fancysim is not installed, run '
                                    '`pip install "fancysim>=2"`'),
    (["env.id=tests.helpers.raises_on_import:Env"], "cannot import 'tests.helpers.raises_on_import' "
                                                    "(libsimulator.so.3: cannot open shared object file)"),
    *[([f"algo={a}", "env.id=tests.helpers.obs_envs:UnboundedActions", "algo.learning_starts=64"],
       f"algo={a} needs finite Box action bounds; env.id=tests.helpers.obs_envs:UnboundedActions has low=")
      for a in ("sac", "td3", "ddpg")],
]


@pytest.mark.parametrize(("overrides", "message"), REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_bad_input_is_refused_at_build_in_rltrain_and_rltrain_check(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as err:
        build.run(compose_cfg([*SMOKE, *overrides]), tmp_path / "run")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "run" / "summary.json").exists()  # nothing started
    console = Console(record=True, width=400)
    assert check.check([*SMOKE, *overrides], console) == 2
    assert message in console.export_text().replace("\n", "")


def test_legitimate_neighbours_of_the_refused_values_still_build(tmp_path):
    for overrides in (["env.max_episode_steps=5"], ["algo.target_kl=null"], ["max_wall_time=1h"],
                      # the warm-up's last step, then a round every env step: one round in the last update
                      ["algo=dqn", "algo.learning_starts=2047", "algo.train_frequency=1"], ["total_env_steps=256"],
                      ["target_return=475"],
                      ["algo=ppo", "env.id=tests.helpers.obs_envs:UnboundedActions", "algo.rollout_len=16"]):
        build.build_trainer(build.prepare(compose_cfg([*SMOKE, *overrides])), tmp_path / "run")


@pytest.mark.parametrize(("overrides", "line"), [
    (["algo.lr=nan"], "rltrain: error: algo.lr=nan: must be a finite number (nan and inf train nothing)"),
    # the user's env raised: its traceback is kept in the run dir, which the line names
    ([f"{BAD_ENV}RaisingReset"], "rltrain: error: env.id=tests.helpers.bad_envs:RaisingReset: reset() raised "
                                 "RuntimeError: simulator license server unreachable; fix the env or its env.kwargs; "
                                 "traceback in {run}/error.txt"),
    (["trainer=distributed_simulator", "trainer.master_addr=256.1.1.1"],
     "rltrain: error: trainer.master_addr=256.1.1.1: cannot listen on it for the rendezvous (Name or service not "
     "known); use 127.0.0.1 or an address of this machine"),
    (["hydra.run.dir=/proc/x"], "rltrain: error: hydra.run.dir=/proc/x: cannot create it (No such file or "
                                "directory); pick a writable hydra.run.dir"),
], ids=["nan-lr", "raising-reset", "master-addr", "unwritable-run-dir"])
def test_bad_input_is_one_line_and_exit_2_from_the_cli(tmp_path, overrides, line):
    res = _train(tmp_path / "run", *overrides)
    assert res.returncode == 2, res.stderr[-3000:]
    assert _stderr_lines(res) == [line.format(run=tmp_path / "run")]


# -- resuming a checkpoint of another run ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("small") / "run"
    res = _train(run_dir, "total_env_steps=512", "eval.every_env_steps=0", "checkpoint.every_env_steps=0")
    assert res.returncode == 0, res.stderr
    return run_dir


@pytest.mark.parametrize(("overrides", "what"), [
    (["model.hidden_sizes=[32]"], "model.hidden_sizes: [64, 64] -> [32]"),
    (["model.activation=relu"], "model.activation: 'tanh' -> 'relu'"),
    (["env=acrobot"], "env.id: 'CartPole-v1' -> 'Acrobot-v1'"),
    (["algo=a2c"], "algo._target_: 'rltrain.algos.ppo.PPO' -> 'rltrain.algos.a2c.A2C'"),
    (["+env.kwargs.sutton_barto_reward=true"], "env.kwargs.sutton_barto_reward: (unset) -> True"),
], ids=["architecture", "model", "env", "algorithm", "env-kwargs"])
def test_resuming_a_checkpoint_of_another_run_names_what_differs(small_run, tmp_path, overrides, what):
    ckpt = small_run / "checkpoints" / "final.pt"
    with pytest.raises(ConfigError) as err:
        build.run(compose_cfg([*SMOKE, f"resume={ckpt}", "total_env_steps=1024", *overrides]), tmp_path / "run")
    line = str(err.value)
    assert line.startswith(f"resume={ckpt}: this run's settings differ from the checkpoint's: "), line
    assert what in line and "resume_allow_changes=[" in line and "\n" not in line, line


@pytest.mark.slow  # two rltrain runs of 2 s wall time each, plus start-up: ~20 s on a busy machine
def test_resume_command_survives_quotes_and_hydra_syntax_in_the_run_dir(tmp_path):
    # (a "${" in a run dir cannot even start: Hydra interpolates its own logging config's copy of the path)
    run_dir = tmp_path / "it's a=run,dir [1]"
    res = run_cli([*SMOKE, f"hydra.run.dir={hydra_quote(str(run_dir))}", "total_env_steps=100000000",
                   "max_wall_time=2s", "eval.every_env_steps=0"], cwd=tmp_path, timeout=120,
                  env={"PYTHONPATH": _pythonpath()})
    assert res.returncode == 3, res.stderr[-3000:]  # stopped by max_wall_time, checkpointed
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = summary["total_env_steps"]
    command = summary["resume_command"]
    assert command.endswith("resume=auto") and "max_wall_time=2s" in command
    env = {**os.environ, "PYTHONPATH": _pythonpath(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("HYDRA_FULL_ERROR", None)
    again = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 3, again.stderr[-3000:]
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["resumed_from_env_steps"] == steps and resumed["total_env_steps"] > steps
    assert sorted(p.name for p in tmp_path.iterdir()) == [run_dir.name]  # the same dir, no second one


@pytest.mark.parametrize("value", ["plain/dir_1.2-3", "it's", "a b=c,d", "back\\slash\\", "q\\'uote", "${x}", "ü"])
def test_hydra_quote_round_trips_through_shell_and_hydra_grammar(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    arg = shlex.split(shlex.join([f"hydra.run.dir={hydra_quote(value)}"]))[0]
    parsed = OverridesParser.create().parse_override(arg).value()
    assert OmegaConf.create({"d": parsed}).d == value  # interpolation resolved as Hydra will


def test_resume_command_keeps_the_other_arguments(monkeypatch):
    from rltrain.run.summary import JOB_ARGS_ENV

    monkeypatch.delenv(JOB_ARGS_ENV, raising=False)  # outside a Hydra job: the command line
    monkeypatch.setattr(sys, "argv", ["rltrain", "algo.lr=1e-3", "hydra.run.dir=old", "resume=never", "seed=3"])
    assert resume_command(Path("/runs/it's")) == \
        "rltrain algo.lr=1e-3 seed=3 'hydra.run.dir='\"'\"'/runs/it\\'\"'\"'s'\"'\"'' resume=auto"


def test_a_multirun_job_s_resume_command_continues_that_job(tmp_path):
    """A sweep job's resume command is that job's (its own overrides, not the sweep's command line with its -m
    and comma lists; under SLURM, not submitit's command line): run as printed, it continues the job in its dir."""
    env = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    sweep = ["-m", "seed=1,2", "env.id=tests.helpers.faulty_envs:SlowEnv", "+env.kwargs.sleep_s=0.004", "debug=smoke",
             "logger=quiet", "total_env_steps=2048", "max_wall_time=1s", "hydra.sweep.dir=sweep"]
    res = run_cli(sweep, cwd=tmp_path, env=env)
    assert "interrupted: " in res.stderr, res.stderr[-3000:]
    job = next((tmp_path / "sweep").glob("1_*"))
    summary = json.loads((job / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["total_env_steps"] < 2048, summary
    command = shlex.split(summary["resume_command"])
    assert command[0] == "rltrain" and "-m" not in command and "seed=2" in command, command
    assert not any("," in arg for arg in command if arg.startswith("seed=")), command
    assert command[-2:] == [f"hydra.run.dir={hydra_quote(str(job))}", "resume=auto"], command
    # as printed, with the wall-time budget lifted so that it can finish here
    res = run_cli([*command[1:], "max_wall_time=null"], cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    done = json.loads((job / "summary.json").read_text())
    assert done["status"] == "completed" and done["seed"] == 2 and done["total_env_steps"] == 2048, done
    assert done["resumed_from_env_steps"] == summary["total_env_steps"]


# -- multirun: a job refused by the run-dir lock writes nothing into the live run's dir ------------------------
def test_record_failure_never_writes_into_a_run_dir_another_run_holds(tmp_path):
    from rltrain.sweeps import ledger

    job = tmp_path / "0_seed=1"
    job.mkdir()
    live = {"status": "running", "owner": "the live run"}
    (job / "summary.json").write_text(json.dumps(live))
    with RunDirLock(job):  # the live run (here: this process through another open file)
        record_failure(job, ValueError("the job's own failure"), sweep_dir=tmp_path)
        assert json.loads((job / "summary.json").read_text()) == live
        assert not (job / "error.txt").exists()
    # still counted: the sweep's ledger says why, and the sweep's end lists it and exits 1
    [entry] = ledger.entries(tmp_path)
    assert (entry.job_dir, entry.state) == (job.name, "failed") and "another rltrain run" in entry.reason, entry
    assert "ValueError: the job's own failure" in entry.reason, entry
    rows = this_sweeps_jobs(tmp_path)
    assert rows[0][1]["status"] == "failed" and sweep_exit_code([s for _, s in rows]) == 1
    record_failure(job, ValueError("the job's own failure"))  # a free dir: the job's own record
    summary = json.loads((job / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == "ValueError: the job's own failure"
    assert "ValueError: the job's own failure" in (job / "error.txt").read_text()
