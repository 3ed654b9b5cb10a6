"""Graceful stop on SIGINT / SIGTERM (and SIGUSR2, submitit's preemption signal).

The handler only records the signal; the training loop checks the flag at its next safe point (after the
current rollout/update), writes a checkpoint and stops. A second Ctrl-C raises KeyboardInterrupt at once.
Listeners (``on_stop``) hear of the request inside the handler: the env watch uses it to abandon an env call
that is stuck, so a stop is honoured even while an env never returns.
Lives in an importable module because submitit pickles signal handlers with the job.
"""

from __future__ import annotations

import signal
import threading

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGUSR2: 140}
# SIGUSR2: SLURM/submitit's "time limit or preemption is near" signal (sbatch --signal=USR2@<delay_s>)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)


class StopFlag:
    def __init__(self) -> None:
        self.signum: int | None = None
        self.reason: str | None = None
        self._previous: dict[int, object] = {}
        self._listeners: list = []

    def on_stop(self, listener) -> None:
        """Call ``listener()`` when a stop is requested (from the signal handler: it must be quick)."""
        self._listeners.append(listener)

    def install(self, signums: tuple[int, ...] = STOP_SIGNALS) -> StopFlag:
        if threading.current_thread() is not threading.main_thread():
            return self  # signals can only be handled on the main thread (e.g. joblib workers)
        for s in signums:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def uninstall(self) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: the user means it
        self.signum = signum
        self.reason = signal.Signals(signum).name
        for listener in self._listeners:
            listener()

    def request(self, reason: str) -> None:
        """Stop for a non-signal reason (wall-time budget, a failed worker)."""
        self.reason = reason
        self.signum = self.signum or 0
        for listener in self._listeners:
            listener()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum or 0, 3)
