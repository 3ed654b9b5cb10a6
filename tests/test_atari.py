"""The Atari presets run from real ale-py games: train, checkpoint, resume and evaluate with a video.

Learning to a score is GPU work (see the presets' headers); here each preset must run end to end on a budget
of a few updates, from the CLI, as a user on a CPU would first try it."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow
pytest.importorskip("ale_py")
pytest.importorskip("cv2")
QUIET = ["logger=quiet", "eval.episodes=1", "eval.every_env_steps=0", "checkpoint.every_env_steps=512"]


def _summary(path) -> dict:
    return json.loads((path / "summary.json").read_text())


def _no_leak_report(stderr: str) -> None:
    """A run leaves no ALE simulator alive at exit: nanobind would report each one ("leaked N instances")."""
    assert "nanobind: leaked" not in stderr, stderr[-2000:]


def test_ppo_atari_trains_resumes_and_evaluates_with_video(tmp_path):
    pytest.importorskip("moviepy")
    run = tmp_path / "run"
    small = ["experiment=ppo_atari", "env.num_envs=2", "algo.rollout_len=64", *QUIET, f"hydra.run.dir={run}"]
    first = run_cli([*small, "total_env_steps=256"], cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    _no_leak_report(first.stderr)
    assert _summary(run)["status"] == "completed" and (run / "checkpoints" / "final.pt").exists()
    resumed = run_cli([*small, "total_env_steps=512", "resume=auto"], cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _no_leak_report(resumed.stderr)  # the envs restored from envs.pkl replace the ones built: all freed
    s = _summary(run)
    assert s["status"] == "completed" and s["resumed_from_env_steps"] == 256 and s["total_env_steps"] == 512
    ev = run_cli([str(run), "--episodes", "1", "--video"], cwd=tmp_path, timeout=600, module="rltrain.cli.evaluate")
    assert ev.returncode == 0, ev.stderr[-2000:]
    _no_leak_report(ev.stderr)
    assert "mean return" in ev.stdout and list((run / "videos").glob("*.mp4")), ev.stdout


@pytest.mark.parametrize(("preset", "extra"), [
    ("dqn_atari", ["algo.learning_starts=128", "algo.buffer_size=4096", "algo.batch_size=8"]),
    ("impala_atari", ["env.num_envs=2", "algo.rollout_len=32"]),
])
def test_dqn_and_impala_atari_presets_run_and_checkpoint(tmp_path, preset, extra):
    out = run_cli([f"experiment={preset}", *extra, *QUIET, "total_env_steps=512", "hydra.run.dir=run"],
                  cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    _no_leak_report(out.stderr)
    assert _summary(tmp_path / "run")["status"] == "completed"
    assert (tmp_path / "run" / "checkpoints" / "final.pt").exists()
    assert sys.executable  # the run used this interpreter's ale-py (pytest.importorskip above)
