"""Learner-side supervision of actor processes: start, read, watch, restart, stop.

Every read waits on the actors' pipes *and* their process sentinels with a timeout, so a dead actor is
seen the moment it dies (SIGKILL included) and the learner never hangs on a silent one; an actor that is
alive but sends nothing (not even its heartbeat thread's beat) for ``actor_timeout_s`` is killed and
handled as failed. Shutdown is explicit: a closing flag in the shared weights plus a ``Stop`` message,
join with a deadline while draining pipes (a sender blocked on a full pipe must be able to finish), then
terminate, then kill.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from rltrain.trainers.actor_loop import (
    ActorFailed,
    ActorSpec,
    Credit,
    Heartbeat,
    Hello,
    RolloutMsg,
    Stop,
    actor_main,
)

log = logging.getLogger("rltrain.actors")


class ActorFailure(RuntimeError):
    """An actor died or raised and the policy (``on_actor_failure``) says stop."""


@dataclass
class ActorSlot:
    """One actor position; survives restarts (``generation`` counts starts)."""

    actor_id: int
    generation: int = 0
    restarts: int = 0
    proc: mp.process.BaseProcess | None = None
    conn: Connection | None = None
    last_seen: float = field(default_factory=time.monotonic)
    steps: int = 0
    episodes: int = 0
    sps: float = 0.0  # collection SPS of its last rollout
    version: int = -1
    error: str | None = None


class ActorPool:
    def __init__(self, make_spec: Callable[[int, int], ActorSpec], num_actors: int, *, start_method: str,
                 on_failure: str, max_restarts: int, actor_timeout_s: float,
                 on_restart: Callable[[ActorSpec], None] | None = None):
        self.ctx = mp.get_context(start_method)
        self.make_spec, self.on_restart = make_spec, on_restart
        self.on_failure, self.max_restarts, self.actor_timeout_s = on_failure, max_restarts, actor_timeout_s
        self.slots = [ActorSlot(k) for k in range(num_actors)]
        self.total_restarts = 0
        self.stopping = False
        self._rr = 0

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self, generations: list[int] | None = None) -> None:
        for slot in self.slots:
            slot.generation = generations[slot.actor_id] if generations else 0
            self._spawn(slot)

    def _spawn(self, slot: ActorSlot) -> None:
        spec = self.make_spec(slot.actor_id, slot.generation)
        parent, child = self.ctx.Pipe(duplex=True)
        proc = self.ctx.Process(target=actor_main, args=(spec, child), name=f"actor-{slot.actor_id}", daemon=True)
        proc.start()
        child.close()  # only the actor holds its end: its death shows as EOF here
        slot.proc, slot.conn, slot.last_seen, slot.error = proc, parent, time.monotonic(), None
        if self.on_restart and slot.generation > 0:
            self.on_restart(spec)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every actor and join it; never leaves a child behind."""
        self.stopping = True
        for slot in self.slots:
            if slot.conn is not None:
                with contextlib.suppress(OSError):
                    slot.conn.send(Stop())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(s.proc is not None and s.proc.is_alive() for s in self.slots):
            conns = [s.conn for s in self.slots if s.conn is not None]
            for conn in wait(conns, timeout=0.05) if conns else []:
                try:
                    conn.recv()  # drain: an actor blocked in send must get to see its Stop
                except (EOFError, OSError):
                    self._close_conn(conn)
        for slot in self.slots:
            self._reap(slot)

    def _close_conn(self, conn: Connection) -> None:
        for slot in self.slots:
            if slot.conn is conn:
                slot.conn.close()
                slot.conn = None

    @staticmethod
    def _reap(slot: ActorSlot) -> None:
        proc = slot.proc
        if proc is not None:
            proc.join(0.5)
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
            proc.close()
        if slot.conn is not None:
            slot.conn.close()
        slot.proc, slot.conn = None, None

    # -- reading ----------------------------------------------------------------------------------------------
    def poll(self, timeout_s: float, *, max_rollouts: int) -> list[RolloutMsg]:
        """Up to ``max_rollouts`` rollouts that arrived within ``timeout_s``; handles heartbeats, errors and
        deaths on the way. ``max_rollouts == 0`` only watches the processes (the queue is full)."""
        out: list[RolloutMsg] = []
        live = [s for s in self.slots if s.proc is not None]
        waitables: list = [s.proc.sentinel for s in live]  # type: ignore[union-attr]
        if max_rollouts > 0:
            waitables += [s.conn for s in live if s.conn is not None]
        ready = set(wait(waitables, timeout=timeout_s))
        dead = [s for s in live if s.proc.sentinel in ready]  # type: ignore[union-attr]
        # round robin, one message per actor per pass: a fast actor must not starve a slow one
        talking = [s for s in live if s.conn is not None and (s.conn in ready or s in dead)]
        self._rr = (self._rr + 1) % max(len(talking), 1)
        talking = talking[self._rr:] + talking[: self._rr]
        while talking:
            for slot in list(talking):
                if len(out) >= max_rollouts and slot not in dead:
                    talking.remove(slot)
                    continue
                try:
                    if not slot.conn.poll(0):  # type: ignore[union-attr]
                        talking.remove(slot)
                        continue
                    msg = slot.conn.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    talking.remove(slot)
                    continue
                self._handle(slot, msg, out)
        for slot in dead:  # after draining: a raised actor's traceback arrives before its sentinel
            self._failed(slot, self._death_reason(slot))
        if max_rollouts > 0:
            self._check_heartbeats()
        return out

    def _handle(self, slot: ActorSlot, msg: object, out: list[RolloutMsg]) -> None:
        slot.last_seen = time.monotonic()
        if isinstance(msg, RolloutMsg):
            if msg.generation != slot.generation:
                return
            slot.steps += msg.num_steps
            slot.episodes = msg.episodes
            slot.sps = msg.num_steps / max(msg.collect_s, 1e-9)
            slot.version = msg.version
            out.append(msg)
        elif isinstance(msg, ActorFailed):
            slot.error = msg.traceback
            log.error("actor %d (generation %d) raised:\n%s", msg.actor_id, msg.generation, msg.traceback)
        elif isinstance(msg, (Hello, Heartbeat)):
            pass

    def _death_reason(self, slot: ActorSlot) -> str:
        proc = slot.proc
        proc.join(1.0)  # type: ignore[union-attr]
        code = proc.exitcode  # type: ignore[union-attr]
        if slot.error:
            last = slot.error.strip().splitlines()[-1]
            return f"actor {slot.actor_id} raised {last}"
        if code is not None and code < 0:
            return f"actor {slot.actor_id} was killed by {signal.Signals(-code).name} (exit code {code})"
        return f"actor {slot.actor_id} exited with code {code}"

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.proc is None or slot.conn is None:
                continue
            if slot.conn.poll(0):  # unread messages: it is talking, we are the slow ones
                continue
            if now - slot.last_seen > self.actor_timeout_s:
                slot.proc.kill()
                self._failed(slot, f"actor {slot.actor_id} sent nothing for {now - slot.last_seen:.0f}s "
                                   f"(trainer.actor_timeout_s={self.actor_timeout_s:g}); killed")

    def _failed(self, slot: ActorSlot, reason: str) -> None:
        if self.stopping:
            return
        self._reap(slot)
        if self.on_failure == "restart" and slot.restarts < self.max_restarts:
            slot.restarts += 1
            self.total_restarts += 1
            slot.generation += 1
            log.warning("%s; restarting it (restart %d of at most %d, fresh seed)", reason, slot.restarts,
                        self.max_restarts)
            self._spawn(slot)
            return
        why = "on_actor_failure=abort" if self.on_failure == "abort" else \
            f"trainer.max_restarts={self.max_restarts} reached"
        raise ActorFailure(f"{reason}; stopping ({why})")

    def grant(self, msg: RolloutMsg) -> None:
        """``msg`` left the learner's queue: its actor (if still that generation) may send one more."""
        slot = self.slots[msg.actor_id]
        if slot.conn is not None and slot.generation == msg.generation:
            with contextlib.suppress(OSError):  # it died; its sentinel reports that
                slot.conn.send(Credit(1))

    # -- display ----------------------------------------------------------------------------------------------
    def rows(self) -> list[str]:
        now = time.monotonic()
        return [f"actor {s.actor_id}: {s.sps:,.0f} sps  episodes {s.episodes}  v{s.version}  "
                f"heartbeat {now - s.last_seen:.1f}s ago  restarts {s.restarts}" for s in self.slots]
