"""Trainer ``parallel`` end to end, with real agent processes (``python -m rltrain`` subprocesses).

Every test also checks that no process (agents, resource tracker) and no /dev/shm entry outlives the run.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

from rltrain.run.metrics import WALL_CLOCK_PREFIX
from tests.conftest import REPO, run_cli

SMOKE = ["debug=smoke", "logger=quiet", "trainer=parallel"]
ENV = {"PYTHONPATH": str(REPO)}  # agents import tests.helpers.faulty_envs


def summary(path) -> dict:
    return json.loads((path / "summary.json").read_text())


def non_wall_columns(path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if not k.startswith(WALL_CLOCK_PREFIX)} for row in csv.DictReader(f)]


def test_agent_equals_sequential_run_with_its_seed_and_overrides_apply(cli, tmp_path, orphan_watch):
    """total_env_steps is the budget of all agents together, as of all workers under every trainer: each of
    the 2 agents trains on half of total_env_steps=4096, and equals a sequential run of that budget."""
    out = cli(*SMOKE, "trainer.num_agents=2", "trainer.scopes=[2,3]", "total_env_steps=4096",
              "trainer.agent_overrides=[{algo.lr:1e-3},{algo.lr:3e-4,model.hidden_sizes:[32,32]}]",
              "hydra.run.dir=par", timeout=600)
    assert out.returncode == 0, out.stderr
    par = tmp_path / "par"
    s = summary(par)
    assert s["status"] == "completed" and s["aggregate"]["n"] == 2
    # each agent's 2048, rounded up to whole updates (agent 1: 3 envs x 64 steps per update)
    assert [a["total_env_steps"] for a in s["agents"]] == [2048, 2112] and s["total_env_steps"] == 4160
    assert s["budget_env_steps"] == 4096 and "4160 env steps over 2 agents (total_env_steps=4096" in out.stdout
    assert s["final_eval_return"] == s["aggregate"]["mean"]
    assert (par / "learning_curves.png").read_bytes()[:4] == b"\x89PNG"
    seeds = json.loads((par / "seeds.json").read_text())["workers"]
    import yaml

    cfg0 = yaml.safe_load((par / "agent_0" / "config.yaml").read_text())
    cfg1 = yaml.safe_load((par / "agent_1" / "config.yaml").read_text())
    assert (cfg0["algo"]["lr"], cfg0["env"]["num_envs"], cfg0["model"]["hidden_sizes"]) == (1e-3, 2, [64, 64])
    assert (cfg1["algo"]["lr"], cfg1["env"]["num_envs"], cfg1["model"]["hidden_sizes"]) == (3e-4, 3, [32, 32])
    assert cfg0["total_env_steps"] == cfg1["total_env_steps"] == 2048
    assert cfg1["seed"] == seeds["agent_1"]["root"] == s["agents"][1]["seed"] != cfg0["seed"]
    for name in ("metrics.csv", "summary.json", "seeds.json", "checkpoints/final.pt"):
        assert (par / "agent_1" / name).exists(), name
    # agent 1 == a sequential run with agent 1's derived seed, env count and overrides
    out = cli("debug=smoke", "logger=quiet", f"seed={cfg1['seed']}", "env.num_envs=3", "algo.lr=3e-4",
              "model.hidden_sizes=[32,32]", "total_env_steps=2048", "hydra.run.dir=seq", timeout=600)
    assert out.returncode == 0, out.stderr
    par_rows = non_wall_columns(par / "agent_1" / "metrics.csv")
    seq_rows = non_wall_columns(tmp_path / "seq" / "metrics.csv")
    assert len(par_rows) >= 4 and par_rows == seq_rows
    assert summary(tmp_path / "seq")["final_eval_return"] == s["agents"][1]["final_eval_return"]


BUDGET = [*SMOKE, "logger.progress=plain", "eval.episodes=1", "eval.every_env_steps=0",
          "checkpoint.every_env_steps=0", "trainer.num_agents=2", "total_env_steps=5000"]


def start_line(stdout: str) -> str:
    lines = [x for x in stdout.splitlines() if x.startswith("[rltrain] budget: ")]
    assert len(lines) == 1, stdout
    return lines[0].removeprefix("[rltrain] budget: ")


def test_the_start_line_says_where_the_agents_end_as_they_then_do(cli, tmp_path, orphan_watch):
    """2 agents, 2500 env steps each, in whole updates of 256: the start line says 2560 each, 5120 in all, and
    the progress rows and the summary agree with it."""
    out = cli(*BUDGET, "hydra.run.dir=run", timeout=600)
    assert out.returncode == 0, out.stderr
    line = start_line(out.stdout)
    assert line == "total_env_steps=5000 over 2 agents, 2500 each: each runs to 2560 env steps (10 whole updates " \
                   "of algo.rollout_len (64) x env.num_envs (4) = 256), 5120 env steps in all; 2% over", line
    ends, updates, size, in_all = map(int, re.search(r"runs to (\d+) env steps \((\d+) whole updates of .* = (\d+)"
                                                     r"\), (\d+) env steps in all", line).groups())
    s = summary(tmp_path / "run")
    assert [a["total_env_steps"] for a in s["agents"]] == [ends, ends] == [updates * size] * 2
    assert s["total_env_steps"] == in_all and f"completed: {in_all} env steps over 2 agents" in out.stdout
    rows = re.findall(r"^\[agent_\d\] \d+/(\d+) steps", out.stdout, re.M)
    assert rows and set(rows) == {str(ends)}, out.stdout  # the rows count to where each agent ends


def test_agents_of_different_update_sizes_each_get_their_end_and_rltrain_check_says_it(cli, tmp_path, orphan_watch):
    """agent_overrides giving agent 1 another update (3 envs x 100 steps): each agent's end is said, as it runs,
    and rltrain-check's row is the start line (the agents composed over the command line's overrides)."""
    overrides = "trainer.agent_overrides=[{},{algo.rollout_len:100,env.num_envs:3}]"
    out = cli(*BUDGET, overrides, "hydra.run.dir=run", timeout=600)
    assert out.returncode == 0, out.stderr
    line = start_line(out.stdout)
    assert line == "total_env_steps=5000 over 2 agents, 2500 each: in whole updates, agent 0: 2560 (10 x 256), " \
                   "agent 1: 2700 (9 x 300), 5260 env steps in all; 5% over", line
    said = [(int(k), int(e), int(u) * int(n))
            for k, e, u, n in re.findall(r"agent (\d+): (\d+) \((\d+) x (\d+)\)", line)]
    s = summary(tmp_path / "run")
    assert [(a["index"], a["total_env_steps"], a["total_env_steps"]) for a in s["agents"]] == said
    assert f"{s['total_env_steps']} env steps in all" in line
    assert {re.findall(rf"^\[agent_{k}\] \d+/(\d+) steps", out.stdout, re.M)[0] for k in (0, 1)} == {"2560", "2700"}
    check = subprocess.run([sys.executable, "-m", "rltrain.cli.check", *BUDGET, overrides], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"})
    assert check.returncode == 0, check.stdout + check.stderr
    assert " ".join(line.split()) in " ".join(check.stdout.replace("\u2502", " ").split()), check.stdout


def test_raising_and_killed_agents_are_reported_and_the_others_finish(cli, tmp_path, orphan_watch):
    out = cli(*SMOKE, "trainer.num_agents=3",
              "trainer.agent_overrides=[{},{env.id:tests.helpers.faulty_envs:raising_cartpole},"
              "{env.id:tests.helpers.faulty_envs:sigkill_cartpole}]", "hydra.run.dir=run", timeout=600, env=ENV)
    assert out.returncode == 0, out.stderr  # continue: the run is still useful
    s = summary(tmp_path / "run")
    assert s["status"] == "partial" and s["failed_agents"] == [1, 2]
    assert s["agents"][0]["status"] == "completed" and s["aggregate"]["n"] == 1
    assert s["final_eval_return"] == s["agents"][0]["final_eval_return"]
    assert "RuntimeError: faulty env" in s["agents"][1]["error"]
    assert "faulty_envs.py" in s["agents"][1]["traceback"]
    assert s["agents"][2]["error"] == "killed by signal SIGKILL"
    # an env fault is one line naming the env and its step; the agent's traceback is in its error.txt
    assert "rltrain: agent 1 failed: env 0 failed in step() at its step 101: RuntimeError: faulty env" in out.stderr
    assert out.stderr.count("agent_1/error.txt") == 1, out.stderr  # the line names it once
    assert "faulty_envs.py" in (tmp_path / "run" / "agent_1" / "error.txt").read_text()
    assert "rltrain: agent 2 failed: killed by signal SIGKILL" in out.stderr


def test_abort_stops_the_other_agents_with_a_checkpoint(cli, tmp_path, orphan_watch):
    out = cli(*SMOKE, "trainer.num_agents=2", "trainer.on_agent_failure=abort",
              "trainer.agent_overrides=[{total_env_steps:10000000},"
              "{env.id:tests.helpers.faulty_envs:raising_cartpole_after_agent_0}]",
              "hydra.run.dir=run", timeout=600, env=ENV)
    assert out.returncode == 1, out.stderr
    s = summary(tmp_path / "run")
    assert s["status"] == "failed" and s["failed_agents"] == [1]
    assert s["agents"][0]["status"] == "interrupted" and "abort" in s["agents"][0]["stop_reason"]
    assert s["agents"][0]["total_env_steps"] < 10_000_000
    assert list((tmp_path / "run" / "agent_0" / "checkpoints").glob("step_*.pt"))


def test_sigint_stops_all_agents_with_checkpoints(tmp_path, orphan_watch):
    # a new session, signalled as a group: what Ctrl-C in a terminal does (every process gets SIGINT)
    proc = subprocess.Popen([sys.executable, "-m", "rltrain", *SMOKE, "trainer.num_agents=2",
                             "total_env_steps=10000000", "logger.progress=plain", "hydra.run.dir=run"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 300
    running = set()
    while len(running) < 2 and time.monotonic() < deadline:  # both agents are training
        line = proc.stdout.readline()
        if not line:
            break
        if "steps (" in line and not line.split("]")[1].strip().startswith("0/"):
            running.add(line.split("]")[0])
    assert len(running) == 2, proc.stderr.read() if proc.poll() is not None else "agents never started"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err
    assert "resume=auto" in err
    s = summary(tmp_path / "run")
    assert s["status"] == "interrupted" and s["stop_reason"] == "SIGINT"
    for k in (0, 1):
        assert s["agents"][k]["status"] == "interrupted"
        assert list((tmp_path / "run" / f"agent_{k}" / "checkpoints").glob("step_*.pt"))
    # resume=auto: every agent continues from its own checkpoint, here to a slightly larger budget
    steps = [s["agents"][k]["total_env_steps"] for k in (0, 1)]
    budget = max(steps) + 512  # each agent's: total_env_steps is the two agents' together
    out = run_cli([*SMOKE, "trainer.num_agents=2", f"total_env_steps={2 * budget}", "hydra.run.dir=run",
                   "resume=auto"], cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    s = summary(tmp_path / "run")
    assert s["status"] == "completed"
    for k in (0, 1):
        agent = summary(tmp_path / "run" / f"agent_{k}")
        assert agent["status"] == "completed" and agent["total_env_steps"] >= budget
        first = non_wall_columns(tmp_path / "run" / f"agent_{k}" / "metrics.csv")[0]
        assert int(float(first["env_steps"])) <= steps[k]  # rows from before the stop were kept


def test_wall_time_adds_up_over_a_sigterm_and_resume(tmp_path, orphan_watch):
    """The parent's wall_time_s, like each agent's, is the run's over every session, not the last one's."""
    proc = subprocess.Popen([sys.executable, "-m", "rltrain", *SMOKE, "trainer.num_agents=1",
                             "total_env_steps=10000000", "logger.progress=plain", "hydra.run.dir=run"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # the agent is training
        line = proc.stdout.readline()
        if not line or ("steps (" in line and not line.split("]")[1].strip().startswith("0/")):
            break
    time.sleep(3)  # a first session clearly longer than the second's start-up: the sum is not the last
    proc.send_signal(signal.SIGTERM)  # what `kill` and SLURM send the parent; it stops the agent
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err
    run = tmp_path / "run"
    first, agent_first = summary(run), summary(run / "agent_0")["wall_time_s"]
    assert first["status"] == "interrupted" and first["wall_time_s"] > agent_first > 0, first
    budget = first["agents"][0]["total_env_steps"] + 512
    started = time.monotonic()
    out = run_cli([*SMOKE, "trainer.num_agents=1", f"total_env_steps={budget}", "hydra.run.dir=run", "resume=auto"],
                  cwd=tmp_path, timeout=600)
    elapsed = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    final, agent = summary(run), summary(run / "agent_0")["wall_time_s"]
    assert final["status"] == "completed" and agent > agent_first  # the agent's own: its checkpoint's counter
    # the parent's second session holds the agent's, and lies within the command's time
    assert first["wall_time_s"] + (agent - agent_first) <= final["wall_time_s"] <= first["wall_time_s"] + elapsed


def test_an_agent_s_share_below_one_update_is_refused_in_the_parent_s_terms(cli, tmp_path):
    """300 steps over 2 agents is 150 each, less than one update of 256: refused at start (each agent would have
    run a whole update, 512 in all), in one line naming the share and the total the user sets; nothing written."""
    out = cli(*BUDGET, "total_env_steps=300", "hydra.run.dir=run", timeout=120)
    errors = [x for x in out.stderr.splitlines() if x.startswith("rltrain: error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-3000:]
    assert errors[0] == ("rltrain: error: trainer=parallel: agent 0 of 2 gets 150 of total_env_steps=300, less than "
                         "one update: algo.rollout_len (64) x env.num_envs (4) = 256 env steps; raise total_env_steps "
                         "(the agents share it) or make the rollout smaller"), errors[0]
    assert not (tmp_path / "run").exists()
