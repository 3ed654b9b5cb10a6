"""Stop requests: SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 (submitit's preemption signal), in every phase.

Where the run has a safe point to stop at (the training loop, between updates) the handler only records the
signal; the loop checks the flag there, writes a checkpoint and stops. Where it has none (start-up, building
envs, loading a checkpoint, connecting to a cluster, the rendezvous of ranks, an evaluation), the code runs
inside ``StopFlag.raising()`` and the handler raises ``StopRequested`` at once: nothing half-done there is
worth keeping, and a call that never returns (an env constructor, a FIFO named like a checkpoint) must not
hold the stop. A second Ctrl-C after a stop request means "now" anywhere: ``StopRequested(now=True)``.
Whoever catches ``StopRequested`` ends the run ``interrupted`` with the checkpoint that already exists.

Listeners (``on_stop``) hear of the request inside the handler: the env watch uses it to abandon an env call
that is stuck, so a stop is honoured even while an env never returns.
Lives in an importable module because submitit pickles signal handlers with the job.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

# SIGUSR2: SLURM/submitit's "time limit or preemption is near" signal (sbatch --signal=USR2@<delay_s>); SIGUSR1
# the other one batch systems send (sbatch --signal=USR1@...); SIGHUP: the terminal went away
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
EXIT_CODES = {s: 128 + int(s) for s in STOP_SIGNALS}  # the shell's convention: 130 for SIGINT, 143 SIGTERM


class StopRequested(BaseException):
    """A stop request honoured at once (no safe point to wait for, or a second Ctrl-C: ``now``).

    A ``BaseException`` like ``KeyboardInterrupt``: code that handles its own errors (``except Exception``)
    must not swallow it."""

    def __init__(self, signum: int, reason: str, *, now: bool = False, phase: str = ""):
        super().__init__(reason)
        self.signum, self.reason, self.now, self.phase = signum, reason, now, phase

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum, 3)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopFlag:
    def __init__(self) -> None:
        self.signum: int | None = None
        self.reason: str | None = None
        self._previous: dict[int, object] = {}
        self._listeners: list = []
        self._phases: list[str] = []  # the innermost raising() phase last

    def on_stop(self, listener) -> None:
        """Call ``listener()`` when a stop is requested (from the signal handler: it must be quick)."""
        self._listeners.append(listener)

    def install(self, signums: tuple[int, ...] = STOP_SIGNALS) -> StopFlag:
        if threading.current_thread() is not threading.main_thread():
            return self  # signals can only be handled on the main thread (e.g. joblib workers)
        for s in signums:
            if signal.getsignal(s) == signal.SIG_IGN:
                continue  # ignored by whoever started us (nohup ignores SIGHUP): their choice stands
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def ignore(self) -> None:
        """Ignore further stop signals while a stop is being reported (a repeated signal must not cut the
        one line short with a traceback)."""
        for s in self._previous:
            signal.signal(s, signal.SIG_IGN)

    def uninstall(self) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.signum:
            # a second Ctrl-C after a stop signal: the user means it
            raise StopRequested(self.signum, self.reason or signal_name(signum), now=True, phase=self.phase)
        first = self.signum is None
        self.signum = signum
        self.reason = signal_name(signum)
        if first:
            for listener in self._listeners:
                listener()
        if self._phases:
            raise StopRequested(signum, self.reason, phase=self.phase)

    def request(self, reason: str) -> None:
        """Stop for a non-signal reason (wall-time budget, a failed worker)."""
        self.reason = reason
        self.signum = self.signum or 0
        for listener in self._listeners:
            listener()

    @property
    def phase(self) -> str:
        return self._phases[-1] if self._phases else ""

    @contextlib.contextmanager
    def raising(self, phase: str) -> Iterator[None]:
        """Within the block, a stop request raises ``StopRequested`` at once (and on entry, when one came
        already): for phases with no safe point to stop at. ``phase`` names it in the stop line."""
        self.check(phase)
        self._phases.append(phase)
        try:
            yield
        finally:
            self._phases.pop()

    def check(self, phase: str) -> None:
        """Raise ``StopRequested`` if a stop was requested (a poll for loops that have their own safe points)."""
        if self.requested:
            raise StopRequested(self.signum or 0, self.reason or "stop", phase=phase)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum or 0, 3)


def during(err: StopRequested) -> str:
    """`` during <phase>`` for the stop line, ``; second Ctrl-C`` when the user meant now."""
    return (f" during {err.phase}" if err.phase else "") + ("; second Ctrl-C: stopped at once" if err.now else "")


def exit_now(code: int) -> None:
    """End this process at once (no interpreter shutdown, no exit hooks: one of them may wait on a dead peer),
    stdout and stderr flushed first."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
