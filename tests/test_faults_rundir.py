"""The run dir tells the truth at all times, provoked with real runs.

``summary.json`` says ``running`` while a run is live and ``crashed`` is recorded on the next start after a
SIGKILL; no step appears twice in ``metrics.csv`` or TensorBoard after any resume; a refused command leaves
no files; a resume with changed settings refuses in one line unless ``resume_allow_changes`` names them; a
sweep whose jobs all crash fails as a whole and counts them.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_faults import SMOKE, _pythonpath, _stderr_lines, _summary, _train

TB = "logger.sinks=[csv,tensorboard]"


def _steps(run_dir: Path) -> list[int]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [int(float(r["env_steps"])) for r in csv.DictReader(f)]


def _tensorboard_steps(run_dir: Path, tag: str = "time/wall") -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def _repeated(steps: list[int]) -> list[int]:
    return [s for s, n in Counter(steps).items() if n > 1]


@pytest.mark.parametrize("trainer", [[], ["trainer=parallel", "trainer.num_agents=2"]], ids=["sequential", "parallel"])
def test_resume_auto_of_a_finished_run_logs_no_step_twice(tmp_path, trainer):
    run_dir = tmp_path / "run"
    assert _train(run_dir, TB, *trainer).returncode == 0
    res = _train(run_dir, TB, *trainer, "resume=auto")
    assert res.returncode == 0, res.stderr[-3000:]
    dirs = sorted(run_dir.glob("agent_*")) or [run_dir]
    for d in dirs:
        assert _repeated(_steps(d)) == [], _steps(d)
        assert _repeated(_tensorboard_steps(d)) == [], _tensorboard_steps(d)
        assert _steps(d)[-1] == 2048 // len(dirs)  # parallel's agents share total_env_steps


def test_resume_after_an_interruption_logs_no_step_twice(tmp_path):
    run_dir = tmp_path / "run"
    assert _train(run_dir, TB, "total_env_steps=1536").returncode == 0  # ends between two checkpoints' steps
    res = _train(run_dir, TB, "total_env_steps=3072", "resume=auto")
    assert res.returncode == 0, res.stderr[-3000:]
    steps, tb = _steps(run_dir), _tensorboard_steps(run_dir)
    assert _repeated(steps) == [] and _repeated(tb) == [] and steps == sorted(steps), steps
    assert steps[-1] == 3072


def test_summary_says_running_while_live_and_crashed_after_a_sigkill(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.Popen([sys.executable, "-m", "rltrain", *SMOKE, f"hydra.run.dir={run_dir}",
                             "total_env_steps=100000000"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not (run_dir / "metrics.csv").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        live = _summary(run_dir)
        assert live["status"] == "running" and live["pid"] == proc.pid and live["host"] and live["started_at"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert _summary(run_dir)["status"] == "running"  # what a killed run leaves: a dead pid, no lock holder
    res = _train(run_dir, "total_env_steps=2048", "resume=auto")  # a fresh start over its checkpoints: refused
    assert res.returncode == 0, res.stderr[-3000:]
    warnings = [ln for ln in _stderr_lines(res) if "warning" in ln]
    assert len(warnings) == 1 and f"pid {proc.pid}" in warnings[0] and "crashed" in warnings[0], res.stderr
    crashed = _summary(run_dir)["crashed_before"]
    assert crashed["status"] == "crashed" and crashed["pid"] == proc.pid and crashed["last_env_steps"] >= 512


@pytest.mark.parametrize("overrides", [["total_env_steps=-1"], ["algo.lr=-1"], ["env.step_timeout_s=0"]])
def test_a_refused_command_leaves_no_files(tmp_path, overrides):
    run_dir = tmp_path / "run"
    res = _train(run_dir, *overrides)
    assert res.returncode == 2 and len(_stderr_lines(res)) == 1, res.stderr
    assert not run_dir.exists(), sorted(run_dir.rglob("*"))


def test_a_command_refused_in_another_runs_dir_leaves_its_hydra_files(tmp_path):
    """Hydra writes a command's ``.hydra/`` (config, overrides) into the run dir before the task starts: a command
    refused there (a fresh start over a run's checkpoints, a resume with changed settings) put its own settings in
    place of the run's, which ``rltrain-report`` and a reader then took for the run's. They are put back."""
    run_dir = tmp_path / "run"
    assert _train(run_dir, "total_env_steps=1024").returncode == 0
    before = {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}
    for extra in (["algo.lr=0.5"], ["algo.lr=0.5", "resume=auto"]):
        res = _train(run_dir, "total_env_steps=1024", *extra)
        assert res.returncode == 2 and len(_stderr_lines(res)) == 1, res.stderr
        assert {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()} == before, extra


def test_a_resume_with_changed_settings_refuses_unless_allowed_and_then_uses_them(tmp_path):
    run_dir = tmp_path / "run"
    env = ["env.id=tests.helpers.faulty_envs:make_counting", "env.num_envs=2"]
    assert _train(run_dir, *env, "+env.kwargs.length=5", "total_env_steps=1024").returncode == 0
    # another trainer on resume: refused before anything is written (it would restart from step 0)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".rltrain.lock"}
    res = _train(run_dir, *env, "+env.kwargs.length=5", "resume=auto", "trainer=parallel")
    assert res.returncode == 2 and len(_stderr_lines(res)) == 1, res.stderr
    assert "trainer._target_: 'rltrain.trainers.sequential.SequentialTrainer' -> " in res.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name in before} == before
    # changed env kwargs: one line listing the difference and the opt-in
    res = _train(run_dir, *env, "+env.kwargs.length=8", "resume=auto", "total_env_steps=2048")
    assert res.returncode == 2 and len(_stderr_lines(res)) == 1, res.stderr
    assert "env.kwargs.length: 5 -> 8" in res.stderr and "resume_allow_changes=[env.kwargs.length]" in res.stderr
    # opted in: the run trains with the new value (fresh envs, not the pickled ones) and records it
    res = _train(run_dir, *env, "+env.kwargs.length=8", "resume=auto", "total_env_steps=2048",
                 "resume_allow_changes=[env.kwargs]")
    assert res.returncode == 0, res.stderr[-3000:]
    summary = _summary(run_dir)
    assert summary["resumed_from_env_steps"] == 1024 and summary["resume_changes"] == ["env.kwargs.length: 5 -> 8"]
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[-1]["rollout/episode_length"]) == 8.0  # make_counting ends episodes at `length`


def test_a_resume_does_not_compare_a_key_the_run_does_not_read(tmp_path):
    """A resume refused a changed ``algo.n_quantiles`` in a DQN without a QR head: a key the run never reads, which
    the start line already says is not read, cannot change what the run computes. It is not compared (run dir
    and checkpoint alike; ``rltrain-check`` too); a key the run reads still is."""
    run_dir = tmp_path / "run"
    dqn = ["algo=dqn", "experiment=none", "algo.learning_starts=64", "eval.every_env_steps=0", "eval.episodes=1"]
    assert _train(run_dir, *dqn, "algo.n_quantiles=51", "total_env_steps=1024").returncode == 0
    more = [*dqn, "resume=auto", "total_env_steps=2048"]
    check = subprocess.run([sys.executable, "-m", "rltrain.cli.check", *SMOKE, f"hydra.run.dir={run_dir}", *more,
                            "algo.n_quantiles=200"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    res = _train(run_dir, *more, "algo.n_quantiles=200")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "algo.n_quantiles=200 is not read: only algo.distributional=qr uses it (now none)" in res.stdout
    summary = _summary(run_dir)
    assert summary["resumed_from_env_steps"] == 1024 and not summary.get("resume_changes"), summary
    res = _train(run_dir, *[*dqn, "resume=auto", "total_env_steps=3072"], "algo.lr=0.01")
    assert res.returncode == 2 and "algo.lr: 0.0001 -> 0.01" in res.stderr, res.stderr
    # rltrain-check says the same line, the key to allow included (its console read "[algo.lr]" as a style tag)
    check = subprocess.run([sys.executable, "-m", "rltrain.cli.check", *SMOKE, f"hydra.run.dir={run_dir}", *dqn,
                            "resume=auto", "total_env_steps=3072", "algo.lr=0.01", "model.hidden_sizes=[32]"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    said = " ".join((check.stdout + check.stderr).split())
    assert check.returncode == 2 and "resume_allow_changes=[algo.lr,model.hidden_sizes]" in said, said[-2000:]
    assert "model.hidden_sizes=[32] hydra.run.dir" in said or "model.hidden_sizes=[32])" in said, said[-2000:]


def test_a_resume_whose_envs_start_afresh_does_not_replay_the_first_sessions_seeds(tmp_path):
    """Envs that cannot continue from the checkpoint (``env.vectorization=async``, whose envs live in other
    processes; another env count; a rank above 0) were reset with the run's env seeds again, so the resumed
    session replayed the first one's episodes. They now start from seeds drawn from the run's and the resume
    step: new to the run, and the same for the same resume."""
    import shutil

    run_dir, log = tmp_path / "run", tmp_path / "seeds.log"
    env = ["env.id=tests.helpers.counting_env:SeedLogging", f"+env.kwargs.log={log}", "env.num_envs=2",
           "env.vectorization=async", "eval.every_env_steps=0", "eval.episodes=1"]
    assert _train(run_dir, *env, "total_env_steps=512").returncode == 0
    tree = json.loads((run_dir / "seeds.json").read_text())["workers"]["main"]

    def seeds(log) -> list[int]:  # the training envs' (not the env probe's 0, not the evaluation's)
        return [s for s in map(int, log.read_text().split()) if s not in (0, tree["eval_seed"])] \
            if log.exists() else []

    first = seeds(log)
    assert sorted(first) == sorted(tree["env_seeds"]), first  # reset once, seeded once per env
    shutil.copytree(run_dir, tmp_path / "again")
    res = _train(run_dir, *env, "total_env_steps=1024", "resume=auto")
    assert res.returncode == 0, res.stderr[-3000:]
    # built, the envs are reset with the run's seeds; the resume then resets them, unstepped, with new ones
    resumed = seeds(log)[2:]
    assert len(resumed) == 4 and sorted(resumed[:2]) == sorted(first), resumed
    assert not set(resumed[2:]) & set(first), (first, resumed)
    log.unlink()
    assert _train(tmp_path / "again", *env, "total_env_steps=1024", "resume=auto").returncode == 0
    again = seeds(log)  # the same resume, the same seeds (each env's own process writes its line: any order)
    assert sorted(again[:2]) == sorted(resumed[:2]) and sorted(again[2:]) == sorted(resumed[2:]), (again, resumed)


def test_a_sweep_whose_jobs_all_crash_fails_and_counts_them(tmp_path):
    res = run_cli(["-m", *SMOKE, "seed=1,2", "env.id=tests.helpers.broken_envs:Raising", "env.num_envs=2",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, timeout=300,
                  env={"PYTHONPATH": _pythonpath()})
    assert res.returncode == 1, res.stderr[-3000:]
    assert "0/2 jobs completed, 2 failed" in res.stderr, res.stderr
    summaries = sorted((tmp_path / "sweep").glob("*/summary.json"))
    assert len(summaries) == 2 and all(_summary(p.parent)["status"] == "failed" for p in summaries)
