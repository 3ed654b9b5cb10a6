"""Evaluation episodes on separate envs with fixed seeds (periodic eval, final eval, ``rltrain-eval``).

Episode j of an evaluation always starts from seed ``eval_seed + j``: evaluations at different points of
training (and of different runs with the same root seed) see the same start states, and evaluation never
touches the training RNGs (stochastic evaluation draws from its own generator).
"""

from __future__ import annotations

import ctypes.util
import os
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from rltrain.data.structs import Policy, obs_buffer, obs_map
from rltrain.envs.deadline import EnvFault, env_fault
from rltrain.envs.make import env_spec
from rltrain.errors import ConfigError
from rltrain.models.cores import put_state, reset_state, select_state
from rltrain.run.signals import StopFlag

# the step cap of an evaluation episode on an env without a time limit of its own (some of Gymnasium's own
# envs register none: a greedy policy that walks into a wall would evaluate forever)
NO_LIMIT_CAP = 100_000


def time_limit(env: gym.Env) -> int | None:
    """The env's own episode step limit: a ``TimeLimit`` among its wrappers, or its registered one."""
    while env is not None:
        if isinstance(env, gym.wrappers.TimeLimit):
            return int(env._max_episode_steps)
        env = getattr(env, "env", None)
    return None


def evaluate(policy: Policy, make_env: Callable[..., gym.Env], *, episodes: int, eval_seed: int,
             deterministic: bool = True, device: torch.device | None = None, video_dir: Path | None = None,
             max_parallel: int = 16, real_scores: bool = False, max_episode_steps: int | None = None,
             stop: StopFlag | None = None, capped: list[int] | None = None,
             successes: list[bool] | None = None) -> np.ndarray:
    """Run ``episodes`` full episodes on envs from ``make_env(render_mode=...)``; returns their returns
    [episodes] (float64), episode j from seed ``eval_seed + j``. Up to ``max_parallel`` episodes run side by
    side and act as one batch (one forward pass per step instead of one per episode: evaluation was a third of
    a CartPole solve's wall time); with a video, one env records every episode in turn.

    ``real_scores`` (an ``env.wrappers`` list is applied): an episode is a whole game, scored by the
    unclipped ``info["real_score"]`` (envs/wrappers.py), not a learning episode that a life loss ended.

    A recurrent policy acts with its core state, one per env, zeroed whenever that env starts an episode.

    Every episode ends: one longer than ``max_episode_steps`` (None: the env's own time limit, or
    ``NO_LIMIT_CAP`` steps when it has none) is cut there like a truncation, and its index appended to
    ``capped``. ``successes`` gets each episode's last ``info["is_success"]`` where the env reports one (goal
    tasks), in the order the episodes end. ``stop`` is checked every step: a stop request raises ``StopRequested``."""
    device = device or torch.device("cpu")
    width = 1 if video_dir is not None else max(1, min(episodes, max_parallel))
    envs = []
    for _ in range(width):
        env = make_env(render_mode="rgb_array" if video_dir else None)
        envs.append(_record_video(env, video_dir) if video_dir is not None else env)
    gen = torch.Generator(device=device).manual_seed(eval_seed)
    # as in training: the stored keys in their storage dtype (the model converts / scales), one array per key
    template = obs_buffer(env_spec(envs[0], "eval").observation, (0,))
    space = envs[0].action_space
    low = high = None
    if hasattr(space, "low") and space.dtype != np.int64:
        low, high = space.low, space.high
    cap = max_episode_steps or (None if time_limit(envs[0]) else NO_LIMIT_CAP)
    returns = np.zeros(episodes)
    totals = [0.0] * width  # Python floats: one add per step, no numpy scalar
    lengths = [0] * width  # steps of each env's current game (real_scores: across its lives)
    episode_of = [-1] * width  # which episode each env is playing
    stepped = [0] * width  # each env's steps, for the line that names a failing one
    obs: list = [None] * width
    started = 0
    for i in range(min(width, episodes)):
        obs[i], _ = _call(envs[i].reset, i, 0, "reset()", seed=eval_seed + started)
        episode_of[i], started = started, started + 1
    active = list(range(min(width, episodes)))
    state = policy.initial_state(width)
    was_training = policy.training
    policy.eval()
    try:
        with torch.inference_mode():
            while active:
                if stop is not None and stop.signum is not None:  # the poll without a call per batch
                    stop.check("evaluation")
                batch = obs_map(lambda t, *xs: torch.as_tensor(np.array(xs, t.dtype), device=device), template,
                                *[obs[i] for i in active])
                if state is None:
                    actions = policy.act(batch, deterministic=deterministic, generator=gen).action.cpu().numpy()
                else:
                    out = policy.act(batch, select_state(state, active), deterministic=deterministic, generator=gen)
                    actions, state = out.action.cpu().numpy(), put_state(state, active, out.state)
                if low is not None:
                    actions = np.clip(actions, low, high)
                # scalar actions as Python numbers (what .item() gave each one), the others row by row
                acts = actions.tolist() if actions.ndim == 1 else actions
                still = []
                for k, i in enumerate(active):
                    stepped[i] += 1
                    try:
                        o, rew, term, trunc, info = envs[i].step(acts[k])
                        totals[i] += float(rew)
                    except Exception as err:  # the user's env: the one line a training env's failure is
                        raise eval_fault(err, i, stepped[i], "step()") from err
                    lengths[i] += 1
                    if cap is not None and lengths[i] >= cap and not (term or trunc):
                        # cut like a time limit: the whole game ends, its rewards so far are its return
                        trunc, info = True, {"real_score": totals[i]}
                        if capped is not None:
                            capped.append(episode_of[i])
                    if state is not None and (term or trunc):  # a new episode (or life) starts from zero
                        state = reset_state(state, np.arange(width) == i)
                    if real_scores and (term or trunc) and "real_score" not in info:
                        # a learning episode (a life) ended, the game goes on (and so does its video)
                        o, _ = _call(envs[i].next_life if isinstance(envs[i], GameVideo) else envs[i].reset, i,
                                     stepped[i], "reset() (a life was lost)")
                    elif term or trunc or "real_score" in info:  # with env.wrappers: the real game score
                        returns[episode_of[i]], totals[i] = info.get("real_score", totals[i]), 0.0
                        if successes is not None and "is_success" in info:
                            successes.append(bool(info["is_success"]))
                        lengths[i] = 0
                        if started == episodes:
                            continue  # this env is done
                        o, _ = _call(envs[i].reset, i, stepped[i], "reset() (its episode had ended)",
                                     seed=eval_seed + started)
                        episode_of[i], started = started, started + 1
                    obs[i] = o
                    still.append(i)
                active = still
    finally:
        policy.train(was_training)
        for env in envs:
            env.close()
    return returns


def eval_fault(err: BaseException, env_index: int, env_step: int, call: str) -> EnvFault:
    """An evaluation env that raised or returned what is not a number: the training env's one line (exit 2, the
    traceback chained for ``error.txt``), named as an evaluation env (a fresh one each evaluation)."""
    return EnvFault(f"evaluation {env_fault(err, env_index, env_step, call)}", env_index=env_index, env_step=env_step)


def _call(fn: Callable[..., tuple], env_index: int, env_step: int, call: str, **kwargs) -> tuple:
    """An evaluation env's ``reset`` (an episode's start: rare next to its steps, a call more costs nothing)."""
    try:
        return fn(**kwargs)
    except Exception as err:
        raise eval_fault(err, env_index, env_step, call) from err


def headless_sdl() -> None:
    """SDL's dummy video and audio drivers for this process, where the user chose none. A video renders
    off-screen (``rgb_array``), but an env that draws with pygame (Gymnasium's classic control, Box2D) runs
    ``pygame.init()``, whose SDL probes for a display and a sound server: on a headless machine the display
    probe prints ``error: XDG_RUNTIME_DIR is invalid or not set in the environment.`` on a run that
    succeeds. SDL reads these when pygame initialises it: set before the first render, which imports pygame.

    MuJoCo renders with OpenGL, GLFW's by default, which needs a display: with none (no ``DISPLAY`` /
    ``WAYLAND_DISPLAY``) and no ``MUJOCO_GL`` of the user's, ``MUJOCO_GL`` is set to an off-screen backend that
    is installed (``egl``, else ``osmesa``; none: left unset, and ``check_mujoco_video`` refuses). MuJoCo reads
    it when it is imported: called before any env is built where a video is asked (``rltrain``,
    ``rltrain-eval --video``)."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    if not headless() or os.environ.get("MUJOCO_GL"):
        return
    backend = offscreen_gl()
    if backend is not None:
        os.environ["MUJOCO_GL"] = backend


def headless() -> bool:
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def offscreen_gl() -> str | None:
    """The off-screen OpenGL backend MuJoCo can use here: ``egl`` or ``osmesa`` where its library is found."""
    for backend, lib in (("egl", "EGL"), ("osmesa", "OSMesa")):
        if ctypes.util.find_library(lib):
            return backend
    return None


def check_mujoco_video(env: gym.Env) -> None:
    """Refuse a MuJoCo env's video where it cannot render: no display, no ``MUJOCO_GL``, no EGL nor OSMesa
    (GLFW would print warnings and fail with ``mujoco.FatalError``)."""
    mods = {c.__module__ for c in type(env.unwrapped).__mro__}
    if not any(m.split(".")[0] in ("mujoco", "dm_control") or ".mujoco" in m for m in mods):
        return
    if headless() and not os.environ.get("MUJOCO_GL"):
        raise ConfigError("eval.video=true (--video) cannot render a MuJoCo env here: no display and no off-screen "
                          "OpenGL (MUJOCO_GL unset, neither EGL nor OSMesa found); install libegl1 (or libosmesa6) "
                          "or set MUJOCO_GL, or set eval.video=false")


def check_video(make_env: Callable[..., gym.Env]) -> None:
    """``eval.video=true`` checked at start (``rltrain``, ``rltrain-check``): one env built and rendered as the
    final evaluation will, so that a video that cannot be made is refused before training, not after it."""
    env = make_env(render_mode="rgb_array")
    try:
        _check_render(env)
    finally:
        env.close()


def _check_render(env) -> None:
    try:
        import moviepy  # noqa: F401
    except ImportError:
        raise ConfigError("eval.video=true needs moviepy: pip install 'rltrain[video]'") from None
    headless_sdl()
    check_mujoco_video(env)
    try:
        env.reset(seed=0)
        env.render()
    except gym.error.DependencyNotInstalled as err:
        raise ConfigError(f"eval.video=true cannot render this env ({err}): pip install 'rltrain[video]'") from None


def _record_video(env, video_dir: Path):
    _check_render(env)
    return GameVideo(env, str(video_dir), episode_trigger=lambda _: True, disable_logger=True)


class GameVideo(gym.wrappers.RecordVideo):
    """One video per evaluated episode: with ``env.wrappers`` (EpisodicLife) a lost life ends a learning
    episode, and ``evaluate`` continues the game with ``next_life``, which keeps recording (RecordVideo's
    ``reset`` would cut the game into one video per life), as CleanRL and SB3 record whole games."""

    def next_life(self):
        obs, info = self.env.reset()
        if self.recording:
            self._capture_frame()
        return obs, info
