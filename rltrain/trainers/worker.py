"""The worker side of ``supervise.WorkerGroup``: what runs inside each worker process.

``_bootstrap`` is the child's entry point (``WorkerGroup.start`` hands it to the process): it ties the
worker's life to its parent's, sets the signals, starts the pipe listener and the heartbeat thread, then runs
``target(ctx, payload)`` and reports ``Done`` or ``Failed``. ``WorkerContext`` is what the target sees (its
index, ``send``, ``stop_requested``), ``ContextStop`` the ``StopFlag`` a worker's training loop polls. The
parent side and the rules both sides keep are described in ``trainers/supervise.py``.
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
from rltrain.run.signals import StopFlag
from rltrain.trainers.messages import Done, Failed, Heartbeat, Started, Stop


class WorkerContext:
    """What a worker's target gets: its index, ``send``, and whether the parent asked it to stop."""

    def __init__(self, index: int, conn: Connection):
        self.index = index
        self._conn = conn
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
                self._conn.send(msg)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            self.parent_gone = True
            self.request_stop("parent gone")

    def _listen(self) -> None:
        # every read has a timeout, so the thread also notices a closed pipe promptly
        while not self.parent_gone:
            try:
                if not self._conn.poll(0.5):
                    continue
                msg = self._conn.recv()
            except (EOFError, OSError):
                self.parent_gone = True
                self.request_stop("parent gone")
                return
            if isinstance(msg, Stop):
                self.request_stop(msg.reason)
            else:
                self._inbox.put(msg)

    def _progress(self) -> tuple[int, int]:
        # env calls begun (envs/vector.py's CallWatch), read without importing it: a worker without envs
        vector = sys.modules.get("rltrain.envs.vector")
        return self.ticks, vector.CallWatch.calls if vector is not None else 0

    def _heartbeat(self, every_s: float) -> None:
        # relays the loop's progress, never just this thread's: a stuck loop stops the heartbeats
        last = self._progress()
        while not self._stop.wait(every_s) and not self.parent_gone:
            now = self._progress()
            if now != last:
                last = now
                self.send(Heartbeat(self.index, time.time()))


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
               graceful_sigterm: bool, parent_pid: int, direct_child: bool) -> None:
    """Runs in the child: tie its life to the parent's, signals, threads, one torch thread, then
    ``target(ctx, payload)``."""
    die_with_parent(parent_pid, direct=direct_child)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctx = WorkerContext(index, conn)
    if graceful_sigterm:  # also replaces the handlers a forked child inherited from its parent
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, lambda s, f: ctx.request_stop(signal.Signals(s).name))
    if "torch" in sys.modules:  # the target's module (unpickled before we run) imported it
        # small nets on few cores: more threads only contend with the other workers
        sys.modules["torch"].set_num_threads(1)
    threading.Thread(target=ctx._listen, name="rltrain-listen", daemon=True).start()
    if heartbeat_s > 0:
        threading.Thread(target=ctx._heartbeat, args=(heartbeat_s,), name="rltrain-heartbeat",
                         daemon=True).start()
    ctx.send(Started(index, os.getpid()))
    code = 0
    try:
        result = target(ctx, payload)
        ctx.send(Done(index, result))
    except BaseException as err:  # noqa: BLE001 - everything is reported to the parent, then we exit non-zero
        one_line = isinstance(err, ConfigError)
        message = str(err) if one_line else f"{type(err).__name__}: {err}"
        ctx.send(Failed(index, message, traceback.format_exc(), one_line))
        code = 1
    finally:
        ctx._stop.set()  # ends the heartbeat thread
        with ctx._send_lock:
            conn.close()
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip interpreter teardown of half-broken state; the pipe is already flushed
