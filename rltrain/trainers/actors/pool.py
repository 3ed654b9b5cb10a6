"""Learner-side supervision of the actors on top of ``workers.WorkerGroup``: restart or abort policy.

``WorkerGroup`` reports what happened (a rollout, a heartbeat, ``Failed`` with the actor's traceback,
``Exited`` for a process that died without a word, e.g. SIGKILL, ``Unresponsive`` for a silent one); this
pool maps worker indices to actor slots and applies ``on_actor_failure``: restart the slot as a new
generation (fresh, recorded seed) up to ``max_restarts`` times, or raise ``ActorFailure``.

The event source is the backend's (``backends.py``): a local ``WorkerGroup`` or Ray's ``RayGroup``, which also
names each actor's node (``placements``, per generation) and reports an actor it could place on no node within
``actor_timeout_s`` (``Unplaced``): the run goes on without that slot, and stops only when no actor is left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rltrain.trainers.actors.actor import ActorSpec, Credit, RolloutMsg, actor_main
from rltrain.trainers.messages import Unplaced
from rltrain.trainers.supervise import Done, Exited, Failed, Heartbeat, Started, Unresponsive, WorkerGroup

log = logging.getLogger("rltrain.actors")


class ActorFailure(RuntimeError):
    """An actor died or raised and ``on_actor_failure`` (or ``max_restarts``) says stop."""


@dataclass
class ActorSlot:
    """One actor position; survives restarts (``generation`` counts its starts)."""

    actor_id: int
    generation: int = 0
    restarts: int = 0
    index: int = -1  # its current WorkerGroup index
    last_seen: float = 0.0
    steps: int = 0
    episodes: int = 0
    sps: float = 0.0  # collection SPS of its last rollout
    version: int = -1
    node: str = ""  # where it runs (Ray backend: node IP, host name, node id); '' locally
    dropped: bool = False  # no node could take it (Ray): the run goes on without it


class ActorPool:
    def __init__(self, make_spec: Callable[[int, int], ActorSpec], num_actors: int, *, start_method: str,
                 on_failure: str, max_restarts: int, actor_timeout_s: float,
                 on_restart: Callable[[ActorSpec], None] | None = None, group: Any = None):
        # daemon=False: an actor may start env processes of its own (env.vectorization=async)
        self.group = group or WorkerGroup(start_method=start_method, heartbeat_s=1.0,
                                          heartbeat_timeout_s=actor_timeout_s, name="rltrain-actor", daemon=False)
        self.placements: dict[str, dict] = {}  # actor_<k>_gen_<g> -> its node (Ray backend)
        self.make_spec, self.on_restart = make_spec, on_restart
        self.on_failure, self.max_restarts = on_failure, max_restarts
        self.slots = [ActorSlot(k) for k in range(num_actors)]
        self.by_index: dict[int, ActorSlot] = {}
        self.total_restarts = 0
        self.stopping = False

    def start(self, generations: list[int] | None = None) -> None:
        for slot in self.slots:
            slot.generation = generations[slot.actor_id] if generations else 0
            self._spawn(slot)

    def _spawn(self, slot: ActorSlot) -> None:
        spec = self.make_spec(slot.actor_id, slot.generation)
        slot.index = self.group.start(actor_main, spec)
        slot.last_seen = time.monotonic()
        self.by_index[slot.index] = slot
        if self.on_restart and slot.generation > 0:
            self.on_restart(spec)

    def stop(self) -> None:
        """Stop message, join, then terminate / kill: no actor outlives this call."""
        self.stopping = True
        self.group.shutdown(grace_s=10.0, term_s=5.0)

    # -- reading ----------------------------------------------------------------------------------------------
    def poll(self, timeout_s: float) -> list[RolloutMsg]:
        """Rollouts that arrived within ``timeout_s``; failures are handled (restart) or raised (abort)."""
        out: list[RolloutMsg] = []
        for ev in list(self.group.poll(timeout_s)):
            if isinstance(ev, RolloutMsg):
                slot: ActorSlot | None = self.slots[ev.actor_id]
                if ev.generation != slot.generation:  # type: ignore[union-attr]
                    continue  # sent by a generation already replaced
            else:
                slot = self.by_index.get(ev.index)
                if slot is None or slot.index != ev.index:
                    continue
            slot.last_seen = time.monotonic()
            if isinstance(ev, RolloutMsg):
                slot.steps += ev.num_steps
                slot.episodes = ev.episodes
                slot.sps = ev.num_steps / max(ev.collect_s, 1e-9)
                slot.version = ev.version
                out.append(ev)
            elif isinstance(ev, Failed):
                log.error("actor %d (generation %d) raised:\n%s", slot.actor_id, slot.generation, ev.traceback)
                self._failed(slot, f"actor {slot.actor_id} raised {ev.error}")
            elif isinstance(ev, Exited):
                self._failed(slot, f"actor {slot.actor_id} {ev.description}")
            elif isinstance(ev, Unresponsive):
                self.group.kill(ev.index)
                self._failed(slot, f"actor {slot.actor_id} sent nothing for {ev.silent_s:.0f}s "
                                   f"(trainer.actor_timeout_s={self.group.heartbeat_timeout_s:g}); killed")
            elif isinstance(ev, Done):
                self._failed(slot, f"actor {slot.actor_id} returned before it was asked to stop")
            elif isinstance(ev, Unplaced):
                self._unplaced(slot, ev.waited_s)
            elif isinstance(ev, Started):
                self._placed(slot)
            elif isinstance(ev, Heartbeat):
                pass
        return out

    def _failed(self, slot: ActorSlot, reason: str) -> None:
        if self.stopping:
            return
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

    def _placed(self, slot: ActorSlot) -> None:
        node_of = getattr(self.group, "node_of", None)
        if node_of is None:
            return
        slot.node = node_of(slot.index)
        self.placements[f"actor_{slot.actor_id}_gen_{slot.generation}"] = self.group.placement(slot.index)
        log.info("actor %d (generation %d) runs on %s", slot.actor_id, slot.generation, slot.node)

    def _unplaced(self, slot: ActorSlot, waited_s: float) -> None:
        if self.stopping:
            return
        slot.dropped = True
        left = sum(not s.dropped for s in self.slots)
        if not left:
            raise ActorFailure(f"no node could take actor {slot.actor_id} within {waited_s:.0f}s "
                               f"(trainer.actor_timeout_s) and no actor is left; stopping")
        log.warning("no node could take actor %d within %.0fs (trainer.actor_timeout_s): going on with %d of %d "
                    "actors", slot.actor_id, waited_s, left, len(self.slots))

    @property
    def active(self) -> list[ActorSlot]:
        return [s for s in self.slots if not s.dropped]

    def grant(self, msg: RolloutMsg) -> None:
        """``msg`` left the learner's queue: its actor (if still that generation) may send one more."""
        slot = self.slots[msg.actor_id]
        if slot.generation == msg.generation:
            self.group.send(slot.index, Credit(1))  # False if it died: its Exited event reports that

    # -- display ----------------------------------------------------------------------------------------------
    def rows(self) -> list[str]:
        now = time.monotonic()
        return [f"actor {s.actor_id}: {s.sps:,.0f} sps  episodes {s.episodes}  v{s.version}  "
                f"heartbeat {now - s.last_seen:.1f}s ago  restarts {s.restarts}" for s in self.slots]
