"""The two seams of ``trainer=subprocess_actors`` that a backend (``trainer.backend``) implements, typed.

The pool (``pool.py``), the learner's queue, the loop and the algorithms see the actors only through these
Protocols, so they are the same code whatever runs the actors:

- the event source, ``ActorEvents``: starts an actor (a restart is a start under a new index), tells what the
  actors did (their own messages, e.g. rollouts, and the supervision events of ``trainers/messages.py``), hands
  them the learner's messages, kills one, stops all, and says where one runs (``WorkerNode``);
- the weights transport: on the learner ``WeightsTransport`` (publish a version, and the picklable
  ``WeightsHandle`` an actor starting now attaches to), in the actor ``WeightsReader`` (``read_if_newer``).

A backend (``ActorBackend``) connects to where the actors run and makes one of each for a run:

============ ============================================= ===============================================
backend      event source                                  weights transport
============ ============================================= ===============================================
``local``    ``supervise.WorkerGroup`` (processes, pipes)  ``shared_weights.SharedWeights`` (shared memory)
``ray``      ``ray_actors.RayGroup`` (Ray actors)          ``ray_weights.RayWeights`` (Ray's object store)
============ ============================================= ===============================================

Neither implementation knows the other's insides. Where a transport has no channel of its own to the actors
(Ray's version notes), the backend hands it the event source's public ``broadcast`` when it makes it, and the
actor loop passes each learner message that is not its own (a ``Credit``) to ``WeightsReader.receive``.
``tests/test_actors.py`` checks each implementation against these Protocols, and runs one contract scenario
against both backends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: the Ray actor host imports this module before torch is loaded
    from pathlib import Path

    import torch

    from rltrain.trainers.worker import WorkerContext


@dataclass(frozen=True)
class WorkerNode:
    """Where an actor runs, as its machine names itself (Ray: the node's IP, host name and node id)."""

    node_ip: str
    hostname: str
    node_id: str
    pid: int

    def describe(self) -> str:
        return f"{self.node_ip} ({self.hostname}, node {self.node_id[:8]})"


@runtime_checkable
class ActorEvents(Protocol):
    """Starts, watches and stops the actors of one run; one index per start, never reused."""

    def start(self, target: Callable[[WorkerContext, Any], Any], payload: Any) -> int:
        """Start one actor running ``target(ctx, payload)`` (both picklable); returns its index."""
        ...

    def poll(self, timeout: float) -> Iterable[Any]:
        """What happened within ``timeout`` seconds, in order: each actor's own messages (rollouts) and
        ``Started`` (placed and running), ``Heartbeat``, ``Done``, ``Failed`` (its traceback), ``Exited`` (ended
        without a word), ``Unresponsive`` (silent too long), ``Unplaced`` (no machine took it in time)."""
        ...

    def send(self, index: int, msg: Any) -> bool:
        """Hand ``msg`` to actor ``index`` (its ``ctx.recv``; a ``Stop`` sets ``ctx.stop_requested``); False when
        it is gone."""
        ...

    def kill(self, index: int) -> None:
        """End actor ``index`` now, whatever it is doing."""
        ...

    def shutdown(self, *, grace_s: float, term_s: float) -> None:
        """``Stop`` to every actor, up to ``grace_s`` for them to return, then end the rest: none outlives it."""
        ...

    def placement(self, index: int) -> WorkerNode | None:
        """Where actor ``index`` runs once its ``Started`` was reported; None: on this machine."""
        ...


@runtime_checkable
class WeightsReader(Protocol):
    """An actor's side of the weights transport (``WeightsHandle.attach()`` in the actor)."""

    @property
    def env_steps(self) -> int:
        """The learner's env steps when it published the newest version this reader knows of."""
        ...

    @property
    def closing(self) -> bool:
        """The learner is ending the run (local: a flag in shared memory, seen even while the pipe is full)."""
        ...

    def read_if_newer(self, last_version: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        """``(version, policy state)`` when a version other than ``last_version`` is out, else None (cheap)."""
        ...

    def receive(self, msg: Any) -> None:
        """A learner message the actor loop does not handle itself: the transport's, if it rides the event
        source (Ray's version notes); a transport with a channel of its own ignores it."""
        ...

    def close(self) -> None:
        ...


class WeightsHandle(Protocol):
    """Picklable: what an actor's ``ActorSpec`` carries to reach the weights."""

    def attach(self) -> WeightsReader:
        ...


@runtime_checkable
class WeightsTransport(Protocol):
    """The learner's side: one writer, every actor a reader."""

    @property
    def handle(self) -> WeightsHandle:
        """For an actor starting now (a transport that pushes versions puts the current one in it)."""
        ...

    @property
    def version(self) -> int:
        """The version last published."""
        ...

    def publish(self, state: dict[str, torch.Tensor], *, version: int, env_steps: int) -> None:
        """Make ``state`` version ``version`` for every actor (``env_steps``: the learner's, for warm-up)."""
        ...

    def mark_closing(self) -> None:
        """Tell the readers the run is ending (before the event source stops the actors)."""
        ...

    def close(self) -> None:
        """Release what it holds (shared memory, objects); idempotent."""
        ...


@runtime_checkable
class ActorBackend(Protocol):
    """Where a run's actors live: ``connect`` first, then ``weights``; ``close`` last (also after a failure)."""

    name: str

    def connect(self, *, actor_timeout_s: float, on_lost: Callable[[str], None] | None = None,
                run_dir: Path | None = None) -> ActorEvents:
        """Reach the machines (refusing in one line what cannot work); the run's event source. ``on_lost(why)``
        is called (from a thread) if the machines the run depends on are lost (a cluster's head); ``run_dir``:
        where the run's end is recorded should they take this process with them."""
        ...

    def weights(self, state: dict[str, torch.Tensor], *, version: int, env_steps: int) -> WeightsTransport:
        """The run's weights transport, ``state`` published as ``version``."""
        ...

    def close(self) -> None:
        ...
