"""Settings the user set that the run will not read, said at start in one line each (a warning, never a refusal).

A settings class says which of its keys its current values leave unread, and why: ``AlgoSettings.unread_keys``
(``algo.n_quantiles`` without ``algo.distributional=qr``, SAC's noise shape without ``algo.action_noise``, ...)
and ``ModelSettings.unread_keys`` for the observation the run probed (``model.hidden_sizes`` where an image goes
through a CNN alone), with the algorithm's own ``model_keys_unread`` (a Q-network has no critic to share a
torso with). Only the keys the user typed count: the job's command-line overrides. A preset's keys are not
the user's (``experiment=auto`` chooses one unasked), and no shipped preset sets a key its own run leaves unread
(``tests/test_unread_keys.py``): where an override makes a preset's key unread (``algo.distributional=qr``
beside a preset's ``algo.loss``), the override is what the user set. ``rltrain`` says them as it starts,
``rltrain-check`` for each job it checks. A sweep over ``algo.distributional`` x ``algo.n_quantiles`` still runs:
each job says which of its settings it leaves unread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rltrain.errors import spelled
from rltrain.trainers.settings import RunSettings

if TYPE_CHECKING:
    from rltrain.trainers.base import Trainer


def user_keys(overrides: Sequence[str]) -> set[str]:
    """The dotted keys the user set: each ``key=value`` override (``+``/``++`` prefixed ones too; ``~key``
    deletes, so it sets nothing). A group choice (``experiment=``, ``algo=``) and Hydra's own keys are not
    settings of the run."""
    keys: set[str] = set()
    for override in overrides:
        key, sep, _ = str(override).partition("=")
        key = key.lstrip("+")
        if sep and not key.startswith("~") and "." in key and not key.startswith("hydra."):
            keys.add(key)
    return keys


def _value(cfg: dict, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def unread_lines(settings: RunSettings, overrides: Sequence[str]) -> list[str]:
    """One line per unread key of a run (its settings, the env probed) that the user set (``user_keys``; a key
    under it, ``model.key_encoders.image``, counts), e.g. ``algo.n_quantiles=51 is not read: only
    algo.distributional=qr uses it (now none)``."""
    mine = user_keys(overrides)
    found = settings.unread_keys()
    return [f"{key}={spelled(_value(settings.config, key))} is not read: {why}" for key, why in found.items()
            if key in mine or any(k.startswith(key + ".") for k in mine)]


def job_overrides() -> list[str]:
    """The overrides the running job was composed from: Hydra's record of them (``rltrain`` and
    ``rltrain.train``, an experiment=auto preset included); none for a config composed elsewhere."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return [str(o) for o in HydraConfig.get().overrides.task]


def agent_lines(agents: Sequence[RunSettings], per_agent: Sequence[Sequence[str]], overrides: Sequence[str],
                said: Sequence[str]) -> list[str]:
    """``trainer=parallel``: the unread keys of each agent's own settings (its ``trainer.agent_overrides`` entry over
    the command line's overrides, cli/agents.py), ``agent k: <line>``, but for the lines the run's own
    (``said``) already say: ``trainer.agent_overrides=[{algo.n_quantiles:51},{}]`` without
    ``algo.distributional=qr`` in agent 0's, or a command-line ``algo.n_atoms`` that an agent's own
    ``algo.distributional=qr`` leaves unread for another reason."""
    return [f"agent {k}: {line}" for k, (agent, own) in enumerate(zip(agents, per_agent, strict=True))
            for line in unread_lines(agent, [*overrides, *own]) if line not in said]


def say_unread(trainer: Trainer, overrides: Sequence[str] | None = None, *, prefix: str = "[rltrain]") -> None:
    """Print the run's ``unread_lines`` at start, and each parallel agent's own (``agent_lines``); ``overrides``:
    None for the running job's own (``job_overrides``)."""
    overrides = job_overrides() if overrides is None else list(overrides)
    lines = unread_lines(trainer.settings, overrides)
    # the capability first: importing trainers.parallel (its supervision layer) costs every other run's start
    if trainer.capabilities.agent_configs:
        from rltrain.cli.agents import override_list
        from rltrain.trainers.parallel import ParallelTrainer

        assert isinstance(trainer, ParallelTrainer)  # the one trainer with agent configs
        entries = trainer.agent_overrides or [[] for _ in trainer.agents]
        lines += agent_lines(trainer.agents, [override_list(e) for e in entries], overrides, lines)
    for line in lines:
        print(f"{prefix} {line}", flush=True)
