"""The agents of ``trainer=parallel``, composed here in the CLI: one complete, typed settings per agent.

Agent k gets the command line's config plus its own ``trainer.agent_overrides[k]`` (composed by Hydra, so an
override can switch a group: ``algo=a2c``), its own root seed ``worker_root(seed, (k,))`` (a SeedSequence child,
recorded in ``seeds.json``), its env count (``trainer.scopes``), its device (``trainer.devices``, round robin), its
share of ``total_env_steps`` (the budget of all agents together) and its resume path. Everything is validated
before any process starts; the trainer only places the agents.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from rltrain.errors import ConfigError
from rltrain.run.device import pick_device
from rltrain.run.seeding import worker_root
from rltrain.trainers.settings import ParallelSettings

SEQUENTIAL = {"_target_": "rltrain.trainers.sequential.SequentialTrainer", "_partial_": True}


def agent_share(total: int, num_agents: int, k: int) -> int:
    """Agent k's share of ``total_env_steps``: equal shares, the remainder one step each to the first agents."""
    return total // num_agents + (k < total % num_agents)


def sets_budget(entry: list[str] | dict) -> bool:
    """Whether an agent's ``trainer.agent_overrides`` entry sets its own ``total_env_steps`` (then its budget, not
    a share of the total)."""
    return any(o.partition("=")[0].lstrip("+~") == "total_env_steps" for o in override_list(entry))


def override_list(entry: list[str] | dict) -> list[str]:
    """One agent's overrides: a list of Hydra override strings, or a dict ``{dotted.key: value}``.

    The dict form needs no quoting on the command line: ``trainer.agent_overrides=[{algo.lr:1e-3},{}]``.
    """
    if isinstance(entry, dict):
        return [f"{k}={json.dumps(v) if isinstance(v, str) else _hydra_value(v)}" for k, v in entry.items()]
    return [str(o) for o in entry]


def _hydra_value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(json.dumps(x) if isinstance(x, str) else _hydra_value(x) for x in v) + "]"
    return str(v)


def compose_agent_overrides(per_agent: list[list[str]]) -> list[dict]:
    """Each agent's config: the command line's overrides + its own, composed by Hydra, as plain dicts.

    Inside the ``rltrain`` app the command line's overrides are taken from Hydra's runtime config; called
    from Python (no app running) the agents' overrides apply on top of ``train.yaml``'s defaults.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from rltrain.cli.schema import register
    from rltrain.conf import __file__ as conf_init

    register()

    base: list[str] = []
    if HydraConfig.initialized():
        # trainer.* overrides belong to the parent (and agent_overrides would be parsed twice)
        base = [o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith("trainer")]

    def _compose(extra: list[str]) -> dict:
        try:
            cfg = compose(config_name="train", overrides=base + list(extra))
        except Exception as err:  # a bad override: name the agent's list, in one line
            raise ConfigError(f"trainer.agent_overrides {extra}: {str(err).splitlines()[0]}") from None
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]

    if GlobalHydra.instance().is_initialized():
        return [_compose(o) for o in per_agent]
    with initialize_config_dir(config_dir=str(Path(conf_init).parent), version_base="1.3"):
        return [_compose(o) for o in per_agent]


def agent_configs(cfg: dict, trainer: ParallelSettings) -> list[dict]:
    """Agent k's plain config: the parent config (+ its overrides), its own seed, env count, device and budget;
    trainer=sequential. ``build.build_trainer`` validates each and turns it into ``RunSettings``.

    ``total_env_steps`` is the budget of all agents together, as it is of all workers under every trainer:
    each agent gets an equal share (the first ``total % num_agents`` one step more), unless its own
    ``trainer.agent_overrides`` entry sets ``total_env_steps``, which is then that agent's budget."""
    num_agents, scopes, overrides = trainer.num_agents, trainer.scopes, trainer.agent_overrides
    devices = list(trainer.devices or [cfg["device"]])
    for dev in devices:
        pick_device(dev)  # fails here, in one line, for an unknown or unavailable device
    per_agent = [override_list(e) for e in overrides] if overrides else [[] for _ in range(num_agents)]
    bases = compose_agent_overrides(per_agent) if overrides else [copy.deepcopy(cfg) for _ in range(num_agents)]
    total = int(cfg["total_env_steps"])
    out = []
    for k, base in enumerate(bases):
        c = copy.deepcopy(base)
        if not sets_budget(per_agent[k]):
            c["total_env_steps"] = agent_share(total, num_agents, k)
        c["seed"], c["seed_drawn"] = worker_root(int(cfg["seed"]), (k,)), False
        if scopes:
            c["env"]["num_envs"] = int(scopes[k])
        c["device"] = devices[k % len(devices)]
        c["trainer"] = dict(SEQUENTIAL)
        resume = c.get("resume") or "never"
        if resume not in ("never", "auto"):  # a parent run dir (or checkpoint dir): each agent its own
            c["resume"] = str(Path(resume) / f"agent_{k}")
        out.append(c)
    return out
