"""A sweep survives a job killed from outside: the job is recorded failed, the others run, the sweep counts it.

Real multiruns under the basic, joblib and submitit-local launchers; the job (or, under the basic launcher,
which runs jobs in its own process, the job's agent process) is SIGKILLed as the OOM killer would, while it
trains. Each job's ``summary.json`` must tell how it ended, and the sweep must exit non-zero with the count.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import child_pids
from tests.helpers.sweeps import ENV, by_job_num, send, wait_for
from tests.test_faults import _pythonpath

SLOW = ["debug=smoke", "logger=quiet", "env.id=tests.helpers.faulty_envs:SlowEnv", "eval.every_env_steps=0",
        "eval.episodes=1", "total_env_steps=1024"]


def _sweep(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, **ENV, "PYTHONPATH": _pythonpath(), "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen([sys.executable, "-m", "rltrain", "-m", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _running_pid(job_dir_glob, sweep: Path) -> int | None:
    for path in sweep.glob(f"{job_dir_glob}/summary.json"):
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if summary.get("status") == "running":
            return int(summary["pid"])
    return None


def _check_counted(proc: subprocess.Popen, sweep: Path, *, killed: int, jobs: int, why: str) -> dict[int, dict]:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and "TerminatedWorkerError" not in err, err[-3000:]
    assert f"{jobs - 1}/{jobs} jobs completed, 1 failed" in err, err[-3000:]
    done = by_job_num(sweep)
    assert sorted(done) == list(range(jobs)), done
    assert done[killed]["status"] == "failed" and why in done[killed]["error"], done[killed]
    assert all(done[k]["status"] == "completed" for k in done if k != killed), done
    return done


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None,
                    reason="needs the 'joblib' extra")
def test_joblib_a_job_killed_from_outside_fails_alone(tmp_path):
    sweep = tmp_path / "sweep"
    proc = _sweep(tmp_path, "hydra/launcher=joblib_procs", "hydra.launcher.n_jobs=2", "seed=1,2,3", *SLOW)
    try:
        pid = wait_for(lambda: _running_pid("0_*", sweep), timeout=120, what="job 0 training")
        send(pid, signal.SIGKILL)
        done = _check_counted(proc, sweep, killed=0, jobs=3, why="killed by SIGKILL")
    finally:
        proc.kill()
    assert done[0]["last_checkpoint"] is None or Path(done[0]["last_checkpoint"]).exists()


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None,
                    reason="needs the 'slurm' extra")
def test_submitit_local_a_job_killed_from_outside_fails_alone(tmp_path):
    sweep = tmp_path / "sweep"
    proc = _sweep(tmp_path, "hydra/launcher=local", "seed=1,2", *SLOW)
    try:
        pid = wait_for(lambda: _running_pid("0_*", sweep), timeout=180, what="job 0 training")
        send(pid, signal.SIGKILL)
        # submitit sees its task end without a result; how it ended is not its to say
        _check_counted(proc, sweep, killed=0, jobs=2, why="ended without a result")
    finally:
        proc.kill()


def test_basic_launcher_a_job_whose_process_is_killed_fails_alone(tmp_path):
    """The basic launcher runs each job in the sweep's own process: what can be killed from outside is a
    process of the job (here its one agent); the job fails, the next job runs, the sweep counts it."""
    sweep = tmp_path / "sweep"
    proc = _sweep(tmp_path, "trainer=parallel", "trainer.num_agents=1", "seed=1,2", *SLOW)
    try:
        wait_for(lambda: list(sweep.glob("0_*/agent_0/metrics.csv")), timeout=120, what="job 0's agent training")
        agents = wait_for(lambda: child_pids(proc.pid), timeout=30, what="the agent process")
        for pid in agents:
            send(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err and "1/2 jobs completed, 1 failed" in err, err[-3000:]
    done = by_job_num(sweep)
    assert done[0]["status"] == "failed" and "killed by signal SIGKILL" in done[0]["agents"][0]["error"], done[0]
    assert done[1]["status"] == "completed"


# -- the end of a sweep counts what this sweep's jobs became --------------------------------------------------
@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None,
                    reason="needs the 'joblib' extra")
def test_joblib_a_job_stopped_by_sigterm_fails_the_sweep(tmp_path):
    """A job stopped by a signal did not complete: the sweep lists it ``interrupted`` and exits 1, as for a
    failed job (only a stop at the user's own ``max_wall_time`` gives 3, as a single run does)."""
    sweep, training = tmp_path / "sweep", tmp_path / "training"
    training.mkdir()
    # signalled once its training loop is under way (its env's first step): a SIGTERM in the phases before it
    # (start-up, env construction, checkpoint loading, right after summary.json says running) is honoured at
    # once and named after the phase ("SIGTERM during env construction"), not the one asserted below
    proc = _sweep(tmp_path, "hydra/launcher=joblib_procs", "hydra.launcher.n_jobs=2", "seed=1,2", *SLOW,
                  f"+env.kwargs.marker_dir={training}")
    try:
        pid = wait_for(lambda: _running_pid("0_*", sweep), timeout=120, what="job 0 running")
        wait_for((training / str(pid)).exists, timeout=120, what="job 0 training")
        send(pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-3000:]
    assert "1/2 jobs completed, 1 interrupted" in err and "Traceback" not in err, err[-3000:]
    line = next(ln for ln in err.splitlines() if ln.strip().startswith("interrupted: 0_"))
    assert line.endswith(": SIGTERM"), line
    done = by_job_num(sweep)
    assert done[0]["status"] == "interrupted" and done[1]["status"] == "completed", done


def _records(job: Path) -> dict[str, bytes]:
    """Every file of a run's record. Left out: Hydra's ``.hydra/`` (the last command line), the lock file, and
    Hydra's job log, which a later command only appends to (submitit logs its job's end there)."""
    skipped = (".rltrain.lock", "train.log")
    return {str(p.relative_to(job)): p.read_bytes() for p in sorted(job.rglob("*"))
            if p.is_file() and ".hydra" not in p.relative_to(job).parts and p.name not in skipped}


LAUNCHERS = {"basic": [], "joblib_procs": ["hydra/launcher=joblib_procs", "hydra.launcher.n_jobs=2"],
             "local": ["hydra/launcher=local"]}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_a_sweep_rerun_into_a_used_sweep_dir_refuses_its_jobs_and_keeps_every_record(tmp_path, launcher):
    """A 3-job sweep, then a 2-job sweep into the same dir while a live run holds job 1's dir: job 0 holds an
    earlier run (refused afresh, resumed under submitit's default resume=auto), job 1 is another run's. The
    records there stay as they were, and the end counts this sweep's 2 jobs, the refused ones by name."""
    from rltrain.run.lock import RunDirLock

    plugin = {"joblib_procs": "hydra_plugins.hydra_joblib_launcher", "local": "hydra_plugins.hydra_submitit_launcher"}
    if launcher in plugin and importlib.util.find_spec(plugin[launcher]) is None:
        pytest.skip(f"needs the plugin of hydra/launcher={launcher}")
    quick = ["debug=smoke", "logger=quiet", "total_env_steps=256", "eval.every_env_steps=0", "eval.episodes=1"]
    sweep = tmp_path / "sweep"
    first = _sweep(tmp_path, *LAUNCHERS[launcher], "seed=1,2,3", *quick)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0 and "3/3 jobs completed" in err, err[-3000:]
    jobs = {int(p.name.split("_", 1)[0]): p for p in sweep.iterdir() if p.is_dir() and p.name[0].isdigit()}
    live = json.loads((jobs[1] / "summary.json").read_text())
    live.update(status="running", pid=os.getpid())  # the live run: this process, holding the dir's lock
    (jobs[1] / "summary.json").write_text(json.dumps(live))
    before = {num: _records(job) for num, job in jobs.items()}
    logs = {num: (job / "train.log").read_bytes() for num, job in jobs.items()}
    with RunDirLock(jobs[1]):
        second = _sweep(tmp_path, *LAUNCHERS[launcher], "seed=1,2", *quick)
        _, err = second.communicate(timeout=300)
    assert second.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    refused = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("refused: ")]
    assert any(ln.startswith(f"refused: {jobs[1].name}: ") and "another rltrain run" in ln for ln in refused), err
    after = {num: _records(job) for num, job in jobs.items()}
    assert after[1] == before[1] and after[2] == before[2]
    assert all((job / "train.log").read_bytes().startswith(logs[num]) for num, job in jobs.items())
    if launcher == "local":  # submitit jobs default to resume=auto: job 0 continues its finished run
        assert "1/2 jobs completed, 1 refused" in err, err[-3000:]
        assert json.loads((jobs[0] / "summary.json").read_text())["status"] == "completed"
    else:
        assert "0/2 jobs completed, 2 refused" in err, err[-3000:]
        assert any(ln.startswith(f"refused: {jobs[0].name}: ") and "earlier run's checkpoints" in ln
                   for ln in refused), err
        assert after[0] == before[0]
    assert not any((job / "error.txt").exists() for job in jobs.values())
