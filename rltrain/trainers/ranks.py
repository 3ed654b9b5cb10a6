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
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rltrain.envs.deadline import EnvFault
from rltrain.errors import ConfigError
from rltrain.run.signals import StopFlag, StopRequested
from rltrain.trainers.rendezvous import LaunchInfo, LocalRendezvous
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
    stderr_path: str | None = None  # fd 2 appended there (``RankStderr``); None: left as it is
    rendezvous_fd: int | None = None  # the parent's listening socket (``LocalRendezvous.fileno``): closed in a
    #                                   forked rank, which inherits it and never accepts on it


@dataclass(frozen=True)
class RankFailure:
    """Why a rank failed; rank -> parent just before the bootstrap's ``Failed``. ``kind``: ``config`` (bad
    input), ``env`` (the user's env misbehaved in this rank: ``EnvFault``), ``error`` (its own failure), ``peer``
    (a collective failed because another rank is gone), ``died`` (exited without a word: killed or crashed)."""

    rank: int
    kind: str
    message: str
    traceback: str = ""

    @property
    def exit_code(self) -> int:
        """The user's env (or input) failed: 2, as it ends a single-process run; anything else is rltrain's: 1."""
        return 2 if self.kind in ("config", "env") else 1


def failure_of(rank: int, err: BaseException) -> RankFailure:
    # an env fault is this rank's failure (its line names the rank, the env and step), not bad input for the whole
    # job; a rank stopped because another failed (the parent's Stop during the rendezvous) is not the cause either
    kind = "env" if isinstance(err, EnvFault) else "config" if isinstance(err, ConfigError) else \
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
    if job.stderr_path:
        _stderr_to(job.stderr_path)
    if job.rendezvous_fd is not None:
        release_inherited(job.rendezvous_fd, job.launch.master_port)
    try:
        return run_rank(job.launch, job.settings, Path(job.run_dir), backend=job.backend, timeout_s=job.timeout_s,
                        stop=ContextStop(ctx))  # the parent's Stop -> the all-reduced stop bit -> same update
    except BaseException as err:  # noqa: B036 - classify everything, KeyboardInterrupt included; then re-raise
        ctx.send(replace(failure_of(job.launch.rank, err), traceback=""))
        raise


def release_inherited(fd: int, port: int) -> None:
    """Close the parent's rendezvous socket where this rank inherited it (a forked rank): the descriptor would
    keep the port bound as long as the rank lives, past the parent's end. Only if ``fd`` is that very socket, a
    TCP one bound to ``port``: a rank started otherwise (forkserver, spawn) has another file there, or none."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return  # no socket at that number
    try:
        mine = sock.family in (socket.AF_INET, socket.AF_INET6) and sock.getsockname()[1] == port
    except OSError:
        mine = False
    if mine:
        sock.close()
    else:
        sock.detach()  # someone else's descriptor: left open


def _stderr_to(path: str) -> None:
    """Point this process's fd 2 (Python's stderr and C++'s warnings alike) at the end of ``path``."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return  # the terminal it is
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)


class RankStderr:
    """The ranks' stderr, each appended to ``<run dir>/ranks/rank_<r>.stderr`` and copied to the terminal by the
    supervisor while no rank has failed. Once one has, only the failed ranks' own output is copied: the others'
    is what losing a peer looks like (c10d's warnings and C++ stack traces for every call to the gone store) and
    stays in the file; the failure is the one line naming the rank that failed first."""

    def __init__(self, run_dir: Path, world_size: int):
        folder = Path(run_dir) / "ranks"
        self.paths = [folder / f"rank_{r}.stderr" for r in range(world_size)]
        try:
            folder.mkdir(exist_ok=True)
            self.offsets = [p.stat().st_size if p.exists() else 0 for p in self.paths]  # a resume appends
        except OSError:
            self.paths, self.offsets = [], []  # the ranks' stderr stays the terminal's

    def path(self, rank: int) -> str | None:
        return str(self.paths[rank]) if self.paths else None

    def read(self) -> dict[int, bytes]:
        """What each rank wrote since the last read. Read *before* polling the ranks' messages: whatever a
        failure made a survivor write came after the failure's message or exit, so the poll that follows sees it."""
        out = {}
        for r, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[r])
                    data = f.read()
            except OSError:
                continue
            if data:
                self.offsets[r] += len(data)
                out[r] = data
        return out

    def copy(self, chunks: dict[int, bytes], failures: dict[int, RankFailure]) -> None:
        own = {r for r, f in failures.items() if f.kind != "peer"}
        shown = b"".join(data for r, data in sorted(chunks.items()) if not failures or r in own)
        if shown:
            sys.stderr.flush()
            buffer = getattr(sys.stderr, "buffer", None)
            if buffer is not None:
                buffer.write(shown)
                buffer.flush()
            else:
                sys.stderr.write(shown.decode("utf-8", "replace"))
                sys.stderr.flush()


# after one rank fails, how long the others get to notice (a collective with a gone peer fails at once; a rank
# stuck in a call, e.g. a rendezvous with a peer that does not answer, does not) before they are terminated
RANK_GRACE_S = 10.0


def supervise_ranks(group: WorkerGroup, stop: StopFlag, *, timeout_s: float, stderr: RankStderr | None = None
                    ) -> tuple[dict[int, dict], list[RankFailure]]:
    """Wait for every rank; pass a stop request on; after the first failure stop the others and give them
    ``min(timeout_s, RANK_GRACE_S)`` to end (their collectives fail), then terminate whatever is left; copy the
    ranks' ``stderr`` to the terminal as it comes (``RankStderr``).
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
        chunks = stderr.read() if stderr else {}
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
        if stderr:
            stderr.copy(chunks, failures)
        if failures and first_failure is None:
            first_failure = time.monotonic()
        if first_failure is not None and time.monotonic() - first_failure > grace_s:
            for w in group.workers:
                if not w.finished:
                    failures.setdefault(w.index, RankFailure(w.index, "peer", f"did not stop within {grace_s:g} s "
                                                             "of another rank's failure; terminated"))
            group.shutdown(grace_s=0.0)  # SIGTERM, then SIGKILL
            break
    if stderr:
        stderr.copy(stderr.read(), failures)
    return summaries, list(failures.values())


def spawn_ranks(run_rank: Callable[..., dict], settings: RunSettings, run_dir: Path, stop: StopFlag, *,
                world_size: int, backend: str, timeout_s: float,
                master_addr: str) -> tuple[dict[int, dict], list[RankFailure]]:
    """Start ``world_size`` local ranks, each running ``run_rank`` (a picklable module-level function), and
    supervise them to the end (see the module docstring)."""
    # this process holds the rendezvous port from the OS's pick to the end (closed after the group: the ranks are
    # gone by then), so nothing can take it before the ranks join, as it could a port picked, freed and re-bound
    with LocalRendezvous(master_addr, world_size, timeout_s) as rendezvous:
        stderr = RankStderr(run_dir, world_size)
        jobs = [RankJob(LaunchInfo(rank=r, world_size=world_size, local_rank=r, master_addr=master_addr,
                                   master_port=rendezvous.port, source="local"), settings, str(run_dir), backend,
                        timeout_s, stderr.path(r), rendezvous_fd=rendezvous.fileno())
                for r in range(world_size)]
        # auto: fork (the ranks inherit torch and this module: nothing to import) while this process has no other
        # thread and no CUDA context, else forkserver (imported once by the server, not per rank);
        # daemon=False: a rank may start processes of its own (env.vectorization=async)
        with WorkerGroup(start_method="auto", heartbeat_timeout_s=None, start_timeout_s=None, name="rltrain-rank",
                         daemon=False, preload=HEAVY_MODULES) as group:
            for job in jobs:
                group.start(functools.partial(spawned_rank, run_rank), job)  # worker index == rank
            rendezvous.serve()  # its server thread starts once every rank is forked
            return supervise_ranks(group, stop, timeout_s=timeout_s, stderr=stderr)


def report_failure(failure: RankFailure, run_dir: Path | None) -> str:
    """The one line of the rank that failed first (a ConfigError is re-raised as it is); its traceback goes to
    ``<run dir>/error.txt``, never to the terminal."""
    if failure.kind == "config":
        raise ConfigError(failure.message)
    message = f"rank {failure.rank} {failure.message}" if failure.kind == "died" else \
        f"rank {failure.rank} failed: {failure.message}"
    if failure.traceback and run_dir is not None:
        path = Path(run_dir) / "error.txt"
        try:
            path.write_text(f"rank {failure.rank}:\n{failure.traceback}")
        except OSError:
            return message
        if str(path) not in message:  # rank 0's loop names it already: say it once, as the loop words it for the env
            message += f"; traceback in {path}" if failure.kind == "env" else f" (traceback in {path})"
    return message
