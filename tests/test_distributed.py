"""trainer=distributed_simulator: real processes, real gloo (and nccl when a GPU is there).

Covers: launch detection (torchrun / SLURM variables, node lists), the equivalence of W ranks x n envs with
one process x W*n envs on the same data, identical replicas after training, local spawn / torchrun launch
paths, resume rules, faults (a rank that raises, a rank SIGKILLed) and Ctrl-C.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rltrain.trainers.rendezvous import LaunchInfo, detect_launch, expand_nodelist, free_port
from tests.conftest import REPO, run_cli

# 2 ranks x 2 envs x 64 steps = 256 env steps per update: 8 updates in 2048 steps
FAST = ["trainer=distributed_simulator", "total_env_steps=2048", "algo.rollout_len=64", "env.num_envs=2",
        "eval.every_env_steps=0", "eval.episodes=1", "log.every_env_steps=512", "checkpoint.every_env_steps=1024",
        "logger.progress=plain", "logger.progress_interval_s=1", "trainer.timeout_s=30", "hydra.run.dir=run"]
TEST_ENV = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


# -- launch detection ---------------------------------------------------------------------------------------
def test_nodelist_expansion():
    assert expand_nodelist("node01") == ["node01"]
    assert expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_nodelist("r[1-2]n[3-4]") == ["r1n3", "r1n4", "r2n3", "r2n4"]


def test_the_local_rendezvous_holds_its_port_from_the_pick_to_close():
    """The port of a local spawn is never free between the OS's pick and the end of the run: another socket cannot
    bind it before ``serve`` (a rank that connects early waits in the backlog) nor after; ``close`` frees it."""
    from datetime import timedelta

    import torch.distributed as dist

    from rltrain.trainers.rendezvous import LocalRendezvous

    def bindable(port: int) -> bool:
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # only a listener refuses it, not TIME_WAIT
            try:
                other.bind(("127.0.0.1", port))
                return True
            except OSError:
                return False

    with LocalRendezvous("127.0.0.1", 2, timeout_s=30) as rendezvous:
        port = rendezvous.port
        assert not bindable(port)
        early = socket.create_connection(("127.0.0.1", port), timeout=5)  # queued, not refused
        rendezvous.serve()
        assert not bindable(port)
        client = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=30))
        client.set("k", "v")
        assert client.add("n", 2) == 2 and client.get("k") == b"v"
        del client
        early.close()
    assert bindable(port)
    LocalRendezvous("127.0.0.1", 2, timeout_s=30).close()  # never served: the socket alone is closed


def test_a_rank_ends_its_watchdog_before_it_leaves_the_group():
    """The heartbeat watchdog stops when asked (run_rank asks before destroy_process_group): a daemon thread left
    inside a store call at interpreter exit aborts the process with SIGABRT after a completed run."""
    from rltrain.trainers.distributed import TorchDistSync

    class Store:  # counts the heartbeats, as the rendezvous store's add does
        beats = 0

        def add(self, key, n):
            Store.beats += n
            return Store.beats

    sync = TorchDistSync(rank=0, world_size=1, timeout_s=60.0, grad_device=torch.device("cpu"), store=Store())
    sync.start_watchdog()
    deadline = time.monotonic() + 30
    while Store.beats == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Store.beats > 0  # it was beating
    sync.stop_watchdog()
    assert not sync._watch_thread.is_alive()
    beats = Store.beats
    time.sleep(1.2)
    assert Store.beats == beats  # and beats no more


def test_detect_torchrun_and_slurm(monkeypatch):
    assert detect_launch({}) is None
    assert detect_launch({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NODELIST": "a1"}) is None  # 1 task: spawn
    tr = detect_launch({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "29400"})
    assert tr == LaunchInfo(3, 4, 1, "h", 29400, "torchrun")
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol: our own parser
    sl = detect_launch({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                        "SLURM_NODELIST": "gpu[07-10]", "SLURM_JOB_ID": "123456"})
    assert sl == LaunchInfo(5, 8, 1, "gpu07", 15000 + 123456 % 20000, "slurm")


# -- equivalence: 2 ranks x n envs == 1 process x 2n envs on the same data ------------------------------------
def test_two_ranks_equal_one_process_with_twice_the_envs(tmp_path, no_leaks):
    from tests.helpers.dist_equiv import N_PER_RANK, make_ppo, make_rollout

    port = free_port()  # plain subprocesses, no multiprocessing: pytest must not own a resource tracker
    env = {**os.environ, **TEST_ENV}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.helpers.dist_equiv", str(r), str(port),
                               str(tmp_path / f"r{r}.pt")], env=env, cwd=REPO) for r in range(2)]
    assert [p.wait(timeout=90) for p in procs] == [0, 0]
    single = make_ppo(2 * N_PER_RANK)
    m1 = single.learn(make_rollout(2 * N_PER_RANK), progress=0.0)
    ranks = [torch.load(tmp_path / f"r{r}.pt", weights_only=True) for r in range(2)]
    for key, ref in single.policy.state_dict().items():
        assert torch.equal(ranks[0]["policy"][key], ranks[1]["policy"][key]), key  # replicas bitwise equal
        torch.testing.assert_close(ranks[0]["policy"][key], ref, rtol=1e-5, atol=1e-6, msg=key)
    initial = make_ppo(N_PER_RANK).policy.state_dict()["torso.nets.weights.0"]
    assert not torch.equal(ranks[0]["policy"]["torso.nets.weights.0"], initial)  # an update did happen
    for key in ("loss/policy", "loss/value", "loss/entropy"):  # means of equal-sized halves = the global mean
        assert ranks[0]["metrics"][key] == pytest.approx(m1[key], rel=1e-5, abs=1e-6)


# -- launch paths, identical replicas, resume ------------------------------------------------------------------
def test_local_spawn_trains_identical_replicas_and_resumes(cli, tmp_path, no_leaks):
    r = cli(*FAST, "trainer.world_size=2", timeout=180, env=TEST_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    s = summary(tmp_path / "run")
    assert s["status"] == "completed" and s["world_size"] == 2 and s["backend"] == "gloo"
    assert s["launcher"] == "local" and s["total_env_steps"] == 2048 and s["updates"] == 8
    assert len(s["rank_sps"]) == 2 and all(v > 0 for v in s["rank_sps"])
    assert len(set(s["rank_param_sha256"])) == 1, s["rank_param_sha256"]
    seeds = json.loads((tmp_path / "run" / "seeds.json").read_text())["workers"]
    assert set(seeds) == {"rank_0", "rank_1"}
    assert not set(seeds["rank_0"]["env_seeds"]) & set(seeds["rank_1"]["env_seeds"])
    assert (tmp_path / "run" / "checkpoints" / "final.pt").exists()

    # same global batch (2 x 2 envs x 64 = 1 x 4 x 64): resumes on one rank
    r = cli(*FAST, "trainer.world_size=1", "env.num_envs=4", "total_env_steps=3072", "resume=auto",
            timeout=180, env=TEST_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    s = summary(tmp_path / "run")
    assert s["status"] == "completed" and s["total_env_steps"] == 3072 and s["updates"] == 12

    # a different global batch is refused, with the arithmetic and the fix
    r = cli(*FAST, "trainer.world_size=1", "total_env_steps=4096", "resume=auto", timeout=180, env=TEST_ENV)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "global batch" in r.stderr and "1 x 2 x 64 = 128" in r.stderr and "env.num_envs=4" in r.stderr
    # rltrain-check refuses it too (it said `valid`), and passes the resume that fits
    check = run_cli([*FAST, "trainer.world_size=1", "total_env_steps=4096", "resume=auto"], cwd=tmp_path,
                    env=TEST_ENV, module="rltrain.cli.check")
    said = " ".join((check.stdout + check.stderr).split())  # rich wraps the line at the terminal's width
    assert check.returncode == 2 and "global batch" in said and "env.num_envs=4" in said, said[-3000:]
    check = run_cli([*FAST, "trainer.world_size=2", "total_env_steps=4096", "resume=auto"], cwd=tmp_path,
                    env=TEST_ENV, module="rltrain.cli.check")
    assert check.returncode == 0, check.stdout[-3000:]


def test_episodes_are_counted_over_every_rank_as_env_steps_are(cli, tmp_path, no_leaks):
    """Episodes of exactly 10 steps: 2 ranks x 2 envs x 512 steps end 4 x 51 of them (rank 0's alone: 102),
    in the summary and in metrics.csv's last row."""
    r = cli(*FAST, "trainer.world_size=2", "env.id=tests.helpers.faulty_envs:make_counting", "experiment=none",
            "algo.num_minibatches=2", timeout=180, env=TEST_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    s = summary(tmp_path / "run")
    assert s["total_env_steps"] == 2048 and s["episodes"] == 4 * 51, s
    with (tmp_path / "run" / "metrics.csv").open() as f:
        rows = {int(float(row["env_steps"])): float(row["rollout/episodes"]) for row in csv.DictReader(f)}
    assert rows[512] == 4 * 12 and rows[2048] == 4 * 51, rows  # at 512: 128 steps per env, 12 episodes each


def test_eval_target_return_stops_every_rank_at_the_same_update(cli, tmp_path, no_leaks):
    """Only rank 0 evaluates: the stop on ``eval.target_return`` must be agreed, or rank 1 would wait in the
    next gradient all-reduce until trainer.timeout_s. CartPole's return is >= 1 on every episode."""
    r = cli(*FAST, "trainer.world_size=2", "eval.every_env_steps=512", "eval.target_return=1", timeout=180,
            env=TEST_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    s = summary(tmp_path / "run")
    assert s["status"] == "completed" and s["solved_at_env_steps"] == s["total_env_steps"] == 512, s


def _torchrun(args: list[str], cwd: Path, *, nnodes: int = 1, node_rank: int = 0, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node_rank={node_rank}",
           f"--nproc_per_node={2 if nnodes == 1 else 1}", "--master_addr=127.0.0.1", f"--master_port={port}",
           "-m", "rltrain", *args]
    env = {**os.environ, **TEST_ENV, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def test_torchrun_two_processes(tmp_path, no_leaks):
    p = _torchrun(FAST, tmp_path, port=free_port())
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 0, out[-3000:]
    s = summary(tmp_path / "run")
    assert s["launcher"] == "torchrun" and s["world_size"] == 2 and s["total_env_steps"] == 2048
    assert len(set(s["rank_param_sha256"])) == 1


@pytest.mark.slow
def test_torchrun_two_nodes_on_localhost(tmp_path, no_leaks):
    port = free_port()
    nodes = [_torchrun(FAST, tmp_path, nnodes=2, node_rank=k, port=port) for k in range(2)]
    outs = [n.communicate(timeout=240)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    s = summary(tmp_path / "run")
    assert s["world_size"] == 2 and len(set(s["rank_param_sha256"])) == 1


# -- faults and Ctrl-C -------------------------------------------------------------------------------------
# the user's env raising exits 2 as in a single-process run; a killed rank is the infrastructure's failure: 1
@pytest.mark.parametrize(("mode", "expect", "code"), [
    ("raise", "rank 1 failed: env 0 failed in step() at its step 150: RuntimeError: injected fault on rank 1", 2),
    ("kill", "rank 1 killed by signal SIGKILL", 1)])
def test_a_failing_rank_stops_the_job(cli, tmp_path, no_leaks, mode, expect, code):
    timeout_s, stamp = 20, tmp_path / "fault.time"
    r = cli(*FAST, "total_env_steps=100000", f"trainer.timeout_s={timeout_s}",
            "env.id=tests.helpers.faulty_envs:faulty_cartpole", "env.max_episode_steps=500",
            "+env.kwargs.fault_rank=1", f"+env.kwargs.mode={mode}", "+env.kwargs.after_steps=150",
            f"+env.kwargs.stamp={stamp}", timeout=180, env=TEST_ENV)
    reaction = time.time() - float(stamp.read_text())  # from the fault to the whole job's exit
    assert r.returncode == code, r.stderr[-3000:]
    assert expect in r.stderr, r.stderr[-3000:]
    assert reaction < timeout_s, reaction
    s = summary(tmp_path / "run")
    assert s["status"] == "failed" and s["failed_rank"] == 1


def test_ctrl_c_checkpoints_and_stops_all_ranks(tmp_path, no_leaks):
    run = tmp_path / "run"
    env = {**os.environ, **TEST_ENV, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    with open(tmp_path / "out.txt", "w") as out:
        p = subprocess.Popen([sys.executable, "-m", "rltrain", *FAST, "total_env_steps=10000000",
                              "checkpoint.every_env_steps=0"], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                             env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:  # wait until training is under way
            csv = run / "metrics.csv"
            if csv.exists() and len(csv.read_text().splitlines()) >= 3:
                break
            time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=60)
    text = (tmp_path / "out.txt").read_text()
    assert rc == 130, text[-3000:]
    s = summary(run)
    assert s["status"] == "interrupted" and s["stop_reason"] == "SIGINT" and "resume=auto" in s["resume_command"]
    assert len(set(s["rank_param_sha256"])) == 1  # both ranks stopped at the same update
    assert list((run / "checkpoints").glob("step_*.pt"))


def test_config_error_in_a_rank_is_one_line_exit_2(cli, tmp_path, no_leaks):
    # the parent never builds envs: the bad keyword fails inside the ranks, as a ConfigError
    r = cli(*FAST, "env.id=tests.helpers.faulty_envs:faulty_cartpole", "+env.kwargs.bogus=1", timeout=180, env=TEST_ENV)
    assert r.returncode == 2, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "env.kwargs" in lines[0] and "bogus" in lines[0], r.stderr[-3000:]


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return None


def test_ranks_exit_when_their_parent_is_killed(tmp_path, orphan_watch):
    from tests.conftest import child_pids

    run = tmp_path / "run"
    env = {**os.environ, **TEST_ENV, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "rltrain", *FAST, "total_env_steps=10000000"], cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:  # wait until training is under way
        csv = run / "metrics.csv"
        if csv.exists() and len(csv.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    helpers = child_pids(p.pid)  # the two ranks (and a fork server, if one was needed)
    assert p.poll() is None and len(helpers) >= 2, helpers
    p.kill()
    p.wait(timeout=10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_state(pid) not in (None, "Z") for pid in helpers):
        time.sleep(0.2)
    assert all(_state(pid) in (None, "Z") for pid in helpers), {pid: _state(pid) for pid in helpers}


# -- GPU ---------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nccl_on_gpus(cli, tmp_path, no_leaks):
    world = min(torch.cuda.device_count(), 2)  # nccl needs one GPU per rank
    r = cli(*FAST, f"trainer.world_size={world}", "device=cuda", "trainer.backend=nccl", timeout=300, env=TEST_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    s = summary(tmp_path / "run")
    assert s["backend"] == "nccl" and s["world_size"] == world and s["status"] == "completed"
    assert len(set(s["rank_param_sha256"])) == 1


def test_averaged_gradients_keep_each_parameter_layout(tmp_path):
    """``TorchDistSync.grads`` over a real gloo group: a parameter without a gradient gets the average in its own
    layout (an input-major first layer, models.layers.input_major), as autograd would give it; FusedAdam reads
    parameter and gradient in memory order, so a row-major gradient would move the wrong weights."""
    import torch.distributed as dist

    from rltrain.models.layers import hidden_mlp
    from rltrain.trainers.distributed import TorchDistSync

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        net, _ = hidden_mlp(3, (16,), "tanh")
        weight, bias = net[0].weight, net[0].bias
        assert weight.stride() == (1, 16)
        bias.grad = torch.ones(16)
        sync = TorchDistSync(rank=0, world_size=1, timeout_s=30.0, grad_device=torch.device("cpu"))
        sync.grads([weight, bias])  # the weight has no gradient: the average of zeros, in its layout
        assert weight.grad.stride() == weight.stride() and not weight.grad.any()
        weight.grad = torch.arange(48.0).reshape(3, 16).t()  # [16, 3] in the weight's layout
        expect = weight.grad.clone()
        sync.grads([weight, bias])
        assert weight.grad.stride() == weight.stride() and torch.equal(weight.grad, expect)
        assert torch.equal(bias.grad, torch.ones(16))
    finally:
        dist.destroy_process_group()


def test_episode_statistics_pool_every_rank_in_rows_and_summary(cli, tmp_path, no_leaks):
    """Each env's episodes last (and return) 11 + seed % 16 steps: a row's mean, min, max and length and the
    summary's last-100 return read every rank's episodes, the same ones, not rank 0's (fewer than 100 per rank
    here, so the summary's figure is the mean over all of them)."""
    r = cli(*FAST, "trainer.world_size=2", "env.id=tests.helpers.faulty_envs:SeededLengthEnv", "experiment=none",
            "algo.num_minibatches=2", timeout=180, env=TEST_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    seeds = json.loads((tmp_path / "run" / "seeds.json").read_text())["workers"]
    lengths = {rank: [11 + seed % 16 for seed in seeds[rank]["env_seeds"]] for rank in ("rank_0", "rank_1")}
    every = lengths["rank_0"] + lengths["rank_1"]
    assert (min(every), max(every)) != (min(lengths["rank_0"]), max(lengths["rank_0"])), lengths  # tells them apart
    per_env = 512  # 2048 steps over 2 ranks x 2 envs
    returns = [length for length in every for _ in range(per_env // length)]
    s = summary(tmp_path / "run")
    assert s["episodes"] == len(returns) and s["train_return_last100"] == pytest.approx(np.mean(returns)), s
    with (tmp_path / "run" / "metrics.csv").open() as f:
        last = [row for row in csv.DictReader(f)][-1]
    assert float(last["rollout/episode_return_min"]) == min(every), last
    assert float(last["rollout/episode_return_max"]) == max(every), last
    assert min(every) <= float(last["rollout/episode_return"]) <= max(every)
    assert float(last["rollout/episode_length"]) == pytest.approx(float(last["rollout/episode_return"]))
