"""Against a real SLURM (bash scripts/slurm-local.sh up): job arrays, a failing job, 2 tasks as 2 ranks, and a
preempted job (scancel --signal=USR2) that is requeued and resumes from its checkpoint in the same run dir."""

from __future__ import annotations

import importlib.util
import shutil
import signal
import subprocess
import sys
import time

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


@pytest.mark.parametrize(("override", "key"), [("hydra.launcher.partition=nosuch", "hydra.launcher.partition"),
                                               ("hydra.launcher.mem_gb=100000", "hydra.launcher.mem_gb")])
def test_slurm_sbatch_refusal_is_one_line_and_leaves_no_sweep(tmp_path, override, key):
    res = run_cli(["-m", *SLURM, override, "seed=1,2", *TINY, "hydra.sweep.dir=sweep"], cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rltrain: error: sbatch refused") and key in lines[0], lines
    assert not (tmp_path / "sweep").exists()


def test_slurm_job_out_of_requeues_ends_the_sweep_with_its_line(tmp_path):
    # SLURM may send --signal up to 60 s before the time it names (sbatch(1)): a 1-minute job signalled 40 s before
    # its end got SIGUSR2 1.7 s after its start, before training began. 2 minutes: the signal comes 20 s in or later
    res = run_cli(["-m", *SLURM, "hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=40",
                   "hydra.launcher.max_num_timeout=0", "seed=1", "debug=smoke", "logger=quiet",
                   "total_env_steps=30000000", "eval.every_env_steps=0", "hydra.sweep.dir=sweep"],
                  cwd=tmp_path, timeout=240)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    s = by_job_num(tmp_path / "sweep")[0]
    assert s["status"] == "interrupted" and s["stop_reason"].startswith("SIGUSR2") and s["checkpoint"]
    line = next(ln for ln in res.stderr.splitlines() if ln.startswith("rltrain: job 0 did not complete"))
    assert "max_num_timeout" in line and "resume=auto" in line  # why, and how to continue it
    assert "0/1 jobs completed" in res.stderr  # the sweep's end summary ran


def squeue_ids(array: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-r", "-j", array, "-t", "PD,R,CG,S", "-o", "%i %T"],
                         capture_output=True, text=True, timeout=30).stdout
    return [ln for ln in out.splitlines() if ln.strip()]


def test_slurm_stopping_the_sweep_stops_its_jobs(tmp_path):
    """SIGTERM to the submitting process: the running job gets SIGTERM (it checkpoints), the pending one is
    cancelled, and nothing of the sweep is left in the queue."""
    cmd = [sys.executable, "-m", "rltrain", "-m", *SLURM, "hydra.launcher.array_parallelism=1", "seed=1,2",
           "debug=smoke", "logger=quiet", "total_env_steps=30000000", "eval.every_env_steps=0",
           "log.every_env_steps=256", "hydra.sweep.dir=sweep"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    array = None
    try:
        metrics = lambda: next((tmp_path / "sweep").glob("*/metrics.csv"), None)  # noqa: E731
        wait_for(lambda: metrics() is not None and csv_rows(metrics()) >= 1, timeout=240, what="training to start")
        submitit = tmp_path / "sweep" / ".submitit"
        array = next(p.name for p in submitit.iterdir() if p.name[0].isdigit()).split("_")[0]
        assert any(" PENDING" in ln for ln in squeue_ids(array))  # the second job waits for the first
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        wait_for(lambda: not squeue_ids(array), timeout=60, what="the sweep's jobs to leave the queue")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if array and squeue_ids(array):  # only when rltrain left them: the test failed
            subprocess.run(["scancel", array], timeout=30)
    assert proc.returncode == 143, err[-3000:]
    assert f"stopping the sweep's SLURM jobs (scancel {array})" in err
    s = next(iter(by_job_num(tmp_path / "sweep").values()))
    assert s["status"] == "interrupted" and s["stop_reason"].startswith("SIGTERM") and s["checkpoint"]
    assert len(by_job_num(tmp_path / "sweep")) == 1  # the pending job never ran


def test_slurm_two_tasks_need_a_trainer_that_takes_ranks(tmp_path):
    res = run_cli(["-m", *SLURM, "hydra.launcher.tasks_per_node=2", "seed=1", *TINY, "hydra.sweep.dir=sweep"],
                  cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "trainer=sequential" in lines[0] and "distributed_simulator" in lines[0], lines
    assert not (tmp_path / "sweep" / ".submitit").exists()  # refused before anything was submitted


def test_slurm_a_job_that_can_never_start_is_named(tmp_path):
    """2 tasks x 2 CPUs on the 2-CPU node: SLURM keeps it pending (PartitionConfig); rltrain says so."""
    cmd = [sys.executable, "-m", "rltrain", "-m", *SLURM, "hydra.launcher.tasks_per_node=2",
           "hydra.launcher.cpus_per_task=2", "trainer=distributed_simulator", "allow_nested_processes=true",
           "seed=1", *TINY, "hydra.sweep.dir=sweep"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    array = None
    try:
        submitit = tmp_path / "sweep" / ".submitit"
        array = wait_for(lambda: submitit.exists() and next((p.name for p in submitit.iterdir()
                                                             if p.name[0].isdigit()), None), timeout=60,
                         what="the job id").split("_")[0]
        time.sleep(25)  # the line comes within the launcher's first checks of the queue
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        wait_for(lambda: not squeue_ids(array), timeout=60, what="the pending job to be cancelled")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if array and squeue_ids(array):  # only when rltrain left it: the test failed
            subprocess.run(["scancel", array], timeout=30)
    line = next((ln for ln in err.splitlines() if "PartitionConfig" in ln), None)
    assert line and "hydra.launcher.cpus_per_task" in line, err[-3000:]
