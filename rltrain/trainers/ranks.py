"""The local spawn of ``distributed_simulator``: W ranks as the W workers of one ``supervise.WorkerGroup``.

Used when no launcher made this process a rank (no torchrun, no multi-task SLURM step). The ranks are workers
of the one supervision layer every multi-process trainer uses: a rank's summary returns as ``Done``; a rank
that raises classifies its failure where the exception type is known (``RankFailure``: config / error / peer)
before the bootstrap sends ``Failed`` with the traceback; a killed rank is ``Exited`` (kind ``died``). The
parent passes a stop request on as ``Stop`` (the ranks' loops agree on it through the all-reduced stop bit, so
all stop at the same update), and after the first failure gives the others ``trainer.timeout_s`` to notice
before terminating them, so a dead peer never hangs the job.
"""

from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rltrain.envs.deadline import EnvFault
from rltrain.errors import ConfigError
from rltrain.run.signals import StopFlag, StopRequested
from rltrain.trainers.rendezvous import LaunchInfo, free_port
from rltrain.trainers.settings import RunSettings
from rltrain.trainers.supervise import (
    HEAVY_MODULES,
    ContextStop,
    Done,
    Exited,
    Failed,
    WorkerContext,
    WorkerGroup,
)


class PeerFailure(RuntimeError):
    """A collective failed or timed out: another rank is gone, hung or crashed (``gone``: the ranks whose
    heartbeat had stopped, when known)."""

    gone: list[int] = []


@dataclass(frozen=True)
class RankJob:
    """What a locally spawned rank needs (plain, picklable)."""

    launch: LaunchInfo
    settings: RunSettings
    run_dir: str
    backend: str
    timeout_s: float


@dataclass(frozen=True)
class RankFailure:
    """Why a rank failed; rank -> parent just before the bootstrap's ``Failed``. ``kind``: ``config`` (bad
    input), ``error`` (its own failure), ``peer`` (a collective failed because another rank is gone),
    ``died`` (exited without a word: killed or crashed)."""

    rank: int
    kind: str
    message: str
    traceback: str = ""


def failure_of(rank: int, err: BaseException) -> RankFailure:
    # an env fault is this rank's failure (its line names the env and step), not bad input for the whole job; a
    # rank stopped because another failed (the parent's Stop during the rendezvous) is not the cause either
    kind = "error" if isinstance(err, EnvFault) else "config" if isinstance(err, ConfigError) else \
        "peer" if isinstance(err, (PeerFailure, StopRequested)) else "error"
    return RankFailure(rank, kind, str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}",
                       "".join(traceback.format_exception(type(err), err, err.__traceback__)))


def primary_failure(failures: list[RankFailure]) -> RankFailure:
    """The root cause: a rank that failed on its own beats ranks that only lost contact with it."""
    own = [f for f in failures if f.kind != "peer"]
    return (own or failures)[0]


def spawned_rank(run_rank: Callable[..., dict], ctx: WorkerContext, job: RankJob) -> dict:
    """Worker ``rank`` of the parent's group, running ``run_rank`` (the distributed trainer's, handed down so that
    this module does not import the trainer): its summary returns as ``Done``; a failure is classified here,
    where the exception's type is known, and sent before the bootstrap sends ``Failed`` with the traceback."""
    try:
        return run_rank(job.launch, job.settings, Path(job.run_dir), backend=job.backend, timeout_s=job.timeout_s,
                        stop=ContextStop(ctx))  # the parent's Stop -> the all-reduced stop bit -> same update
    except BaseException as err:  # noqa: B036 - classify everything, KeyboardInterrupt included; then re-raise
        ctx.send(replace(failure_of(job.launch.rank, err), traceback=""))
        raise


# after one rank fails, how long the others get to notice (a collective with a gone peer fails at once; a rank
# stuck in a call, e.g. a rendezvous with a peer that does not answer, does not) before they are terminated
RANK_GRACE_S = 10.0


def supervise_ranks(group: WorkerGroup, stop: StopFlag, *, timeout_s: float
                    ) -> tuple[dict[int, dict], list[RankFailure]]:
    """Wait for every rank; pass a stop request on; after the first failure stop the others and give them
    ``min(timeout_s, RANK_GRACE_S)`` to end (their collectives fail), then terminate whatever is left.
    Returns the summaries by rank and the failures in the order they happened."""
    summaries: dict[int, dict] = {}
    failures: dict[int, RankFailure] = {}
    first_failure: float | None = None
    stopping = False
    grace_s = min(timeout_s, RANK_GRACE_S)
    while group.alive:
        if (stop.requested or failures) and not stopping:
            stopping = True
            group.stop_all(stop.reason or "stop" if stop.requested else "another rank failed")
        for ev in group.poll(timeout=0.25):
            if isinstance(ev, Done):
                summaries[ev.index] = ev.result
            elif isinstance(ev, RankFailure):
                failures.setdefault(ev.rank, ev)
            elif isinstance(ev, Failed):  # the traceback joins the rank's RankFailure (sent just before)
                known = failures.setdefault(ev.index, RankFailure(ev.index, "error", ev.error))
                failures[ev.index] = replace(known, traceback=ev.traceback)
            elif isinstance(ev, Exited):
                failures.setdefault(ev.index, RankFailure(ev.index, "died" if ev.exitcode else "error",
                                                          ev.description))
        if failures and first_failure is None:
            first_failure = time.monotonic()
        if first_failure is not None and time.monotonic() - first_failure > grace_s:
            for w in group.workers:
                if not w.finished:
                    failures.setdefault(w.index, RankFailure(w.index, "peer", f"did not stop within {grace_s:g} s "
                                                             "of another rank's failure; terminated"))
            group.shutdown(grace_s=0.0)  # SIGTERM, then SIGKILL
            break
    return summaries, list(failures.values())


def spawn_ranks(run_rank: Callable[..., dict], settings: RunSettings, run_dir: Path, stop: StopFlag, *,
                world_size: int, backend: str, timeout_s: float,
                master_addr: str) -> tuple[dict[int, dict], list[RankFailure]]:
    """Start ``world_size`` local ranks, each running ``run_rank`` (a picklable module-level function), and
    supervise them to the end (see the module docstring)."""
    port = free_port(master_addr)
    jobs = [RankJob(LaunchInfo(rank=r, world_size=world_size, local_rank=r, master_addr=master_addr,
                               master_port=port, source="local"), settings, str(run_dir), backend, timeout_s)
            for r in range(world_size)]
    # auto: fork (the ranks inherit torch and this module: nothing to import) while this process has no other
    # thread and no CUDA context, else forkserver (imported once by the server, not per rank);
    # daemon=False: a rank may start processes of its own (env.vectorization=async)
    with WorkerGroup(start_method="auto", heartbeat_timeout_s=None, start_timeout_s=None, name="rltrain-rank",
                     daemon=False, preload=HEAVY_MODULES) as group:
        for job in jobs:
            group.start(functools.partial(spawned_rank, run_rank), job)  # worker index == rank
        return supervise_ranks(group, stop, timeout_s=timeout_s)


def report_failure(failure: RankFailure, run_dir: Path | None) -> str:
    """The one line of the rank that failed first (a ConfigError is re-raised as it is); its traceback goes to
    ``<run dir>/error.txt``, never to the terminal."""
    if failure.kind == "config":
        raise ConfigError(failure.message)
    message = f"rank {failure.rank} {failure.message}" if failure.kind == "died" else \
        f"rank {failure.rank} failed: {failure.message}"
    if failure.traceback and run_dir is not None:
        try:
            (Path(run_dir) / "error.txt").write_text(f"rank {failure.rank}:\n{failure.traceback}")
            message += f" (traceback in {Path(run_dir) / 'error.txt'})"
        except OSError:
            pass
    return message
