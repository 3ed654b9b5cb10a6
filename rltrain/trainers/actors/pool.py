"""The learner's actors: start them, restart or abort on failure, credit them, hand them weights, stop them.

The backend's event source (``seams.ActorEvents``: a local ``supervise.WorkerGroup`` or Ray's ``RayGroup``)
reports what happened (a rollout, a heartbeat, ``Failed`` with the actor's traceback, ``Exited`` for one that
died without a word, e.g. SIGKILL, ``Unresponsive`` for a silent one, ``Unplaced`` for one no machine took
within ``actor_timeout_s``); this pool maps its indices to actor slots and applies ``on_actor_failure``: restart
the slot as a new generation (fresh, recorded seed) up to ``max_restarts`` times, or raise ``ActorFailure``. An
unplaced actor is left out: the run goes on without that slot and stops only when no actor is left.

Each actor starts with the weights transport's current handle (``seams.WeightsTransport``), so a restarted
actor never acts with weights older than the version current at its start. ``placements`` names the machine of
every actor generation where the event source names one (Ray).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rltrain.trainers.actors.actor import ActorSpec, Credit, RolloutMsg, actor_main
from rltrain.trainers.actors.seams import ActorEvents, WeightsHandle, WeightsTransport
from rltrain.trainers.messages import Done, Exited, Failed, Heartbeat, Started, Unplaced, Unresponsive

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rltrain.actors")
SpecMaker = Callable[[WeightsHandle, int, int], ActorSpec]  # (weights handle, actor id, generation) -> its spec


class ActorFailure(RuntimeError):
    """An actor died or raised and ``on_actor_failure`` (or ``max_restarts``) says stop."""


@dataclass
class ActorSlot:
    """One actor position; survives restarts (``generation`` counts its starts)."""

    actor_id: int
    generation: int = 0
    restarts: int = 0
    index: int = -1  # its current event-source index
    steps: int = 0
    episodes: int = 0
    sps: float = 0.0  # collection SPS of its last rollout
    version: int = -1
    node: str = ""  # where it runs, where the event source names it (Ray: node IP, host name, node id)
    dropped: bool = False  # no machine could take it: the run goes on without it


class ActorPool:
    def __init__(self, events: ActorEvents, num_actors: int, *, on_failure: str, max_restarts: int,
                 actor_timeout_s: float, on_restart: Callable[[ActorSpec], None] | None = None,
                 traceback_file: Path | None = None):
        self.events, self.on_restart = events, on_restart
        self.traceback_file = traceback_file  # where an actor's traceback goes (the terminal gets one line)
        self.on_failure, self.max_restarts, self.actor_timeout_s = on_failure, max_restarts, actor_timeout_s
        self.slots = [ActorSlot(k) for k in range(num_actors)]
        # the last generation of each actor position past num_actors that an earlier session ran (a resume with
        # fewer actors): kept in the checkpoint, so a later resume that adds that actor back seeds it afresh
        self.retired: list[int] = []
        self.by_index: dict[int, ActorSlot] = {}
        self.placements: dict[str, dict] = {}  # actor_<k>_gen_<g> -> its node (where the event source names it)
        self.total_restarts = 0
        self.failure: str | None = None  # why the actors stopped the run (ActorFailure's message)
        self.exit_code = 1  # the run's, once ``failure`` is set: 2 when the user's env (or input) failed the actor
        self.stopping = False
        self.weights: WeightsTransport | None = None
        self._make_spec: SpecMaker | None = None

    @property
    def generations(self) -> list[int]:
        """The last generation of every actor position the run has had, this session's first (the checkpoint's
        record: each position's next start takes the generation after it, and with it a seed never used)."""
        return [s.generation for s in self.slots] + self.retired

    def resume(self, generations: list[int]) -> None:
        """Continue a run whose actors had these generations: a resumed actor is a new process, hence a fresh
        generation (and seed)."""
        for slot in self.slots:
            slot.generation = generations[slot.actor_id] + 1 if slot.actor_id < len(generations) else 0
        self.retired = list(generations[len(self.slots):])

    def start(self, make_spec: SpecMaker, weights: WeightsTransport) -> None:
        """Start every actor; the pool owns ``weights`` from now on (``stop`` closes it)."""
        self._make_spec, self.weights = make_spec, weights
        for slot in self.slots:
            self._spawn(slot)

    def _spawn(self, slot: ActorSlot) -> None:
        assert self._make_spec is not None and self.weights is not None
        spec = self._make_spec(self.weights.handle, slot.actor_id, slot.generation)
        slot.index = self.events.start(actor_main, spec)
        self.by_index[slot.index] = slot
        if self.on_restart and slot.generation > 0:
            self.on_restart(spec)

    def publish(self, state: dict[str, torch.Tensor], *, version: int, env_steps: int) -> None:
        assert self.weights is not None
        self.weights.publish(state, version=version, env_steps=env_steps)

    def stop(self) -> None:
        """Closing flag, stop message, join, then terminate / kill: no actor outlives this call; the weights are
        released."""
        self.stopping = True
        if self.weights is not None:
            self.weights.mark_closing()
        self.events.shutdown(grace_s=10.0, term_s=5.0)
        if self.weights is not None:
            self.weights.close()
            self.weights = None

    # -- reading ----------------------------------------------------------------------------------------------
    def poll(self, timeout_s: float) -> list[RolloutMsg]:
        """Rollouts that arrived within ``timeout_s``; failures are handled (restart) or raised (abort)."""
        out: list[RolloutMsg] = []
        for ev in list(self.events.poll(timeout_s)):
            if isinstance(ev, RolloutMsg):
                slot: ActorSlot | None = self.slots[ev.actor_id]
                if ev.generation != slot.generation:  # type: ignore[union-attr]
                    continue  # sent by a generation already replaced
            else:
                slot = self.by_index.get(ev.index)
                if slot is None or slot.index != ev.index:
                    continue
            if isinstance(ev, RolloutMsg):
                slot.steps += ev.num_steps
                slot.episodes = ev.episodes
                slot.sps = ev.num_steps / max(ev.collect_s, 1e-9)
                slot.version = ev.version
                out.append(ev)
            elif isinstance(ev, Failed):
                where = self._keep_traceback(slot, ev.traceback, user_fault=ev.user_fault)
                self._failed(slot, f"actor {slot.actor_id} failed: {ev.error}{where}", exit_code=ev.exit_code)
            elif isinstance(ev, Exited):
                self._failed(slot, f"actor {slot.actor_id} {ev.description}")
            elif isinstance(ev, Unresponsive):
                self.events.kill(ev.index)
                self._failed(slot, f"actor {slot.actor_id} sent nothing for {ev.silent_s:.0f}s "
                                   f"(trainer.actor_timeout_s={self.actor_timeout_s:g}); killed")
            elif isinstance(ev, Done):
                self._failed(slot, f"actor {slot.actor_id} returned before it was asked to stop")
            elif isinstance(ev, Unplaced):
                self._unplaced(slot, ev.waited_s)
            elif isinstance(ev, Started):
                self._placed(slot)
            elif isinstance(ev, Heartbeat):
                pass
        return out

    def _keep_traceback(self, slot: ActorSlot, text: str, *, user_fault: bool) -> str:
        """Append an actor's traceback to ``traceback_file``; the note naming it (empty if it cannot be written),
        worded as the single-process run's: ``; traceback in`` after the user's error, in brackets after ours."""
        if self.traceback_file is None:
            return ""
        try:
            with open(self.traceback_file, "a") as f:
                f.write(f"actor {slot.actor_id} (generation {slot.generation}):\n{text}\n")
        except OSError:
            return ""
        return f"; traceback in {self.traceback_file}" if user_fault else f" (traceback in {self.traceback_file})"

    def _failed(self, slot: ActorSlot, reason: str, *, exit_code: int = 1) -> None:
        """Restart ``slot`` or abort the run (``ActorFailure``) with ``exit_code``: 2 for the user's env, as a
        single-process run ends for it; 1 (the default) for a dead, silent or misbehaving actor (rltrain's)."""
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
        self.failure, self.exit_code = f"{reason}; stopping ({why})", exit_code
        raise ActorFailure(self.failure)

    def _placed(self, slot: ActorSlot) -> None:
        node = self.events.placement(slot.index)
        if node is None:  # on this machine: nothing to name
            return
        slot.node = node.describe()
        self.placements[f"actor_{slot.actor_id}_gen_{slot.generation}"] = dataclasses.asdict(node)
        log.info("actor %d (generation %d) runs on %s", slot.actor_id, slot.generation, slot.node)

    def _unplaced(self, slot: ActorSlot, waited_s: float) -> None:
        if self.stopping:
            return
        slot.dropped = True
        left = sum(not s.dropped for s in self.slots)
        if not left:
            self.failure = (f"no node could take actor {slot.actor_id} within {waited_s:.0f}s "
                            f"(trainer.actor_timeout_s) and no actor is left; stopping")
            raise ActorFailure(self.failure)
        log.warning("no node could take actor %d within %.0fs (trainer.actor_timeout_s): going on with %d of %d "
                    "actors", slot.actor_id, waited_s, left, len(self.slots))

    def grant(self, msg: RolloutMsg) -> None:
        """``msg`` left the learner's queue: its actor (if still that generation) may send one more."""
        slot = self.slots[msg.actor_id]
        if slot.generation == msg.generation:
            self.events.send(slot.index, Credit(1))  # False if it died: its Exited event reports that

