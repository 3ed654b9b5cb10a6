"""Multiruns with the basic launcher, failing jobs, rltrain-report, Optuna, joblib, rltrain-check, wall-time
budgets and SIGUSR2 (all real CLI subprocesses on tiny budgets)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import signal
import subprocess
import sys

import pytest
import yaml

from rltrain.errors import ConfigError
from rltrain.sweeps.callbacks import check_nesting
from rltrain.trainers.settings import parse_duration
from tests.conftest import run_cli
from tests.helpers.sweeps import ENV, TINY, by_job_num, csv_rows, wait_for

CRASH = ["env.id=tests.helpers.faulty_envs:crashing_cartpole"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """4 jobs: seeds 1,2 x (a healthy env, an env that raises after 10 steps)."""
    tmp = tmp_path_factory.mktemp("sweep")
    res = run_cli(["-m", "seed=1,2", *CRASH, "+env.kwargs.crash_after=-1,10", *TINY, "hydra.sweep.dir=sweep"],
                  cwd=tmp, env=ENV)
    return tmp, res


def test_multirun_runs_every_job_and_survives_a_failing_one(sweep):
    tmp, res = sweep
    assert res.returncode == 1, res.stderr[-3000:]  # the sweep finished, and says some jobs failed
    jobs = by_job_num(tmp / "sweep")
    assert sorted(jobs) == [0, 1, 2, 3], res.stderr[-3000:]
    # hydra orders jobs as the product of the overrides: seed outer, crash_after inner
    for num in (0, 2):
        s = jobs[num]
        assert s["status"] == "completed" and math.isfinite(s["final_eval_return"])
        job_dir = next((tmp / "sweep").glob(f"{num}_*"))
        for name in ("config.yaml", "metrics.csv", "seeds.json", "checkpoints/final.pt", ".hydra/overrides.yaml"):
            assert (job_dir / name).exists(), name
    for num in (1, 3):
        assert jobs[num]["status"] == "failed"
        assert "deliberate failure" in jobs[num]["error"]
        assert "Traceback" in (next((tmp / "sweep").glob(f"{num}_*")) / "error.txt").read_text()
    assert {jobs[0]["seed"], jobs[2]["seed"]} == {1, 2}
    assert "2/4 jobs completed" in res.stderr


def test_report_groups_by_config_and_aggregates_seeds(sweep, tmp_path):
    sweep_tmp, _ = sweep
    out = tmp_path / "report.md"
    res = subprocess.run([sys.executable, "-m", "rltrain.cli.report", str(sweep_tmp / "sweep"), "--out", str(out),
                          "--json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = {r["group"]: r for r in json.loads(res.stdout)}
    assert set(rows) == {"env.kwargs.crash_after=-1", "env.kwargs.crash_after=10"}
    ok, bad = rows["env.kwargs.crash_after=-1"], rows["env.kwargs.crash_after=10"]
    assert (ok["n"], ok["runs"], ok["failed"]) == (2, 2, 0)
    assert ok["ci95_mean"][0] <= ok["mean"] <= ok["ci95_mean"][1]
    assert ok["iqm"] is not None and ok["median"] is not None
    assert (bad["n"], bad["failed"], bad["mean"]) == (0, 2, None)
    text = out.read_text()
    assert "| env.kwargs.crash_after=-1 | 2/2 |" in text
    assert (tmp_path / "report.png").stat().st_size > 1000


def test_report_on_a_parallel_run_dir_reads_agent_subdirs(sweep, tmp_path):
    """A run dir with agent_<k>/ subdirs (the parallel trainer's layout) is reported per agent."""
    import shutil

    sweep_tmp, _ = sweep
    run = tmp_path / "parallel_run"
    for k, num in enumerate((0, 2)):
        shutil.copytree(next((sweep_tmp / "sweep").glob(f"{num}_*")), run / f"agent_{k}")
    (run / "summary.json").write_text(json.dumps({"status": "completed"}))
    res = subprocess.run([sys.executable, "-m", "rltrain.cli.report", str(run), "--json"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert len(rows) == 1 and rows[0]["n"] == 2 and rows[0]["group"] == "all runs"
    assert not list(run.rglob("*.png"))  # a report reads run dirs; it draws where asked (--plot, --out)


def test_a_config_error_in_one_job_does_not_end_the_sweep(cli):
    res = cli("-m", "total_env_steps=256,-5", *TINY[:2], "eval.every_env_steps=0", "eval.episodes=1",
              "hydra.sweep.dir=sweep")
    assert res.returncode == 1, res.stderr[-2000:]
    assert "total_env_steps=-5 must be a positive integer" in res.stderr
    assert "Traceback" not in res.stderr


def test_report_labels_a_job_that_failed_before_its_config_by_its_own_overrides(cli, tmp_path):
    """A job refused before config.yaml is written is grouped and labelled by what Hydra composed for it
    (``.hydra/config.yaml``), not as a run of no algorithm on no env."""
    res = cli("-m", "algo=ppo,a2c", "total_env_steps=256,-5", *TINY[:2], "eval.every_env_steps=0", "eval.episodes=1",
              "hydra.sweep.dir=sweep")
    assert res.returncode == 1, res.stderr[-2000:]
    report = run_cli(["sweep", "--json"], cwd=tmp_path, module="rltrain.cli.report")
    assert report.returncode == 0, report.stderr
    rows = {r["group"]: r for r in json.loads(report.stdout)}
    assert not any("None" in g or "none" in g for g in rows), rows
    assert set(rows) == {f"algo={a} total_env_steps={n}" for a in ("ppo", "a2c") for n in (256, -5)}, rows
    assert rows["algo=a2c total_env_steps=-5"]["failed"] == 1 and rows["algo=ppo total_env_steps=256"]["n"] == 1


def test_a_sweep_exits_0_only_when_every_job_completed():
    """Only the jobs' final states count (a job SLURM requeued is counted as its last attempt ended); a stop at
    the user's own max_wall_time gives 3, as a single run's does, unless another job did worse."""
    from rltrain.sweeps.callbacks import sweep_exit_code

    done = {"status": "completed"}
    budget = {"status": "interrupted", "stop_reason": "max_wall_time"}
    assert sweep_exit_code([done, done]) == 0
    assert sweep_exit_code([done, budget]) == 3
    assert sweep_exit_code([{"status": "interrupted", "stop_reason": "max_wall_time during the final evaluation"}]) == 3
    for other in ({"status": "interrupted", "stop_reason": "SIGTERM"}, {"status": "failed"}, {"status": "refused"},
                  {"status": "running"}, {"status": "unreadable"}):
        assert sweep_exit_code([done, other]) == 1, other
        assert sweep_exit_code([budget, other]) == 1, other


def test_task_returns_a_finite_float_never_nan():
    from rltrain.cli.train import _sweep_value
    from rltrain.run.summary import FAILED_RETURN

    assert _sweep_value({"final_eval_return": 12.5}) == 12.5
    for bad in ({"final_eval_return": None}, {"final_eval_return": float("nan")}, {}):
        assert _sweep_value(bad) == FAILED_RETURN and math.isfinite(FAILED_RETURN)


@pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="needs the 'sweep' extra (optuna)")
def test_optuna_seeds_are_replicates_not_a_parameter(cli, tmp_path):
    res = cli("-m", "hydra/sweeper=ppo_optuna", "hydra.sweeper.n_trials=2", "seed=1,2", *TINY,
              "hydra.sweep.dir=sweep")
    assert res.returncode == 0, res.stderr[-3000:]
    # Optuna's import of alembic logs "setup plugin alembic.autogenerate.*" through Hydra's INFO handler: not here
    assert "alembic" not in res.stdout + res.stderr, res.stdout[:3000]
    jobs = by_job_num(tmp_path / "sweep")
    assert sorted(jobs) == [0, 1, 2, 3]  # 2 trials x 2 seeds
    result = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    assert "seed" not in result["best_params"] and "algo.lr" in result["best_params"]
    configs = {n: yaml.safe_load(next((tmp_path / "sweep").glob(f"{n}_*/config.yaml")).read_text()) for n in jobs}
    # each trial ran both seeds with the same hyper-parameters; Optuna was told their mean
    trials = [(0, 1), (2, 3)]
    for a, b in trials:
        assert configs[a]["algo"]["lr"] == configs[b]["algo"]["lr"]
        assert {configs[a]["seed"], configs[b]["seed"]} == {1, 2}
    means = [(jobs[a]["final_eval_return"] + jobs[b]["final_eval_return"]) / 2 for a, b in trials]
    assert result["best_value"] == pytest.approx(max(means))


@pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="needs the 'sweep' extra (optuna)")
def test_optuna_rdb_storage_keeps_the_study_and_a_second_sweep_continues_it(cli, tmp_path):
    """hydra.sweeper.storage=sqlite:///...: the study lives in the database, and a second sweep with the same
    study name (its own sweep dir and sampler seed, as docs/guide/sweeps.md says) adds its trials to it, with
    parameters of its own (Optuna 2.10's RDB storage needs SQLAlchemy < 2: the sweep extra says so)."""
    import sqlite3

    db = tmp_path / "study.db"
    study = ["hydra/sweeper=ppo_optuna", f"hydra.sweeper.storage=sqlite:///{db}", "hydra.sweeper.study_name=cont",
             *TINY, "algo.rollout_len=32", "env.num_envs=2", "total_env_steps=64"]
    for n, (trials, total) in enumerate(((2, 2), (1, 3))):
        res = cli("-m", *study, f"hydra.sweeper.n_trials={trials}", f"hydra.sweeper.sampler.seed={n}",
                  f"hydra.sweep.dir=sweep{n}")
        assert res.returncode == 0, res.stderr[-3000:]
        assert sorted(by_job_num(tmp_path / f"sweep{n}")) == list(range(trials))
        with contextlib.closing(sqlite3.connect(db)) as con:  # the database itself, not Optuna's reading of it
            rows = con.execute("SELECT s.study_name, t.state FROM trials t JOIN studies s USING (study_id)").fetchall()
            lrs = con.execute("SELECT param_value FROM trial_params WHERE param_name = 'algo.lr'").fetchall()
        assert rows == [("cont", "COMPLETE")] * total, rows
        assert len(set(lrs)) == total, lrs
    result = yaml.safe_load((tmp_path / "sweep1" / "optimization_results.yaml").read_text())
    assert "algo.lr" in result["best_params"]  # the best of all three trials, the first sweep's included


def test_missing_extra_names_it(tmp_path):
    """A regular package named hydra_plugins first on the path hides every installed plugin, as if not installed."""
    fake = tmp_path / "fake"
    (fake / "hydra_plugins").mkdir(parents=True)
    (fake / "hydra_plugins" / "__init__.py").write_text("")
    for override, extra in (("hydra/sweeper=ppo_optuna", "sweep"), ("hydra/launcher=joblib_procs", "joblib"),
                            ("hydra/launcher=slurm", "slurm")):
        res = run_cli(["-m", override, "seed=1,2"], cwd=tmp_path, env={"PYTHONPATH": str(fake)}, timeout=120)
        assert res.returncode == 2, res.stderr
        assert f"pip install 'rltrain[{extra}]'" in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None,
                    reason="needs the 'joblib' extra")
def test_joblib_launcher_runs_jobs_in_parallel_processes(cli, tmp_path):
    res = cli("-m", "hydra/launcher=joblib_procs", "hydra.launcher.n_jobs=2", "seed=1,2", *TINY,
              "hydra.sweep.dir=sweep")
    assert res.returncode == 0, res.stderr[-3000:]
    # rltrain's config is not matched to the plugin's schema by name: Hydra's deprecation warning (4 lines in
    # the launching process and in every job's) would otherwise end the sweep's stderr
    assert "is validated against ConfigStore schema" not in res.stderr, res.stderr[-3000:]
    jobs = by_job_num(tmp_path / "sweep")
    assert sorted(jobs) == [0, 1] and all(s["status"] == "completed" for s in jobs.values())
    assert "hydra/launcher=joblib is" not in res.stdout
    # the plugin's own launcher, under the name rltrain's had: one line says which is which
    res = cli("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=1", *TINY, "hydra.sweep.dir=plugin")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "[rltrain] hydra/launcher=joblib is hydra-joblib-launcher's worker pool" in res.stdout and \
        "is hydra/launcher=joblib_procs" in res.stdout, res.stdout


def test_parallel_launchers_refuse_multi_process_trainers_unless_asked():
    joblib = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
    with pytest.raises(ConfigError, match="allow_nested_processes=true"):
        check_nesting(joblib, ["sequential", "parallel"], ["trainer=sequential,parallel"])
    check_nesting(joblib, ["parallel"], ["trainer=parallel", "allow_nested_processes=true"])  # asked: fine
    check_nesting(joblib, ["sequential"], [])
    check_nesting("hydra._internal.core_plugins.basic_launcher.BasicLauncher", ["parallel"], [])  # one at a time


def test_joblib_refusal_stops_the_sweep_before_any_job(cli, tmp_path):
    res = cli("-m", "hydra/launcher=joblib_procs", "trainer=sequential,distributed_simulator", *TINY)
    assert res.returncode == 2 and "allow_nested_processes=true" in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("summary.json"))


def test_check_prints_layout_seeds_batch_and_output_without_training(tmp_path):
    res = subprocess.run([sys.executable, "-m", "rltrain.cli.check", "debug=smoke", "env.num_envs=8"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env={**ENV, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for needle in ("1 process (this one)", "8 envs x 64 rollout_len = 512", "2048 total_env_steps / 512 = 4",
                   "root seed", "eval seed", "outputs/runs/", "valid"):
        assert needle in out, needle
    assert not (tmp_path / "outputs").exists()  # nothing ran
    bad = subprocess.run([sys.executable, "-m", "rltrain.cli.check", "-m", "seed=1,2", "env.num_envs=4,0"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**ENV, "COLUMNS": "200"})
    assert bad.returncode == 2
    # a job's error on stderr (one line, also piped), the count on stdout with the tables
    assert "env.num_envs=0 must be a positive integer" in bad.stderr and "2/4 job(s) valid" in bad.stdout


def test_parse_duration():
    assert parse_duration("23h", "max_wall_time") == 23 * 3600
    assert parse_duration("1d2h30m", "max_wall_time") == 86400 + 2 * 3600 + 1800
    assert parse_duration(90, "max_wall_time") == 90.0
    with pytest.raises(ConfigError):
        parse_duration("soon", "max_wall_time")


def test_max_wall_time_checkpoints_stops_and_resumes(cli, tmp_path):
    res = cli("debug=smoke", "logger=quiet", "total_env_steps=10000000", "max_wall_time=2s", "hydra.run.dir=run")
    assert res.returncode == 3, res.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["stop_reason"] == "max_wall_time" and s["checkpoint"]
    steps = s["total_env_steps"]
    assert 0 < steps < 10000000 and "resume=auto" in res.stderr
    res = cli("debug=smoke", "logger=quiet", f"total_env_steps={steps + 256}", "hydra.run.dir=run", "resume=auto")
    assert res.returncode == 0, res.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "completed" and s["resumed_from_env_steps"] == steps


def test_max_wall_time_in_a_sweep_stops_the_job_not_the_sweep(cli, tmp_path):
    """Each job stops at its budget and the next runs; the sweep exits 3 as a single run stopped so does (not 0:
    no job completed), and rltrain-report shows their last evals apart from final returns, marked."""
    # an evaluation after each job's first update (256 env steps), which always runs (the budget is checked before
    # each update): with debug=smoke's 1024, a job that trains fewer than 1024 steps in its second (a loaded
    # machine: ~1800 here under load) would stop with no eval, and the report with no row of last evals
    res = cli("-m", "seed=1,2", "debug=smoke", "logger=quiet", "total_env_steps=10000000", "max_wall_time=1s",
              "eval.every_env_steps=256", "log.every_env_steps=256", "hydra.sweep.dir=sweep")
    assert res.returncode == 3, res.stderr[-2000:]
    jobs = by_job_num(tmp_path / "sweep")
    assert sorted(jobs) == [0, 1]
    assert all(s["status"] == "interrupted" and s["stop_reason"] == "max_wall_time" for s in jobs.values())
    assert "interrupted: " in res.stderr and "0/2 jobs completed, 2 interrupted" in res.stderr
    report = run_cli([str(tmp_path / "sweep"), "--json"], cwd=tmp_path, module="rltrain.cli.report")
    assert report.returncode == 0, report.stderr
    rows = {r["group"]: r for r in json.loads(report.stdout)}
    assert (rows["all runs"]["n"], rows["all runs"]["interrupted"]) == (0, 2), rows
    last = rows["all runs (interrupted: last eval)"]
    assert last["n"] == 2 and last["returns"] == "last eval of interrupted runs", last
    lasts = sorted(s["final_eval_return"] for s in jobs.values())
    assert last["mean"] == pytest.approx(sum(lasts) / 2), (last, lasts)
    assert "2 runs stopped before their total_env_steps (max_wall_time: 2)" in report.stderr, report.stderr


def test_sigusr2_checkpoints_at_a_safe_point_and_resumes_in_the_same_dir(tmp_path, no_leaks):
    cmd = [sys.executable, "-m", "rltrain", "debug=smoke", "logger=quiet", "total_env_steps=10000000",
           "hydra.run.dir=run"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: csv_rows(tmp_path / "run" / "metrics.csv") >= 1, timeout=120, what="the first metrics row")
        proc.send_signal(signal.SIGUSR2)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 140, err[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["stop_reason"] == "SIGUSR2" and s["checkpoint"]
    steps = s["total_env_steps"]
    res = run_cli(["debug=smoke", "logger=quiet", f"total_env_steps={steps + 256}", "hydra.run.dir=run",
                   "resume=auto"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "completed" and s["resumed_from_env_steps"] == steps > 0
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[1:]
    logged = [int(float(r.split(",")[0])) for r in rows]
    assert logged == sorted(logged) and logged[-1] >= steps + 256  # one continuous curve, no rewound steps
