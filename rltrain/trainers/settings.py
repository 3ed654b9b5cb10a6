"""Typed run settings: what a trainer receives instead of a Hydra config.

``cli/build.py`` turns the composed config into a ``RunSettings`` before any trainer starts: every group's
keys are checked against these fields (a misspelled or unknown key fails in one line), the algorithm becomes
a picklable factory (``functools.partial`` of its class with validated keyword-only hyper-parameters) and
the environment a picklable ``EnvFactory``. Settings are frozen, plain and picklable, so they cross process
boundaries (agents, ranks, actors) as they are; a DictConfig never does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rltrain.data.structs import EnvSpec
from rltrain.envs.make import EnvFactory
from rltrain.errors import ConfigError, close_matches
from rltrain.models.settings import ModelSettings


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    every_env_steps: int = 25000  # periodic evaluation cadence (0 disables; the final evaluation always runs)
    episodes: int = 10
    deterministic: bool = True  # the headline mode: greedy / mean actions; false samples
    both_modes: bool = True  # also evaluate the other mode and record both (a policy can be good in one only)
    video: bool = False  # record the final evaluation's episodes to <run dir>/videos
    target_return: float | None = None  # stop at the first periodic evaluation whose mean return reaches it
    max_episode_steps: int | None = None  # evaluation episodes end (truncated) after this many steps; null: the
    # env's own time limit, else 100000 (an env without one would evaluate forever). Source: rltrain

    def __post_init__(self) -> None:
        steps = self.max_episode_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0):
            raise ConfigError(f"eval.max_episode_steps={steps!r} must be a positive integer, or null for the env's "
                              "own time limit")


@dataclass(frozen=True, kw_only=True)
class LogSettings:
    every_env_steps: int = 5000  # one metrics.csv row (and TensorBoard scalars) per interval


@dataclass(frozen=True, kw_only=True)
class CheckpointSettings:
    every_env_steps: int = 50000  # periodic checkpoint cadence (0 disables; best and final are always written)
    keep_last: int = 3
    replay_buffer: bool = False  # off-policy algos: also store the replay buffer


SINKS = ("csv", "tensorboard", "wandb", "mlflow")
WANDB_MODES = ("online", "offline", "disabled")


@dataclass(frozen=True, kw_only=True)
class LoggerSettings:
    sinks: tuple[str, ...] = ("csv", "tensorboard")  # metrics.csv is always written; plus any of SINKS
    progress: str = "auto"  # auto | rich | plain | off
    progress_interval_s: float = 10.0
    # trackers (logger=wandb / logger=mlflow; run/trackers.py)
    # None below: the tracker's own environment variables / settings files decide (run/trackers.py)
    # W&B project / MLflow experiment (None: WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME, else rltrain)
    project: str | None = None
    entity: str | None = None  # W&B team or user (None: your default entity)
    group: str | None = None  # None: the sweep dir's name for a multirun's jobs, the run's for parallel agents
    name: str | None = None  # None: the run dir's name (agent_<k> for an agent of trainer=parallel)
    tags: tuple[str, ...] = ()
    # W&B: online | offline (writes <run dir>/wandb, no network; `wandb sync` later) | disabled; None: WANDB_MODE
    mode: str | None = None
    tracking_uri: str | None = None  # MLflow: None = MLFLOW_TRACKING_URI, else a local store <run dir>/mlruns

    def __post_init__(self) -> None:
        for sink in self.sinks:
            if sink not in SINKS:
                raise ConfigError(f"logger.sinks={list(self.sinks)}: unknown sink {sink!r}"
                                  f"{close_matches(sink, SINKS)}; use any of {', '.join(SINKS)}")
            # a missing tracker package is one line before anything starts (the import itself stays lazy)
            if sink in ("wandb", "mlflow") and not _installed(sink):
                raise ConfigError(f"logger.sinks={sink}: the {sink} package is missing; "
                                  f"pip install 'rltrain[{sink}]'")
        if self.mode is not None and self.mode not in WANDB_MODES:
            raise ConfigError(f"logger.mode={self.mode!r} is not one of: {', '.join(WANDB_MODES)} "
                              "(offline: no network, sync later with `wandb sync`)")


def _installed(package: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """One run (or one agent / rank / learner of it): budget, seeds, device, env, algorithm, cadences."""

    seed: int  # the root seed (drawn by the CLI when the config says null)
    seed_drawn: bool
    device: str  # auto | cpu | cuda | cuda:N, resolved by each process (run/device.py)
    torch_threads: int
    total_env_steps: int
    target_return: float | None
    max_wall_time_s: float | None
    resume: str  # never | auto | a checkpoint file or run dir
    resume_trust_envs: bool = False  # unpickle an env sidecar this run dir did not write (only files you trust)
    resume_allow_changes: tuple[str, ...] = ()  # settings a resume may change (e.g. env.kwargs); others refuse
    env: EnvFactory
    # the env as ``env`` builds it, probed once per run by the CLI (envs/make.py ``probe_env``) and handed to every
    # process of the run (loops, agents, ranks, actors), which then build no env to read it; None: probe it there
    env_spec: EnvSpec | None = None
    algo: Callable[..., Any] = field(repr=False)  # functools.partial(AlgorithmClass, settings=..., model=...)
    eval: EvalSettings = EvalSettings()
    log: LogSettings = LogSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    logger: LoggerSettings = LoggerSettings()
    model: ModelSettings = ModelSettings()  # encoder / torso by observation space (also inside ``algo``)
    config: dict = field(default_factory=dict, repr=False)  # the resolved config, recorded in checkpoints

    @property
    def algo_class(self) -> type:
        return getattr(self.algo, "func", self.algo)

    @property
    def algo_settings(self) -> Any:
        """The algorithm's typed settings (e.g. ``PPOSettings``) inside ``algo``."""
        return self.algo.keywords["settings"]

    def replace(self, **changes) -> RunSettings:
        """A copy with ``changes``; ``config`` (the record) follows the top-level ones it mirrors."""
        config = dict(self.config)
        for key in ("seed", "seed_drawn", "device", "resume"):
            if key in changes:
                config[key] = changes[key]
        if "env" in changes:
            config["env"] = {**config.get("env", {}), **changes["env"].record()}
            changes.setdefault("env_spec", None)  # another env: the probed spec no longer says what it is
        return dataclasses.replace(self, config=config, **changes)
