"""The Optuna sweeper with seeds as a replicate axis (pip install 'rltrain[sweep]').

With the plugin's own sweeper, ``seed=1,2,3`` would become a categorical hyper-parameter that Optuna tunes
(and "optimises" by picking a lucky seed). Here ``seed=...`` is taken out of the search space: every trial runs
once per seed and Optuna is told the mean of the replicates' final returns (a failed replicate counts as
``FAILED_RETURN``, so a configuration that crashes is never preferred). RL results vary a lot between seeds
(Henderson et al. 2018; Agarwal et al. 2021), so a trial scored on one seed is mostly noise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus

from rltrain.run.summary import FAILED_RETURN


def split_seeds(arguments: list[str]) -> tuple[list[str], list[str]]:
    """(arguments without ``seed=``, the seed values as strings); no seed override -> ([...], [])."""
    parser = OverridesParser.create()
    rest, seeds = [], []
    for arg, parsed in zip(arguments, parser.parse_overrides(arguments), strict=True):
        if parsed.key_or_group == "seed" and parsed.package is None:
            seeds = [str(v) for v in parsed.sweep_iterator()] if parsed.is_sweep_override() else [str(parsed.value())]
        else:
            rest.append(arg)
    return rest, seeds


def mean_return(returns: Sequence[JobReturn]) -> float:
    values = []
    for r in returns:
        v = r._return_value if r.status == JobStatus.COMPLETED else None
        values.append(float(v) if isinstance(v, (int, float)) and math.isfinite(v) else FAILED_RETURN)
    return sum(values) / len(values)


class ReplicatingLauncher:
    """Wraps the real launcher: each trial's overrides x seeds are launched; one JobReturn per trial back."""

    def __init__(self, launcher: Any, seeds: list[str], first_job_idx: int):
        self.launcher, self.seeds, self.next_idx = launcher, seeds, first_job_idx

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
        expanded = [[*o, f"seed={s}"] for o in job_overrides for s in self.seeds]
        # our own job counter: the sweeper advances its index by trials, we launch trials x seeds jobs
        returns = self.launcher.launch(expanded, initial_job_idx=self.next_idx)
        self.next_idx += len(expanded)
        k = len(self.seeds)
        out = []
        for i, overrides in enumerate(job_overrides):
            group = returns[i * k:(i + 1) * k]
            out.append(dataclasses.replace(group[0], overrides=list(overrides), status=JobStatus.COMPLETED,
                                           _return_value=mean_return(group)))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.launcher, name)


@contextlib.contextmanager
def alembic_quiet() -> Iterator[None]:
    """The ``alembic`` logger at WARNING for the block, unless the user set its level (then theirs to see)."""
    logger = logging.getLogger("alembic")
    if logger.level != logging.NOTSET:  # configured on purpose (e.g. in hydra/hydra_logging)
        yield
        return
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(logging.NOTSET)


def import_optuna_quietly() -> None:
    """Import Optuna with ``alembic_quiet``. Optuna imports alembic (its RDB storage's migrations), whose import
    logs one INFO line per built-in plugin ("setup plugin alembic.autogenerate.*"), and Hydra imports Optuna
    when it builds an Optuna sweeper's sampler (``optuna.samplers.TPESampler``), after it has sent INFO
    records to the terminal and before any of the sweeper's code runs: 7 lines of a library rltrain does not
    use would open every Optuna sweep's output. ``SweepCallback.on_multirun_start`` calls this just before
    Hydra builds the sweeper; the import is the same one, made earlier."""
    # without the 'sweep' extra there is nothing to import: building the sweeper says so (cli/train.py)
    with alembic_quiet(), contextlib.suppress(ImportError):
        import optuna  # noqa: F401


class Replicated:
    """Mixed into the plugin's OptunaSweeper (see ``hydra_plugins/rltrain_plugins/sweepers.py``)."""

    sweeper: Any

    def sweep(self, arguments: list[str]) -> None:
        rest, seeds = split_seeds(list(arguments))
        if len(seeds) > 1:
            impl = self.sweeper
            impl.launcher = ReplicatingLauncher(impl.launcher, seeds, impl.job_idx or 0)
        elif seeds:
            rest.append(f"seed={seeds[0]}")
        return self.sweeper.sweep(rest)
