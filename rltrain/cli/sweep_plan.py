"""What a sweep will run, worked out before any job launches, by ``rltrain -m`` and ``rltrain-check -m`` alike.

A sweep's axes are the sweeper's own search space (``hydra.sweeper.params``) and the command line's overrides,
the later one of a key winning (as Hydra's sweepers read them). An enumerating sweeper (Hydra's basic one)
runs the product of every axis; a sampling one (Optuna) draws intervals (``interval(1e-4, 1e-2)``), which
cannot be enumerated: they are taken at their ends, together (``corners``). ``refuse_at_start`` is what a sweep
must pass before anything is written (``StartCheck``, a Hydra callback in ``conf/train.yaml``): no nested
processes under a parallel launcher, and no key that the schema does not know; a key is every job's (a value
only one job's, refused by that job alone).
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from typing import Any

from hydra.experimental.callback import Callback

from rltrain.errors import ConfigError

# Hydra's own sweeper enumerates every axis; any other (Optuna, Nevergrad, Ax) samples what is not a choice
ENUMERATING_SWEEPERS = ("BasicSweeper",)


@dataclass(frozen=True)
class Axis:
    """One key of a sweep: the override line of each value it takes (a fixed override: one line)."""

    key: str
    lines: tuple[str, ...]
    sampled: bool = False  # an interval the sweeper samples: ``lines`` are its two ends
    shapes: bool = True  # its values may change which keys the config has (a config group, a mapping value)


def samples(config: Any) -> bool:
    """Whether the sweeper of the multirun ``config`` samples (True) or enumerates its axes."""
    target = str(config.hydra.sweeper.get("_target_", ""))
    return target.rsplit(".", 1)[-1] not in ENUMERATING_SWEEPERS


def arguments(config: Any, overrides: list[str]) -> list[str]:
    """The sweeper's search space (``hydra.sweeper.params``) followed by ``overrides``, as sweepers join them."""
    params = config.hydra.sweeper.get("params") or {}
    return [f"{k}={v}" for k, v in params.items()] + list(overrides)


def axes(lines: list[str], *, sampling: bool, loader: Any = None) -> list[Axis]:
    """The axes of a sweep's override ``lines`` (the last line of a key wins). An interval under an enumerating
    sweeper is refused with Hydra's own error, as ``rltrain -m`` refuses it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = {}
    for p in OverridesParser.create(config_loader=loader).parse_overrides(lines):
        parsed[p.get_key_element()] = p
    repository = getattr(loader, "repository", None)
    out = []
    for key, p in parsed.items():
        group = repository is None or repository.group_exists(p.key_or_group)
        if not p.is_sweep_override():
            out.append(Axis(key, (p.input_line,)))
        elif sampling and p.is_interval_sweep():
            ends = p.value()
            out.append(Axis(key, (f"{key}={ends.start}", f"{key}={ends.end}"), sampled=True, shapes=False))
        else:
            values = list(p.sweep_iterator()) if not p.is_interval_sweep() else []
            shapes = group or any(isinstance(v, dict) for v in values)
            out.append(Axis(key, tuple(f"{key}={v}" for v in p.sweep_string_iterator()), shapes=shapes))
    return out


# up to this many sampled intervals, every corner of their box is checked (2**4 = 16 per grid point)
ALL_CORNERS_UP_TO = 4


def corners(sampled: list[Axis]) -> list[list[str]]:
    """The ends of the sampled intervals to check together: every corner of their box (a limit that two keys
    set together, e.g. minibatches that must divide the envs, fails at a mixed corner: few envs, many
    minibatches), or past ``ALL_CORNERS_UP_TO`` intervals all low, all high and each interval alone at the
    other end from the rest."""
    if len(sampled) <= ALL_CORNERS_UP_TO:
        return [list(c) for c in itertools.product(*(a.lines for a in sampled))]
    out = [[a.lines[i] for a in sampled] for i in (0, 1)]
    for i in (0, 1):
        for k in range(len(sampled)):
            out.append([a.lines[1 - i if j == k else i] for j, a in enumerate(sampled)])
    return out


def jobs(sweep: list[Axis]) -> list[list[str]]:
    """The override lists to check: every combination of the enumerated axes, each with the sampled intervals
    at each of their ``corners`` (the ends bound what the sweeper can draw)."""
    grid = itertools.product(*(a.lines for a in sweep if not a.sampled))
    ends = corners([a for a in sweep if a.sampled])
    return [[*combo, *end] for combo in grid for end in ends]


def key_jobs(sweep: list[Axis]) -> list[list[str]]:
    """The fewest jobs whose configs hold every key the sweep's jobs can have: one value of each axis whose
    values cannot change the keys (``seed=1,...,500`` composes once), every value of one that can."""
    return [list(c) for c in itertools.product(*(a.lines if a.shapes else a.lines[:1] for a in sweep))]


def check_keys(cfg: Any) -> None:
    """The schema's unknown-key check (``build.check_config``) on a composed job, values unchecked: a ``+key``
    reaches the schema, where Hydra cannot tell it from a free-form mapping's (``+env.kwargs.x``)."""
    from omegaconf import OmegaConf

    from rltrain.cli.build import check_config

    # unresolved: the keys do not depend on the values, and resolving one is the job's business
    check_config(OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])),
                 keys_only=True)


def refuse_at_start(config: Any, *, loader: Any) -> list[Axis]:
    """Refuse the multirun ``config`` (Hydra's, before its sweeper runs) for what would fail every job: a
    multi-process trainer under a parallel launcher, several SLURM tasks per job for a trainer that runs in one
    process, an unknown key. ``loader``: Hydra's config loader, which composes each job as its launcher will.
    Returns the sweep's axes."""
    from rltrain.sweeps import slurm
    from rltrain.sweeps.callbacks import check_nesting

    task = list(config.hydra.overrides.task)
    sweep = axes(arguments(config, task), sampling=samples(config), loader=loader)
    trainers = [line.partition("=")[2] for a in sweep if a.key.lstrip("+~") == "trainer" for line in a.lines]
    check_nesting(str(config.hydra.launcher.get("_target_", "")),
                  [str(config.hydra.runtime.choices.get("trainer")), *trainers], task)
    tasks = slurm.job_tasks(config)
    if tasks > 1:  # every trainer of the sweep (a group axis is composed per value; the launcher refuses it too)
        slurm.refuse_single_process_ranks(trainers=slurm.trainers_of(config, key_jobs(sweep), loader=loader),
                                          tasks=tasks)
    for job in key_jobs(sweep):
        check_keys(loader.load_sweep_config(config, job))
    return sweep


def as_launched(config: Any, job: list[str]) -> list[str]:
    """A job's overrides as its launcher runs it: rltrain's submitit launchers (SLURM, local) add
    ``resume=auto`` unless the job chose a resume mode (``sweeps/requeue.py``)."""
    from hydra.utils import get_class

    from rltrain.sweeps.requeue import Resumable, with_resume_auto

    try:
        launcher = get_class(str(config.hydra.launcher.get("_target_", "")))
    except (ImportError, ValueError):  # a launcher whose plugin is missing: composing the job says so
        return job
    return with_resume_auto(job) if issubclass(launcher, Resumable) else job


class StartCheck(Callback):
    """``refuse_at_start`` in ``rltrain -m``: Hydra calls ``on_multirun_start`` before its sweeper writes
    ``multirun.yaml`` or makes the sweep dir, so a refused sweep leaves nothing behind."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        from rltrain.cli.train import one_line

        try:
            refuse_at_start(config, loader=GlobalHydra.instance().config_loader())
        # Hydra turns a callback's exception into a warning and goes on: say it in one line and exit ourselves
        except ConfigError as err:
            print(f"rltrain: error: {err}", file=sys.stderr)
            sys.exit(2)
        except (HydraException, OmegaConfBaseException) as err:
            print(f"rltrain: error: {one_line(err)}", file=sys.stderr)
            sys.exit(2)
