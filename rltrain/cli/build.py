"""``run(cfg, run_dir)``: validate the composed config, seed, pick the device, build the trainer, fit.

Objects are wired here in Python; the YAML groups only name a ``_target_`` under ``rltrain.`` and its
keyword arguments. An algorithm's settings dataclass (``settings_class``) and the other classes' keyword-only
constructor signatures are the schema: unknown keys and wrong types fail here, before anything starts, with
the key's full name.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
import sys
import tempfile
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from rltrain.cli.multiagent import check_agents
from rltrain.envs.make import EnvFactory, ProbedEnv, probe_env
from rltrain.errors import ConfigError, close_matches
from rltrain.models.settings import ModelSettings
from rltrain.run.seeding import draw_root_seed
from rltrain.trainers.settings import (
    CheckpointSettings,
    EvalSettings,
    LoggerSettings,
    LogSettings,
    RunSettings,
)

RESERVED = {"self", "spec", "num_envs", "device", "sync", "settings", "run_dir", "stop", "agents", "model"}


def to_plain(cfg: Any) -> dict:
    """DictConfig -> plain dict (resolved). Never send a DictConfig across a process boundary."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg  # type: ignore[return-value]


def resolve_target(node: dict, group: str) -> type:
    target = node.get("_target_")
    if not isinstance(target, str) or not target.startswith("rltrain."):
        raise ConfigError(f"{group}._target_={target!r} must name a class under 'rltrain.'")
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"{group}._target_={target!r} cannot be imported: {err}") from None


# keys of a group that rltrain reads itself rather than passing to the group's class: algo.action_mask
# (train.yaml, merged into every algo) decides how the envs are wrapped (``settings_from``'s probe)
NOT_HPARAMS = ("action_mask",)


def hparams(node: dict) -> dict:
    return {k: v for k, v in node.items() if not k.startswith("_") and k not in NOT_HPARAMS}


def schema(cls: type, group: str) -> tuple[list[str], dict]:
    """(valid keys in order, their type hints) of a group's class: the fields of an algorithm's settings
    dataclass (``cls.settings_class``), else ``cls.__init__``'s keyword-only arguments."""
    settings = getattr(cls, "settings_class", None)
    if settings is not None:
        return [f.name for f in dataclasses.fields(settings) if f.init], typing.get_type_hints(settings)
    sig = inspect.signature(cls.__init__)
    reserved = RESERVED if group == "algo" else {"self", "settings", "run_dir", "agents"}  # a trainer may have `sync`
    valid = [n for n, p in sig.parameters.items() if n not in reserved and p.kind == p.KEYWORD_ONLY]
    return valid, typing.get_type_hints(cls.__init__)


def check_kwargs(cls: type, params: dict, group: str) -> None:
    """Unknown keys and wrong types, checked against the group's schema (``schema``)."""
    valid, hints = schema(cls, group)
    for key, value in params.items():
        if key not in valid:
            raise ConfigError(f"{group}.{key}: unknown key{close_matches(key, valid)} (valid: {', '.join(valid)})")
        hint = hints.get(key)
        if hint is not None and not _type_ok(value, hint):
            raise ConfigError(f"{group}.{key}={value!r} has the wrong type: expected {_type_name(hint)}")
        # nan passes every `x <= 0` test and inf every `x > 0` test: no float hyper-parameter may be either
        if any(isinstance(v, float) and not math.isfinite(v) for v in (value if isinstance(value, list) else [value])):
            raise ConfigError(f"{group}.{key}={value}: must be a finite number (nan and inf train nothing)")
        if key == "hidden_sizes" and isinstance(value, list) and any(isinstance(v, int) and v <= 0 for v in value):
            raise ConfigError(f"{group}.hidden_sizes={value}: every width must be a positive integer "
                              f"(e.g. {group}.hidden_sizes=[64,64])")


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (Sequence, list, tuple, typing.Sequence) or hint in (list, tuple):
        args = typing.get_args(hint)
        return isinstance(value, (list, tuple)) and all(_type_ok(v, args[0]) for v in value) if args else \
            isinstance(value, (list, tuple))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is not None:
        return str(hint).replace("typing.", "").replace("collections.abc.", "")
    return getattr(hint, "__name__", str(hint))


def model_settings(cfg: dict) -> ModelSettings:
    """The ``model`` group, typed (its dataclass validates itself)."""
    node = cfg.get("model") or {"_target_": "rltrain.models.settings.ModelSettings"}
    cls = resolve_target(node, "model")
    check_kwargs(cls, hparams(node), "model")
    return cls(**hparams(node))


def algo_settings(cfg: dict):
    """The ``algo`` group as the algorithm's typed settings (``cls.settings_class``, e.g. ``PPOSettings``): keys
    and types checked here, values by the dataclass itself. The one place the group becomes settings."""
    return _algo_class_and_settings(cfg)[1]


def _algo_class_and_settings(cfg: dict) -> tuple[type, Any]:
    cls = resolve_target(cfg["algo"], "algo")
    if getattr(cls, "settings_class", None) is None:
        raise ConfigError(f"algo._target_={cfg['algo'].get('_target_')!r} is not an rltrain algorithm (a class "
                          "with a settings_class, as rltrain.algos.ppo.PPO)")
    params = hparams(cfg["algo"])
    check_kwargs(cls, params, "algo")
    return cls, cls.settings_class(**params)


def algo_factory(cfg: dict):
    """A ``functools.partial`` of the algorithm class with its settings (``algo_settings``) and, for an algorithm
    that builds its networks from the model family, the model settings: called with ``(spec, *, num_envs,
    device[, sync])`` wherever the run needs the algorithm."""
    cls, settings = _algo_class_and_settings(cfg)
    params: dict[str, Any] = {"settings": settings}
    if "model" in inspect.signature(cls.__init__).parameters:
        params["model"] = model_settings(cfg)
    return functools.partial(cls, **params)


def validate(cfg: dict) -> None:
    """Checks that need no objects: budgets, sizes, cadences, resume path, device."""
    for key in ("total_env_steps",):
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] <= 0:
            raise ConfigError(f"{key}={cfg[key]!r} must be a positive integer")
    for key in ("env.num_envs", "eval.episodes", "checkpoint.keep_last", "torch_threads"):
        group, _, name = key.rpartition(".")
        value = cfg[group][name] if group else cfg[name]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{key}={value!r} must be a positive integer")
    for group in ("log", "eval", "checkpoint"):
        value = cfg[group]["every_env_steps"]
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ConfigError(f"{group}.every_env_steps={value!r} must be an integer >= 0 (0 disables)")
    if cfg["seed"] is not None and (not isinstance(cfg["seed"], int) or cfg["seed"] < 0):
        raise ConfigError(f"seed={cfg['seed']!r} must be a non-negative integer or null")
    for key, target in (("target_return", cfg.get("target_return")),
                        ("eval.target_return", cfg["eval"].get("target_return"))):
        if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                                   or not math.isfinite(target)):
            raise ConfigError(f"{key}={target!r} must be a finite number or null")
    steps = cfg["env"].get("max_episode_steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0):
        raise ConfigError(f"env.max_episode_steps={steps!r} must be a positive integer, or null for the env's own "
                          "time limit")
    resume = cfg.get("resume") or "never"
    if resume not in ("never", "auto") and not Path(resume).exists():
        raise ConfigError(f"resume={resume}: no such checkpoint file or run directory (use auto, never or a path)")
    if cfg["logger"]["progress"] is False:  # YAML 1.1 reads a bare `off` as false
        cfg["logger"]["progress"] = "off"
    if cfg["logger"]["progress"] not in ("auto", "rich", "plain", "off"):
        raise ConfigError(f"logger.progress={cfg['logger']['progress']!r} is not one of: auto, rich, plain, off")
    cfg["max_wall_time_s"] = parse_duration(cfg.get("max_wall_time"), "max_wall_time")


def parse_duration(value: Any, key: str) -> float | None:
    """'23h', '90m', '1d2h30m', '45s' or a number of seconds -> seconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not value > 0 or not math.isfinite(value):
            raise ConfigError(f"{key}={value} must be a finite number of seconds > 0 (or null for no limit)")
        return float(value)
    import re

    number = r"(\d+(?:\.\d+)?)"
    parts = re.fullmatch(rf"\s*(?:{number}d)?\s*(?:{number}h)?\s*(?:{number}m)?\s*(?:{number}s)?\s*", str(value))
    if not parts or not any(parts.groups()):
        raise ConfigError(f"{key}={value!r} is not a duration like 23h, 90m, 1d2h or 3600")
    d, h, m, s = (float(g or 0) for g in parts.groups())
    seconds = d * 86400 + h * 3600 + m * 60 + s
    if seconds <= 0:  # 0 would stop before the first update: a run that can only end interrupted
        raise ConfigError(f"{key}={value} must be > 0 (or null for no limit)")
    return seconds


def prepare(cfg: Any, run_dir: Path) -> dict:
    """Plain, validated config with its root seed fixed; writes ``config.yaml`` into the run dir."""
    cfg = to_plain(cfg)
    validate(cfg)
    cfg["seed_drawn"] = cfg["seed"] is None
    if cfg["seed"] is None:
        cfg["seed"] = draw_root_seed()
    torch.set_num_threads(int(cfg["torch_threads"]))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg


TOP_LEVEL = ("seed", "device", "torch_threads", "total_env_steps", "target_return", "max_wall_time",
             "allow_nested_processes", "resume", "resume_trust_envs", "resume_allow_changes", "seed_drawn",
             "max_wall_time_s",
             "algo", "trainer", "env", "model", "logger", "eval", "log", "checkpoint")
INTERNAL_KEYS = ("seed_drawn", "max_wall_time_s")  # written by prepare(), never set by the user


def group_settings(cls: type, node: dict, group: str):
    """A frozen settings dataclass from one config group: unknown keys and wrong types fail in one line."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key, value in node.items():
        if key not in fields:
            raise ConfigError(f"{group}.{key}: unknown key{close_matches(key, list(fields))} "
                              f"(valid: {', '.join(fields)})")
        if not _type_ok(value, hints[key]):
            raise ConfigError(f"{group}.{key}={value!r} has the wrong type: expected {_type_name(hints[key])}")
    return cls(**{k: tuple(v) if isinstance(v, list) and typing.get_origin(hints[k]) is tuple else v
                  for k, v in node.items()})


def settings_from(cfg: dict) -> RunSettings:
    """The typed settings and picklable factories of a validated plain config (``prepare``'s output)."""
    unknown = [k for k in cfg if k not in TOP_LEVEL]
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key{close_matches(unknown[0], TOP_LEVEL)} "
                          f"(top-level keys: {', '.join(k for k in TOP_LEVEL if k not in INTERNAL_KEYS)})")
    probed = probe_env(group_settings(EnvFactory, cfg["env"], "env"),
                       str((cfg.get("algo") or {}).get("action_mask", "auto")))
    # a PettingZoo env: algo=ppo is ippo there, single-agent algorithms refused (before any other line is said)
    check_agents(cfg, probed.factory)
    _say_mask_line(probed)
    return RunSettings(
        seed=int(cfg["seed"]), seed_drawn=bool(cfg["seed_drawn"]), device=str(cfg["device"]),
        torch_threads=int(cfg["torch_threads"]), total_env_steps=int(cfg["total_env_steps"]),
        target_return=None if cfg.get("target_return") is None else float(cfg["target_return"]),
        max_wall_time_s=cfg.get("max_wall_time_s"), resume=str(cfg.get("resume") or "never"),
        resume_trust_envs=bool(cfg.get("resume_trust_envs", False)),
        resume_allow_changes=tuple(cfg.get("resume_allow_changes") or ()),
        env=probed.factory, env_spec=probed.spec, algo=algo_factory(cfg),
        eval=group_settings(EvalSettings, cfg["eval"], "eval"), log=group_settings(LogSettings, cfg["log"], "log"),
        checkpoint=group_settings(CheckpointSettings, cfg["checkpoint"], "checkpoint"),
        logger=group_settings(LoggerSettings, cfg["logger"], "logger"), model=model_settings(cfg), config=cfg)


_MASK_LINES: set[str] = set()  # said once per build (parallel agents build one env factory each)


def _say_mask_line(probed: ProbedEnv) -> None:
    if probed.line and probed.line not in _MASK_LINES:
        _MASK_LINES.add(probed.line)
        print(f"rltrain: {probed.line}", file=sys.stderr)


def env_factory(node: dict, *, action_mask: str = "off") -> EnvFactory:
    """The env factory recorded in a checkpoint's config (keys this version does not know are dropped), with the
    ``action_mask`` source its run resolved; builds no env (``probe_env`` resolves it where none is recorded)."""
    known = {f.name for f in dataclasses.fields(EnvFactory)}
    return group_settings(EnvFactory, {**{k: v for k, v in node.items() if k in known}, "action_mask": action_mask},
                          "env")


def build_trainer(cfg: dict, run_dir: Path, *, check_only: bool = False):
    """The trainer object for a prepared plain config; nothing starts until its ``fit()``. The algorithm the
    pre-flight checks build is the one its loop trains where that loop runs in this process (cli/preflight.py);
    ``check_only`` (``rltrain-check``): the checks build a CPU copy and nothing is written."""
    _MASK_LINES.clear()
    trainer_cls = resolve_target(cfg["trainer"], "trainer")
    params = hparams(cfg["trainer"])
    check_kwargs(trainer_cls, params, "trainer")
    extra = {}
    if trainer_cls.capabilities.agent_configs:  # trainer=parallel: one config per agent
        from rltrain.cli.agents import agent_configs

        agents = agent_configs(cfg, params)
        for agent in agents:
            validate(agent)
        extra["agents"] = [settings_from(a) for a in agents]  # unknown / mistyped keys fail before any start
    from rltrain.cli.preflight import preflight

    settings = settings_from(cfg)
    trainer = trainer_cls(settings=settings, run_dir=Path(run_dir), **params, **extra)
    algo = preflight(settings, trainer, check_only=check_only)  # budget, sizes against this machine, the algorithm
    show_model(algo, None if check_only else run_dir, echo=cfg["logger"].get("progress") not in ("off", False))
    return trainer


def show_model(algo: Any, run_dir: Path | None, *, echo: bool) -> None:
    """The built model in words (models/describe.py) in ``<run dir>/model.txt`` (None: not written, e.g.
    ``rltrain-check``), and on stdout with progress on."""
    from rltrain.models.describe import describe_model, networks_of

    notes = [f"frame stack: {algo.frame_stack} frames (read from the env's FrameStackObservation; stored once "
             "per frame in the replay)"] if algo.frame_stack else []
    text = f"algo={algo.name}\n" + describe_model(networks_of(algo), notes)
    if run_dir is not None:
        Path(run_dir, "model.txt").write_text(text + "\n")
    if echo:
        print("[rltrain] model:\n" + "\n".join("  " + line for line in text.splitlines()), flush=True)


def run(cfg: Any, run_dir: Path) -> dict:
    """Train as configured; returns the summary (the dict written to ``summary.json``)."""
    import contextlib

    from rltrain.run.checkpoint import disk_write_failure, sweep_temp_files
    from rltrain.run.lock import RunDirLock, owns_run
    from rltrain.run.summary import mark_failed

    run_dir = Path(run_dir)
    owner = owns_run()
    if owner:
        writable_run_dir(run_dir)
    # one owner per run dir (design 6): taken before anything is written; other ranks work under rank 0's lock
    with RunDirLock(run_dir) if owner else contextlib.nullcontext():
        plain = to_plain(cfg)
        check_resume_config(plain, run_dir)  # before config.yaml is overwritten with this run's
        trainer = build_trainer(prepare(plain, run_dir), run_dir)
        if owner:
            sweep_temp_files(run_dir)  # what a killed earlier run left (we hold the lock: nobody is writing)
        try:
            return trainer.fit()
        except OSError as err:
            message = disk_write_failure(err, run_dir)
            if message is None:
                raise
            mark_failed(run_dir, message)  # e.g. the final checkpoint failed after the loop: no summary said so
            raise ConfigError(message) from None


def check_resume_config(cfg: dict, run_dir: Path) -> None:
    """``resume=auto`` in a run dir whose recorded run had other trainer / algo / model / env settings: one
    line listing them (a trainer that keeps its checkpoints elsewhere would otherwise restart from step 0
    over the run's summary), unless ``resume_allow_changes`` names them."""
    from rltrain.run.checkpoint import ALLOW_KEY, resume_mismatch

    allow = cfg.get(ALLOW_KEY) or []
    if not isinstance(allow, list) or not all(isinstance(a, str) and a for a in allow):
        raise ConfigError(f"{ALLOW_KEY}={allow!r} must be a list of setting names, e.g. [env.kwargs]")
    if cfg.get("resume") != "auto" or not (run_dir / "config.yaml").is_file():
        return
    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return  # the checkpoint's own config is compared at resume
    error = resume_mismatch("auto", saved if isinstance(saved, dict) else {}, cfg)
    if error:
        raise ConfigError(error.replace("resume=auto:", f"resume=auto in {run_dir}:", 1))


def writable_run_dir(run_dir: Path) -> None:
    """Create the run dir and write a file in it, or fail in one line naming it (e.g. ``/proc/x``, read-only)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as err:
        raise ConfigError(f"hydra.run.dir={run_dir}: cannot write there ({err.strerror or err}); pick a writable "
                          "hydra.run.dir") from None
