"""Supervision that cannot be fooled, and envs that misbehave mid-run.

Real runs on envs that hang, raise or return what their spaces forbid (``tests/helpers/broken_envs.py``):
each ends with one line naming the env and its step, ``summary.json`` saying ``failed``, a non-zero exit.
A stop signal is honoured while an env call is stuck (the call is abandoned). SIGKILL of the parent of each
trainer kind leaves no process of its tree alive (checked from ``/proc``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rltrain.run.seeding import derive
from tests.conftest import child_pids
from tests.test_faults import SMOKE, _pythonpath, _stderr_lines, _summary, _train

BROKEN = "env.id=tests.helpers.broken_envs:"


def _errors(res) -> list[str]:
    return [ln for ln in _stderr_lines(res) if not ln.startswith("[")]  # progress lines start with [


def _popen(run_dir: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": _pythonpath(), "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen([sys.executable, "-m", "rltrain", *SMOKE, f"hydra.run.dir={run_dir}", *extra],
                            cwd=run_dir.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child waiting to be reaped by init is gone for our purpose)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


# -- an env that misbehaves mid-run: one line naming the env and its step ------------------------------------
@pytest.mark.parametrize(("env", "what"), [
    ("Raising", "RuntimeError: Raising: the simulator lost its connection"),
    ("BadShape", "observation of shape (4,), but the observation space says (3,)"),
    ("BadDtype", "could not convert string to float"),
    ("TextReward", "could not convert string to float: 'lots'"),
    ("ArrayReward", "reward array([1.]) of shape (1,): step() must return one number (e.g. float(reward))"),
])
def test_an_env_that_breaks_mid_run_fails_in_one_line_naming_env_and_step(tmp_path, env, what):
    run_dir = tmp_path / "run"
    res = _train(run_dir, f"{BROKEN}{env}", "env.num_envs=2")
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1, lines
    assert re.match(r"rltrain: error: env 0 failed in step\(\) at its step 301: ", lines[0]), lines[0]
    assert what in lines[0] and f"traceback in {run_dir}/error.txt" in lines[0]
    assert "Traceback" in (run_dir / "error.txt").read_text()  # the user's env bug keeps its traceback
    summary = _summary(run_dir)
    assert summary["status"] == "failed" and what in summary["error"]


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_a_hung_env_fails_the_run_after_step_timeout_naming_it(tmp_path, vectorization, no_leaks):
    run_dir = tmp_path / "run"
    res = _train(run_dir, f"{BROKEN}Hanging", "env.num_envs=2", f"env.vectorization={vectorization}",
                 "env.step_timeout_s=1.5")
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1 and "warn" not in res.stderr.lower(), res.stderr
    assert lines[0].startswith("rltrain: error: env 0 did not return from its step 301 within "
                               "env.step_timeout_s=1.5s"), lines[0]
    assert _summary(run_dir)["status"] == "failed"


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_sigterm_is_honoured_while_an_env_call_is_stuck(tmp_path, vectorization, no_leaks):
    run_dir = tmp_path / "run"
    marker = tmp_path / "hung"
    proc = _popen(run_dir, f"{BROKEN}Hanging", f"+env.kwargs.marker={marker}", "env.num_envs=2",
                  f"env.vectorization={vectorization}", "env.step_timeout_s=null")
    try:
        _wait_for(marker, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)  # the call is abandoned ~0.5 s after the signal (no timed assert)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    summary = _summary(run_dir)
    assert summary["status"] == "interrupted" and "abandoned" in summary["stop_reason"]
    assert summary["checkpoint"] is None  # nothing was checkpointed before step 512: the line must not say so
    assert "no checkpoint had been written yet" in err and "checkpoint written" not in err, err


# -- the legitimate corner cases train on --------------------------------------------------------------------
def test_an_env_whose_return_never_varies_trains_to_completion(tmp_path):
    """Explained variance is NaN by definition there (Var(returns) = 0): not a fault."""
    res = _train(tmp_path / "run", f"{BROKEN}ZeroReward", "env.num_envs=2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert _summary(tmp_path / "run")["status"] == "completed"


def test_a_nan_met_only_in_evaluation_fails_the_run(tmp_path):
    eval_seed = derive(1, 2).eval_seed  # seed=1 (debug=smoke), env.num_envs=2: episode 0 of every evaluation
    run_dir = tmp_path / "run"
    res = _train(run_dir, f"{BROKEN}EvalNaN", f"+env.kwargs.nan_seed={eval_seed}", "env.num_envs=2")
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1 and "non-finite evaluation return=nan (eval episode 0)" in lines[0], lines
    assert _summary(run_dir)["status"] == "failed"
    assert not (run_dir / "checkpoints" / "final.pt").exists()


# -- the same env failure ends every trainer alike: exit 2, one line naming the rank / actor, the env, its step -----
# each trainer's flags, and who its line names first when a training env fails (a rank, an actor; its own process)
TRAINERS = {
    "sequential": ([], ""),
    "distributed_simulator": (["trainer=distributed_simulator", "trainer.world_size=2"], r"rank [01] failed: "),
    "subprocess_actors": (["trainer=subprocess_actors", "trainer.num_actors=1", "trainer.max_restarts=1",
                           "trainer.start_method=fork"], r"actor 0 failed: "),
}


@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_an_env_that_raises_ends_every_trainer_with_exit_2_in_one_line(tmp_path, trainer, no_leaks):
    extra, who = TRAINERS[trainer]
    run_dir = tmp_path / "run"
    res = _train(run_dir, f"{BROKEN}Raising", "env.num_envs=2", "total_env_steps=100000", *extra)
    assert res.returncode == 2, res.stderr[-3000:]  # the user's env, as for trainer=sequential: not rltrain's 1
    lines = [ln for ln in _errors(res) if not ln.startswith("rltrain: warning:")]  # an actor's restart is said
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert re.match(rf"rltrain: error: {who}env 0 failed in step\(\) at its step 301: RuntimeError: Raising: the "
                    "simulator lost its connection", lines[0]), lines[0]
    assert lines[0].count(f"; traceback in {run_dir / 'error.txt'}") == 1, lines[0]
    assert "Raising: the simulator lost its connection" in (run_dir / "error.txt").read_text()
    assert _summary(run_dir)["status"] == "failed"


# the eval env runs where the run evaluates: the process itself, rank 0, the actors' learner
EVALUATES = {"sequential": "", "distributed_simulator": "rank 0 failed: ", "subprocess_actors": ""}


@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_an_evaluation_env_that_raises_ends_every_trainer_with_exit_2_in_one_line(tmp_path, trainer):
    seeds = sorted({derive(1, 2).eval_seed, derive(1, 2, path=(0,)).eval_seed})  # seed=1: a run's, rank 0's
    run_dir = tmp_path / "run"
    res = _train(run_dir, f"{BROKEN}EvalRaising", f"+env.kwargs.seeds=[{','.join(map(str, seeds))}]",
                 "env.num_envs=2", *TRAINERS[trainer][0])
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert lines[0].startswith(f"rltrain: error: {EVALUATES[trainer]}evaluation env 0 failed in step() at its step 1: "
                               "RuntimeError: EvalRaising: the evaluation level is missing (run at env step 1024); "
                               f"traceback in {run_dir / 'error.txt'}"), lines[0]
    assert _summary(run_dir)["status"] == "failed"


# -- SIGKILL of each parent kind: nothing of its tree survives -----------------------------------------------
@pytest.mark.parametrize("extra", [
    ["env.vectorization=async"],
    ["trainer=parallel", "trainer.num_agents=2"],  # start_method=auto: fork
    ["trainer=parallel", "trainer.num_agents=2", "trainer.start_method=spawn", "env.vectorization=async"],
    ["trainer=distributed_simulator", "trainer.world_size=2"],
    ["trainer=subprocess_actors", "trainer.num_actors=2"],  # forkserver
], ids=["sequential-async-envs", "parallel-fork", "parallel-spawn-async-envs", "distributed", "actors"])
def test_sigkill_of_the_parent_leaves_no_process_of_its_tree(tmp_path, extra):
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, "total_env_steps=100000000", "env.id=tests.helpers.faulty_envs:SlowEnv",
                  "env.num_envs=2", *extra)
    try:
        # training has begun everywhere: the first metrics row of the run (or of an agent)
        deadline = time.monotonic() + 120
        while not (list(run_dir.glob("metrics.csv")) or list(run_dir.glob("agent_*/metrics.csv"))):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        tree = child_pids(proc.pid)
        assert tree, "the run should have started processes of its own"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while any(_running(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = {p: Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")[:120] for p in tree if _running(p)}
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, survivors


def test_sigterm_reaches_a_parallel_agent_stuck_in_an_env_call(tmp_path, no_leaks):
    run_dir = tmp_path / "run"
    marker = tmp_path / "hung"
    proc = _popen(run_dir, f"{BROKEN}Hanging", f"+env.kwargs.marker={marker}", "env.num_envs=2",
                  "env.step_timeout_s=null", "trainer=parallel", "trainer.num_agents=1")
    try:
        _wait_for(marker, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    summary = _summary(run_dir)
    assert summary["status"] == "interrupted" and "abandoned" in summary["agents"][0]["stop_reason"], summary
    assert "no agent had a checkpoint yet" in err and "checkpoint written" not in err, err


class _Slow(gym.Env):
    """Each step sleeps the next of ``delays`` (seconds)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, delays: list[float]):
        self.delays = list(delays)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        time.sleep(self.delays.pop(0))
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_the_deadline_a_loop_of_steps_keeps_armed_gives_each_step_its_own_time():
    """A loop of steps keeps one deadline timer armed (no system call per step): steps that each take most of
    ``env.step_timeout_s`` never fault though together they outlive it many times over (the timer is judged
    against the call running when it fires); the step that outlives it faults in one line naming its step; the
    timer is cleared when the loop is done, so nothing after it sees a SIGALRM."""
    from rltrain.envs.deadline import EnvFault
    from rltrain.envs.vector import VecEnv

    venv = VecEnv([lambda: _Slow([0.3] * 6 + [3.0])], seeds=[0], step_timeout_s=0.5)
    try:
        venv.reset()
        for _ in range(6):  # 1.8 s of steps under a 0.5 s deadline, kept armed between them
            venv.step(np.zeros(1, np.int64))
        started = time.monotonic()
        with pytest.raises(EnvFault, match=r"^env 0 did not return from its step 7 within env.step_timeout_s=0.5s"):
            venv.step(np.zeros(1, np.int64))
        assert time.monotonic() - started < 2.0  # the hung step was cut at its own deadline, not the sleep's end
        venv.idle()
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        venv.close()
