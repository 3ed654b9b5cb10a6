"""``rltrain-check -m`` and ``rltrain -m`` decide a sweep alike before any job runs: the nesting refusal, a
sampling sweeper's intervals (checked at every mix of their ends), an unknown ``+key`` refused at start leaving no
files, and the submitit launchers' ``resume=auto`` in the config that is checked."""

from __future__ import annotations

import importlib.util

import pytest
from rich.console import Console

from rltrain.cli import check
from rltrain.cli import sweep_plan as plan
from rltrain.cli.presets import resolve_experiment
from rltrain.errors import ConfigError
from tests.conftest import run_cli
from tests.helpers.sweeps import ENV, TINY

needs_optuna = pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="needs the 'sweep' extra")
needs_submitit = pytest.mark.skipif(importlib.util.find_spec("submitit") is None, reason="needs the 'slurm' extra")
OPTUNA = ["hydra/sweeper=ppo_optuna", "hydra.sweeper.n_trials=30"]


def _check(*overrides: str) -> tuple[int, str]:
    console = Console(record=True, width=400)
    code = check.check(resolve_experiment(["debug=smoke", *overrides])[0], console, multirun=True)
    return code, " ".join(console.export_text().split())


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None, reason="joblib extra")
def test_check_refuses_nested_processes_as_rltrain_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="trainer=parallel starts its own processes.*allow_nested_processes=true"):
        _check("hydra/launcher=joblib_procs", "trainer=parallel", "seed=1,2")
    code, said = _check("hydra/launcher=joblib_procs", "trainer=parallel", "seed=1,2", "allow_nested_processes=true")
    assert code == 0 and "2/2 job(s) valid" in said, said


@needs_optuna
def test_check_takes_sampled_intervals_at_every_mix_of_their_ends(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # ppo_optuna.yaml's params with the command line's replacing two: clip_coef fixed, lr's interval narrowed
    code, said = _check(*OPTUNA, "seed=1", "algo.clip_coef=0.2", "algo.lr=tag(log, interval(1e-4, 1e-2))")
    assert code == 0 and "8/8 job(s) valid" in said, said  # the 2**3 mixes of three intervals' ends
    assert "checked at every mix of their ends: algo.lr [0.0001, 0.01]" in said, said
    assert "algo.gae_lambda [0.9, 0.99]" in said, said
    assert capsys.readouterr().out.count("[rltrain-check] model:") == 1  # every job is built, the first one shown
    code, said = _check(*OPTUNA, "seed=1", "algo.clip_coef=0.2", "algo.lr=interval(-1e-3, 1e-2)")  # no lr: -1e-3
    assert code == 2 and "algo.lr=-0.001" in said and "4/8 job(s) valid" in said, said
    # a limit two keys set together fails only at a mixed corner: few envs, many minibatches (a recurrent core's
    # minibatches split the envs); all-low (2, 1) and all-high (8, 4) both pass
    mixed = ["hydra/sweeper=optuna", "model.core=lstm", "env.num_envs=int(interval(2, 8))",
             "algo.num_minibatches=int(interval(1, 4))"]
    code, said = _check(*mixed)
    assert code == 2 and "3/4 job(s) valid" in said, said
    assert "env.num_envs=2 algo.num_minibatches=4" in said and "must divide env.num_envs=2" in said, said


def test_past_four_intervals_each_is_checked_alone_at_its_other_end():
    sampled = [plan.Axis(f"k{i}", (f"k{i}=lo", f"k{i}=hi"), sampled=True, shapes=False) for i in range(5)]
    mixes = plan.corners(sampled)
    assert len(mixes) == 2 + 2 * 5 and len({tuple(m) for m in mixes}) == len(mixes)
    assert ["k0=lo", "k1=lo", "k2=lo", "k3=hi", "k4=lo"] in mixes
    assert ["k0=lo", "k1=hi", "k2=hi", "k3=hi", "k4=hi"] in mixes
    assert len(plan.corners(sampled[:4])) == 16 and plan.corners([]) == [[]]


def test_an_unknown_plus_key_stops_the_sweep_at_start_and_leaves_nothing(tmp_path):
    res = run_cli(["-m", "+foo=1,2", *TINY, "hydra.sweep.dir=sweep"], cwd=tmp_path, env=ENV)
    assert res.returncode == 2 and "foo: unknown key" in res.stderr, res.stderr[-2000:]
    assert "Launching" not in res.stdout + res.stderr and not (tmp_path / "sweep").exists()
    # a free-form mapping takes new keys: checked as rltrain -m checks it (one compose per shape of job)
    code, said = _check("env.id=tests.helpers.faulty_envs:crashing_cartpole", "+env.kwargs.crash_after=-1,10",
                        f"hydra.sweep.dir={tmp_path / 'free'}")
    assert code == 0 and "2/2 job(s) valid" in said, said


def test_a_sweep_refused_at_start_leaves_nothing_it_made(tmp_path):
    held = tmp_path / "held"
    held.mkdir()
    (held / "notes.txt").write_text("mine")
    for where in ("fresh", "held"):
        res = run_cli(["-m", "algo.lrr=1e-3,3e-4", *TINY, f"hydra.sweep.dir={where}"], cwd=tmp_path, env=ENV)
        assert res.returncode == 2 and "algo.lrr: unknown key; did you mean 'lr'?" in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "fresh").exists() and [p.name for p in held.iterdir()] == ["notes.txt"]


@needs_optuna
def test_an_optuna_key_typo_is_refused_before_the_sweep_dir_is_made(tmp_path):
    res = run_cli(["-m", *OPTUNA, "hydra.sweep.dir=sweep", "algo.lrr=tag(log, interval(1e-4, 1e-2))", *TINY],
                  cwd=tmp_path, env=ENV)
    assert res.returncode == 2 and "algo.lrr: unknown key" in res.stderr, res.stderr[-2000:]
    assert "Launching" not in res.stdout + res.stderr and not (tmp_path / "sweep").exists()


@needs_submitit
def test_check_runs_a_slurm_job_with_the_launchers_resume_auto(tmp_path, monkeypatch):
    """A finished SLURM sweep submitted again into its dir resumes its jobs (resume=auto, sweeps/requeue.py):
    the check composes that, as the job will run."""
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep"
    res = run_cli(["debug=smoke", f"hydra.run.dir={sweep / 'job'}"], cwd=tmp_path, env=ENV)  # the finished job
    assert res.returncode == 0, res.stderr[-2000:]
    slurm = ["hydra/launcher=slurm", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=job"]
    code, said = _check(*slurm)
    assert code == 0 and "1/1 job(s) valid" in said, said
    code, said = _check(*slurm, "resume=never")  # the job's own choice stands: a fresh run into a used dir
    assert code == 2 and "holds an earlier run's checkpoints" in said, said


@needs_submitit
def test_check_refuses_several_slurm_tasks_for_a_single_process_trainer(tmp_path, monkeypatch):
    """hydra.launcher.tasks_per_node=2 makes two SLURM tasks per job: the ranks of a distributed_simulator run,
    two copies of one run in one dir for any other trainer. rltrain-check -m refuses it as rltrain -m does."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="2 SLURM tasks per job, but trainer=sequential runs in one process"):
        _check("hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2", "seed=1,2")
    with pytest.raises(ConfigError, match="trainer=sequential runs in one process"):  # one job of the sweep's
        _check("hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2", "trainer=distributed_simulator,sequential")
    code, said = _check("hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2", "trainer=distributed_simulator",
                        "seed=1,2")
    assert code == 0 and "2/2 job(s) valid" in said, said


def test_check_runs_on_the_torch_threads_every_rltrain_process_runs_on(tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(SystemExit) as end:
            check.main(["debug=smoke"])
        assert end.value.code == 0 and torch.get_num_threads() == 1  # run/process.init_process
    finally:
        torch.set_num_threads(threads)
