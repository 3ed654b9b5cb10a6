"""trainer=subprocess_actors: the backends' seams, shared weights, batching, preemption, failures, signals,
resume.

Every end-to-end test runs the real CLI (real actor processes) with ``orphan_watch``: no process and no
/dev/shm entry may outlive it. The seams (``rltrain/trainers/actors/seams.py``) are checked twice: each
implementation's members against its Protocol's signatures, and one contract scenario
(``tests/helpers/actor_backends.py``) run against both backends.
"""

from __future__ import annotations

import ast
import inspect
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rltrain.data.structs import Rollout
from rltrain.run.metrics import read_metrics
from rltrain.trainers.actors import seams
from rltrain.trainers.actors.backends import LocalBackend, RayBackend
from rltrain.trainers.actors.ray_actors import RayGroup
from rltrain.trainers.actors.ray_weights import RayWeights, RayWeightsHandle, RayWeightsReader
from rltrain.trainers.actors.rollouts import merge_rollouts
from rltrain.trainers.actors.shared_weights import SharedWeights, WeightsHandle
from rltrain.trainers.supervise import WorkerGroup
from tests.conftest import REPO, child_pids

FAST = ["trainer=subprocess_actors", "debug=smoke", "env.num_envs=2", "algo.rollout_len=32", "algo.num_minibatches=2",
        "algo.update_epochs=1", "eval.every_env_steps=0", "eval.episodes=1", "checkpoint.every_env_steps=0",
        "log.every_env_steps=256", "logger.progress=plain"]


TESTS_ON_PATH = {"PYTHONPATH": str(REPO)}  # env.id=tests.helpers.actor_envs:... from the run's cwd


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# -- the seams: every implementation against its Protocol, then one contract on both backends --------------------
def protocol_mismatches(cls: type, proto: type) -> list[str]:
    """What ``cls`` lacks of ``proto``: a member, or a method whose parameters (names, kinds, which may be left
    out) do not accept every call the Protocol's signature allows."""
    found = []
    members = {n for n in [*vars(proto), *getattr(proto, "__annotations__", {})] if not n.startswith("_")}
    for name in sorted(members):
        want = inspect.getattr_static(proto, name, None)
        have = inspect.getattr_static(cls, name, None)
        if have is None and name not in getattr(cls, "__annotations__", {}):
            found.append(f"{cls.__name__}.{name} is missing")
            continue
        if not inspect.isfunction(want):
            continue  # a property or an attribute: any kind of member of that name reads the same
        if not inspect.isfunction(have):
            found.append(f"{cls.__name__}.{name} is not a method")
            continue
        w = inspect.signature(want).parameters
        h = inspect.signature(have).parameters
        for p in list(w.values())[1:]:
            q = h.get(p.name)
            if q is None or q.kind != p.kind:
                found.append(f"{cls.__name__}.{name}: no {p.kind.description} parameter {p.name!r}")
            elif p.default is not inspect.Parameter.empty and q.default is inspect.Parameter.empty:
                found.append(f"{cls.__name__}.{name}: {p.name!r} may be left out, but has no default")
        for q in list(h.values())[1:]:
            if q.name not in w and q.default is inspect.Parameter.empty and q.kind not in (q.VAR_POSITIONAL,
                                                                                          q.VAR_KEYWORD):
                found.append(f"{cls.__name__}.{name}: needs {q.name!r}, which the Protocol never passes")
    return found


IMPLEMENTATIONS = [
    (seams.ActorEvents, [WorkerGroup, RayGroup]),
    (seams.WeightsTransport, [SharedWeights, RayWeights]),
    (seams.WeightsReader, [SharedWeights, RayWeightsReader]),
    (seams.WeightsHandle, [WeightsHandle, RayWeightsHandle]),
    (seams.ActorBackend, [LocalBackend, RayBackend]),
]


@pytest.mark.parametrize("proto,classes", IMPLEMENTATIONS, ids=[p.__name__ for p, _ in IMPLEMENTATIONS])
def test_each_backend_implements_the_seams(proto, classes):
    assert [m for cls in classes for m in protocol_mismatches(cls, proto)] == []


def test_the_seam_check_catches_a_wrong_implementation():
    class Renamed(WorkerGroup):
        def send(self, worker: int, msg) -> bool:  # the Protocol passes index=
            return False

        def shutdown(self, *, grace_s: float, term_s: float, force: bool) -> None:  # needs what it never gets
            pass

    class Partial:
        def start(self, target, payload, /) -> int:  # positional-only: start(target=..., payload=...) fails
            return 0

    assert protocol_mismatches(Renamed, seams.ActorEvents) == [
        "Renamed.send: no positional or keyword parameter 'index'",
        "Renamed.send: needs 'worker', which the Protocol never passes",
        "Renamed.shutdown: needs 'force', which the Protocol never passes"]
    found = protocol_mismatches(Partial, seams.ActorEvents)
    assert "Partial.poll is missing" in found and "Partial.placement is missing" in found
    assert "Partial.start: no positional or keyword parameter 'target'" in found


def _contract(backend: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.helpers.actor_backends", backend], cwd=REPO,
                         capture_output=True, text=True, timeout=420)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("CONTRACT=")), None)
    assert out.returncode == 0 and line, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(line.removeprefix("CONTRACT="))


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_both_backends_keep_the_seams_contract(backend, no_leaks):
    if backend == "ray":
        pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")
    c = _contract(backend)
    assert c["backend_is_protocol"] and c["events_is_protocol"] and c["weights_is_protocol"]
    # the weights: each version published once the reader caught up is read, in order, whole, with its env
    # steps; of three published at once the reader fetches the newest
    said = c["echo_said"]
    assert said[0] == ["hello", 1]  # the handle attached a seams.WeightsReader
    seen = [s[1:] for s in said if s[0] == "seen"]
    assert [v for v, _, _ in seen][:6] == [0, 1, 2, 3, 4, 5] and seen[-1][0] == 8 and c["transport_version"] == 8
    assert all(steps == 10 * v and whole for v, steps, whole in seen)
    assert [v for v, _, _ in seen] == sorted(set(v for v, _, _ in seen))
    # the learner's messages reach the actor in order, and its answers come back; its result comes back
    assert [s[1] for s in said if s[0] == "pong"] == [1, 2, 3]
    assert c["send_ping_1"] and c["send_finish"] and c["echo_done"] == {"seen": [v for v, _, _ in seen]}
    # a raise is Failed with the actor's traceback; a SIGKILL is Exited; silence is Unresponsive
    assert c["raising_failed"] == ["RuntimeError: boom in the contract target", True]
    assert c["dying_exited"]
    assert c["hanging_silent_s"] >= 4.0
    assert c["send_to_ended"] is False
    # where an actor runs: None locally (this machine), else the very process that said Started
    for who in ("echo", "raising", "dying", "hanging"):
        pid, placed = c[f"{who}_started"]
        assert placed == (None if backend == "local" else pid)
    assert c["alive_after_shutdown"] == []


PACKAGE = REPO / "rltrain"
RAY_MODULES = {"ray_actors.py", "ray_cluster.py", "ray_weights.py"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def test_no_module_reaches_into_ray_private_or_another_backend():
    """No ``ray._private`` (nor any ``ray._x``) anywhere, and in the actors package no private attribute of
    anything but ``self`` / ``cls``: each backend stays behind the seams' public members, and behind Ray's."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO)
        for node in ast.walk(_tree(path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{rel}:{node.lineno} imports {n}" for n in names if n.startswith("ray._")]
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = ast.unparse(node.value)
                if base == "ray" or (path.parent.name == "actors" and base not in ("self", "cls")):
                    found.append(f"{rel}:{node.lineno} reads {base}.{node.attr}")
    assert found == []


def test_ray_is_imported_only_by_the_ray_backend_and_only_when_chosen():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = _tree(path)
        lazy = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.If)) for n in ast.walk(f)}
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for mod in mods:
                if mod.split(".")[0] == "ray" and path.name not in RAY_MODULES:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} imports {mod}")
                if mod.split(".")[-1] in {m[:-3] for m in RAY_MODULES} and id(node) not in lazy \
                        and path.name not in RAY_MODULES:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} imports {mod} at module level")
    assert found == []
    # a local run's modules, and the Ray backend's modules themselves, load without Ray
    code = ("import sys; sys.modules['ray'] = None; import rltrain.trainers.actors.learner, "
            "rltrain.trainers.actors.ray_actors, rltrain.trainers.actors.ray_weights; "
            "from rltrain.trainers.actors.backends import make_backend; from rltrain.envs.make import EnvFactory; "
            "make_backend('local', ray=None, start_method='fork', num_actors=2, env=EnvFactory(id='CartPole-v1'))"
            ".connect(actor_timeout_s=5).shutdown(grace_s=1, term_s=1)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


# -- shared-memory weights ------------------------------------------------------------------------------------
def _reader(handle, conn, stop):
    weights = SharedWeights.attach(handle)
    last, versions = -1, []
    while not stop.value:  # a lock-free flag: a reader SIGKILLed inside Event.is_set() would hold its lock
        update = weights.read_if_newer(last)
        if update:
            last, state = update
            # a torn read would mix two versions: every element equals its version
            assert float(state["w"].min()) == float(state["w"].max()) == float(last)
            if not versions:
                conn.send(last)  # attached and reading
            versions.append(last)
        time.sleep(0.0005)
    # the writer set ``stop`` after its last publish: one more read sees it, however long this reader went
    # unscheduled in between (a loaded machine)
    update = weights.read_if_newer(last)
    if update:
        last, state = update
        assert float(state["w"].min()) == float(state["w"].max()) == float(last)
        versions.append(last)
    conn.send(versions)
    weights.close()


def _publish(weights: SharedWeights, v: int) -> None:
    weights.publish({"w": torch.full((1000,), float(v)), "b": torch.zeros(3, dtype=torch.int64)}, version=v,
                    env_steps=v)


def test_shared_weights_versions_and_no_leak(no_leaks):
    # in its own process: multiprocessing's resource tracker (a child) lives as long as its parent
    out = subprocess.run([sys.executable, "-c", "from tests.test_actors import shm_scenario; shm_scenario()"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not Path(out.stdout.strip().splitlines()[-1]).exists()


def shm_scenario() -> None:
    state = {"w": torch.zeros(1000), "b": torch.zeros(3, dtype=torch.int64)}
    with SharedWeights.create(state) as weights:
        path = Path("/dev/shm") / weights.handle.name
        assert path.exists()
        reader = SharedWeights.attach(weights.handle)
        assert reader.read_if_newer(0) is None  # the version did not move: no copy
        weights.publish({"w": torch.full((1000,), 7.0), "b": torch.ones(3, dtype=torch.int64)}, version=7,
                        env_steps=99)
        version, got = reader.read_if_newer(0)
        assert version == 7 and reader.env_steps == 99 and torch.equal(got["b"], torch.ones(3, dtype=torch.int64))
        reader.close()
        ctx = mp.get_context("fork")
        # the harness shares no lock with the readers (a RawValue, not an Event), so killing one cannot wedge
        # the other or the writer through the test itself; daemon readers, so a failed assert is reported
        # instead of an exit that waits on them
        stop = ctx.RawValue("b", 0)
        pipes = [ctx.Pipe() for _ in range(2)]
        procs = [ctx.Process(target=_reader, args=(weights.handle, pipes[k][1], stop), daemon=True)
                 for k in range(2)]
        for p in procs:
            p.start()
        try:
            for parent, _ in pipes:
                assert parent.poll(60) and parent.recv() == 7
            for v in range(8, 40):
                _publish(weights, v)
                time.sleep(0.005)
            os.kill(procs[0].pid, signal.SIGKILL)  # a reader killed mid-loop cannot wedge the writer
            _publish(weights, 40)
            stop.value = 1  # after the publish: the reader's last read sees version 40
            assert pipes[1][0].poll(60)
            versions = pipes[1][0].recv()
            for p in procs:
                p.join(30)
            assert procs[1].exitcode == 0 and procs[0].exitcode == -signal.SIGKILL
            assert versions[-1] == 40 and versions == sorted(set(versions))  # only forward, each version once
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(5)
            for a, b in pipes:
                a.close()
                b.close()
    assert not path.exists()
    print(path)


def test_merge_rollouts_concatenates_envs():
    def ro(n: int, version: int) -> Rollout:
        T = 4
        return Rollout(obs=np.zeros((T, n, 3), np.float32), actions=np.zeros((T, n), np.int64),
                       log_probs=np.zeros((T, n), np.float32), rewards=np.full((T, n), version, np.float32),
                       terminated=np.zeros((T, n), bool), truncated=np.zeros((T, n), bool),
                       next_obs=np.zeros((T, n, 3), np.float32), policy_version=np.full(T, version, np.int64),
                       episode_returns=[float(version)])

    batch = merge_rollouts([ro(2, 1), ro(3, 5)])
    assert batch.shape == (4, 5) and batch.obs.shape == (4, 5, 3)
    assert batch.policy_version.shape == (4, 5)
    assert (batch.policy_version[:, :2] == 1).all() and (batch.policy_version[:, 2:] == 5).all()
    assert batch.episode_returns == [1.0, 5.0]


# -- end to end -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [
    ["trainer.start_method=fork", "trainer.compress=lz4", "trainer.max_policy_lag=0"],
    pytest.param(["trainer.start_method=spawn", "trainer.compress=zlib"], marks=pytest.mark.slow),
])
def test_async_run_logs_lag_and_seeds(cli, tmp_path, orphan_watch, extra):
    out = cli(*FAST, "total_env_steps=1024", "hydra.run.dir=run", *extra, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "run"
    s = summary(run)
    assert s["status"] == "completed" and s["total_env_steps"] >= 1024 and s["restarts"] == 0
    rows = read_metrics(run / "metrics.csv")
    for col in ("actors/policy_lag_min", "actors/policy_lag_mean", "actors/policy_lag_max", "actors/queue_fill",
                "time/dequeue_wait_s", "time/actor_sps", "time/learner_sps", "actors/policy_version"):
        assert col in rows[0], col
    lags = [float(r["actors/policy_lag_max"]) for r in rows if r["actors/policy_lag_max"]]
    assert lags and min(lags) >= 0
    if "trainer.max_policy_lag=0" in extra:
        assert max(lags) == 0  # older data was dropped (and counted), never learned from
    seeds = json.loads((run / "seeds.json").read_text())["workers"]
    assert {"learner", "actor_0_gen_0", "actor_1_gen_0"} <= set(seeds)
    assert seeds["actor_0_gen_0"]["env_seeds"] != seeds["actor_1_gen_0"]["env_seeds"]
    assert "actor 0:" in out.stdout and "lag min/mean/max" in out.stdout  # per-actor progress rows


@pytest.mark.parametrize("preempt,expect_max", [("trainer.preemption.fraction_samples=0.5", 2.0),
                                                ("trainer.preemption.fraction_workers=0.5", 2.0)])
def test_sync_preemption_thresholds(cli, tmp_path, orphan_watch, preempt, expect_max):
    # actor 1 sleeps 20 ms per step: without preemption every batch would wait for it
    out = cli(*FAST, "total_env_steps=1024", "hydra.run.dir=run", "trainer.sync=true", "trainer.batch_rollouts=4",
              "trainer.start_method=fork", "env.id=tests.helpers.actor_envs:SlowActorCartPole",
              "+env.kwargs.delay_s=0.02", preempt, timeout=180, env=TESTS_ON_PATH)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    sizes = [float(r["actors/batch_rollouts"]) for r in rows if r["actors/batch_rollouts"]]
    assert sizes and max(sizes) <= expect_max < 4  # never a full batch of 4: the threshold ended the wait
    assert float(rows[-1]["actors/preempted_batches"]) > 0
    lags = [float(r["actors/policy_lag_max"]) for r in rows if r["actors/policy_lag_max"]]
    assert max(lags) == 0  # sync: only current-version data is learned from


def test_sync_without_preemption_waits_for_full_batches(cli, tmp_path, orphan_watch):
    out = cli(*FAST, "total_env_steps=512", "hydra.run.dir=run", "trainer.sync=true", "trainer.batch_rollouts=4",
              "trainer.start_method=fork", timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    sizes = [float(r["actors/batch_rollouts"]) for r in rows if r["actors/batch_rollouts"]]
    assert sizes and min(sizes) == 4.0 and float(rows[-1]["actors/preempted_batches"]) == 0
    # sync is reproducible from the seed: a rerun differs only in the time/ columns (wall-clock figures)
    again = cli(*FAST, "total_env_steps=512", "hydra.run.dir=run2", "trainer.sync=true", "trainer.batch_rollouts=4",
                "trainer.start_method=fork", timeout=180)
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = read_metrics(tmp_path / "run2" / "metrics.csv")
    assert [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rerun] == \
        [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_raising_actor_traceback_reaches_learner_and_error_txt(cli, tmp_path, orphan_watch):
    out = cli(*FAST, "total_env_steps=100000", "hydra.run.dir=run", "trainer.on_actor_failure=abort",
              "trainer.start_method=fork", "env.id=tests.helpers.actor_envs:RaisingCartPole", timeout=180,
              env=TESTS_ON_PATH)
    assert out.returncode == 2, out.stderr[-3000:]  # the user's env raised: as a single-process run ends
    console = out.stdout + out.stderr  # Hydra's console log handler writes to stdout
    # one line names the actor, the env call and the exception; the traceback is the run dir's error.txt
    assert "RuntimeError: boom from the env" in console and "Traceback" not in console
    assert re.search(r"rltrain: error: actor [01] failed: env \d failed in step\(\) at its step ", out.stderr)
    assert f"; traceback in {tmp_path / 'run' / 'error.txt'}" in out.stderr
    trace = (tmp_path / "run" / "error.txt").read_text()
    assert "boom from the env" in trace and "Traceback" in trace
    s = summary(tmp_path / "run")
    assert s["status"] == "failed" and "boom" in s["error"] and "on_actor_failure=abort" in s["error"]
    assert s["checkpoint"] and Path(s["checkpoint"]).exists()


def _start(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "rltrain", *FAST, "hydra.run.dir=run", *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # its own process group, as a shell job


def _actor_pids(pid: int) -> list[int]:
    """Forked actors are the learner's children; skip multiprocessing's resource tracker."""
    pids = []
    for p in sorted(child_pids(pid)):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_text()
        except FileNotFoundError:
            continue
        if "resource_tracker" not in cmd and "forkserver" not in cmd:
            pids.append(p)
    return pids


def _wait_for(pred, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _wait_training(proc: subprocess.Popen, run: Path) -> None:
    _wait_for(lambda: (run / "metrics.csv").exists() or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()[1][-3000:]


@pytest.mark.parametrize("policy", ["restart", "abort"])
def test_sigkilled_actor(tmp_path, orphan_watch, policy):
    # restart: the actors hold at their 200th step until the test opens the gate, so the run cannot end (and the
    # pool stop, leaving the death unreported) between the kill and the learner reading the actor's sentinel
    gate = tmp_path / "gate"
    if policy == "restart":
        args = ["total_env_steps=4096", "env.id=tests.helpers.actor_envs:GatedCartPole"]
        env = {**TESTS_ON_PATH, "RLTRAIN_TEST_GATE": str(gate)}
    else:
        args, env = ["total_env_steps=1000000"], None
    proc = _start(tmp_path, *args, "trainer.start_method=fork", f"trainer.on_actor_failure={policy}", env=env)

    def log_text() -> str:
        return "".join(p.read_text() for p in (tmp_path / "run").glob("*.log"))

    try:
        _wait_training(proc, tmp_path / "run")
        victim = _actor_pids(proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        if policy == "restart":
            _wait_for(lambda: "restarting it" in log_text() or proc.poll() is not None)
            gate.touch()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    s = summary(tmp_path / "run")
    if policy == "restart":
        assert proc.returncode == 0, err[-3000:]
        assert s["status"] == "completed" and s["restarts"] == 1
        log = log_text()
        assert "SIGKILL" in log and "restarting it" in log
        seeds = json.loads((tmp_path / "run" / "seeds.json").read_text())["workers"]
        gen1 = [k for k in seeds if k.endswith("_gen_1")]
        assert len(gen1) == 1 and seeds[gen1[0]]["env_seeds"] != seeds[gen1[0].replace("_gen_1", "_gen_0")]["env_seeds"]
    else:
        assert time.monotonic() - killed_at < 60  # detected via the sentinel, then a clean stop with checkpoint
        assert proc.returncode == 1, err[-3000:]
        assert s["status"] == "failed"
        assert "killed by signal SIGKILL" in s["error"] and "on_actor_failure=abort" in s["error"]
        assert Path(s["checkpoint"]).exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_checkpoints_then_resume_continues(tmp_path, orphan_watch, signum):
    run = tmp_path / "run"
    method = "fork" if signum == signal.SIGTERM else "forkserver"
    proc = _start(tmp_path, "total_env_steps=1000000", f"trainer.start_method={method}")
    try:
        _wait_training(proc, run)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)  # Ctrl-C: the terminal signals the whole process group
        else:
            os.kill(proc.pid, signum)  # a batch system's SIGTERM to the learner only
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == {signal.SIGTERM: 143, signal.SIGINT: 130}[signum], err[-3000:]
    first = summary(run)
    assert first["status"] == "interrupted" and Path(first["checkpoint"]).exists()
    if signum == signal.SIGINT:
        return
    steps, updates = first["total_env_steps"], first["updates"]
    resumed = subprocess.run([sys.executable, "-m", "rltrain", *FAST, "hydra.run.dir=run", "resume=auto",
                              f"total_env_steps={steps + 512}", "trainer.start_method=fork"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    second = summary(run)
    assert second["total_env_steps"] >= steps + 512 and second["updates"] > updates
    rows = [r for r in read_metrics(run / "metrics.csv") if int(float(r["env_steps"])) > steps]
    assert rows and min(float(r["actors/policy_version"]) for r in rows) > updates  # the version continued
    seeds = json.loads((run / "seeds.json").read_text())["workers"]
    assert "actor_0_gen_1" in seeds  # resumed actors are new processes with fresh, recorded seeds


def test_an_actor_dropped_on_resume_and_added_back_gets_fresh_seeds(cli, tmp_path, orphan_watch):
    """trainer.num_actors may change on resume: 2 -> 1 -> 2 actors. The actor added back is a new process, so a new
    generation with seeds no earlier session used (actor_1_gen_0's would replay its first session's env streams),
    and seeds.json still lists every generation the run started, earlier sessions' too."""
    run = tmp_path / "run"
    base = [*FAST, "hydra.run.dir=run", "trainer.start_method=fork"]
    for actors, steps, resume in [(2, 256, []), (1, 512, ["resume=auto"]), (2, 768, ["resume=auto"])]:
        out = cli(*base, f"trainer.num_actors={actors}", f"total_env_steps={steps}", *resume, timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
    seeds = json.loads((run / "seeds.json").read_text())["workers"]
    assert {"actor_0_gen_0", "actor_0_gen_1", "actor_0_gen_2", "actor_1_gen_0", "actor_1_gen_1"} <= set(seeds)
    env_seeds = [tuple(tree["env_seeds"]) for name, tree in seeds.items() if name.startswith("actor_")]
    assert len(set(env_seeds)) == len(env_seeds)  # no two starts share an env stream


@pytest.mark.parametrize("algo", ["impala", "dqn"])
def test_other_algorithms_under_actors(cli, tmp_path, orphan_watch, algo):
    # impala: V-trace over lagged actor data; dqn: actors feed the learner's replay buffer (Ape-X style),
    # warm-up random actions follow the learner's env steps published in the shared weights' header
    base = [a for a in FAST if not a.startswith(("algo.num_minibatches", "algo.update_epochs"))]
    # dqn's default learning_starts (10000) exceeds this budget: refused at build (no gradient step ever)
    starts = ["algo.learning_starts=256"] if algo == "dqn" else []
    out = cli(*base, *starts, "total_env_steps=1024", "hydra.run.dir=run", f"algo={algo}", "trainer.start_method=fork",
              timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    s = summary(tmp_path / "run")
    assert s["status"] == "completed" and s["algo"] == algo and s["updates"] >= 2


def test_a_rollout_delivered_as_read_only_views_is_the_learner_s_own():
    """Ray hands a rollout's arrays out as read-only views of its object store (the local pipe unpickles fresh
    ones): decoding makes it the learner's own, writable, so torch.from_numpy neither warns nor could write
    through; a writable rollout is passed on as it is (no copy)."""
    import dataclasses
    import warnings

    import torch

    from rltrain.trainers.actors.actor import decode

    T, n = 3, 2
    owned = Rollout(obs={"a": np.zeros((T, n, 3), np.float32)}, actions=np.zeros((T, n), np.int64),
                    log_probs=np.zeros((T, n), np.float32), rewards=np.ones((T, n), np.float32),
                    terminated=np.zeros((T, n), bool), truncated=np.zeros((T, n), bool),
                    next_obs={"a": np.zeros((T, n, 3), np.float32)}, policy_version=np.zeros(T, np.int64))
    assert decode(owned, "none") is owned
    views = dataclasses.replace(owned)
    for f in dataclasses.fields(views):
        value = getattr(views, f.name)
        for array in (value.values() if isinstance(value, dict) else [value]):
            if isinstance(array, np.ndarray):
                array.flags.writeable = False
    got = decode(views, "none")
    assert got.rewards.flags.writeable and got.obs["a"].flags.writeable and got.actions.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.from_numpy(got.rewards)


def test_a_multi_agent_rollout_delivered_read_only_is_the_learner_s_own_too():
    """A multi-agent env's MultiRollout (a Rollout per policy group) has no rewards of its own: decoding reads its
    groups' (it raised AttributeError under Ray, every multi-agent run behind Ray actors)."""
    import dataclasses

    from rltrain.data.agents import MultiRollout
    from rltrain.trainers.actors.actor import decode

    T, n = 2, 3
    group = Rollout(obs=np.zeros((T, n, 2), np.float32), actions=np.zeros((T, n), np.int64),
                    log_probs=np.zeros((T, n), np.float32), rewards=np.ones((T, n), np.float32),
                    terminated=np.zeros((T, n), bool), truncated=np.zeros((T, n), bool),
                    next_obs=np.zeros((T, n, 2), np.float32), policy_version=np.zeros(T, np.int64))
    owned = MultiRollout(groups={"shared": group}, env_steps=T * n)
    assert decode(owned, "none") is owned
    for f in dataclasses.fields(group):
        value = getattr(group, f.name)
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    got = decode(owned, "none")
    assert got is not owned and got.groups["shared"].rewards.flags.writeable and got.env_steps == T * n
