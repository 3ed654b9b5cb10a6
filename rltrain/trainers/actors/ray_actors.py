"""The Ray event source of ``trainer=subprocess_actors`` (``trainer.backend=ray``): actors as Ray actors.

``RayGroup`` is a ``seams.ActorEvents`` like the local ``supervise.WorkerGroup`` and reports the same events, so
the pool's restart / abort policy, the learner, the loop and the algorithms run unchanged:

- each actor is one Ray actor (``ActorHost``, a threaded actor) in a placement group of its own: one bundle of
  ``trainer.ray.actor_resources``, the groups spread over the nodes that can take them. Its ``run`` call runs
  the very ``actor_main`` a local actor process runs, with a ``WorkerContext`` whose channel is an outbox instead
  of a pipe: what the actor ``send``s (``Placed``, rollouts, heartbeats) waits there, and the learner long-polls
  it with one ``take`` call in flight per actor. A rollout comes back as that call's return value, i.e. through
  Ray's object store (numpy arrays, read in place on the learner's node);
- what the learner sends (credits, the weights transport's notes, ``Stop``) goes by ``deliver`` calls to the
  context's ``deliver``, as the local pipe listener hands it what the pipe brings;
- ``run`` returning gives ``Done`` or ``Failed`` (the actor's traceback; ``worker.run_target`` as locally); a Ray
  actor error (the worker process died, its node was lost) gives ``Exited`` naming the cause; an actor that sends
  nothing for ``heartbeat_timeout_s`` is ``Unresponsive``; one whose placement group no node reserved within that
  time (no node has its resources free) is ``Unplaced``, and the pool goes on without it. A reserved one that is
  still starting (a fresh Ray worker importing torch on a loaded node) is given ``START_TIMEOUT_S``, as a local
  worker is.

The credits bound the rollouts in flight exactly as locally: an actor only collects while it holds one.
"""

from __future__ import annotations

import os
import queue
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rltrain.trainers.actors.seams import WorkerNode
from rltrain.trainers.messages import Done, Exited, Failed, Heartbeat, Started, Stop, Unplaced, Unresponsive
from rltrain.trainers.worker import WorkerContext, run_target

TAKE_WAIT_S = 0.5  # a take call returns after this long without messages (the learner re-issues it)
START_TIMEOUT_S = 300.0  # placed, but torch, the algorithm and the envs not loaded yet (as WorkerGroup's start)


@dataclass(frozen=True)
class Placed:
    """actor -> learner, first message: where Ray placed it."""

    index: int
    node: WorkerNode


@dataclass(frozen=True)
class Lost(Exited):
    """The Ray actor is gone (its worker process died or its node was lost); ``reason`` is Ray's word for it."""

    reason: str = ""

    @property
    def description(self) -> str:
        return self.reason


class ActorHost:
    """The Ray actor class (made remote by ``RayGroup``); lives in a Ray worker process on some node."""

    def __init__(self, index: int, heartbeat_s: float):
        import ray

        self.outbox: queue.Queue[Any] = queue.Queue()  # the context's channel: emptied by the learner's take calls
        self.ctx = WorkerContext(index, self.outbox.put)
        self.heartbeat_s = heartbeat_s
        # placed: said at once (torch and the envs load later, with the target; the heartbeat covers that)
        node = WorkerNode(ray.util.get_node_ip_address(), socket.gethostname(),
                          ray.get_runtime_context().get_node_id(), os.getpid())
        self.ctx.send(Placed(index, node))

    def run(self, target: Callable[[WorkerContext, Any], Any], payload: Any) -> Done | Failed:
        """``target(ctx, payload)`` as a local worker runs it (heartbeats while it makes progress)."""
        self.ctx.start_heartbeat(self.heartbeat_s)
        return run_target(self.ctx, target, payload)

    def take(self, wait_s: float) -> list:
        """The outbox's messages; waits up to ``wait_s`` for the first."""
        out = []
        try:
            out.append(self.outbox.get(timeout=wait_s))
            while True:
                out.append(self.outbox.get_nowait())
        except queue.Empty:
            return out

    def deliver(self, msgs: list) -> None:
        for msg in msgs:
            self.ctx.deliver(msg)


@dataclass(eq=False)
class _Remote:
    index: int
    handle: Any
    group: Any  # its placement group (None: it asks for no resource, any node takes it)
    run_ref: Any
    take_ref: Any
    ready_ref: Any  # resolves once a node reserved its placement group (None once it did)
    created: float
    last_seen: float
    placed: WorkerNode | None = None
    running: bool = False  # its target sent something: from now on, silence is judged by the heartbeat timeout


class RayGroup:
    """Learner side: see the module docstring. ``options`` are the Ray actor options (resources, and the
    ``scheduling_strategy`` its placement groups follow)."""

    def __init__(self, *, options: dict, bundle: dict[str, float], heartbeat_s: float = 1.0,
                 heartbeat_timeout_s: float = 60.0):
        import ray

        self.ray = ray
        self.options = {k: v for k, v in options.items() if k != "scheduling_strategy"}
        self.strategy = options.get("scheduling_strategy", "SPREAD")
        self.bundle = bundle  # the same resources under Ray's names (empty: it asks for none)
        self.remote_cls = ray.remote(ActorHost)
        self.heartbeat_s, self.heartbeat_timeout_s = heartbeat_s, heartbeat_timeout_s
        self.live: dict[int, _Remote] = {}
        self._next = 0

    # -- seams.ActorEvents ------------------------------------------------------------------------------------
    def start(self, target: Callable[[WorkerContext, Any], Any], payload: Any) -> int:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        index, self._next = self._next, self._next + 1
        group, ready = None, None
        strategy: Any = self.strategy
        if self.bundle:  # reserved on a node before the actor starts: ``ready`` tells placed from still waiting
            group = placement_group([self.bundle], strategy=self.strategy)
            ready = group.ready()
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
        handle = self.remote_cls.options(max_concurrency=4, max_restarts=0, scheduling_strategy=strategy,
                                         **self.options).remote(index, self.heartbeat_s)
        now = time.monotonic()
        self.live[index] = _Remote(index, handle, group, handle.run.remote(target, payload),
                                   handle.take.remote(TAKE_WAIT_S), ready, now, now)
        return index

    def placement(self, index: int) -> WorkerNode | None:
        w = self.live.get(index)
        return w.placed if w is not None else None

    def send(self, index: int, msg: Any) -> bool:
        w = self.live.get(index)
        if w is None:
            return False
        w.handle.deliver.remote([msg])
        return True

    def broadcast(self, msg: Any) -> None:
        """``msg`` to every live actor (the weights transport's version notes)."""
        for w in self.live.values():
            w.handle.deliver.remote([msg])

    def kill(self, index: int) -> None:
        w = self.live.pop(index, None)
        if w is not None:
            self.ray.kill(w.handle, no_restart=True)
            if w.group is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(w.group)  # frees its reservation on its node

    def poll(self, timeout: float = 0.5) -> Iterator[Any]:
        refs = {}
        for w in self.live.values():
            refs[w.run_ref] = ("run", w)
            if w.take_ref is not None:
                refs[w.take_ref] = ("take", w)
            if w.ready_ref is not None:
                refs[w.ready_ref] = ("ready", w)
        ready = []
        if refs:
            ready, _ = self.ray.wait(list(refs), num_returns=1, timeout=timeout)
            if ready:
                ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=0)
        else:
            time.sleep(timeout)
        now = time.monotonic()
        ready.sort(key=lambda r: refs[r][0] == "run")  # a worker's last messages before its result
        for ref in ready:
            kind, w = refs[ref]
            if w.index not in self.live:
                continue
            if kind == "ready":
                w.ready_ref, w.last_seen = None, now  # reserved: from now on it is starting
            else:
                yield from (self._took(w, ref, now) if kind == "take" else self._ran(w, ref))
        yield from self._check_silent(now)

    def _took(self, w: _Remote, ref, now: float) -> Iterator[Any]:
        try:
            msgs = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as err:
            w.take_ref = None  # the run call reports how it ended
            if w.placed is None:
                yield from self._lost(w, err)
            return
        w.take_ref = w.handle.take.remote(TAKE_WAIT_S)
        for msg in msgs:
            w.last_seen = now
            if isinstance(msg, Placed):
                w.placed, w.ready_ref = msg.node, None
                yield Started(w.index, msg.node.pid)
            else:
                w.running = True
                yield msg

    def _ran(self, w: _Remote, ref) -> Iterator[Any]:
        try:
            last = self.ray.get(w.take_ref, timeout=10) if w.take_ref is not None else []
            last += self.ray.get(w.handle.take.remote(0.0), timeout=10)
            for msg in last:  # what it sent last comes before its result
                if not isinstance(msg, (Placed, Heartbeat)):
                    yield msg
            outcome = self.ray.get(ref)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError) as err:
            yield from self._lost(w, err)
            return
        self.kill(w.index)  # frees its resources on its node
        yield outcome

    def _lost(self, w: _Remote, err: BaseException) -> Iterator[Any]:
        self.kill(w.index)
        where = f" on {w.placed.describe()}" if w.placed else ""
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        yield Lost(w.index, None, f"was lost{where} (Ray: {first[:200]})")

    def _check_silent(self, now: float) -> Iterator[Any]:
        for w in list(self.live.values()):
            if w.ready_ref is not None:  # no node reserved its resources yet
                if now - w.created > self.heartbeat_timeout_s:
                    self.kill(w.index)
                    yield Unplaced(w.index, now - w.created)
            elif now - w.last_seen > (self.heartbeat_timeout_s if w.running else START_TIMEOUT_S):
                yield Unresponsive(w.index, now - w.last_seen)

    def shutdown(self, *, grace_s: float = 30.0, term_s: float = 5.0) -> None:
        """Stop message, wait up to ``grace_s`` for the run calls, then kill every actor of this group."""
        for w in self.live.values():
            w.handle.deliver.remote([Stop("shutdown")])
        runs = [w.run_ref for w in self.live.values() if w.placed is not None]
        if runs:
            self.ray.wait(runs, num_returns=len(runs), timeout=grace_s)
        for index in list(self.live):
            self.kill(index)
