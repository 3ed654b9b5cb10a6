"""A stop request is honoured in every phase, in one line, leaving a true summary or no run dir.

Real ``rltrain`` processes and real signals (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, a second Ctrl-C) sent
while the run is starting, building its envs (one that never returns), training, evaluating an env whose
episodes never end, or loading a checkpoint that is a FIFO. Nothing here asserts a time: each wait has a
generous bound, and a hang fails the test at that bound.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rltrain.run.seeding import derive
from tests.test_faults import SMOKE, _pythonpath, _summary

STUCK = "env.id=tests.helpers.stuck_envs:"
CODES = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129, "SIGUSR1": 138, "SIGUSR2": 140}


def _default_signals() -> None:
    # the test runner may have been started with some of them ignored (nohup ignores SIGHUP): the run must
    # get them as a user's shell would deliver them
    for name in CODES:
        signal.signal(getattr(signal, name), signal.SIG_DFL if name != "SIGINT" else signal.default_int_handler)


def _popen(run_dir: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": _pythonpath(), "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen([sys.executable, "-m", "rltrain", *SMOKE, f"hydra.run.dir={run_dir}", *extra],
                            cwd=run_dir.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_signals)


def _wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"ended before {what}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.05)


def _listening(port: int) -> bool:
    """Whether a TCP socket of this machine listens on ``port`` (read from /proc: no connection is made)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                return True
    return False


def _finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[str, list[str]]:
    """(stderr, its lines that are not progress lines); the process must end within ``timeout``."""
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[")]
    return err, lines


def _one_stop_line(err: str, lines: list[str]) -> str:
    assert "Traceback" not in err, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("rltrain: stopped ("), lines[0]
    return lines[0]


# -- start-up ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CODES))
def test_a_stop_while_starting_is_one_line_and_leaves_no_run_dir(tmp_path, name):
    """The env's constructor never returns (the pre-flight look at it): the stop cannot wait for it."""
    run_dir, marker = tmp_path / "run", tmp_path / "building"
    proc = _popen(run_dir, f"{STUCK}BuildHangs", "+env.kwargs.always=true", f"+env.kwargs.marker={marker}")
    _wait_for(marker.exists, proc, "the env construction")
    proc.send_signal(getattr(signal, name))
    err, lines = _finish(proc)
    line = _one_stop_line(err, lines)
    assert proc.returncode == CODES[name], err[-3000:]
    assert f"({name} during start-up) before training began" in line and "no run dir was left" in line, line
    assert not run_dir.exists()


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_stop_in_the_first_second_is_one_line(tmp_path, name):
    """Sent as soon as the command says it is starting (imports, composition, the pre-flight checks): wherever
    it lands, one line, the signal's exit code, and either no run dir or a true summary."""
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, "total_env_steps=1000000")
    assert proc.stdout.readline()  # the first progress line: the command runs
    proc.send_signal(getattr(signal, name))
    err, lines = _finish(proc)
    _one_stop_line(err, lines)
    assert proc.returncode == CODES[name], err[-3000:]
    assert not run_dir.exists() or _summary(run_dir)["status"] == "interrupted"


def test_a_stop_while_the_trainer_builds_its_envs_ends_interrupted(tmp_path):
    run_dir, marker = tmp_path / "run", tmp_path / "building"
    proc = _popen(run_dir, f"{STUCK}BuildHangs", f"+env.kwargs.run_dir={run_dir}", f"+env.kwargs.marker={marker}")
    _wait_for(marker.exists, proc, "the trainer's env construction")
    proc.send_signal(signal.SIGTERM)
    err, lines = _finish(proc)
    line = _one_stop_line(err, lines)
    assert proc.returncode == 143
    summary = _summary(run_dir)
    assert summary["status"] == "interrupted" and summary["stop_reason"] == "SIGTERM during env construction"
    assert summary["checkpoint"] is None and "no checkpoint had been written yet" in line, line


def test_a_stop_during_the_rendezvous_is_honoured(tmp_path):
    """Rank 0 of a torchrun-style launch whose peer never comes: it waits in the rendezvous (inside torch's C++,
    where no signal handler runs, unless the wait is watched) until the stop."""
    from rltrain.trainers.rendezvous import free_port

    run_dir = tmp_path / "run"
    ranks = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port())}
    os.environ.update(ranks)  # inherited by the child only (restored below)
    try:
        proc = _popen(run_dir, "trainer=distributed_simulator", "trainer.timeout_s=300")
    finally:
        for key in ranks:
            os.environ.pop(key)
    _wait_for(lambda: (run_dir / "summary.json").exists(), proc, "the run to start")
    # rank 0 serves the rendezvous store from the thread the rendezvous starts (its port listens): the run is past
    # start-up (a stop there would be named after it), in the wait that watches for a stop
    _wait_for(lambda: _listening(int(ranks["MASTER_PORT"])), proc, "the rendezvous")
    proc.send_signal(signal.SIGTERM)
    err, lines = _finish(proc)
    _one_stop_line(err, lines)
    assert proc.returncode == 143, err[-3000:]
    assert _summary(run_dir)["stop_reason"] == "SIGTERM during the rendezvous"


# -- training ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["SIGHUP", "SIGUSR1"])
def test_sighup_and_sigusr1_checkpoint_and_stop_like_sigterm(tmp_path, name):
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, "env.id=tests.helpers.faulty_envs:SlowEnv", "total_env_steps=1000000")
    _wait_for(lambda: (run_dir / "metrics.csv").exists(), proc, "training")
    proc.send_signal(getattr(signal, name))
    err, lines = _finish(proc)
    line = _one_stop_line(err, lines)
    assert proc.returncode == CODES[name], err[-3000:]
    summary = _summary(run_dir)
    assert summary["status"] == "interrupted" and summary["stop_reason"] == name
    assert summary["checkpoint"] and Path(summary["checkpoint"]).exists()
    assert f"checkpoint {summary['checkpoint']}" in line and "resume=auto" in line


def test_a_second_ctrl_c_stops_at_once_in_one_line(tmp_path):
    """Each env step takes 0.2 s, so the first Ctrl-C waits for the rollout to end; the second means now."""
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, "env.id=tests.helpers.faulty_envs:SlowEnv", "+env.kwargs.sleep_s=0.2",
                  "env.num_envs=1", "algo.rollout_len=32", "checkpoint.every_env_steps=32",
                  "total_env_steps=1000000")
    _wait_for(lambda: list(run_dir.glob("checkpoints/step_*.pt")), proc, "the first checkpoint")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    err, lines = _finish(proc)
    line = _one_stop_line(err, lines)
    assert proc.returncode == 130, err[-3000:]
    summary = _summary(run_dir)
    assert summary["status"] == "interrupted" and "second Ctrl-C" in summary["stop_reason"], summary
    assert summary["checkpoint"] and Path(summary["checkpoint"]).exists()  # the one written before, named
    assert f"checkpoint {summary['checkpoint']}" in line


# -- evaluation ----------------------------------------------------------------------------------------------
def test_evaluation_episodes_of_an_env_without_a_time_limit_end_at_the_cap(tmp_path):
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, f"{STUCK}NeverEnds", "total_env_steps=512", "eval.max_episode_steps=50")
    err, _ = _finish(proc, timeout=120)
    assert proc.returncode == 0, err[-3000:]
    summary = _summary(run_dir)
    assert summary["status"] == "completed" and summary["final_eval_return"] == 50.0  # reward 1 per step
    # the tools repeat that evaluation: cut where the run cut it, not at the no-limit cap (100000 steps each)
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    tool = subprocess.run([sys.executable, "-m", "rltrain.cli.evaluate", str(run_dir), "--episodes", "2",
                           "--allow-import"], capture_output=True, text=True, timeout=120, env=env)
    assert tool.returncode == 0 and "mean return: 50.00" in tool.stdout, tool.stdout + tool.stderr[-2000:]
    api = subprocess.run([sys.executable, "-c", "import sys, rltrain; print(rltrain.evaluate(sys.argv[1], episodes=2, "
                          "allow_import=True).returns.tolist())", str(run_dir)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert api.returncode == 0 and api.stdout.strip() == "[50.0, 50.0]", api.stdout + api.stderr[-2000:]


def test_the_default_cap_applies_only_where_the_env_has_no_time_limit(monkeypatch):
    import gymnasium as gym

    from rltrain.trainers import episodes
    from tests.helpers.stub_policies import StubPolicy
    from tests.helpers.stuck_envs import NeverEnds

    monkeypatch.setattr(episodes, "NO_LIMIT_CAP", 30)
    capped: list[int] = []
    rets = episodes.evaluate(StubPolicy(), lambda **_: NeverEnds(), episodes=3, eval_seed=5, capped=capped)
    assert rets.tolist() == [30.0] * 3 and sorted(capped) == [0, 1, 2]
    limited = episodes.evaluate(StubPolicy(), lambda **_: gym.wrappers.TimeLimit(NeverEnds(), 12), episodes=2,
                                eval_seed=5)
    assert limited.tolist() == [12.0, 12.0]  # the env's own limit ends them; no cap needed
    assert np.all(episodes.evaluate(StubPolicy(), lambda **_: NeverEnds(), episodes=2, eval_seed=5,
                                    max_episode_steps=7) == 7.0)


def test_sigterm_during_the_final_evaluation_of_an_env_that_never_ends(tmp_path):
    """No time limit, no eval.max_episode_steps: the final evaluation would run 100000 steps per episode. The
    final checkpoint is written before it, so the stop loses nothing."""
    run_dir, marker = tmp_path / "run", tmp_path / "evaluating"
    eval_seed = derive(1, 2).eval_seed  # seed=1 (debug=smoke), env.num_envs=2
    proc = _popen(run_dir, f"{STUCK}NeverEnds", f"+env.kwargs.marker={marker}", f"+env.kwargs.marker_seed={eval_seed}",
                  "env.num_envs=2", "total_env_steps=256", "eval.every_env_steps=0")
    _wait_for(marker.exists, proc, "the final evaluation")
    proc.send_signal(signal.SIGTERM)
    err, lines = _finish(proc)
    line = _one_stop_line(err, lines)
    assert proc.returncode == 143, err[-3000:]
    summary = _summary(run_dir)
    assert summary["status"] == "interrupted" and summary["stop_reason"] == "SIGTERM during the final evaluation"
    assert summary["checkpoint"] == str(run_dir / "checkpoints" / "final.pt") and Path(summary["checkpoint"]).exists()
    assert summary["total_env_steps"] == 256 and summary["final_eval_return"] is None
    assert "final.pt" in line


# -- checkpoint loading ----------------------------------------------------------------------------------------
def test_a_fifo_named_like_a_checkpoint_is_refused_not_read(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    os.mkfifo(run_dir / "checkpoints" / "step_000000004096.pt")
    proc = _popen(run_dir, "resume=auto")
    err, lines = _finish(proc)
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert "checkpoints/step_000000004096.pt (a FIFO, not a regular file)" in lines[0], lines[0]
    left = {p.name for p in run_dir.iterdir()}  # Hydra's own .hydra/ and log aside, nothing was written
    assert not left & {"config.yaml", "summary.json", ".rltrain.lock", "model.txt"}, left
