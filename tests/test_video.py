"""Evaluation videos: one file per evaluated episode (an Atari game with all its lives, not one per life), and a
MuJoCo env's video on a machine with no display (an off-screen OpenGL picked, or the run refused at start)."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import compose_cfg
from tests.helpers.stub_policies import StubPolicy

ROOT = Path(__file__).resolve().parents[1]


def test_a_game_of_several_lives_is_one_video(tmp_path):
    pytest.importorskip("moviepy")
    from rltrain.envs.make import make_env
    from rltrain.trainers.episodes import evaluate

    def make(render_mode=None):
        return make_env("tests.helpers.lives_env:RenderedLives", {"lives": 3, "life_steps": 5},
                        wrappers=["EpisodicLife"], render_mode=render_mode)

    rets = evaluate(StubPolicy(3), make, episodes=2, eval_seed=0, video_dir=tmp_path / "v", real_scores=True)
    assert len(rets) == 2
    assert len(list((tmp_path / "v").glob("*.mp4"))) == 2  # was 6: one per life


def test_an_atari_evaluation_records_one_video_per_game(tmp_path):
    for module in ("ale_py", "cv2", "moviepy"):
        pytest.importorskip(module)
    from rltrain.cli.build import env_factory
    from rltrain.trainers.episodes import evaluate

    factory = env_factory(OmegaConf.to_container(compose_cfg(["env=atari"]).env, resolve=True))
    evaluate(StubPolicy(4), factory.make, episodes=2, eval_seed=0, video_dir=tmp_path / "v",
             real_scores=factory.real_scores)
    assert len(list((tmp_path / "v").glob("*.mp4"))) == 2  # was 10: Breakout's 5 lives each


def test_an_ordinary_env_records_one_video_per_episode(tmp_path):
    pytest.importorskip("moviepy")
    pytest.importorskip("pygame")
    from rltrain.envs.make import make_env
    from rltrain.trainers.episodes import evaluate

    evaluate(StubPolicy(2), lambda render_mode=None: make_env("CartPole-v1", render_mode=render_mode),
             episodes=2, eval_seed=0, video_dir=tmp_path / "v")
    assert len(list((tmp_path / "v").glob("*.mp4"))) == 2


def _headless(tmp_path, code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh Python with no display and no MUJOCO_GL of the user's."""
    drop = ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM", "HYDRA_FULL_ERROR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env,
                          cwd=tmp_path)


RUN = """
import sys
{patch}
from rltrain.cli.train import main
sys.argv = ["rltrain", "env=mujoco", "env.id=Hopper-v5", "env.num_envs=1", "total_env_steps=64",
            "algo.rollout_len=64", "algo.num_minibatches=1", "algo.update_epochs=1", "logger=quiet",
            "eval.every_env_steps=0", "eval.episodes=1", "eval.max_episode_steps=20", "eval.video=true",
            "hydra.run.dir=run"]
main()
"""


def test_a_mujoco_video_renders_off_screen_on_a_machine_with_no_display(tmp_path):
    for module in ("mujoco", "moviepy"):
        pytest.importorskip(module)
    if not (ctypes.util.find_library("EGL") or ctypes.util.find_library("OSMesa")):
        pytest.skip("needs EGL or OSMesa (an off-screen OpenGL)")
    res = _headless(tmp_path, RUN.format(patch=""))
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(list((tmp_path / "run" / "videos").glob("*.mp4"))) == 1


def test_a_mujoco_video_with_no_off_screen_opengl_is_refused_before_training(tmp_path):
    pytest.importorskip("mujoco")
    pytest.importorskip("moviepy")
    # the library lookup finds nothing: a machine with neither EGL nor OSMesa installed
    res = _headless(tmp_path, RUN.format(patch="import ctypes.util; ctypes.util.find_library = lambda name: None"))
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1, res.stderr[-3000:]
    assert "MUJOCO_GL" in lines[0] and "libegl1" in lines[0], lines
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused at start: nothing trained


def test_the_users_mujoco_gl_is_kept(monkeypatch):
    from rltrain.trainers.episodes import headless_sdl

    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv("MUJOCO_GL", "glfw")
    headless_sdl()
    assert os.environ["MUJOCO_GL"] == "glfw"
