"""Process plumbing: results, forwarded tracebacks, killed workers, stop messages, escalation to SIGKILL.

Each scenario runs in its own process (tests/helpers/supervise_scenarios.py) and the test checks that no worker,
no helper process and no /dev/shm entry outlives it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rltrain.errors import ConfigError
from rltrain.trainers.supervise import check_start_method
from tests.conftest import REPO


def scenario(name: str, method: str = "spawn") -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.helpers.supervise_scenarios", name, method], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def kinds(report: dict, index: int) -> list[str]:
    return [e["type"] for e in report["events"] if e["index"] == index]


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_results_come_back(method, orphan_watch):
    rep = scenario("ok", method)
    for k in (0, 1):
        assert kinds(rep, k) == ["Started", "Done"]
    assert [e["result"]["sum"] for e in rep["events"] if e["type"] == "Done"] == [10, 10]
    assert rep["exitcodes"] == [0, 0] and rep["alive"] == []


def test_raising_worker_sends_its_traceback(orphan_watch):
    rep = scenario("raise")
    failed = [e for e in rep["events"] if e["type"] == "Failed"]
    assert len(failed) == 2
    assert "RuntimeError: boom in worker" in failed[0]["error"]
    assert "supervise_scenarios.py" in failed[0]["traceback"] and "in raising" in failed[0]["traceback"]
    assert rep["exitcodes"] == [1, 1] and rep["alive"] == []


def test_sigkilled_worker_is_reported_and_the_other_stops_cleanly(orphan_watch):
    rep = scenario("sigkill")
    assert kinds(rep, 1) == ["Started", "Exited"]
    exited = next(e for e in rep["events"] if e["type"] == "Exited")
    assert exited["exitcode"] == -9 and exited["description"] == "killed by signal SIGKILL"
    done = next(e for e in rep["events"] if e["type"] == "Done")
    assert done["result"] == {"stopped": "test stop"}
    assert rep["alive"] == []


def test_stop_message_reaches_workers(orphan_watch):
    rep = scenario("stop")
    assert [e["result"] for e in rep["events"] if e["type"] == "Done"] == [{"stopped": "test stop"}] * 2


def test_shutdown_escalates_to_sigkill(orphan_watch):
    rep = scenario("stubborn")
    assert rep["alive"] == []
    assert rep["shutdown_s"] < 15


def test_shutdown_reads_the_pipes_so_a_worker_blocked_sending_can_stop(orphan_watch):
    """A worker blocked writing a message bigger than the pipe's buffer (an actor's rollout of Atari frames)
    returns on the Stop once the shutdown drains its pipe; without the draining it ends by SIGKILL."""
    rep = scenario("flood")
    assert rep["returned"] == ["worker-0", "worker-1"] and rep["alive"] == []


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_forkserver_workers_share_one_import_of_torch(method, orphan_watch):
    """forkserver: the server imported torch and the target's module once, before forking both workers;
    spawn (the control): each worker imported the module itself, and nothing loaded torch;
    fork: the workers inherited the parent's modules (the parent never imported torch here)."""
    rep = scenario("imports", method)
    results = [e["result"] for e in rep["events"] if e["type"] == "Done"]
    assert len(results) == 2, rep
    if method == "spawn":
        assert all(r["module_imported_in"] == r["pid"] and not r["torch_loaded"] for r in results), results
        return
    origin = {r["module_imported_in"] for r in results}
    assert len(origin) == 1 and not origin & {r["pid"] for r in results}, results  # one import, elsewhere
    if method == "fork":
        assert origin == {rep["parent"]}, (origin, rep["parent"])  # the parent's own import
    else:  # the fork server's import, with torch preloaded although nothing the worker runs imports it
        assert origin != {rep["parent"]} and all(r["torch_loaded"] for r in results), (results, rep["parent"])


def test_workers_that_start_processes_need_daemon_false(orphan_watch):
    rep = scenario("child")  # daemon=False
    assert [e["result"] for e in rep["events"] if e["type"] == "Done"] == [{"child_exitcode": 0}] * 2, rep
    rep = scenario("child_of_daemon")  # the default, daemon=True: Python refuses
    failed = [e for e in rep["events"] if e["type"] == "Failed"]
    assert len(failed) == 2 and "daemonic processes are not allowed to have children" in failed[0]["error"], rep


def test_a_loop_stuck_in_a_call_goes_silent_while_a_slow_live_loop_does_not(orphan_watch):
    """The heartbeat relays the loop's progress, not the heartbeat thread's life."""
    rep = scenario("stuck", "fork")
    for k in (0, 1):
        assert kinds(rep, k) == ["Started", "Unresponsive", "Exited"], rep["events"]
    rep = scenario("polling", "fork")  # 4 s of work, silence limit 1.5 s: it polls, so it is alive
    assert [e["result"] for e in rep["events"] if e["type"] == "Done"] == [{"polled": True}] * 2, rep["events"]


def test_auto_forks_only_while_that_is_safe(monkeypatch):
    import threading

    import torch

    code = "from rltrain.trainers.supervise import check_start_method; print(check_start_method('auto'))"
    fresh = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert fresh.stdout.strip() == "fork", fresh.stderr  # one thread, no CUDA: the workers inherit our modules
    release = threading.Event()
    other = threading.Thread(target=release.wait, daemon=True)
    other.start()
    try:
        assert check_start_method("auto") == "forkserver"  # another thread could hold a lock across the fork
    finally:
        release.set()
        other.join()
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert check_start_method("auto") == "forkserver"


def test_unknown_start_method_is_a_config_error():
    with pytest.raises(ConfigError, match="start_method"):
        check_start_method("threads")


def test_fork_is_refused_once_cuda_is_initialised(monkeypatch):
    import torch

    from rltrain.errors import ConfigError
    from rltrain.trainers.supervise import check_start_method

    assert check_start_method("fork") == "fork"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(ConfigError, match="^start_method=fork: CUDA is already initialised"):
        check_start_method("fork")
    assert check_start_method("spawn") == "spawn"
    with pytest.raises(ConfigError, match="is not one of: spawn, forkserver, fork"):
        check_start_method("thread")


def test_a_fork_group_made_before_cuda_refuses_to_fork_after_it(monkeypatch):
    # the actors' event source is made before the learner builds its networks (maybe on CUDA): the check that
    # matters is the one at the fork
    import torch

    from rltrain.errors import ConfigError
    from rltrain.trainers.supervise import WorkerGroup

    group = WorkerGroup(start_method="fork")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(ConfigError, match="^start_method=fork: CUDA is already initialised"):
        group.start(print, None)
    assert group.workers == []
    group.shutdown(grace_s=0.0)


def _raise(ctx, err: BaseException):
    raise err


def test_a_failure_says_across_the_pipe_whose_it_is_the_users_env_2_rltrains_own_1():
    """The worker classifies where the exception's type is known; the parent reads the exit code off the message."""
    import pickle

    from rltrain.envs.deadline import env_fault
    from rltrain.trainers.ranks import PeerFailure, failure_of
    from rltrain.trainers.worker import WorkerContext, run_target

    env = env_fault(RuntimeError("the simulator lost its connection"), 0, 301, "step()")
    for err, code in ((env, 2), (ConfigError("algo.lr=-1: must be positive"), 2), (RuntimeError("rltrain's bug"), 1)):
        failed = pickle.loads(pickle.dumps(run_target(WorkerContext(0, lambda msg: None), _raise, err)))
        assert (failed.user_fault, failed.exit_code) == (code == 2, code), err
    assert failed.error == "RuntimeError: rltrain's bug"
    # a rank: the env's failure names the rank (not re-raised as bad input) and exits 2; losing a peer is 1
    assert (failure_of(1, env).kind, failure_of(1, env).exit_code) == ("env", 2)
    assert failure_of(1, PeerFailure("allreduce failed")).exit_code == 1
    assert failure_of(1, RuntimeError("rltrain's bug")).exit_code == 1
