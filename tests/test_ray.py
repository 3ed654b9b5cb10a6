"""trainer=subprocess_actors with trainer.backend=ray: a real multi-node Ray cluster on this host.

One module-wide ``ray.cluster_utils.Cluster``: a head that hosts no actor (no ``actor_host`` resource) and two
worker nodes with ``actor_host: 1`` each, so ``trainer.ray.actor_resources={num_cpus:1,actor_host:1}`` puts
exactly one actor on each worker node. Every run is the real CLI in a subprocess (the learner is the
``rltrain`` process, connecting with ``trainer.ray.address=<head>``). After each run no Ray actor of it
(``ray::ActorHost``) may be left on the cluster; the private-instance test also runs under ``orphan_watch``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rltrain.run.metrics import read_metrics

ray = pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")
pytestmark = pytest.mark.ray

FAST = ["trainer=subprocess_actors", "algo=impala", "debug=smoke", "env.num_envs=2", "algo.rollout_len=32",
        "eval.every_env_steps=0", "eval.episodes=1", "checkpoint.every_env_steps=0", "log.every_env_steps=256",
        "logger.progress=plain"]
ON_NODES = "trainer.ray.actor_resources={num_cpus:1,actor_host:1}"
MB = 1 << 20


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                      "object_store_memory": 100 * MB})
    workers = [c.add_node(num_cpus=1, resources={"actor_host": 1}, object_store_memory=100 * MB) for _ in range(2)]
    c.wait_for_nodes()
    c.workers = workers
    try:
        yield c
    finally:
        c.shutdown()


def _actor_processes() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(b"ray::ActorHost"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _no_actor_left() -> None:
    deadline = time.monotonic() + 20
    while _actor_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _actor_processes(), "a Ray actor of the run outlived it"


def _env() -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _run(tmp_path: Path, *args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rltrain", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout, env=env or _env())


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


# -- same maths as local ----------------------------------------------------------------------------------------
TIME_COLUMNS = ("time/", "actors/queue_fill")  # wall-clock or arrival-timing figures


def _local_then_ray(tmp_path, cluster, args: list[str]):
    """The same run with local actors (run dir ``local``), then with Ray actors on the worker nodes (``remote``)."""
    local = _run(tmp_path, *args, "hydra.run.dir=local", "trainer.start_method=fork")
    assert local.returncode == 0, local.stderr[-3000:]
    remote = _run(tmp_path, *args, "hydra.run.dir=remote", "trainer.backend=ray",
                  f"trainer.ray.address={cluster.address}", ON_NODES)
    assert remote.returncode == 0, remote.stderr[-3000:]
    _no_actor_left()
    return local, remote


def _rows(tmp_path, run: str) -> list[dict]:
    """A run's metrics rows without the wall-clock and arrival-timing columns."""
    return [{k: v for k, v in r.items() if not k.startswith(TIME_COLUMNS)}
            for r in read_metrics(tmp_path / run / "metrics.csv")]


def test_sync_ray_writes_the_local_metric_rows(cluster, tmp_path):
    args = [*FAST, "trainer.sync=true", "total_env_steps=1024", "seed=3"]
    local, remote = _local_then_ray(tmp_path, cluster, args)

    rows = functools.partial(_rows, tmp_path)
    assert len(rows("local")) >= 3 and rows("remote") == rows("local")
    s = _summary(tmp_path / "remote")
    assert s["final_eval_return"] == _summary(tmp_path / "local")["final_eval_return"]
    nodes = {p["node_id"] for p in s["actor_nodes"].values()}
    assert set(s["actor_nodes"]) == {"actor_0_gen_0", "actor_1_gen_0"} and len(nodes) == 2  # one per worker node
    assert "actor 0 on " in remote.stdout and "actor 1 on " in remote.stdout  # the display names the nodes


# a multi-agent env: an actor steps whole PettingZoo envs (every agent of one env in one actor) and, under
# self-play, plays the opponent pool the learner publishes with its weights
AGENTS = {
    "mappo-spread": ["env.id=mpe2.simple_spread_v3:parallel_env", "+env.kwargs.N=3", "+env.kwargs.max_cycles=25",
                     "+env.kwargs.continuous_actions=false", "algo=mappo"],
    "selfplay-c4": ["env.id=pettingzoo.classic.connect_four_v3:env", "algo=ippo", "algo.self_play=true",
                    "algo.self_play_every=1", "algo.self_play_pool=3"],
}


@pytest.mark.parametrize("case", list(AGENTS))
def test_sync_ray_trains_a_multi_agent_env_as_local_actors_do(cluster, tmp_path, case):
    args = ["trainer=subprocess_actors", "trainer.sync=true", "debug=smoke", "env.num_envs=2", "algo.rollout_len=32",
            "algo.update_epochs=1", "eval.every_env_steps=0", "eval.episodes=2", "checkpoint.every_env_steps=0",
            "log.every_env_steps=256", "logger.progress=plain", "total_env_steps=1024", "seed=5", *AGENTS[case]]
    local, remote = _local_then_ray(tmp_path, cluster, args)

    rows = functools.partial(_rows, tmp_path)
    assert len(rows("local")) >= 2 and rows("remote") == rows("local")
    s, ls = _summary(tmp_path / "remote"), _summary(tmp_path / "local")
    assert s["status"] == "completed" and len({p["node_id"] for p in s["actor_nodes"].values()}) == 2
    assert s["final_eval_return_per_agent"] == ls["final_eval_return_per_agent"]
    if case == "selfplay-c4":  # the pool reached the remote actors: the same games, the same outcomes
        assert s["eval_vs_random"] == ls["eval_vs_random"] and s["eval_vs_latest"] == ls["eval_vs_latest"]
        assert set(s["final_eval_return_per_agent"]) == {"player_0", "player_1"}
    else:
        assert set(s["final_eval_return_per_agent"]) == {"agent_0", "agent_1", "agent_2"}


def test_private_instance_even_beside_a_running_cluster(cluster, tmp_path):
    # trainer.ray.address=null is a private instance although this machine runs a cluster (its record in
    # /tmp/ray/ray_current_cluster, RAY_ADDRESS naming it): Ray's own default would join that cluster
    res = _run(tmp_path, *FAST, "total_env_steps=512", "hydra.run.dir=run", "trainer.backend=ray",
               env={**_env(), "RAY_ADDRESS": cluster.address})
    assert res.returncode == 0, res.stderr[-3000:]
    theirs = {n.node_id for n in [cluster.head_node, *cluster.workers]}
    ours = {p["node_id"] for p in _summary(tmp_path / "run")["actor_nodes"].values()}
    assert ours and not ours & theirs, (ours, theirs)
    _no_actor_left()


# -- IMPALA learns CartPole with actors on two nodes; the env module beside the user is shipped to them --------
# (the nodes' workers do not see the launch directory: test_env_module_the_nodes_cannot_import)
BESIDE = "import gymnasium as gym\n\n\ndef make():\n    return gym.make('CartPole-v1')\n"


def test_impala_learns_cartpole_on_two_nodes(cluster, tmp_path):
    (tmp_path / "beside_envs.py").write_text(BESIDE)  # in the launch directory only
    res = _run(tmp_path, "experiment=impala_cartpole", "trainer=subprocess_actors", "env.id=beside_envs:make",
               "hydra.run.dir=run", "logger.progress=off", "total_env_steps=200000", "eval.target_return=475",
               "eval.every_env_steps=10000", "log.every_env_steps=10000", "eval.both_modes=false",
               "checkpoint.every_env_steps=0", "trainer.backend=ray", f"trainer.ray.address={cluster.address}",
               ON_NODES, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    s = _summary(tmp_path / "run")
    # a random policy scores ~20. The preset reaches a greedy evaluation of 475 within 200k steps on every seed
    # measured under subprocess_actors (local seeds 1-16, also with ~4 versions of lag; Ray seeds in the docs), at
    # 100k steps at the latest: the run stops at the first evaluation that reaches it (eval.target_return) and the
    # final evaluation repeats it (same weights, same eval seeds)
    assert s["solved_at_env_steps"] is not None and s["solved_at_env_steps"] == s["total_env_steps"], s
    assert s["best_eval_return"] >= 475 and s["final_eval_return"] >= 475, s
    assert len({p["node_id"] for p in s["actor_nodes"].values()}) == 2
    _no_actor_left()


# -- bad input: one line, non-zero exit, no run dir ---------------------------------------------------------------
def _refused(tmp_path: Path, *args: str, env: dict | None = None, code: list[str] | None = None) -> str:
    started = time.monotonic()
    cmd = [sys.executable, *(code or ["-m", "rltrain"]), *FAST, "hydra.run.dir=run", "trainer.backend=ray", *args]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=90, env=env or _env())
    assert time.monotonic() - started < 60
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("rltrain: error:")]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-3000:]
    assert not (tmp_path / "run").exists(), sorted((tmp_path / "run").rglob("*"))
    return lines[0]


def test_unreachable_head(tmp_path):
    line = _refused(tmp_path, "trainer.ray.address=127.0.0.1:9")  # the discard port: nothing listens
    assert "cannot reach the Ray head at 127.0.0.1:9" in line and "ray start --head" in line


def test_missing_token(cluster, tmp_path):
    env = {**_env(), "RAY_AUTH_MODE": "token", "HOME": str(tmp_path), "RAY_AUTH_TOKEN_PATH": str(tmp_path / "none")}
    env.pop("RAY_AUTH_TOKEN", None)
    line = _refused(tmp_path, f"trainer.ray.address={cluster.address}", env=env)
    assert "authentication token" in line and "RAY_AUTH_TOKEN" in line


def test_resources_no_node_has(cluster, tmp_path):
    line = _refused(tmp_path, f"trainer.ray.address={cluster.address}", "trainer.ray.actor_resources={num_gpus:1}")
    assert "GPU: 1" in line and "no node" in line and "actor_host" in line


def test_ray_not_installed(tmp_path):
    code = ["-c", "import sys; sys.modules['ray'] = None; sys.argv[0] = 'rltrain'; "
                  "from rltrain.cli.train import main; main()"]
    line = _refused(tmp_path, code=code)
    assert "pip install 'rltrain[ray]'" in line


def test_env_module_the_nodes_cannot_import(cluster, tmp_path):
    # the learner imports it (PYTHONPATH), the nodes' workers cannot: named before anything starts
    pkg = tmp_path / "elsewhere" / "hidden_envs"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("import gymnasium as gym\n\ndef make():\n    return gym.make('CartPole-v1')\n")
    env = {**_env(), "PYTHONPATH": str(tmp_path / "elsewhere")}
    line = _refused(tmp_path, f"trainer.ray.address={cluster.address}", ON_NODES, "env.id=hidden_envs:make", env=env)
    assert "cannot be built on the Ray worker nodes" in line and "hidden_envs" in line


# -- a lost node, then SIGTERM (last: it removes a node of the module's cluster) ----------------------------------
def _wait_for(pred, proc: subprocess.Popen, timeout: float = 150.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_no_actor_left_stops_the_run_in_one_line(cluster, tmp_path):
    # both actors need `lonely`, which one extra node offers; once it is removed no node can take their restarts
    lonely = cluster.add_node(num_cpus=2, resources={"lonely": 2}, object_store_memory=100 * MB)
    cluster.wait_for_nodes()
    run, out = tmp_path / "run", tmp_path / "stdout.txt"
    proc = subprocess.Popen([sys.executable, "-m", "rltrain", *FAST, "hydra.run.dir=run", "total_env_steps=10000000",
                             "trainer.backend=ray", f"trainer.ray.address={cluster.address}",
                             "trainer.ray.actor_resources={num_cpus:1,lonely:1}", "trainer.actor_timeout_s=8"],
                            cwd=tmp_path, stdout=out.open("w"), stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    try:
        # a metrics row needs one actor's data; the summary names both only once each reported its node (the
        # progress rows say where each runs from then on)
        _wait_for(lambda: _rows_written(run) >= 1 and _both_placed(out), proc)
        cluster.remove_node(lonely, allow_graceful=False)
        _, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    errors = [ln for ln in err.splitlines() if ln.startswith("rltrain: error:")]
    assert proc.returncode == 1 and len(errors) == 1, err[-3000:]
    assert "and no actor is left; stopping" in errors[0] and "trainer.actor_timeout_s" in errors[0], errors
    s = _summary(run)
    assert s["status"] == "failed" and "no actor is left" in s["error"]
    assert {"actor_0_gen_0", "actor_1_gen_0"} <= set(s["actor_nodes"])
    _no_actor_left()


def _both_placed(stdout: Path) -> bool:
    """Both actors have said where they run (the progress rows name each actor's node from then on)."""
    text = stdout.read_text()
    return "actor 0 on " in text and "actor 1 on " in text


def _rows_written(run: Path) -> int:
    """Rows in the run's metrics.csv so far (0 before the first is written)."""
    path = run / "metrics.csv"
    return len(read_metrics(path)) if path.exists() else 0


def test_node_lost_mid_run_then_sigterm(cluster, tmp_path):
    run, out = tmp_path / "run", tmp_path / "stdout.txt"
    proc = subprocess.Popen([sys.executable, "-m", "rltrain", *FAST, "hydra.run.dir=run", "total_env_steps=10000000",
                             "trainer.backend=ray", f"trainer.ray.address={cluster.address}", ON_NODES,
                             "trainer.actor_timeout_s=8"], cwd=tmp_path, stdout=out.open("w"),
                            stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True)

    def log() -> str:
        return "".join(p.read_text() for p in run.glob("*.log"))

    try:
        # a metrics row exists before the node goes (the progress rows come on a timer, not with the rows)
        _wait_for(lambda: _rows_written(run) >= 1 and _both_placed(out), proc)
        node = re.search(r"actor 0 on .*?node (\w{8})\)", out.read_text()).group(1)  # the progress rows
        victim = next(n for n in cluster.workers if n.node_id.startswith(node))
        cluster.remove_node(victim, allow_graceful=False)
        # its actor is lost, restarted as generation 1, which no node can take (each holds one actor_host)
        _wait_for(lambda: "going on with 1 of 2 actors" in log(), proc)  # warnings: also in the run's log
        steps = _rows_written(run)
        _wait_for(lambda: _rows_written(run) > steps, proc)  # learning goes on
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    s = _summary(run)
    # a restart Ray placed on the dying node before it was declared dead is lost too: one or more restarts
    assert s["status"] == "interrupted" and Path(s["checkpoint"]).exists() and s["restarts"] >= 1
    assert "actor 0 was lost" in log() and "restarting it" in log()
    last = f"actor_0_gen_{s['restarts']}"  # actor 0's last generation: no node could take it
    assert "actor_1_gen_0" in s["actor_nodes"] and last not in s["actor_nodes"]
    _no_actor_left()
    # the user's cluster stays up: the head and the remaining worker node (a node an earlier test of this module
    # removed may still be listed alive until Ray's health check declares it dead, so compare by id)
    alive = {n["NodeID"] for n in ray_nodes(cluster) if n["Alive"]}
    kept = [cluster.head_node, *(n for n in cluster.workers if n is not victim)]
    assert {n.node_id for n in kept} <= alive, alive


def ray_nodes(cluster) -> list[dict]:
    # Ray prints its own warnings (e.g. "raylet has lagging heartbeats") to stdout too: find our line by its tag
    code = (f"import ray, json; ray.init(address={cluster.address!r}, log_to_driver=False); "
            "print('NODES=' + json.dumps(ray.nodes()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env())
    line = next((x for x in out.stdout.splitlines() if x.startswith("NODES=")), None)
    assert line is not None, out.stdout[-2000:] + out.stderr[-2000:]
    return json.loads(line.removeprefix("NODES="))
