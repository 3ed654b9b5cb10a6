"""The deadline of this process's env calls (``CallWatch``) and the one-line faults of a misbehaving env.

An env that raises, returns what does not fit its spaces, or does not return from ``step``/``reset`` within
``env.step_timeout_s`` ends the run in one line naming the env and its step (``EnvFault``). The deadline is a
``SIGALRM`` timer of the main thread (no thread), so it also catches a loop that a heartbeat thread would still
report alive; a loop of steps arms it once and clears it when the loop is done (no system call per step). The
same timer abandons a call stuck when a stop signal arrives (``CallWatch.abandon``).
"""

from __future__ import annotations

import signal
import threading
import time

from rltrain.errors import ConfigError

# env calls begun in this process, by every watch and counted env: the liveness a worker's heartbeat reports.
# A one-item list, incremented in place: a class attribute's write on every call would cost each of the
# watch's own attribute reads their specialised fast path.
ENV_CALLS = [0]
ABANDON_AFTER_S = 0.5  # a stop signal abandons an env call still running this long after it arrived


class EnvFault(ConfigError):
    """An env misbehaved (raised, bad output, hung): one line naming the env index and its step."""

    def __init__(self, message: str, *, env_index: int, env_step: int):
        super().__init__(message)
        self.env_index, self.env_step = env_index, env_step


class EnvCallAbandoned(Exception):
    """A stop signal arrived while an env call was stuck; the call was given up (the envs are unusable)."""

    def __init__(self, env_index: int, env_step: int, stuck_s: float):
        super().__init__(f"env {env_index} was stuck in step {env_step} for {stuck_s:.1f}s when the stop signal "
                         "came; the call was abandoned")
        self.env_index, self.env_step, self.stuck_s = env_index, env_step, stuck_s


class CallWatch:
    """Deadline and stop-abandon for the env calls of this process's main thread (one per vector env).

    ``begin``/``end`` around a vector step arm and clear an ``ITIMER_REAL`` timer (``end(keep=True)`` leaves it
    running for the next call, ``disarm`` clears it). Its ``SIGALRM`` raises ``EnvFault`` (the call running then
    has outlived ``timeout_s``; a younger one gets the rest of its time) or ``EnvCallAbandoned`` (``abandon`` was
    called: a stop signal came and the call did not return within ``ABANDON_AFTER_S``). Off the main thread it
    does nothing.
    """

    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s
        self.env, self.step, self.started = -1, 0, 0.0
        self.busy, self.stopping = False, False
        self.armed = False  # the ITIMER_REAL timer is running (set by begin, cleared by end / disarm / its alarm)
        # main thread only (signals), and never over someone else's timer (a test runner's alarm, say)
        self.enabled = threading.current_thread() is threading.main_thread() and \
            signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        self._previous = signal.signal(signal.SIGALRM, self._alarm) if self.enabled else None

    def close(self) -> None:
        """Give SIGALRM back to whoever had it."""
        if self.enabled:
            self.enabled, self.armed = False, False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous if self._previous is not None else signal.SIG_DFL)

    def begin(self, step: int) -> None:
        self.step, self.busy, self.env = step, True, -1
        ENV_CALLS[0] += 1
        if self.enabled:
            self.started = time.monotonic()
            if self.stopping:
                signal.setitimer(signal.ITIMER_REAL, ABANDON_AFTER_S)
                self.armed = True
            elif self.timeout_s and not self.armed:
                signal.setitimer(signal.ITIMER_REAL, self.timeout_s)
                self.armed = True

    def end(self, *, keep: bool = False) -> None:
        """The call returned. ``keep``: leave the deadline timer running for the next call (a loop of steps
        saves its two system calls a step; ``_alarm`` then judges the call running when it fires, and
        ``disarm`` ends it when the loop is done)."""
        self.busy = False
        if self.armed and (self.stopping or not keep):
            self.disarm()

    def disarm(self) -> None:
        """Clear the timer between loops of calls: nothing outside an env call ever sees a SIGALRM (an
        interrupted system call in a library that does not retry it, gloo's sockets say)."""
        if self.armed:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)

    def abandon(self) -> None:
        """A stop was requested (called from the signal handler): give a stuck call ``ABANDON_AFTER_S``."""
        self.stopping = True
        if self.enabled and self.busy:
            signal.setitimer(signal.ITIMER_REAL, ABANDON_AFTER_S)
            self.armed = True

    def _alarm(self, signum, frame) -> None:
        self.armed = False
        if not self.busy:
            return  # a kept timer outlived its loop's calls: the next call arms it again
        stuck = time.monotonic() - self.started
        if not self.stopping and self.timeout_s and stuck < self.timeout_s:
            # a kept timer armed by an earlier call: this call gets the rest of its own deadline
            signal.setitimer(signal.ITIMER_REAL, max(self.timeout_s - stuck, 1e-3))  # 0 would clear it
            self.armed = True
            return
        env = max(self.env, 0)
        self.busy = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        if self.stopping:
            raise EnvCallAbandoned(env, self.step, stuck)
        raise timeout_fault(env, self.step, self.timeout_s)


def timeout_fault(env_index: int, env_step: int, timeout_s: float | None) -> EnvFault:
    return EnvFault(f"env {env_index} did not return from its step {env_step} within env.step_timeout_s="
                    f"{timeout_s:g}s (a hung env; raise env.step_timeout_s, or null disables the check)",
                    env_index=env_index, env_step=env_step)


def env_fault(err: BaseException, env_index: int, env_step: int, call: str) -> EnvFault:
    """The one line for an env whose ``call`` raised or returned something unusable."""
    what = f"{type(err).__name__}: {err}".splitlines()[0]
    return EnvFault(f"env {env_index} failed in {call} at its step {env_step}: {what}", env_index=env_index,
                    env_step=env_step)
