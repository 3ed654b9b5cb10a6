"""The worker side of ``supervise.WorkerGroup``: what runs inside each worker process.

``_bootstrap`` is the child's entry point (``WorkerGroup.start`` hands it to the process): it ties the
worker's life to its parent's, sets the signals, starts the pipe listener and the heartbeat thread, then runs
``target(ctx, payload)`` (``run_target``) and reports ``Done`` or ``Failed``. ``WorkerContext`` is what the
target sees (its index, ``send``, ``recv``, ``stop_requested``), whatever carries its messages: the Ray actor
host (``actors/ray_actors.py``) gives it an outbox instead of a pipe and runs the target with the same
``run_target``. ``ContextStop`` is the ``StopFlag`` a worker's training loop polls. The parent side and the rules
both sides keep are described in ``trainers/supervise.py``.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from rltrain.envs.lifetime import die_with_parent
from rltrain.errors import ConfigError
from rltrain.run.logs import LogTargets
from rltrain.run.signals import StopFlag
from rltrain.trainers.messages import Done, Failed, Heartbeat, Started, Stop


class WorkerContext:
    """What a worker's target gets: its index, ``send``, and whether the parent asked it to stop.

    It does not care what carries the messages: ``send`` is the channel's (the pipe's here, a Ray actor's outbox
    in ``actors/ray_actors.py``), and whatever receives the parent's messages hands each to ``deliver`` (the pipe
    listener here, the Ray actor's ``deliver`` method there)."""

    def __init__(self, index: int, send: Callable[[Any], None]):
        self.index = index
        self._send = send
        self._send_lock = threading.Lock()  # the main thread and the heartbeat thread both send
        self._stop = threading.Event()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()  # parent -> worker messages other than Stop
        self.stop_reason: str | None = None
        self.parent_gone = False
        self.ticks = 0  # times the loop polled stop_requested: its progress, which the heartbeat reports
        self.stop_listeners: list[Callable[[], None]] = []

    @property
    def stop_requested(self) -> bool:
        self.ticks += 1
        return self._stop.is_set()

    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason
        first = not self._stop.is_set()
        self._stop.set()
        if first:
            for listener in self.stop_listeners:  # e.g. abandon an env call stuck in the main thread
                listener()

    def wait_stop(self, timeout: float) -> bool:
        return self._stop.wait(timeout)

    def recv(self, timeout: float = 0.0) -> Any | None:
        """The parent's next message other than ``Stop`` (e.g. flow-control credits), or None after
        ``timeout``."""
        try:
            return self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return None

    def send(self, msg: Any) -> None:
        """Send a dataclass message to the parent. A gone parent turns into a stop request, not an error."""
        try:
            with self._send_lock:
                self._send(msg)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            self.parent_gone = True
            self.request_stop("parent gone")

    def deliver(self, msg: Any) -> None:
        """A message from the parent: ``Stop`` sets ``stop_requested``, anything else waits for ``recv``."""
        if isinstance(msg, Stop):
            self.request_stop(msg.reason)
        else:
            self._inbox.put(msg)

    def start_heartbeat(self, every_s: float) -> None:
        """A thread sends a ``Heartbeat`` every ``every_s`` while the loop makes progress, until ``finish``."""
        threading.Thread(target=self._heartbeat, args=(every_s,), name="rltrain-heartbeat", daemon=True).start()

    def finish(self) -> None:
        """The target returned or raised: the heartbeat thread ends."""
        self._stop.set()

    def _progress(self) -> tuple[int, int]:
        # env calls begun (envs/deadline.py's ENV_CALLS), read without importing it: a worker without envs
        deadline = sys.modules.get("rltrain.envs.deadline")
        return self.ticks, deadline.ENV_CALLS[0] if deadline is not None else 0

    def _heartbeat(self, every_s: float) -> None:
        # relays the loop's progress, never just this thread's: a stuck loop stops the heartbeats
        last = self._progress()
        while not self._stop.wait(every_s) and not self.parent_gone:
            now = self._progress()
            if now != last:
                last = now
                self.send(Heartbeat(self.index, time.time()))


def run_target(ctx: WorkerContext, target: Callable[[WorkerContext, Any], Any], payload: Any) -> Done | Failed:
    """``target(ctx, payload)`` and how it ended: ``Done`` with its result, or ``Failed`` with the traceback (a
    ``ConfigError`` is one line that says it all, and the user's fault: ``Failed.user_fault``). The heartbeat ends
    with it."""
    try:
        return Done(ctx.index, target(ctx, payload))
    except BaseException as err:  # noqa: BLE001 - everything is reported to the parent
        user_fault = isinstance(err, ConfigError)
        message = str(err) if user_fault else f"{type(err).__name__}: {err}"
        return Failed(ctx.index, message, traceback.format_exc(), user_fault)
    finally:
        ctx.finish()


def _listen(ctx: WorkerContext, conn: Connection) -> None:
    """The pipe's reader: the parent's messages go to ``ctx.deliver``. Every read has a timeout, so the thread
    also notices a closed pipe promptly."""
    while not ctx.parent_gone:
        try:
            if not conn.poll(0.5):
                continue
            msg = conn.recv()
        except (EOFError, OSError):
            ctx.parent_gone = True
            ctx.request_stop("parent gone")
            return
        ctx.deliver(msg)


class ContextStop(StopFlag):
    """The ``StopFlag`` a worker's training loop polls: set by the parent's ``Stop`` or a direct SIGTERM /
    SIGUSR2.

    A stop whose reason names a signal (the parent was interrupted: ``Stop("SIGINT")``) keeps that signal,
    so the worker's summary carries the exit code the parent's own signal would give (130 for Ctrl-C).
    """

    def __init__(self, ctx: WorkerContext):
        super().__init__()
        self.ctx = ctx

    def on_stop(self, listener: Callable[[], None]) -> None:
        self.ctx.stop_listeners.append(listener)

    @property
    def requested(self) -> bool:
        if self.signum is None and self.ctx.stop_requested:
            self.reason = self.ctx.stop_reason
            self.signum = int(signal.Signals.__members__.get(self.reason or "", 0))
        return self.signum is not None


def _bootstrap(target: Callable[..., Any], index: int, conn: Connection, payload: Any, heartbeat_s: float,
               graceful_sigterm: bool, parent_pid: int, direct_child: bool, logs: LogTargets) -> None:
    """Runs in the child: tie its life to the parent's, signals, the parent's log targets (a spawned child has
    none), threads, one torch thread, then ``target(ctx, payload)``."""
    die_with_parent(parent_pid, direct=direct_child)
    logs.install()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctx = WorkerContext(index, conn.send)
    if graceful_sigterm:  # also replaces the handlers a forked child inherited from its parent
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, lambda s, f: ctx.request_stop(signal.Signals(s).name))
    if "torch" in sys.modules:  # the target's module (unpickled before we run) imported it
        # small nets on few cores: more threads only contend with the other workers
        sys.modules["torch"].set_num_threads(1)
    threading.Thread(target=_listen, args=(ctx, conn), name="rltrain-listen", daemon=True).start()
    if heartbeat_s > 0:
        ctx.start_heartbeat(heartbeat_s)
    ctx.send(Started(index, os.getpid()))
    outcome = run_target(ctx, target, payload)
    ctx.send(outcome)
    with ctx._send_lock:  # not while the heartbeat thread is still writing
        conn.close()
    if isinstance(outcome, Failed):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # skip interpreter teardown of half-broken state; the pipe is already flushed
