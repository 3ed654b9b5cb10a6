"""Typed run settings: what a trainer receives instead of a Hydra config, and the config's schema.

Every default of the config is written once, on a field of a settings dataclass: the top-level keys and the
``eval``, ``log``, ``checkpoint``, ``logger`` groups here (``RunSettings`` and the classes it holds), each
trainer's keys here too (``SequentialSettings`` ... ``SubprocessActorsSettings``, the trainer's
``settings_class``), the ``env`` group on ``envs/make.py``'s ``EnvFactory``, the ``model`` group on
``models/settings.py``'s ``ModelSettings``, an algorithm's on its ``settings_class`` (``algos/ppo.py``).
``cli/schema.py`` hands them to Hydra; ``cli/build.py`` checks every key and type against them before
anything starts; each ``__post_init__`` checks its values. A field marked ``INTERNAL`` is filled in by the
CLI, never a config key.

Settings are frozen, plain and picklable, so they cross process boundaries (agents, ranks, actors) as they
are; a DictConfig never does.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rltrain.data.structs import EnvSpec
from rltrain.envs.make import EnvFactory
from rltrain.errors import ConfigError, close_matches
from rltrain.models.settings import ModelSettings

INTERNAL = {"internal": True}  # field metadata: set by the CLI, not a config key


def _count(key: str, value: Any, *, minimum: int = 1, null: bool = False, hint: str = "") -> None:
    """A count in one line: an integer >= ``minimum`` (or null where ``null``)."""
    if value is None and null:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(f"{key}={value!r} must be {what}{' or null' if null else ''}{hint}")


def _one_of(key: str, value: Any, valid: tuple, *, also: str = "") -> None:
    """``value`` among ``valid``, else one line listing them (``also``: other spellings the key takes)."""
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(map(str, valid))}{also}")


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    every_env_steps: int = 25_000  # periodic evaluation cadence in env steps, whatever log.every_env_steps (each
    #                                evaluation writes a metrics row); 0 disables (the final evaluation always
    #                                runs). Source: rltrain
    episodes: int = 10  # episodes per evaluation. Source: CleanRL (its evaluations run 10 episodes)
    deterministic: bool = True  # the headline mode (final_eval_return): greedy / mean actions; false samples.
    #                                Source: SB3 evaluate_policy(deterministic=True)
    both_modes: bool = True  # also evaluate the other mode: summary.json and the end-of-run line show both.
    #                                Source: rltrain
    video: bool = False  # record the final evaluation's episodes to <run dir>/videos (rltrain[video]).
    #                                Source: rltrain
    target_return: float | None = None  # stop at the first periodic evaluation whose mean return reaches it
    #                                (the final evaluation repeats it: same weights, same eval seeds). Source: rltrain
    max_episode_steps: int | None = None  # evaluation episodes end (truncated) after this many steps; null: the
    #                                env's own time limit, else 100000 (an env without one would evaluate forever).
    #                                Source: rltrain

    def __post_init__(self) -> None:
        _count("eval.every_env_steps", self.every_env_steps, minimum=0, hint=" (0 disables)")
        _count("eval.episodes", self.episodes)
        _finite_or_null("eval.target_return", self.target_return)
        _count("eval.max_episode_steps", self.max_episode_steps, null=True, hint=" (null: the env's own time limit)")


@dataclass(frozen=True, kw_only=True)
class LogSettings:
    every_env_steps: int = 5000  # one metrics.csv row (and TensorBoard scalars) per interval of env steps.
    #                                Source: rltrain

    def __post_init__(self) -> None:
        _count("log.every_env_steps", self.every_env_steps, minimum=0, hint=" (0 disables)")


@dataclass(frozen=True, kw_only=True)
class CheckpointSettings:
    every_env_steps: int = 50_000  # periodic checkpoint cadence in env steps; 0 disables (best and final are
    #                                always written). Source: rltrain
    keep_last: int = 3  # periodic checkpoints kept (older ones are deleted). Source: rltrain
    replay_buffer: bool = False  # off-policy algos: also store the replay buffer (resume without re-filling
    #                                it). Source: rltrain

    def __post_init__(self) -> None:
        _count("checkpoint.every_env_steps", self.every_env_steps, minimum=0, hint=" (0 disables)")
        _count("checkpoint.keep_last", self.keep_last)


SINKS = ("csv", "tensorboard", "wandb", "mlflow")
PROGRESS = ("auto", "rich", "plain", "off")
# the YAML booleans a user types for a display mode (`false`; a YAML file's bare `off` / `on` are booleans too):
# true is the default display, false none
PROGRESS_SWITCH = {True: "auto", False: "off"}
WANDB_MODES = ("online", "offline", "disabled")


@dataclass(frozen=True, kw_only=True)
class LoggerSettings:
    """Where metrics go (run/trackers.py). A tracker's keys left null defer to its own conventions: its
    environment variables (WANDB_PROJECT, MLFLOW_TRACKING_URI, ...) and settings files."""

    sinks: tuple[str, ...] = ("csv", "tensorboard")  # metrics.csv is always written; plus any of csv,
    #                                tensorboard, wandb (rltrain[wandb]), mlflow (rltrain[mlflow]). Source: rltrain
    progress: str | bool = "auto"  # auto (rich on a terminal, plain lines otherwise) | rich | plain | off;
    #                                true means auto, false off (so does a YAML file's bare on / off). Source: rltrain
    progress_interval_s: float = 10.0  # plain mode: one line every this many seconds. Source: rltrain
    project: str | None = None  # W&B project / MLflow experiment; null: WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME,
    #                                else rltrain. Source: rltrain
    entity: str | None = None  # W&B team or user; null: WANDB_ENTITY, else your default entity. Source: W&B
    group: str | None = None  # W&B group / MLflow tag; null: the sweep dir's name for a multirun's jobs, the
    #                                run's for parallel agents. Source: rltrain
    name: str | None = None  # the tracker's run name; null: the run dir's name (agent_<k> for an agent of
    #                                trainer=parallel). Source: rltrain
    tags: tuple[str, ...] = ()  # tags of the tracker's run. Source: rltrain
    mode: str | None = None  # W&B: online | offline (writes <run dir>/wandb, no network; `wandb sync` later) |
    #                                disabled; null: WANDB_MODE / `wandb offline`, else online. Source: W&B
    tracking_uri: str | None = None  # MLflow: any URI (http://..., sqlite:///...); null: MLFLOW_TRACKING_URI,
    #                                else a local store <run dir>/mlruns. Source: MLflow

    def __post_init__(self) -> None:
        if isinstance(self.progress, bool):  # every reader of the settings sees one of PROGRESS
            object.__setattr__(self, "progress", PROGRESS_SWITCH[self.progress])
        _one_of("logger.progress", self.progress, PROGRESS, also=" (or true: auto, false: off)")
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


def _finite_or_null(key: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value)):
        raise ConfigError(f"{key}={value!r} must be a finite number or null")


def parse_duration(value: Any, key: str) -> float | None:
    """'23h', '90m', '1d2h30m', '45s' or a number of seconds -> seconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not value > 0 or not math.isfinite(value):
            raise ConfigError(f"{key}={value} must be a finite number of seconds > 0 (or null for no limit)")
        return float(value)
    number = r"(\d+(?:\.\d+)?)"
    parts = re.fullmatch(rf"\s*(?:{number}d)?\s*(?:{number}h)?\s*(?:{number}m)?\s*(?:{number}s)?\s*", str(value))
    if not parts or not any(parts.groups()):
        raise ConfigError(f"{key}={value!r} is not a duration like 23h, 90m, 1d2h or 3600")
    d, h, m, s = (float(g or 0) for g in parts.groups())
    seconds = d * 86400 + h * 3600 + m * 60 + s
    if seconds <= 0:  # 0 would stop before the first update: a run that can only end interrupted
        raise ConfigError(f"{key}={value} must be > 0 (or null for no limit)")
    return seconds


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """One run (or one agent / rank / learner of it): budget, seeds, device, env, algorithm, cadences. Its
    fields not marked ``INTERNAL`` are the config's top-level keys and groups."""

    seed: int | None = 1  # root seed of every random stream (seeds.json); null draws one at start (recorded).
    #                                Source: rltrain
    device: str = "auto"  # auto | cpu | cuda | cuda:N, resolved by each process (run/device.py). Source: rltrain
    torch_threads: int = 1  # torch threads per process (1 is fastest for small nets on few cores).
    #                                Source: rltrain
    total_env_steps: int = 100_000  # the budget: env steps of all envs and all workers together, under every
    #                                trainer (trainer=parallel: all agents together, an equal share each).
    #                                Source: rltrain (CartPole's scale; presets set their own)
    target_return: float | None = None  # stop once the mean return of the last 20 training episodes reaches
    #                                it. Source: rltrain
    max_wall_time: str | float | None = None  # e.g. 23h, 90m or seconds: checkpoint and stop cleanly when this
    #                                much wall time has passed; null: no limit. Source: rltrain
    allow_nested_processes: bool = False  # let a local parallel launcher (joblib, submitit_local) run
    #                                multi-process trainers (read by the sweep callback). Source: rltrain
    resume: str = "never"  # never | auto (the latest checkpoint in this run dir) | a checkpoint file or run dir.
    #                                Source: rltrain
    resume_trust_envs: bool = False  # unpickle a resumed checkpoint's envs sidecar even if your key did not
    #                                sign it (only files you trust). Source: rltrain
    resume_allow_changes: tuple[str, ...] = ()  # settings a resume may change, e.g. [env.kwargs]; a resume
    #                                refuses other changed trainer / algo / model / env settings. Source: rltrain
    env: EnvFactory  # the env group (envs/make.py EnvFactory)
    # the env as ``env`` builds it, probed once per run by the CLI (envs/make.py ``probe_env``) and handed to
    # every process of the run (loops, agents, ranks, actors), which then build no env to read it; None: probe it
    env_spec: EnvSpec | None = field(default=None, metadata=INTERNAL)
    model: ModelSettings = ModelSettings()  # the model group (models/settings.py ModelSettings)
    logger: LoggerSettings = LoggerSettings()  # the logger group
    eval: EvalSettings = EvalSettings()  # the eval group
    log: LogSettings = LogSettings()  # the log group
    checkpoint: CheckpointSettings = CheckpointSettings()  # the checkpoint group
    seed_drawn: bool = field(default=False, metadata=INTERNAL)  # whether the CLI drew the root seed
    max_wall_time_s: float | None = field(default=None, init=False, metadata=INTERNAL)  # max_wall_time, parsed
    algo: Callable[..., Any] = field(repr=False, metadata=INTERNAL)  # functools.partial(AlgorithmClass,
    #                                settings=..., model=...), built by the CLI from the algo group
    config: dict = field(default_factory=dict, repr=False, metadata=INTERNAL)  # the resolved config, recorded
    #                                in checkpoints

    def __post_init__(self) -> None:
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ConfigError(f"seed={self.seed!r} must be a non-negative integer or null")
        _count("total_env_steps", self.total_env_steps)
        _count("torch_threads", self.torch_threads)
        _finite_or_null("target_return", self.target_return)
        object.__setattr__(self, "max_wall_time_s", parse_duration(self.max_wall_time, "max_wall_time"))
        object.__setattr__(self, "resume", str(self.resume or "never"))
        object.__setattr__(self, "resume_allow_changes", tuple(self.resume_allow_changes or ()))

    @property
    def algo_class(self) -> type:
        return getattr(self.algo, "func", self.algo)

    @property
    def algo_settings(self) -> Any:
        """The algorithm's typed settings (e.g. ``PPOSettings``) inside ``algo``."""
        return self.algo.keywords["settings"]

    def unread_keys(self) -> dict[str, str]:
        """The ``algo`` / ``model`` keys this run will not read -> why (algos/base.py ``unread_keys``)."""
        from rltrain.algos.base import unread_keys  # torch: not for every reader of the settings

        return unread_keys(self.algo_class, self.algo_settings, self.model, self.env_spec)

    def replace(self, **changes) -> RunSettings:
        """A copy with ``changes``; ``config`` (the record) follows the top-level ones it mirrors."""
        config = dict(self.config)
        for key in ("seed", "seed_drawn", "device", "resume", "total_env_steps"):
            if key in changes:
                config[key] = changes[key]
        if "env" in changes:
            config["env"] = {**config.get("env", {}), **changes["env"].record()}
            changes.setdefault("env_spec", None)  # another env: the probed spec no longer says what it is
        return dataclasses.replace(self, config=config, **changes)


# -- the trainers' settings: trainer=<name> picks the class whose ``name`` it is, and its ``settings_class`` --
@dataclass(frozen=True, kw_only=True)
class SequentialSettings:
    """``trainer=sequential`` (trainers/sequential.py): one process collects, then learns; nothing to set."""


AGENT_FAILURE = ("continue", "abort")


@dataclass(frozen=True, kw_only=True)
class ParallelSettings:
    """``trainer=parallel`` (trainers/parallel.py): K independent agents, one process each, aggregated. The
    agents share ``total_env_steps`` equally (an agent's own ``total_env_steps`` override is its budget)."""

    num_agents: int = 2  # agents; agent k's seed is a SeedSequence child of `seed` (seeds.json), its run dir
    #                                agent_<k>/. Source: rltrain
    scopes: tuple[int, ...] | None = None  # per-agent env counts, e.g. [8,8,4,4]; null: env.num_envs each.
    #                                Source: rltrain
    devices: tuple[str, ...] | None = None  # e.g. [cpu,cuda:0,cuda:1], assigned round-robin; null: `device`
    #                                for every agent. Source: rltrain
    agent_overrides: list[list[str] | dict] | None = None  # one entry per agent: [{algo.lr:1e-3},{algo.lr:3e-4}]
    #                                or '[["algo=ppo"],["algo=a2c"]]' (composed by Hydra). Source: rltrain
    start_method: str = "auto"  # auto (fork while safe: one thread, no CUDA; else forkserver) | spawn |
    #                                forkserver | fork. Source: rltrain
    on_agent_failure: str = "continue"  # continue: the others finish (status partial) | abort: stop all
    #                                (status failed). Source: rltrain
    heartbeat_timeout_s: float = 120.0  # an agent silent this long is killed and reported failed.
    #                                Source: rltrain
    shutdown_grace_s: float = 60.0  # after a stop: wait this long for checkpoints, then SIGTERM, then SIGKILL.
    #                                Source: rltrain

    def __post_init__(self) -> None:
        _count("trainer.num_agents", self.num_agents)
        for key in ("scopes", "agent_overrides"):
            value = getattr(self, key)
            if value is not None and len(value) != self.num_agents:
                raise ConfigError(f"trainer.{key} has {len(value)} entries; trainer.num_agents={self.num_agents} "
                                  "needs one per agent")
        if self.scopes is not None and any(s <= 0 for s in self.scopes):
            raise ConfigError(f"trainer.scopes={list(self.scopes)}: every agent needs at least one env")
        _one_of("trainer.on_agent_failure", self.on_agent_failure, AGENT_FAILURE)
        if not self.heartbeat_timeout_s > 0:
            raise ConfigError(f"trainer.heartbeat_timeout_s={self.heartbeat_timeout_s} must be > 0")


DIST_BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True, kw_only=True)
class DistributedSimulatorSettings:
    """``trainer=distributed_simulator`` (trainers/distributed.py): W data-parallel ranks over
    torch.distributed, started here (world_size local processes) or joined when launched by torchrun or a
    multi-task SLURM step."""

    world_size: int = 2  # ranks of a local spawn; torchrun / SLURM set the world size themselves.
    #                                Source: rltrain
    backend: str = "auto"  # auto (nccl when every rank is on a GPU, else gloo) | gloo | nccl.
    #                                Source: PyTorch's advice (gloo for CPU, nccl for GPU)
    timeout_s: float = 300.0  # bound on every collective: a dead or hung peer stops the job within it.
    #                                Source: rltrain
    master_addr: str = "127.0.0.1"  # rendezvous host of a local spawn. Source: rltrain

    def __post_init__(self) -> None:
        _count("trainer.world_size", self.world_size)
        _one_of("trainer.backend", self.backend, DIST_BACKENDS)
        if not self.timeout_s > 0:
            raise ConfigError(f"trainer.timeout_s={self.timeout_s} must be > 0")


@dataclass(frozen=True, kw_only=True)
class PreemptionSettings:
    """``trainer.preemption`` (sync mode): stop waiting for a batch once either share is met."""

    fraction_workers: float = 1.0  # ... this share of actors delivered their whole share. Source: rltrain
    #                                (1.0: wait for every actor)
    fraction_samples: float = 1.0  # ... this share of the batch is in. Source: rltrain (1.0: the whole batch)

    def __post_init__(self) -> None:
        for key in ("fraction_workers", "fraction_samples"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ConfigError(f"trainer.preemption.{key}={value!r} must lie in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class RaySettings:
    """``trainer.ray`` (trainer.backend=ray only; README "Across machines (Ray)")."""

    address: str | None = None  # null: a private Ray instance for this run | auto: the cluster this node
    #                                joined | host:port. Source: Ray (ray.init's address)
    actor_resources: dict | None = None  # Ray resources per actor; null: {num_cpus: 1}. Set it whole; any key
    #                                but num_cpus, num_gpus, memory is a custom resource:
    #                                'trainer.ray.actor_resources={num_cpus:1,actor_host:1}'. Source: Ray


ACTOR_CHOICES = {"start_method": ("fork", "forkserver", "spawn"), "compress": ("none", "lz4", "zlib"),
                 "on_actor_failure": ("restart", "abort"), "backend": ("local", "ray")}


@dataclass(frozen=True, kw_only=True)
class SubprocessActorsSettings:
    """``trainer=subprocess_actors`` (trainers/actors/learner.py): actor processes collect, one learner
    learns; weights go back through shared memory with a version counter, or Ray actors on a cluster
    (backend=ray). Works with ppo (APPO-style), a2c and impala (V-trace)."""

    num_actors: int = 2  # actor processes. Source: rltrain
    envs_per_actor: int | None = None  # envs stepped by each actor; null: env.num_envs. Source: rltrain
    rollout_len: int | None = None  # steps per env per rollout; null: algo.rollout_len. Source: rltrain
    batch_rollouts: int | None = None  # rollouts per learner batch; null: num_actors. Source: rltrain
    queue_out_of_sync_factor: int = 2  # the learner queue holds batch_rollouts x this; actors block when it is
    #                                full. Source: rltrain
    start_method: str = "forkserver"  # fork | forkserver | spawn. Source: rltrain
    sync: bool = False  # true: every batch comes from the current weights (actors wait for them). Source: rltrain
    max_policy_lag: int | None = None  # async: drop (and count) rollouts more than this many versions old;
    #                                null keeps all (V-trace / the clipped surrogate absorb the lag). Source: rltrain
    preemption: PreemptionSettings = PreemptionSettings()  # sync mode: stop waiting for a batch once ...
    compress: str = "none"  # none | lz4 | zlib: rollout payloads crossing the pipe. Source: rltrain
    actor_device: str = "cpu"  # actors act on this device. Source: rltrain
    learner_device: str | None = None  # null: the run's `device`. Source: rltrain
    on_actor_failure: str = "restart"  # restart (fresh recorded seed) | abort (checkpoint and stop with the
    #                                reason). Source: rltrain
    max_restarts: int = 3  # restarts per actor, then the run stops. Source: rltrain
    actor_timeout_s: float = 60.0  # an actor silent this long (no rollout, no heartbeat) is killed and handled
    #                                as failed. Source: rltrain
    backend: str = "local"  # local (actor processes on this machine) | ray (Ray actors on a Ray cluster's
    #                                nodes). Source: rltrain
    ray: RaySettings = RaySettings()  # backend=ray only

    def __post_init__(self) -> None:
        for key in ("num_actors", "queue_out_of_sync_factor"):
            _count(f"trainer.{key}", getattr(self, key))
        for key in ("envs_per_actor", "rollout_len", "batch_rollouts"):
            _count(f"trainer.{key}", getattr(self, key), null=True)
        _count("trainer.max_policy_lag", self.max_policy_lag, minimum=0, null=True)
        _count("trainer.max_restarts", self.max_restarts, minimum=0)
        for key, valid in ACTOR_CHOICES.items():
            _one_of(f"trainer.{key}", getattr(self, key), valid)
        if self.compress == "lz4" and not _installed("lz4"):
            raise ConfigError("trainer.compress=lz4 needs lz4: pip install 'rltrain[compress]' (or use compress=zlib)")
        if self.sync and (self.batch_rollouts or self.num_actors) < self.num_actors:
            raise ConfigError(f"trainer.batch_rollouts={self.batch_rollouts} < trainer.num_actors={self.num_actors}:"
                              " in sync mode every actor delivers at least one rollout per batch")
        if not self.actor_timeout_s > 0:
            raise ConfigError(f"trainer.actor_timeout_s={self.actor_timeout_s} must be > 0")
