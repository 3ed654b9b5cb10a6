"""``scripts/ray-slurm.sbatch`` under a real SLURM (``bash scripts/slurm-local.sh up``), submitted with ``sbatch``
as a user would: a Ray head (token authentication on, a token made for the job) in a job step, the run with
``trainer.backend=ray trainer.ray.address=auto``, then every Ray process of the job stopped. Marked ``slurm`` and
``ray``: CI runs it in its SLURM step (the test cluster has one node, so the job has no worker node; the
head-and-worker path runs with ``srun`` / ``scontrol`` stand-ins in ``tests/test_ray_private.py``, two
"nodes" on this host).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_slurm import slurm_responds

pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.ray,
    pytest.mark.skipif(not slurm_responds(), reason="no responding SLURM (bash scripts/slurm-local.sh up)"),
]

RUN = ["algo=impala", "debug=smoke", "env.num_envs=2", "algo.rollout_len=32", "eval.every_env_steps=0",
       "eval.episodes=1", "checkpoint.every_env_steps=0", "log.every_env_steps=256", "logger.progress=plain",
       "hydra.run.dir=run", "total_env_steps=1024"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _processes_naming(port: int) -> list[str]:
    """Command lines of live processes that belong to the Ray instance on ``port`` (its GCS address)."""
    marks = (f":{port} ", f"--gcs_server_port={port}", f"--port={port}")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace") + " "
        except OSError:
            continue
        if "ray" in cmd and any(m in cmd for m in marks):
            found.append(f"{entry.name}: {cmd[:200]}")
    return found


def test_sbatch_runs_rltrain_on_a_ray_cluster_and_leaves_no_ray_process(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SLURM_"))}
    env.pop("HYDRA_FULL_ERROR", None)
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", RAY_PORT=str(port), PYTHONUNBUFFERED="1",
               RLTRAIN=f"{sys.executable} -m rltrain")
    res = subprocess.run(["sbatch", "--wait", "--parsable", "--nodes=1", "--cpus-per-task=2", "--mem=4G",
                          "--time=10", "--partition=debug", str(REPO / "scripts" / "ray-slurm.sbatch"), *RUN],
                         cwd=tmp_path, capture_output=True, text=True, timeout=420, env=env)
    job = res.stdout.strip().split(";")[0]
    out = tmp_path / f"rltrain-ray-{job}.out"
    log = out.read_text() if out.exists() else "(no job output)"
    assert res.returncode == 0, f"sbatch: {res.stderr[-1000:]}\njob output:\n{log[-4000:]}"
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "completed" and s["total_env_steps"] >= 1024, s
    nodes = {p["hostname"] for p in s["actor_nodes"].values()}
    assert nodes == {socket.gethostname()} and "actor_0_gen_0" in s["actor_nodes"], s["actor_nodes"]
    assert "actor 0 on " in log  # the run's progress rows, in the job's output file
    assert not list(tmp_path.glob(".ray-token-*")), "the job's token outlived it"
    # nothing of the job's Ray is left: its steps stopped it (SLURM's proctrack here would not see daemons)
    deadline = time.monotonic() + 30
    while _processes_naming(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_naming(port), _processes_naming(port)
