"""``run(cfg, run_dir)``: check the composed config, seed, pick the device, build the trainer, fit.

Objects are wired here in Python; the config names a ``_target_`` under ``rltrain.`` and its settings. The
settings dataclasses are the schema (cli/schema.py lists them): ``check_config`` is the one place a key or a
type is checked against them - an unknown key, a wrong type or a count that is not a whole number fails in one
line naming the key, and a count written as a float (``total_env_steps=1e5``) becomes the integer - and each
dataclass's ``__post_init__`` checks its values, before anything starts.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rltrain.algos.base import AlgoSettings, takes_model
from rltrain.cli.aliases import unknown_key
from rltrain.cli.multiagent import check_agents
from rltrain.cli.resolvers import check_targets
from rltrain.cli.rundir import check_fresh_run_dir, check_resume_config, claim_run_dir, writable_run_dir
from rltrain.envs.make import EnvFactory, ProbedEnv, probe_env
from rltrain.errors import ConfigError
from rltrain.models.settings import ModelSettings
from rltrain.run.process import init_process
from rltrain.run.seeding import draw_root_seed
from rltrain.trainers.settings import RunSettings

GROUPS = ("algo", "trainer")  # groups whose schema is the settings_class of the class their _target_ names
INTERNAL_KEYS = ("seed_drawn", "max_wall_time_s")  # written by prepare(), never set by the user
SELECTORS = ("_target_", "_partial_")  # which class a group builds (Hydra's convention), not a setting


def to_plain(cfg: Any) -> dict:
    """DictConfig -> plain dict (resolved; a target that resolves to null refused, ``check_targets``). Never send
    a DictConfig across a process boundary."""
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(cfg, DictConfig):
        return cfg
    check_targets(cfg)
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def resolve_target(node: dict, group: str) -> type:
    target = node.get("_target_")
    if not isinstance(target, str) or not target.startswith("rltrain."):
        raise ConfigError(f"{group}._target_={target!r} must name a class under 'rltrain.'")
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"{group}._target_={target!r} cannot be imported: {err}") from None


# -- the schema: keys and types against the settings dataclasses ----------------------------------------------
def config_fields(cls: type) -> dict[str, Any]:
    """A settings dataclass's config keys -> their type hints (fields marked ``internal`` are not keys)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")}


def _settings_class(cls: type, group: str) -> type:
    settings = getattr(cls, "settings_class", None)
    if settings is None or not dataclasses.is_dataclass(settings):
        kind = "algorithm (a class with a settings_class, as rltrain.algos.ppo.PPO)" if group == "algo" else \
            "trainer (a class with a settings_class, as rltrain.trainers.sequential.SequentialTrainer)"
        raise ConfigError(f"{group}._target_={cls.__module__}.{cls.__name__} is not an rltrain {kind}")
    return settings


def _algo_name(cfg: dict) -> str | None:
    target = str((cfg.get("algo") or {}).get("_target_", ""))
    return target.rpartition(".")[0].rpartition(".")[2] or None


def _dataclass_hint(hint: Any) -> type | None:
    """The settings dataclass a field holds (``preemption: PreemptionSettings``), or None."""
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def _union_args(hint: Any) -> tuple | None:
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else None


def conform(value: Any, hint: Any) -> tuple[bool, Any]:
    """(whether ``value`` fits the type hint, the value as the field takes it): a whole float for an ``int``
    becomes the int (``1e5`` -> 100000), also inside a ``tuple[int, ...]``; nothing else is converted."""
    union = _union_args(hint)
    if union is not None:
        for option in union:
            ok, out = conform(value, option)
            if ok:
                return True, out
        return False, value
    origin = typing.get_origin(hint)
    if hint is type(None):
        return value is None, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return True, int(value)
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool), value
    if hint is str:
        return isinstance(value, str), value
    if origin in (Sequence, list, tuple, typing.Sequence) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False, value
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        if not args:
            return True, value
        items = [conform(v, args[0]) for v in value]
        return all(ok for ok, _ in items), [v for _, v in items]
    if origin is dict or hint is dict:
        return isinstance(value, dict), value
    return True, value


def _wants_int(hint: Any) -> bool:
    return hint is int or any(_wants_int(h) for h in (_union_args(hint) or typing.get_args(hint)))


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is not None or _union_args(hint) is not None:
        return str(hint).replace("typing.", "").replace("collections.abc.", "").replace("NoneType", "None")
    return getattr(hint, "__name__", str(hint))


def check_node(cls: type, node: dict, group: str, *, algo: str | None = None, keys_only: bool = False) -> dict:
    """``node``'s keys and types against ``cls``'s fields, nested settings included (``group``: the node's
    dotted path, "" for the top level). Returns the node with whole floats of integer fields as integers;
    the values themselves are the dataclass's to check. ``keys_only``: the types are not checked either (a
    sweep's start check: a value is one job's to refuse, a key every job's)."""
    schema = config_fields(cls)
    out = {}
    for key, value in node.items():
        path = f"{group}.{key}" if group else key
        if key in SELECTORS and group in GROUPS:
            out[key] = value
            continue
        if key not in schema:
            raise ConfigError(unknown_key(path, list(schema), algo=algo))
        hint = schema[key]
        nested = _dataclass_hint(hint)
        if nested is not None and isinstance(value, dict):
            out[key] = check_node(nested, value, path, algo=algo, keys_only=keys_only)
            continue
        if keys_only:
            out[key] = value
            continue
        ok, out[key] = conform(value, hint)
        if not ok:
            whole = " (a count: a whole number such as 100000 or 1e5)" if _wants_int(hint) and \
                isinstance(value, float) else ""
            raise ConfigError(f"{path}={value!r} has the wrong type: expected {_type_name(hint)}{whole}")
        # nan passes every `x <= 0` test and inf every `x > 0` test: no float setting may be either
        if any(isinstance(v, float) and not math.isfinite(v) for v in (value if isinstance(value, list) else [value])):
            if type(None) in (_union_args(hint) or ()):
                raise ConfigError(f"{path}={value} must be a finite number or null")
            raise ConfigError(f"{path}={value}: must be a finite number (nan and inf train nothing)")
    return out


def check_config(cfg: dict, *, keys_only: bool = False) -> dict:
    """Every key and type (``keys_only``: every key) of a plain composed config against the schema
    (``check_node``); the config is updated in place (whole floats of counts become integers) and returned."""
    top = config_fields(RunSettings)
    valid = [*top, *GROUPS]
    for key in cfg:
        if key not in valid and key not in INTERNAL_KEYS:
            raise ConfigError(unknown_key(key, valid))
    cfg.update(check_node(RunSettings, {k: v for k, v in cfg.items() if k in top}, "", keys_only=keys_only))
    for group in GROUPS:
        if group in cfg:
            cls = _settings_class(resolve_target(cfg[group], group), group)
            cfg[group] = check_node(cls, cfg[group], group, algo=_algo_name(cfg) if group == "algo" else None,
                                    keys_only=keys_only)
    return cfg


def make_settings(cls: type, node: dict):
    """``cls`` from a checked node: lists become tuples where the field is a tuple, nested settings their
    dataclass; its ``__post_init__`` checks the values."""
    schema = config_fields(cls)
    kwargs = {}
    for key, value in node.items():
        if key in SELECTORS or key not in schema:
            continue
        hint = schema[key]
        nested = _dataclass_hint(hint)
        if nested is not None and isinstance(value, dict):
            value = make_settings(nested, value)
        elif isinstance(value, list) and any(typing.get_origin(h) is tuple for h in (_union_args(hint) or (hint,))):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


def model_settings(cfg: dict) -> ModelSettings:
    """The ``model`` group, typed (its dataclass validates itself)."""
    return make_settings(ModelSettings, check_node(ModelSettings, dict(cfg.get("model") or {}), "model"))


def algo_settings(cfg: dict):
    """The ``algo`` group as the algorithm's typed settings (``cls.settings_class``, e.g. ``PPOSettings``): keys
    and types checked here, values by the dataclass itself. The one place the group becomes settings."""
    return _algo_class_and_settings(cfg)[1]


def _algo_class_and_settings(cfg: dict) -> tuple[type, Any]:
    cls = resolve_target(cfg["algo"], "algo")
    settings_cls = _settings_class(cls, "algo")
    node = check_node(settings_cls, dict(cfg["algo"]), "algo", algo=_algo_name(cfg))
    settings = make_settings(settings_cls, node)
    if any(f.name == "checkpoint_buffer" for f in dataclasses.fields(settings_cls)):  # checkpoint.replay_buffer
        replay = bool((cfg.get("checkpoint") or {}).get("replay_buffer", False))
        settings = dataclasses.replace(settings, checkpoint_buffer=replay)
    return cls, settings


def algo_factory(cfg: dict):
    """A ``functools.partial`` of the algorithm class with its settings (``algo_settings``) and, for an algorithm
    that builds its networks from the model family, the model settings: called with ``(spec, *, num_envs,
    device[, sync])`` wherever the run needs the algorithm."""
    cls, settings = _algo_class_and_settings(cfg)
    params: dict[str, Any] = {"settings": settings}
    if takes_model(cls):
        params["model"] = model_settings(cfg)
    return functools.partial(cls, **params)


def trainer_settings(cfg: dict) -> tuple[type, Any]:
    """(the trainer class, its typed settings) from the ``trainer`` group."""
    cls = resolve_target(cfg["trainer"], "trainer")
    settings_cls = _settings_class(cls, "trainer")
    return cls, make_settings(settings_cls, check_node(settings_cls, dict(cfg["trainer"]), "trainer"))


def validate(cfg: dict) -> RunSettings:
    """The whole config checked before anything starts: keys and types (``check_config``), then every value
    (the settings dataclasses, the trainer's included). Returns the run's settings, the env's action mask
    not yet resolved (``settings_from`` does that, building one env)."""
    check_config(cfg)
    top = config_fields(RunSettings)
    resume = cfg.get("resume") or "never"
    if resume not in ("never", "auto") and not Path(resume).exists():
        raise ConfigError(f"resume={resume}: no such checkpoint file or run directory (use auto, never or a path)")
    kwargs = {k: make_settings(_dataclass_hint(top[k]), v) if _dataclass_hint(top[k]) else v
              for k, v in cfg.items() if k in top}
    settings = RunSettings(**kwargs, seed_drawn=bool(cfg.get("seed_drawn", False)), algo=algo_factory(cfg),
                           config=cfg)
    trainer_settings(cfg)
    if isinstance(cfg.get("logger"), dict):  # config.yaml records the mode a boolean (`true`, `off`) stood for
        cfg["logger"]["progress"] = settings.logger.progress
    cfg["max_wall_time_s"] = settings.max_wall_time_s
    return settings


def prepare(cfg: Any) -> dict:
    """Plain, validated config with its root seed fixed (``write_config`` records it once the run is built)."""
    cfg = to_plain(cfg)
    validate(cfg)
    cfg["seed_drawn"] = cfg["seed"] is None
    if cfg["seed"] is None:
        cfg["seed"] = draw_root_seed()
    init_process(torch_threads=cfg["torch_threads"])  # torch threads, glibc's heap (run/process.py)
    return cfg


def write_config(cfg: dict, run_dir: Path) -> None:
    """``config.yaml``: the prepared config of a run that passed every start-up check (a refused command leaves
    the record of the run already in that dir as it was; resume=auto compares against it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def settings_from(cfg: dict) -> RunSettings:
    """The typed settings and picklable factories of a prepared plain config (``prepare``'s output), the env
    probed once (``probe_env``: ONE env built and reset, the run's only look at its env before it starts): its
    factory with the action mask resolved from ``algo.action_mask`` and whether it is multi-agent, and its spec."""
    check_config(cfg)
    mask_mode = str(cfg["algo"].get("action_mask", AlgoSettings.action_mask))  # a user algo's settings may lack it
    probed = probe_env(make_settings(EnvFactory, cfg["env"]), mask_mode)
    # a PettingZoo env: algo=ppo is ippo there, single-agent algorithms refused (before any other line is said)
    check_agents(cfg, probed.factory)
    _say_mask_line(probed)
    settings = validate(cfg)
    return dataclasses.replace(settings, env=probed.factory, env_spec=probed.spec)


_MASK_LINES: set[str] = set()  # said once per build (parallel agents build one env factory each)


def _say_mask_line(probed: ProbedEnv) -> None:
    if probed.line and probed.line not in _MASK_LINES:
        _MASK_LINES.add(probed.line)
        print(f"rltrain: {probed.line}", file=sys.stderr)


def env_factory(node: dict, *, action_mask: str = "off") -> EnvFactory:
    """The env factory recorded in a checkpoint's config (keys this version does not know are dropped), with the
    ``action_mask`` source its run resolved; builds no env (``probe_env`` resolves it where none is recorded)."""
    known = config_fields(EnvFactory)
    factory = make_settings(EnvFactory, check_node(EnvFactory, {k: v for k, v in node.items() if k in known}, "env"))
    return dataclasses.replace(factory, action_mask=action_mask)


def build_trainer(cfg: dict, run_dir: Path, *, check_only: bool = False, show: bool = True):
    """The trainer object for a prepared plain config; nothing starts until its ``fit()``. The algorithm the
    pre-flight checks build is the one its loop trains where that loop runs in this process (cli/preflight.py);
    ``check_only`` (``rltrain-check``): the checks build a CPU copy and nothing is written; ``show=False``: the
    model is not printed (a sweep's jobs after the first)."""
    _MASK_LINES.clear()
    if (cfg.get("eval") or {}).get("video"):
        from rltrain.trainers.episodes import headless_sdl

        headless_sdl()  # before any env is built: MuJoCo reads MUJOCO_GL when it is imported
    trainer_cls, trainer = trainer_settings(cfg)
    extra = {}
    if trainer_cls.capabilities.agent_configs:  # trainer=parallel: one config per agent
        from rltrain.cli.agents import agent_configs

        # every agent's config checked and typed before any start (unknown / mistyped keys, values)
        extra["agents"] = [settings_from(a) for a in agent_configs(cfg, trainer)]
    from rltrain.cli.preflight import preflight, show_model

    settings = settings_from(cfg)
    trainer = trainer_cls(settings=settings, run_dir=Path(run_dir), trainer=trainer, **extra)
    if not check_only:  # settings the user set that this run leaves unread (rltrain-check says them per job)
        from rltrain.cli.unread import say_unread

        say_unread(trainer)
        # before anything is written (model.txt, config.yaml is overwritten with this run's); the keys this run
        # does not read are not compared
        check_resume_config(cfg, Path(run_dir), unread=settings.unread_keys())
    algo = preflight(settings, trainer, check_only=check_only)  # budget, sizes against this machine, the algorithm
    show_model(algo, None if check_only else run_dir, echo=show and settings.logger.progress != "off")
    return trainer


def run(cfg: Any, run_dir: Path) -> dict:
    """Train as configured; returns the summary (the dict written to ``summary.json``)."""
    import contextlib

    from rltrain.run.checkpoint import disk_write_failure, sweep_temp_files
    from rltrain.run.lock import check_ranks, owns_run
    from rltrain.run.summary import mark_failed

    run_dir = Path(run_dir)
    # before the lock: a non-zero rank takes none, so a trainer that takes no ranks would run there unlocked
    trainer_cls = resolve_target(to_plain(cfg)["trainer"], "trainer")
    check_ranks(trainer=trainer_cls.name, takes_ranks=trainer_cls.capabilities.all_reduce)
    owner = owns_run()
    if owner:
        writable_run_dir(run_dir)
    # one owner per run dir (design 6): taken before anything is written; other ranks work under rank 0's lock
    with claim_run_dir(run_dir) if owner else contextlib.nullcontext():  # a dir another run holds: refused
        plain = to_plain(cfg)
        if owner:
            check_fresh_run_dir(plain, run_dir)
        prepared = prepare(plain)
        trainer = build_trainer(prepared, run_dir)
        write_config(prepared, run_dir)
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
