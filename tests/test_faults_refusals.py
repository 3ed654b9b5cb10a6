"""Refusals are bounded and one line; a failure names who failed first; the traceback goes to error.txt.

Real processes: an env whose constructor fails a bare ``assert`` (no message), MuJoCo missing, a rendezvous
port another process holds, a ``MASTER_PORT`` where a service that is no ``torch.distributed`` store listens,
a rank whose env raises, a torchrun rank SIGKILLed, a parallel agent stuck until its heartbeat times out.
Each bound below (a subprocess timeout) is a hang detector, not a timing assertion.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rltrain.sweeps.callbacks import checkpoint_note
from rltrain.trainers.rendezvous import free_port
from tests.conftest import REPO
from tests.test_faults import SMOKE, _pythonpath, _stderr_lines, _summary, _train

STUCK = "env.id=tests.helpers.stuck_envs:"
RANKS = ["trainer=distributed_simulator", "trainer.world_size=2", "env.num_envs=2", "algo.rollout_len=64",
         "eval.every_env_steps=0", "eval.episodes=1", "checkpoint.every_env_steps=256", "trainer.timeout_s=30"]


def _errors(res) -> list[str]:
    return [ln for ln in _stderr_lines(res) if not ln.startswith(("[", " "))]


def _run(args: list[str], cwd: Path, *, env: dict | None = None, timeout: float = 120,
         module: str = "rltrain") -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": _pythonpath(), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    if "HYDRA_FULL_ERROR" not in (env or {}):
        full.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=timeout)


# -- an env that fails to build --------------------------------------------------------------------------------
def test_an_env_failing_a_bare_assert_is_named_by_file_and_line(tmp_path):
    run_dir = tmp_path / "run"
    res = _train(run_dir, f"{STUCK}BareAssert")
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "building the env raised AssertionError at " in lines[0] and "stuck_envs.py:" in lines[0], lines[0]
    assert "(assert size > 0)" in lines[0] and f"traceback in {run_dir / 'error.txt'}" in lines[0], lines[0]
    assert "assert size > 0" in (run_dir / "error.txt").read_text()
    assert _summary(run_dir)["status"] == "failed"


def test_hydra_full_error_shows_the_traceback_as_documented(tmp_path):
    res = _run([*SMOKE, f"hydra.run.dir={tmp_path / 'run'}", f"{STUCK}BareAssert"], tmp_path,
               env={"HYDRA_FULL_ERROR": "1"})
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback (most recent call last)" in res.stderr and "assert size > 0" in res.stderr, res.stderr[-3000:]
    assert res.stderr.rstrip().splitlines()[-1].startswith("rltrain: error: env.id=")


def test_a_missing_simulator_names_its_extra(tmp_path):
    """MuJoCo hidden (tests/helpers/no_mujoco first on the path): the extra, not 'fix the env'."""
    res = _run([*SMOKE, f"hydra.run.dir={tmp_path / 'run'}", "env=mujoco"], tmp_path,
               env={"PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "helpers" / "no_mujoco"), _pythonpath()])})
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1 and "needs mujoco, which is not installed: pip install 'rltrain[mujoco]'" in lines[0], lines
    assert not (tmp_path / "run").exists()


# -- ranks -------------------------------------------------------------------------------------------------
def test_the_local_rendezvous_port_cannot_be_taken_before_the_ranks_join(tmp_path, no_leaks):
    """Another socket binds the local spawn's rendezvous port the moment the ranks start (tests/helpers/taken_port):
    the parent holds it from the OS's pick on, so the other socket is refused and the run completes. A port
    picked, released and left for rank 0 to bind was taken there, and the run failed with 'port is taken'."""
    run_dir = tmp_path / "run"
    res = _run([*SMOKE, *RANKS, f"hydra.run.dir={run_dir}"], tmp_path, module="tests.helpers.taken_port", timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "taken_port: held 127.0.0.1:" in res.stderr and "taken_port: took" not in res.stderr, res.stderr[-3000:]
    assert _summary(run_dir)["status"] == "completed"


def test_a_taken_rendezvous_port_is_one_line_and_no_rank_waits(tmp_path, no_leaks):
    """Rank 0 of a torchrun-style launch (no agent store: rank 0 serves it) whose MASTER_PORT another process
    listens on: the user named that port, so it is the one line naming it."""
    run_dir = tmp_path / "run"
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(4)
        port = squatter.getsockname()[1]
        env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        res = _run([*SMOKE, *RANKS, f"hydra.run.dir={run_dir}"], tmp_path, env=env, timeout=90)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert f"rendezvous: the port 127.0.0.1:{port} (MASTER_ADDR:MASTER_PORT) is taken by another process" \
        in lines[0], lines[0]


def test_a_master_port_that_is_not_a_store_is_refused(tmp_path):
    """A rank of a torchrun-style launch whose MASTER_PORT holds another service (it accepts, never answers)."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(4)
        env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(squatter.getsockname()[1])}
        res = _run([*SMOKE, *RANKS, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, env=env, timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1 and "accepts connections but has not answered as a torch.distributed store" in lines[0]


@pytest.mark.parametrize("rank", [1, 0])  # rank 0 too: the peer whose every collective it ends is not named
def test_a_rank_whose_env_raises_is_one_line_with_its_traceback_in_error_txt(tmp_path, no_leaks, rank):
    run_dir = tmp_path / "run"
    res = _run([*SMOKE, *RANKS, f"hydra.run.dir={run_dir}", "total_env_steps=100000",
                "env.id=tests.helpers.faulty_envs:faulty_cartpole", "env.max_episode_steps=500",
                f"+env.kwargs.fault_rank={rank}", "+env.kwargs.after_steps=400"], tmp_path, timeout=180)
    assert res.returncode == 2, res.stderr[-3000:]  # the user's env: as a single-process run ends
    lines = _stderr_lines(res)  # the surviving rank's c10d warnings stay off the terminal (in ranks/rank_<r>.log)
    assert len(lines) == 1 and "Traceback" not in res.stderr and "[rank" not in res.stderr, res.stderr[-3000:]
    assert (f"rank {rank} failed: env 0 failed in step() at its step 400: RuntimeError: injected fault on rank "
            f"{rank}") in lines[0]
    assert lines[0].count(str(run_dir / "error.txt")) == 1, lines[0]  # the path said once
    assert "injected fault" in (run_dir / "error.txt").read_text()
    s = _summary(run_dir)
    assert s["status"] == "failed" and s["failed_rank"] == rank and s["total_env_steps"] >= 256
    assert s["last_checkpoint"] and Path(s["last_checkpoint"]).exists()


def test_a_sigkilled_torchrun_rank_is_named_with_the_last_checkpoint(tmp_path, no_leaks):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "rltrain", *SMOKE,
           *[a for a in RANKS if a != "trainer.world_size=2"], f"hydra.run.dir={run_dir}", "total_env_steps=100000",
           "env.id=tests.helpers.faulty_envs:faulty_cartpole", "env.max_episode_steps=500",
           "+env.kwargs.fault_rank=1", "+env.kwargs.mode=kill", "+env.kwargs.after_steps=600"]
    env = {**os.environ, "PYTHONPATH": _pythonpath(), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode != 0
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "failed" and s["failed_rank"] == 1, s
    assert "rank 1 stopped answering (killed or crashed" in s["error"], s["error"]
    assert s["last_checkpoint"] and Path(s["last_checkpoint"]).exists() and s["total_env_steps"] >= 256
    ours = [ln for ln in res.stderr.splitlines() if ln.startswith("rltrain:")]
    assert len(ours) == 1 and "rank 1 stopped answering" in ours[0], res.stderr[-3000:]  # the rest is torchrun's


# -- trainer=parallel ----------------------------------------------------------------------------------------
def test_an_agent_killed_for_silence_says_why_and_keeps_its_checkpoint(tmp_path, orphan_watch):
    run_dir = tmp_path / "run"
    # total_env_steps is both agents' budget together: 2048 each, so agent 1's envs pass their 300 good steps
    res = _train(run_dir, "trainer=parallel", "trainer.num_agents=2", "trainer.heartbeat_timeout_s=3",
                 "total_env_steps=4096", "checkpoint.every_env_steps=256", "env.step_timeout_s=null",
                 "trainer.agent_overrides=[{},{env.id:tests.helpers.broken_envs:Hanging}]")
    assert res.returncode == 0, res.stderr[-3000:]  # on_agent_failure=continue: agent 0's result stands
    s = _summary(run_dir)
    agent = s["agents"][1]
    assert s["status"] == "partial" and agent["status"] == "failed", s
    assert agent["error"].startswith("killed by rltrain: no heartbeat for "), agent
    assert "heartbeat_timeout_s=3" in agent["error"], agent
    assert agent["checkpoint"].startswith(str(run_dir / "agent_1" / "checkpoints" / "step_")), agent
    assert Path(agent["checkpoint"]).exists()  # written before it hung: what a resume continues from
    assert "rltrain: agent 1 failed: killed by rltrain: no heartbeat" in res.stderr


def test_the_stop_line_names_each_agents_checkpoint_and_why_one_was_killed():
    note = checkpoint_note({"agents": [
        {"index": 0, "checkpoint": "/r/agent_0/checkpoints/step_000000004096.pt"},
        {"index": 1, "checkpoint": "/r/agent_1/checkpoints/step_000000000512.pt",
         "error": "killed by rltrain: no heartbeat for 3 s"},
        {"index": 2, "checkpoint": None}]})
    assert note == ("checkpoints: agent 0: step_000000004096.pt, agent 1: step_000000000512.pt; agent 2 had none "
                    "(a resume restarts it from step 0) (agent 1 killed by rltrain: no heartbeat for 3 s)")


# -- resume: where the work runs may change ---------------------------------------------------------------------
def test_placement_only_keys_may_change_on_resume():
    from rltrain.run.resume_rules import config_changes

    actors = "rltrain.trainers.actors.learner.SubprocessActorsTrainer"
    saved = {"trainer": {"_target_": actors, "num_actors": 2, "backend": "ray", "sync": False,
                         "ray": {"address": "10.0.0.1:6379", "actor_resources": {"num_cpus": 1, "node_a": 1}}}}
    moved = {"trainer": {"_target_": actors, "num_actors": 4, "backend": "local", "sync": False,
                         "ray": {"address": "10.0.0.9:6379", "actor_resources": {"num_cpus": 2}}}}
    assert config_changes(saved, moved) == ([], [])  # a fresh cluster, more actors: the same learner goes on
    changed = {"trainer": {**moved["trainer"], "sync": True}}
    assert config_changes(saved, changed)[0] == ["trainer.sync: False -> True"]  # what trains is still compared


def test_a_resume_on_more_actors_continues(tmp_path, no_leaks):
    run_dir = tmp_path / "run"
    common = ["trainer=subprocess_actors", "eval.every_env_steps=0", "eval.episodes=1"]
    first = _train(run_dir, *common, "trainer.num_actors=2", "total_env_steps=1024")
    assert first.returncode == 0, first.stderr[-3000:]
    res = _train(run_dir, *common, "trainer.num_actors=3", "total_env_steps=2048", "resume=auto")
    assert res.returncode == 0, res.stderr[-3000:]
    s = _summary(run_dir)
    assert s["status"] == "completed" and s["resumed_from_env_steps"] >= 1024 and s["total_env_steps"] >= 2048


# -- the tools' arguments -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tools") / "run"
    res = _train(run_dir)
    assert res.returncode == 0, res.stderr[-3000:]
    return run_dir


@pytest.mark.parametrize(("args", "says"), [
    (["--seed", "-1"], "--seed=-1 must be between 0 and 2**63"),
    (["--seed", str(10**30)], f"--seed={10**30} must be between 0 and 2**63"),
    (["--episodes", "10000000000000"], "--episodes=10000000000000 must be between 1 and 10,000,000"),
    (["--episodes", "0"], "--episodes=0 must be between 1"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--checkpoint", "middle"], "argument --checkpoint: invalid choice: 'middle'"),
], ids=["negative-seed", "huge-seed", "huge-episodes", "no-episodes", "unknown-flag", "bad-choice"])
def test_rltrain_eval_bad_arguments_are_one_line_exit_2(smoke_run, tmp_path, args, says):
    res = _run([str(smoke_run), *args], tmp_path, module="rltrain.cli.evaluate")
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rltrain-eval: error: ") and says in lines[0], res.stderr


def test_rltrain_eval_loads_the_checkpoint_it_is_asked_for(smoke_run, tmp_path):
    for which in ("final", "best", "latest"):
        res = _run([str(smoke_run), "--checkpoint", which, "--episodes", "1"], tmp_path,
                   module="rltrain.cli.evaluate")
        assert res.returncode == 0, res.stderr[-3000:]
        loaded = res.stdout.splitlines()[0].removeprefix("checkpoint: ")
        expect = {"final": ["final.pt"], "best": ["best.pt"],
                  "latest": ["final.pt", "step_000000002048.pt"]}[which]  # the most env steps: 2048
        assert loaded in [str(smoke_run / "checkpoints" / e) for e in expect], res.stdout


def test_rltrain_export_into_an_unwritable_place_is_one_line(smoke_run, tmp_path):
    res = _run([str(smoke_run), "--out", "/proc/rltrain-nowhere/policy.pt2"], tmp_path, module="rltrain.cli.export")
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write /proc/rltrain-nowhere" in lines[0], res.stderr


# -- subprocess_actors ---------------------------------------------------------------------------------------------
def test_an_actor_whose_env_fails_is_one_line_per_failure_with_tracebacks_in_error_txt(tmp_path, no_leaks):
    """The env's reset() fails mid-run in every actor; each failure is restarted up to trainer.max_restarts, then
    the run stops. Every event is one line, never a traceback; the tracebacks are in error.txt."""
    run_dir = tmp_path / "run"
    res = _train(run_dir, "trainer=subprocess_actors", "trainer.num_actors=1", "trainer.max_restarts=1",
                 f"{STUCK}ResetFails", "total_env_steps=100000", "eval.every_env_steps=0")
    assert res.returncode == 2, res.stderr[-3000:]  # the user's env: as a single-process run ends
    said = res.stdout + res.stderr  # the restart is a warning of the run's log (stdout), the end an error line
    assert "Traceback" not in said, said[-3000:]
    failures = [ln for ln in said.splitlines() if "ResetFails: the level file is gone" in ln
                and not ln.startswith("[summary]")]  # the end-of-run table repeats the summary's error
    assert len(failures) == 2, said[-3000:]  # the failure that was restarted, the one that stopped the run
    for ln in failures:
        assert "actor 0 failed: env 0 failed in reset() (its episode had ended) at its step " in ln, ln
        assert f"; traceback in {run_dir / 'error.txt'}" in ln, ln
    assert "restarting it (restart 1 of at most 1" in failures[0] and "stopping" in failures[1]
    assert (run_dir / "error.txt").read_text().count("ResetFails: the level file is gone") >= 2
    assert _summary(run_dir)["status"] == "failed"


def test_a_forked_rank_does_not_keep_the_parents_rendezvous_port(tmp_path):
    """The spawning parent holds the local rendezvous port (``LocalRendezvous``); a rank forked from it inherits the
    listening socket. Each rank closes that copy at start, so none keeps the port bound past the parent (a rank
    left over from a crashed parent would otherwise block the port for the next run); the parent's own socket,
    which the store serves on, is untouched. The spawn runs in a fresh interpreter, whose only thread makes the
    ranks forked (``start_method="auto"``): a test process holding other threads would fork-server them instead."""
    res = subprocess.run([sys.executable, "-c", SPAWN_PROBE, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr[-3000:]
    spawner, summaries, failures = json.loads(res.stdout.strip().splitlines()[-1])
    assert not failures, failures
    assert sorted(summaries) == ["0", "1"]
    for summary in summaries.values():
        assert summary["parent"] == spawner, "the ranks were not forked: this test checks nothing"
        assert summary["holds"] == [], summary


SPAWN_PROBE = """
import json, os, sys
from pathlib import Path
from rltrain.run.signals import StopFlag
from rltrain.trainers.ranks import spawn_ranks
from tests.helpers.rank_probe import probe_rank
summaries, failures = spawn_ranks(probe_rank, None, Path(sys.argv[1]), StopFlag(), world_size=2, backend="gloo",
                                  timeout_s=30, master_addr="127.0.0.1")
print(json.dumps([os.getpid(), summaries, [str(f) for f in failures]]))
"""
