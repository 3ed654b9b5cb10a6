"""Start, supervise and stop worker processes: the process plumbing every multi-process trainer shares.

One parent, N workers. Each worker gets its own duplex ``Pipe`` (not one shared ``Queue``): a worker that is
SIGKILLed while writing can then only break its own channel, never leave a lock held that the other workers'
writes would wait on forever, and pipes leave nothing in ``/dev/shm``. Everything on a pipe is a typed
dataclass (``Started``, ``Heartbeat``, ``Done``, ``Failed``, ``Stop`` and whatever dataclasses the trainer
defines for its own traffic), never a bare string.

The worker side (``trainers/worker.py``, re-exported here)::

    def agent_main(ctx: WorkerContext, job: MyJob) -> dict:   # module-level: spawn pickles it by name
        while not ctx.stop_requested: ...; ctx.send(MyProgress(...))
        return {"plain": "result"}                            # -> Done(index, result)

The parent side::

    with WorkerGroup(start_method="spawn") as group:
        for k, job in enumerate(jobs):
            group.start(agent_main, job)
        while group.alive:
            for event in group.poll(timeout=0.5):   # Started/Heartbeat/Done/Failed/Exited/Unresponsive/your msgs
                ...
    # __exit__ = shutdown(): Stop message, join(timeout), terminate, join, kill, join; pipes closed.

Supervision: the parent waits on the pipes *and* each ``Process.sentinel`` at once, so a worker that dies
without a word (SIGKILL, OOM killer, segfault) is reported at once as ``Exited`` with its exit code / signal.
A worker that raises sends ``Failed`` with its formatted traceback, then exits 1. The heartbeat reports the
worker's *loop*, not its liveness as a process: every ``heartbeat_s`` a thread sends a ``Heartbeat`` only if
the loop made progress since the last one (it polled ``ctx.stop_requested``, or an env call began:
``ENV_CALLS``), so a loop stuck in an env call or a deadlock goes silent like a dead one; a worker silent
for ``heartbeat_timeout_s`` is reported ``Unresponsive`` (the parent decides what to do, e.g. ``kill(index)``).

Every worker dies with its parent, under every start method: ``die_with_parent`` (Linux's parent-death signal,
SIGKILL) is armed first thing in the child, so a SIGKILLed parent leaves no worker training on in its run dir.

Start-up is paid once where the start method allows it: with ``fork`` the workers inherit the parent's
modules (nothing to import: the fastest start, but only safe before threads and CUDA); with ``forkserver``
the fork server imports ``preload`` (numpy, torch, gymnasium by default) and the first target's module
before it forks anyone, so no worker imports torch again; ``spawn`` starts each worker from a fresh
interpreter. ``auto`` is ``fork`` while the parent has no other thread and no CUDA context, else
``forkserver`` (see ``check_start_method``).

Workers are daemonic by default (the interpreter's exit terminates them even when ``shutdown`` was never
reached); a worker that starts processes of its own (``env.vectorization=async``, or a rank's children) needs
``daemon=False``, since a daemonic process may not have children.

Signals: workers ignore SIGINT (set before the child starts, so also during the spawn bootstrap): Ctrl-C
reaches the whole foreground process group, and the parent alone decides how to stop (a ``Stop`` message
to each worker, which the worker sees as ``ctx.stop_requested``). SIGTERM or SIGUSR2 sent to a worker directly
(e.g. by a batch system) also sets ``stop_requested`` when ``graceful_sigterm=True``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from rltrain.errors import ConfigError
from rltrain.run.logs import LogTargets
from rltrain.run.signals import StopRequested
from rltrain.trainers.messages import Done, Exited, Failed, Heartbeat, Started, Stop, Unresponsive
from rltrain.trainers.worker import ContextStop, WorkerContext, _bootstrap

__all__ = ["Done", "Exited", "Failed", "Heartbeat", "Started", "Stop", "Unresponsive", "WorkerContext", "WorkerGroup",
           "ContextStop", "check_start_method"]

START_METHODS = ("spawn", "forkserver", "fork", "auto")
# imported once by the fork server (start_method=forkserver) instead of once per worker
HEAVY_MODULES = ("numpy", "torch", "gymnasium")


# -- the parent side ------------------------------------------------------------------------------------------
def check_start_method(method: str) -> str:
    """Validate a start method and resolve ``auto``: ``fork`` while this process can still be forked safely,
    else ``forkserver``. ``fork`` after CUDA is initialised would hand children a broken CUDA context."""
    if method not in START_METHODS:
        raise ConfigError(f"start_method={method!r} is not one of: {', '.join(START_METHODS)}")
    if method == "auto":
        return "fork" if _fork_is_safe() else "forkserver"
    if method == "fork" and _cuda_initialized():
        raise ConfigError("start_method=fork: CUDA is already initialised in this process and cannot be "
                          "used in forked children; use start_method=spawn, forkserver or auto")
    return method


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")  # not imported: certainly not initialised
    return torch is not None and bool(torch.cuda.is_initialized())


def _fork_is_safe() -> bool:
    # a forked child holds a copy of every lock but only the forking thread: a lock another thread held
    # stays held forever in the child; and a CUDA context does not survive fork at all
    return threading.active_count() == 1 and not _cuda_initialized()


@dataclass(eq=False)  # hashable by identity
class _Worker:
    index: int
    process: Any  # multiprocessing.process.BaseProcess
    conn: Connection
    last_seen: float
    started: bool = False
    finished: bool = False  # Done/Failed/Exited reported
    extra: dict = field(default_factory=dict)


class WorkerGroup:
    """Starts workers with one start method, multiplexes their messages, and shuts them down for sure."""

    def __init__(self, *, start_method: str = "spawn", heartbeat_s: float = 1.0,
                 heartbeat_timeout_s: float | None = 60.0, start_timeout_s: float | None = 300.0,
                 graceful_sigterm: bool = True, name: str = "rltrain-worker", daemon: bool = True,
                 preload: Sequence[str] = HEAVY_MODULES):
        self.start_method = check_start_method(start_method)  # ``auto`` resolved
        self.ctx = mp.get_context(self.start_method)
        self.heartbeat_s, self.heartbeat_timeout_s = heartbeat_s, heartbeat_timeout_s
        self.start_timeout_s, self.graceful_sigterm, self.name = start_timeout_s, graceful_sigterm, name
        self.daemon, self.preload = daemon, tuple(preload)
        self.workers: list[_Worker] = []
        self._closed = False
        self._reported_silent: set[int] = set()

    # -- starting -------------------------------------------------------------------------------------------
    def start(self, target: Callable[[WorkerContext, Any], Any], payload: Any) -> int:
        """Start one worker running ``target(ctx, payload)``; returns its index. Both must pickle (spawn)."""
        index = len(self.workers)
        if index == 0:
            check_start_method(self.start_method)  # fork: CUDA may have been initialised since the group was made
            self._preload_for(target)
        parent_conn, child_conn = self.ctx.Pipe(duplex=True)
        proc = self.ctx.Process(target=_bootstrap, name=f"{self.name}-{index}", daemon=self.daemon,
                                args=(target, index, child_conn, payload, self.heartbeat_s, self.graceful_sigterm,
                                      os.getpid(), self.start_method != "forkserver",
                                      LogTargets.of_this_process()))
        # SIG_IGN survives fork and exec: the child ignores Ctrl-C from its very first instruction
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if _main_thread() else None
        try:
            proc.start()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        child_conn.close()  # the parent keeps only its end, so a dead child reads as EOF
        self.workers.append(_Worker(index, proc, parent_conn, time.monotonic()))
        return index

    def _preload_for(self, target: Callable) -> None:
        """forkserver: have the server import the heavy modules and the target's module before its first fork.

        Only the process's first fork server reads this (it lives as long as this process); ``__main__`` is
        left out because each child re-creates its own ``__main__`` anyway.
        """
        if self.start_method != "forkserver":
            return
        module = getattr(target, "__module__", None)
        names = [*self.preload, *([module] if module and module != "__main__" else [])]
        self.ctx.set_forkserver_preload(list(dict.fromkeys(names)))

    # -- supervising ----------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """True while some worker has not reported its end (Done, Failed or Exited)."""
        return any(not w.finished for w in self.workers)

    def poll(self, timeout: float = 0.5) -> Iterator[Any]:
        """Yield the messages and synthesised events that arrived within ``timeout`` seconds."""
        pending = [w for w in self.workers if not w.finished]
        if not pending:
            return
        handles: dict[Any, _Worker] = {}
        for w in pending:
            handles[w.conn] = w
            handles[w.process.sentinel] = w
        ready = wait(list(handles), timeout=timeout)
        now = time.monotonic()
        for w in dict.fromkeys(handles[h] for h in ready):
            yield from self._drain(w, now)
            if not w.finished and not w.process.is_alive():
                yield from self._drain(w, now)  # messages written just before exit
                if not w.finished:
                    w.process.join(timeout=1.0)
                    w.finished = True
                    yield Exited(w.index, w.process.exitcode)
        yield from self._check_silent(now)

    def _drain(self, w: _Worker, now: float) -> Iterator[Any]:
        while not w.finished:
            try:
                if not w.conn.poll(0):
                    return
                msg = w.conn.recv()
            except (EOFError, OSError):
                return  # closed: the sentinel tells how it ended
            w.last_seen = now
            if isinstance(msg, Started):
                w.started = True
            if isinstance(msg, (Done, Failed)):
                w.finished = True
                w.process.join(timeout=5.0)
            yield msg

    def _check_silent(self, now: float) -> Iterator[Unresponsive]:
        for w in self.workers:
            if w.finished or w.index in self._reported_silent:
                continue
            limit = self.heartbeat_timeout_s if w.started else self.start_timeout_s
            if limit is not None and now - w.last_seen > limit:
                self._reported_silent.add(w.index)
                yield Unresponsive(w.index, now - w.last_seen)

    # -- stopping -------------------------------------------------------------------------------------------
    def send(self, index: int, msg: Any) -> bool:
        w = self.workers[index]
        if w.finished:
            return False
        try:
            w.conn.send(msg)
            return True
        except (BrokenPipeError, ConnectionResetError, OSError):
            return False

    def placement(self, index: int) -> None:
        """Where worker ``index`` runs: on this machine, nothing to name (a Ray group names the node)."""
        return None

    def stop_all(self, reason: str) -> None:
        for w in self.workers:
            self.send(w.index, Stop(reason))

    def kill(self, index: int) -> None:
        proc = self.workers[index].process
        if proc.is_alive():
            proc.kill()

    def shutdown(self, *, grace_s: float = 30.0, term_s: float = 5.0) -> None:
        """Stop message, join with ``grace_s``, SIGTERM, join ``term_s``, SIGKILL, join; close every pipe.

        Safe to call twice and from ``finally``: after it returns, no worker process is left running.
        """
        if self._closed:
            return
        self._closed = True
        self.stop_all("shutdown")
        self._join_draining(time.monotonic() + grace_s)
        for escalate, wait_s in ((lambda p: p.terminate(), term_s), (lambda p: p.kill(), 5.0)):
            alive = [w.process for w in self.workers if w.process.is_alive()]
            for p in alive:
                escalate(p)
            for p in alive:
                p.join(timeout=wait_s)
        for w in self.workers:
            w.conn.close()
            if w.process.exitcode is not None:
                w.process.close()  # releases the sentinel fd

    def _join_draining(self, deadline: float) -> None:
        """Wait for the workers to exit until ``deadline``, reading and dropping what they still send: a worker
        blocked writing a message larger than the pipe's buffer (an actor's rollout of image frames) only gets
        back to its loop, and to the ``Stop``, once the other end reads."""
        readable = {w.conn: w for w in self.workers}
        while True:
            alive = [w for w in self.workers if w.process.is_alive()]
            remaining = deadline - time.monotonic()
            if not alive or remaining <= 0:
                return
            conns = [w.conn for w in alive if w.conn in readable]
            for conn in wait(conns + [w.process.sentinel for w in alive], timeout=remaining):
                if conn not in readable:
                    continue  # a sentinel: that worker has exited
                try:
                    while conn.poll(0):
                        conn.recv()
                except (EOFError, OSError):
                    del readable[conn]  # closed: only its sentinel is left to wait on

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc) -> None:
        # an error in the parent: no grace; a second Ctrl-C: a short one (the agents are already stopping)
        grace = 30.0 if exc[0] is None else 5.0 if exc[0] in (KeyboardInterrupt, StopRequested) else 0.0
        self.shutdown(grace_s=grace)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
