"""trainer.backend=ray with a private Ray instance (``trainer.ray.address`` null): started for the run, stopped
with it. Ctrl-C checkpoints, kills the run's actors and shuts the instance down: under ``orphan_watch`` (this
process is a child subreaper) no process of the run, Ray's own included, may outlive it. A fresh private
instance then resumes the run from its checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rltrain.run.metrics import read_metrics
from tests.conftest import REPO

pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")
pytestmark = pytest.mark.ray

FAST = ["trainer=subprocess_actors", "algo=impala", "debug=smoke", "env.num_envs=2", "algo.rollout_len=32",
        "eval.every_env_steps=0", "eval.episodes=1", "checkpoint.every_env_steps=0", "log.every_env_steps=256",
        "logger.progress=plain", "trainer.backend=ray", "hydra.run.dir=run"]


def _env() -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def test_ctrl_c_stops_the_private_instance_then_a_fresh_one_resumes(tmp_path, orphan_watch):
    run = tmp_path / "run"
    stdout = tmp_path / "stdout.txt"
    proc = subprocess.Popen([sys.executable, "-m", "rltrain", *FAST, "total_env_steps=10000000"], cwd=tmp_path,
                            stdout=stdout.open("w"), stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)  # its own process group, as a shell job
    try:
        deadline = time.monotonic() + 180
        # two metrics rows, and both actors have said where they run (the progress rows name each actor's node
        # once it reported it; the summary names them only then)
        while not ((run / "metrics.csv").exists() and len(read_metrics(run / "metrics.csv")) >= 2
                   and "actor 0 on " in stdout.read_text() and "actor 1 on " in stdout.read_text()):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    first = json.loads((run / "summary.json").read_text())
    assert first["status"] == "interrupted" and Path(first["checkpoint"]).exists()
    assert {"actor_0_gen_0", "actor_1_gen_0"} <= set(first["actor_nodes"])
    steps, updates = first["total_env_steps"], first["updates"]
    resumed = subprocess.run([sys.executable, "-m", "rltrain", *FAST, "resume=auto", f"total_env_steps={steps + 512}"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=240, env=_env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    second = json.loads((run / "summary.json").read_text())
    assert second["total_env_steps"] >= steps + 512 and second["updates"] > updates
    seeds = json.loads((run / "seeds.json").read_text())["workers"]
    assert "actor_0_gen_1" in seeds and "actor_0_gen_1" in second["actor_nodes"]  # new generations, recorded


# -- scripts/ray-slurm.sbatch, with srun / scontrol stand-ins that run each step on this host (two nodes) ------
SRUN = """#!/usr/bin/env bash
# srun stand-in: drop srun's options (and -w's host), run the step's command here
while [ $# -gt 0 ]; do case "$1" in -w) shift 2;; -*) shift;; *) break;; esac; done
exec "$@"
"""
SCONTROL = """#!/usr/bin/env bash
# two "nodes" of the job, both this host: the head's and one worker's
[ "$1 $2" = "show hostnames" ] && { hostname; hostname; exit 0; }
exit 1
"""


def test_ray_slurm_script_runs_a_token_cluster_and_leaves_nothing(tmp_path, orphan_watch):
    import socket

    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    env = {**_env(), "PATH": f"{shims}:{Path(sys.executable).parent}:{os.environ['PATH']}", "RAY_PORT": str(port),
           "SLURM_JOB_NODELIST": socket.gethostname(), "SLURM_JOB_ID": "4242", "SLURM_CPUS_PER_TASK": "2",
           "RLTRAIN": f"{sys.executable} -m rltrain", "PYTHONPATH": str(REPO),
           # both actors hold at their first step until both are placed: the 1024-step run could otherwise end
           # on actor 0's rollouts before a loaded machine had started actor 1 (the summary names placed actors)
           "RLTRAIN_TEST_BARRIER": str(tmp_path / "barrier")}
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)
    res = subprocess.run(["bash", str(REPO / "scripts" / "ray-slurm.sbatch"),
                          *[a for a in FAST if a not in ("trainer=subprocess_actors", "trainer.backend=ray")],
                          "total_env_steps=1024", "env.id=tests.helpers.actor_envs:BarrierCartPole"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=400, env=env)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "completed" and len(s["actor_nodes"]) == 2, s["actor_nodes"]
    assert len(os.listdir(tmp_path / "barrier")) == 2  # the env held both actors (the test is about placement)
    # both on the worker node (it offers actor_host; the head, 1 CPU and no actor_host, would take one of them)
    assert len({p["node_id"] for p in s["actor_nodes"].values()}) == 1, s["actor_nodes"]
    assert not (tmp_path / ".ray-token-4242").exists()  # the job's token is removed with the job
