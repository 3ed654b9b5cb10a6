"""The typed messages between a ``WorkerGroup`` parent and its workers (trainers/supervise.py), never bare
strings: what a worker sends (``Started``, ``Heartbeat``, ``Done``, ``Failed``), what the parent sends
(``Stop``), and what the parent synthesises from a process's sentinel or silence (``Exited``, ``Unresponsive``).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Started:
    """worker -> parent: the worker's target is about to run."""

    index: int
    pid: int


@dataclass(frozen=True)
class Heartbeat:
    """worker -> parent, every ``heartbeat_s`` from a background thread."""

    index: int
    time: float


@dataclass(frozen=True)
class Done:
    """worker -> parent: the target returned ``result`` (plain, picklable)."""

    index: int
    result: Any


@dataclass(frozen=True)
class Failed:
    """worker -> parent: the target raised; ``traceback`` is the worker's formatted traceback."""

    index: int
    error: str
    traceback: str
    # the user's input or code failed (a ConfigError: an env that raised or returned a bad or non-finite value, a
    # bad value): ``error`` says it all and the run exits 2, as a single-process run does; False: rltrain's own
    # failure (exit 1). Decided in the worker, the one place that still has the exception's type.
    user_fault: bool = False

    @property
    def exit_code(self) -> int:
        return 2 if self.user_fault else 1


@dataclass(frozen=True)
class Stop:
    """parent -> worker: finish at the next safe point (``ctx.stop_requested`` turns true)."""

    reason: str


@dataclass(frozen=True)
class Exited:
    """Synthesised by the parent: the process ended without ``Done``/``Failed`` (killed, crashed, os._exit)."""

    index: int
    exitcode: int | None

    @property
    def description(self) -> str:
        if self.exitcode is not None and self.exitcode < 0:
            try:
                return f"killed by signal {signal.Signals(-self.exitcode).name}"
            except ValueError:
                return f"killed by signal {-self.exitcode}"
        return f"exited with code {self.exitcode} without reporting a result"


@dataclass(frozen=True)
class Unresponsive:
    """Synthesised by the parent: no message from a running worker for ``silent_s`` seconds."""

    index: int
    silent_s: float




@dataclass(frozen=True)
class Unplaced:
    """Synthesised by the parent (Ray backend): no node took the worker within ``waited_s`` seconds."""

    index: int
    waited_s: float
