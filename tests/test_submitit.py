"""hydra/launcher=local (submitit's local executor): the SLURM code path without SLURM — job arrays, a failing
job, and a preempted job (SIGUSR2) that checkpoints, is requeued by submitit and resumes in the same dir."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import run_cli
from tests.helpers.sweeps import ENV, TINY, by_job_num, csv_rows, send, submitit_task_pids, wait_for

pytestmark = pytest.mark.skipif(importlib.util.find_spec("submitit") is None, reason="needs the 'slurm' extra")


def test_local_array_collects_results_and_reports_a_failing_job(tmp_path):
    res = run_cli(["-m", "hydra/launcher=local", "env.id=tests.helpers.faulty_envs:crashing_cartpole",
                   "+env.kwargs.crash_after=-1,10", *TINY, "hydra.sweep.dir=sweep"], cwd=tmp_path, env=ENV, timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    jobs = by_job_num(tmp_path / "sweep")
    assert jobs[0]["status"] == "completed" and jobs[1]["status"] == "failed"
    assert "deliberate failure" in jobs[1]["error"]
    assert (tmp_path / "sweep" / ".submitit").is_dir()  # really went through submitit
    assert "1/2 jobs completed" in res.stderr


def test_local_preempted_job_requeues_and_resumes_in_the_same_dir(tmp_path, no_leaks):
    # the signal must land mid-training: CartPole trains these 16384 steps in ~2 s here, far less on a fast machine,
    # so the job's envs slow to 10 ms a step (from their 32nd) until the test has sent the signal and opens the gate
    total, gate = 16384, tmp_path / "gate"
    cmd = [sys.executable, "-m", "rltrain", "-m", "hydra/launcher=local", "seed=3", "debug=smoke", "logger=quiet",
           "env.id=tests.helpers.faulty_envs:SlowUntilGateCartPole", f"total_env_steps={total}",
           "eval.every_env_steps=0", "eval.episodes=1", "log.every_env_steps=256", "hydra.sweep.dir=sweep"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ENV, "RLTRAIN_TEST_GATE": str(gate)})
    try:
        metrics = lambda: next((tmp_path / "sweep").glob("0_*/metrics.csv"), None)  # noqa: E731
        wait_for(lambda: metrics() is not None and csv_rows(metrics()) >= 1, timeout=180, what="training to start")
        pids = wait_for(lambda: submitit_task_pids(proc.pid), timeout=30, what="the submitit task process")
        for pid in pids:
            send(pid, signal.SIGUSR2)  # what submitit/SLURM send before a time limit or a preemption
        gate.touch()  # the signal is the task's before it takes another step: it stops at its next safe point
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    dirs = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(dirs) == 1, dirs  # the requeued attempt found the same run dir
    s = by_job_num(tmp_path / "sweep")[0]
    assert s["status"] == "completed" and s["total_env_steps"] >= total
    assert s["resumed_from_env_steps"] and 0 < s["resumed_from_env_steps"] < total
    logs = "".join(p.read_text() for p in (tmp_path / "sweep" / ".submitit").rglob("*.err"))
    assert "Caught signal SIGUSR2" in logs, logs[-2000:]  # submitit's handler ran (after our checkpoint)


def test_a_preemption_during_the_final_evaluation_is_requeued_too(monkeypatch):
    """SIGUSR2 in any phase (here the final evaluation, after final.pt) goes back to submitit, which requeues; the
    requeued attempt resumes at the full budget and only evaluates."""
    from rltrain.sweeps import callbacks

    raised: list[int] = []
    monkeypatch.setattr(callbacks, "in_submitit_job", lambda: True)
    monkeypatch.setattr(callbacks.signal, "raise_signal", raised.append)
    callbacks.hand_over_signal({"status": "interrupted", "exit_code": 140,
                                "stop_reason": "SIGUSR2 during the final evaluation"})
    assert raised == [signal.SIGUSR2]
    with pytest.raises(SystemExit) as ended:  # SIGTERM in the same phase: the sweep was asked to stop
        callbacks.hand_over_signal({"status": "interrupted", "exit_code": 143,
                                    "stop_reason": "SIGTERM during the final evaluation"})
    assert ended.value.code == 143 and raised == [signal.SIGUSR2]
