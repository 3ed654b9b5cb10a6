"""Against a real SLURM (bash scripts/slurm-local.sh up): job arrays, a failing job, 2 tasks as 2 ranks, and a
preempted job (scancel --signal=USR2) that is requeued and resumes from its checkpoint in the same run dir."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import pytest

from tests.conftest import run_cli
from tests.helpers.sweeps import ENV, TINY, by_job_num, csv_rows, wait_for


def slurm_responds() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (subprocess.TimeoutExpired, OSError):
        return False


pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(importlib.util.find_spec("submitit") is None, reason="needs the 'slurm' extra"),
    pytest.mark.skipif(not slurm_responds(), reason="no responding SLURM (bash scripts/slurm-local.sh up)"),
]

# small jobs that fit the single-node test cluster; timeout_min <= 10: submitit counts every signal as a
# timeout, so max_num_timeout (3 in the preset) decides whether the job is requeued
SLURM = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=5"]


def test_slurm_array_of_two_returns_both_results(tmp_path):
    res = run_cli(["-m", *SLURM, "seed=1,2", *TINY, "hydra.sweep.dir=sweep"], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    jobs = by_job_num(tmp_path / "sweep")
    assert sorted(jobs) == [0, 1] and all(s["status"] == "completed" for s in jobs.values())
    assert {s["seed"] for s in jobs.values()} == {1, 2}
    array_ids = {p.name.split("_")[0] for p in (tmp_path / "sweep" / ".submitit").iterdir() if p.name[0].isdigit()}
    assert len(array_ids) == 1  # one job array, two tasks


def test_slurm_failing_job_reports_failure(tmp_path):
    res = run_cli(["-m", *SLURM, "env.id=tests.helpers.faulty_envs:crashing_cartpole", "+env.kwargs.crash_after=10",
                   *TINY, "hydra.sweep.dir=sweep"], cwd=tmp_path, env=ENV, timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    s = by_job_num(tmp_path / "sweep")[0]
    assert s["status"] == "failed" and "deliberate failure" in s["error"]  # SLURM itself says COMPLETED


def test_slurm_two_tasks_become_two_ranks(tmp_path):
    res = run_cli(["-m", *SLURM, "hydra.launcher.tasks_per_node=2", "trainer=distributed_simulator",
                   "allow_nested_processes=true", "seed=1", *TINY, "total_env_steps=512",  # one update of 2 ranks
                   "hydra.sweep.dir=sweep"], cwd=tmp_path,
                  timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    s = by_job_num(tmp_path / "sweep")[0]
    assert s["status"] == "completed" and s["world_size"] == 2
    assert s.get("launcher") == "slurm"  # the two SLURM tasks were the ranks (not a local spawn of 2)


def test_slurm_preempted_job_is_requeued_and_resumes(tmp_path):
    total = 8192
    cmd = [sys.executable, "-m", "rltrain", "-m", *SLURM, "seed=3", "debug=smoke", "logger=quiet",
           f"total_env_steps={total}", "eval.every_env_steps=0", "eval.episodes=1", "log.every_env_steps=256",
           "hydra.sweep.dir=sweep"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job = None
    try:
        metrics = lambda: next((tmp_path / "sweep").glob("0_*/metrics.csv"), None)  # noqa: E731
        wait_for(lambda: metrics() is not None and csv_rows(metrics()) >= 1, timeout=240, what="training to start")
        submitit = tmp_path / "sweep" / ".submitit"
        job = wait_for(lambda: next((p.name for p in submitit.iterdir() if p.name[0].isdigit()), None),
                       timeout=30, what="the job id")
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
        _, err = proc.communicate(timeout=420)  # the requeued job waits for its slot again before restarting
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            if job:
                subprocess.run(["scancel", job], timeout=30)
    assert proc.returncode == 0, err[-3000:]
    dirs = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(dirs) == 1, dirs
    s = by_job_num(tmp_path / "sweep")[0]
    assert s["status"] == "completed" and s["total_env_steps"] >= total
    assert s["resumed_from_env_steps"] and 0 < s["resumed_from_env_steps"] < total
