"""The benchmark scripts keep working: a quick run of bench_throughput prints its side-by-side table."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_bench_throughput_quick_prints_the_table():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RLTRAIN_SB3_PYTHON", None)
    out = subprocess.run([sys.executable, "scripts/bench_throughput.py", "--quick", "--only", "env,train,sb3"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("measured at commit "), out.stdout[:200]  # a quoted figure names its tree
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines()
            if line.startswith("| ") and "---" not in line}
    assert {"env", "train", "sb3"} <= set(rows), out.stdout
    env_sps = float(rows["env"].split("|")[3].replace(",", ""))
    train_sps = float(rows["train"].split("|")[3].replace(",", ""))
    assert 0 < train_sps < env_sps  # training can never outrun random actions on the same envs
    assert "skipped" in rows["sb3"] and "--sb3-python" in rows["sb3"]  # no SB3 here: said, not silently dropped


def test_bench_learning_runs_presets_on_other_envs_and_tables_the_sources_metric(tmp_path):
    """``preset:ENV_ID`` runs a preset on another env (one multirun per env); MuJoCo rows use CleanRL's
    metric (mean of the last 100 training episodes), the others the final evaluation."""
    pytest.importorskip("mujoco")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "scripts/bench_learning.py", "--presets", "ppo_cartpole",
                          "ppo_mujoco:InvertedPendulum-v5", "--seeds", "1", "--out", str(tmp_path / "b"),
                          "total_env_steps=2048", "eval.episodes=1"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    table = (tmp_path / "b" / "learning.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    assert set(rows) == {"ppo_cartpole", "ppo_mujoco:InvertedPendulum-v5"}, table
    assert "final eval (10 ep)" in rows["ppo_cartpole"] and ">= 475" in rows["ppo_cartpole"]
    assert "last 100 train episodes" in rows["ppo_mujoco:InvertedPendulum-v5"]
    assert (tmp_path / "b" / "learning.png").stat().st_size > 0


def _bench_offpolicy(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "scripts/bench_offpolicy.py", "--runs", "1", "--dqn-steps", "1200",
                           "--sac-steps", "200", "--sac-width", "16", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=env)


def _table(stdout: str) -> dict[str, list[str]]:
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in stdout.splitlines() if line.startswith("| ") and "---" not in line and "case" not in line}


def test_bench_offpolicy_without_sb3_says_the_peer_side_is_skipped():
    out = _bench_offpolicy("--only", "dqn", "--sb3-python", "/nonexistent/python")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "the SB3 side is skipped" in out.stderr and "pip install stable-baselines3" in out.stderr
    (row,) = [v for k, v in _table(out.stdout).items() if k != "row"]  # the header row left out
    assert float(row[0]) > 0 and row[1] == "-" and row[2] == "-"  # rltrain's CPU time, no SB3 column, no ratio


def test_bench_offpolicy_prints_cpu_ratios_against_sb3():
    pytest.importorskip("stable_baselines3")
    out = _bench_offpolicy()
    assert out.returncode == 0, out.stderr[-3000:]
    rows = _table(out.stdout)
    assert [k.split(",")[0] for k in rows] == ["DQN CartPole-v1", "SAC Pendulum-v1 16x16"], out.stdout
    for cells in rows.values():
        ours, peer, ratio = (float(c) for c in cells[:3])
        assert ours > 0 and peer > 0 and abs(ratio - ours / peer) < 0.1  # a median of one pair: the ratio itself


def test_bench_defaults_lists_its_rows_and_refuses_an_unknown_one():
    """scripts/bench_defaults.py: the table's rows (rltrain's defaults vs SB3's; SB3 is needed only to run it)."""
    listed = subprocess.run([sys.executable, "scripts/bench_defaults.py", "--list"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert {"taxi", "frozenlake", "minigrid-empty", "doorkey", "doorkey-lstm", "dict-goal", "mountaincar-sac",
            "acrobot-ppo", "acrobot-dqn", "memory-a2c", "frozenlake-a2c", "dict-goal-a2c", "memory-impala-actors",
            "memory-impala", "frozenlake-impala", "dict-goal-impala"} == set(names), listed.stdout
    line = {ln.split()[0]: ln for ln in listed.stdout.splitlines()}
    assert "experiment=none" in line["acrobot-dqn"]
    impala = line["memory-impala-actors"]
    assert "model.core=lstm trainer=subprocess_actors trainer.num_actors=2 vs ppo, rllib" in impala, impala
    assert line["memory-a2c"].split()[1] == "a2c" and "vs sb3" in line["memory-a2c"]
    bad = subprocess.run([sys.executable, "scripts/bench_defaults.py", "--envs", "taxy"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "unknown --envs ['taxy']" in bad.stderr, bad.stderr
    zero = subprocess.run([sys.executable, "scripts/bench_defaults.py", "--envs", "taxi", "--own-budget-scale", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert zero.returncode != 0 and "--own-budget-scale must be > 0" in zero.stderr, zero.stderr
    typo = subprocess.run([sys.executable, "scripts/bench_defaults.py", "--peers", "rlib"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert typo.returncode != 0 and "unknown --peers ['rlib']" in typo.stderr, typo.stderr


def test_bench_defaults_runs_only_the_peers_asked_for():
    """``--peers rllib`` on a row whose peers are rltrain's PPO and RLlib: rltrain's run and RLlib's line (skipped
    here, no --rllib-python), and no PPO run."""
    out = subprocess.run([sys.executable, "scripts/bench_defaults.py", "--envs", "frozenlake-impala", "--seeds", "1",
                          "--budget-scale", "0.01", "--peers", "rllib"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("frozenlake-impala")]
    assert [r[2] for r in rows] == ["rllib"], out.stdout
    assert "skipped: no --rllib-python" in out.stdout


def test_bench_multiagent_prints_its_table(tmp_path):
    """One seed of IPPO on MPE simple_spread at a tiny budget; skrl's columns are skipped where the peers' python
    has no skrl (CI), and filled where it has."""
    pytest.importorskip("mpe2")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PEERS_PYTHON": str(tmp_path / "no-python")}
    out = subprocess.run([sys.executable, "scripts/bench_multiagent.py", "--envs", "spread", "--algos", "ippo",
                          "--seeds", "1", "--budget-scale", "0.025"], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| spread | ippo | 2500 |"))
    assert "skipped (no skrl" in row
    floors = {line.split("|")[1].strip(): float(line.split("|")[2].split("+-")[0])
              for line in out.stdout.splitlines() if line.startswith(("| random moves", "| no-op"))}
    assert set(floors) == {"random moves", "no-op (action 0)"} and all(-40 < v < -15 for v in floors.values())
    bad = subprocess.run([sys.executable, "scripts/bench_multiagent.py", "--envs", "spreadd"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "unknown --envs/--algos ['spreadd']" in bad.stderr, bad.stderr


def test_bench_algorithms_prints_its_rows_at_a_tiny_budget():
    """scripts/bench_algorithms.py at a tiny budget: TD3, SAC + HER, QR-DQN, C51 and PQN each run rltrain and
    print its evaluation, return and CPU; a peer column is SB3's / sb3-contrib's where this Python has them, else
    skipped in one line; C51's peer is CleanRL's published number, quoted with its source; the goal task has
    success rates. A bad row name is one line and exit 2."""
    import importlib.util

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "scripts/bench_algorithms.py", "--seeds", "1", "--scale", "0.001",
                          "--only", "td3-pendulum,her-sac,qrdqn-cartpole,c51-cartpole,pqn-cartpole",
                          "--learning-starts", "td3-pendulum=200", "--budget", "c51-cartpole=1000"],
                         cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {k.split(",")[0]: v for k, v in _table(out.stdout).items() if k != "row"}  # the header aside
    assert list(rows) == ["TD3 Pendulum-v1", "SAC + HER PointReach (sparse)", "QR-DQN CartPole-v1",
                          "C51 CartPole-v1", "PQN CartPole-v1"], out.stdout
    # cells: steps, eval (rltrain, peer), last 100 (both), eval success (both), CPU (both), ratio
    for cells in rows.values():
        assert int(cells[0]) >= 1000 and float(cells[7].split()[0]) > 0  # env steps run, rltrain's CPU seconds
        assert cells[1] != "-"  # rltrain's final evaluation
    assert rows["TD3 Pendulum-v1"][0] == "1200" and rows["TD3 Pendulum-v1"][5] == "-"  # 200 random + 1000
    assert 0.0 <= float(rows["SAC + HER PointReach (sparse)"][5].split()[0]) <= 1.0  # a success rate
    assert "huggingface.co/cleanrl/CartPole-v1-c51-seed1" in rows["C51 CartPole-v1"][2]
    assert "same-run ratios; shared VM" in out.stdout
    if importlib.util.find_spec("stable_baselines3"):
        assert float(rows["TD3 Pendulum-v1"][8].split()[0]) > 0 and rows["TD3 Pendulum-v1"][9] != "-"
    else:
        assert "stable_baselines3 not importable" in out.stderr and rows["TD3 Pendulum-v1"][8] == "-"
    bad = subprocess.run([sys.executable, "scripts/bench_algorithms.py", "--only", "td4"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "unknown rows ['td4']" in bad.stderr
