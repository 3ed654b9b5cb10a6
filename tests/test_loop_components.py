"""The loop only loops: its cadence is a plain schedule, and a trainer's hooks are handed what they need
(the algorithm, the counters), never the loop. A real sequential run through ``TrainLoop`` with recording
hooks."""

from __future__ import annotations

from pathlib import Path

import torch

from rltrain.cli.build import prepare, settings_from
from rltrain.run.checkpoint import load_checkpoint
from rltrain.run.device import pick_device
from rltrain.run.seeding import derive
from rltrain.run.signals import StopFlag
from rltrain.trainers.cadence import NEVER, Cadence
from rltrain.trainers.hooks import LoopHooks, Placement, TrainerParts
from rltrain.trainers.loop import TrainLoop
from tests.conftest import compose_cfg


def test_cadence_keeps_its_grid_across_a_resume():
    fresh = Cadence({"log": 100, "eval": 0}, start_steps=0)
    assert not fresh.due("log", 99) and fresh.due("log", 100)
    fresh.done("log", 130)  # ran late (a rollout overshot the multiple): the next one stays on the grid
    assert fresh.next["log"] == 200 and not fresh.due("log", 199)
    assert fresh.next["eval"] == NEVER and not fresh.due("eval", 10**12)
    resumed = Cadence({"log": 100}, start_steps=250)
    assert resumed.next["log"] == 300


class Recording(LoopHooks):
    def __init__(self):
        self.updates: list[tuple[int, int]] = []
        self.summary_algo = None
        self.resume_checked: list[Path] = []

    def check_resume(self, meta, path, *, algo):
        self.resume_checked.append(path)
        return None

    def after_learn(self, rollout, learn_s, *, algo, counters):
        assert learn_s >= 0 and algo.policy is not None
        self.updates.append((counters["updates"], counters["env_steps"]))

    def log_row(self):
        return {"hooks/updates_seen": float(len(self.updates))}

    def extend_checkpoint(self, state, *, algo):
        state["recording"] = {"updates": len(self.updates), "algo": algo.name}

    def extend_summary(self, summary, status, *, algo):
        summary["recording_updates"] = len(self.updates)


def _loop(run_dir: Path, hooks: LoopHooks, overrides: list[str]) -> TrainLoop:
    cfg = compose_cfg(["debug=smoke", "env.num_envs=2", "algo.rollout_len=32", "algo.num_minibatches=2",
                       "total_env_steps=256", "eval.every_env_steps=0", "eval.episodes=1",
                       "log.every_env_steps=128", "checkpoint.every_env_steps=0", "logger=quiet", *overrides])
    s = settings_from(prepare(cfg))
    torch.set_num_threads(1)
    place = Placement(run_dir, derive(s.seed, s.env.num_envs), pick_device(s.device))
    return TrainLoop(s, place, StopFlag(), TrainerParts(hooks=hooks))


def test_hooks_are_given_the_algorithm_and_counters(tmp_path):
    first = Recording()
    summary = _loop(tmp_path, first, []).run()
    assert summary["status"] == "completed" and summary["recording_updates"] == 4
    assert first.updates == [(1, 64), (2, 128), (3, 192), (4, 256)]  # counters already advanced
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0]
    assert "hooks/updates_seen" in header
    state, _ = load_checkpoint(Path(summary["checkpoint"]))
    assert state["recording"] == {"updates": 4, "algo": "ppo"}
    again = Recording()  # a longer budget in the same run dir resumes from the final checkpoint
    resumed = _loop(tmp_path, again, ["resume=auto", "total_env_steps=320"]).run()
    assert again.resume_checked == [Path(summary["checkpoint"])]
    assert again.updates == [(5, 320)] and resumed["resumed_from_env_steps"] == 256


def test_a_finished_loop_is_freed_without_a_collection(tmp_path, monkeypatch):
    """Nothing of a run's loop outlives it by a reference cycle: main() freezes what is left at exit, so an object in
    a cycle is never finalised, and a simulator freed by no one (ale-py) reports itself leaked."""
    import gc
    import weakref

    from rltrain.cli import build

    loops = []
    original = TrainLoop.__init__

    def tracked(self, *args, **kwargs):
        original(self, *args, **kwargs)
        loops.append(weakref.ref(self))

    monkeypatch.setattr(TrainLoop, "__init__", tracked)
    gc.collect()
    gc.disable()
    try:
        build.run(compose_cfg(["debug=smoke", "logger=quiet", "total_env_steps=512", "eval.episodes=1"]), tmp_path)
        assert len(loops) == 1 and loops[0]() is None  # freed when the last reference went, no collection run
    finally:
        gc.enable()


def test_a_final_evaluation_that_reaches_eval_target_return_says_when(tmp_path):
    """The loop runs no periodic evaluation at the budget's last step: the final evaluation stands in for it. One
    that reached ``eval.target_return`` left ``solved_at_env_steps`` null, which a sweep reading "steps to solve"
    took for a run that never got there; it is the step the run ended at, as the periodic one would have said."""
    from rltrain.cli import build

    common = ["debug=smoke", "logger=quiet", "total_env_steps=512", "eval.episodes=1", "eval.every_env_steps=512"]
    summary = build.run(compose_cfg([*common, "eval.target_return=1"]), tmp_path / "reached")
    assert summary["final_eval_return"] >= 1 and summary["solved_at_env_steps"] == summary["total_env_steps"], summary
    assert summary["solved_at_seconds"] > 0
    summary = build.run(compose_cfg([*common, "eval.target_return=100000"]), tmp_path / "not")
    assert summary["solved_at_env_steps"] is None, summary


def test_evaluations_follow_their_own_cadence_not_the_log_rows(tmp_path):
    """``eval.every_env_steps`` below ``log.every_env_steps`` (or the log off) evaluated only where a log row fell:
    every 256 steps asked, every 1024 (or never) run, and ``best.pt`` and ``eval.target_return`` followed those.
    Each due evaluation runs at its step and writes a row there."""
    import csv

    for log_every, rows_at in (("1024", [256, 512, 768, 1024, 1280, 1536, 1792, 2048]),
                               ("0", [256, 512, 768, 1024, 1280, 1536, 1792, 2048])):
        run_dir = tmp_path / f"log_{log_every}"
        _loop(run_dir, Recording(), ["total_env_steps=2048", "eval.every_env_steps=256",
                                     f"log.every_env_steps={log_every}"]).run()
        with open(run_dir / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["env_steps"]) for r in rows] == rows_at
        assert all(r["eval/return_mean"] != "" for r in rows), rows  # every one of them evaluated
