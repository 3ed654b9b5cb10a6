"""trainer.backend=ray refusals and losses: an address that is no Ray head, a head lost mid-run.

The first needs no cluster (a TCP server that accepts and never answers stands at the address). The second
brings up a cluster of its own (a head that hosts no actor, one worker node) and stops its head while the run
trains: the run must end in one line, ``summary.json`` ``failed`` with its last checkpoint, within a bound.
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

pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")

FAST = ["trainer=subprocess_actors", "algo=impala", "debug=smoke", "env.num_envs=2", "algo.rollout_len=32",
        "eval.every_env_steps=0", "eval.episodes=1", "checkpoint.every_env_steps=256", "log.every_env_steps=256",
        "logger=quiet", "trainer.backend=ray"]
MB = 1 << 20


def _env() -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def test_an_address_that_is_not_a_ray_head_is_refused_in_one_line(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(4)
        port = squatter.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "rltrain", *FAST, "hydra.run.dir=run",
                              f"trainer.ray.address=127.0.0.1:{port}"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120, env=_env())
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{port} accepts connections but is not a Ray head" in lines[0], lines
    assert not (tmp_path / "run").exists()


@pytest.mark.ray
def test_a_lost_ray_head_is_one_line_and_a_failed_summary(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "object_store_memory": 100 * MB})
    cluster.add_node(num_cpus=1, resources={"actor_host": 1}, object_store_memory=100 * MB)
    cluster.wait_for_nodes()
    run = tmp_path / "run"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "rltrain", *FAST, "hydra.run.dir=run",
                                 "total_env_steps=10000000", "trainer.num_actors=1",
                                 f"trainer.ray.address={cluster.address}",
                                 "trainer.ray.actor_resources={num_cpus:1,actor_host:1}"], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(),
                                start_new_session=True)
        deadline = time.monotonic() + 240
        while not list((run / "checkpoints").glob("step_*.pt")):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run never checkpointed"
            time.sleep(0.5)
        cluster.remove_node(cluster.head_node, allow_graceful=False)
        _, err = proc.communicate(timeout=180)  # a bound on the whole reaction, not a timing assertion
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.shutdown()
    assert proc.returncode == 1, err[-3000:]
    ours = [ln for ln in err.splitlines() if ln.startswith("rltrain")]
    assert len(ours) == 1 and "stopped answering (lost" in ours[0] and "Traceback" not in err, err[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "failed" and "the Ray head at" in s["error"], s
    assert s["last_checkpoint"] and Path(s["last_checkpoint"]).exists()
