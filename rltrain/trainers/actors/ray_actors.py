"""The Ray event source of ``trainer=subprocess_actors`` (``trainer.backend=ray``): actors as Ray actors.

``RayGroup`` has the interface of ``supervise.WorkerGroup`` that ``pool.ActorPool`` uses (``start``, ``poll``,
``send``, ``kill``, ``shutdown``) and reports the same events, so the pool's restart / abort policy, the
learner, the loop and the algorithms run unchanged:

- each actor is one Ray actor (``ActorHost``, a threaded actor) on any node with ``trainer.ray.actor_resources``
  free; its ``run`` call runs the very ``actor_main`` a local actor process runs, with a ``RayContext`` in
  place of the pipe: what the actor ``send``s (``Started``, rollouts, heartbeats) waits in its outbox, and the
  learner long-polls it with one ``take`` call in flight per actor. A rollout comes back as that call's
  return value, i.e. through Ray's object store (numpy arrays, read in place on the learner's node);
- what the learner sends (credits, ``WeightsNote``s, ``Stop``) goes by ``deliver`` calls into its inbox;
- ``run`` returning gives ``Done`` or ``Failed`` (the actor's traceback); a Ray actor error (the worker
  process died, its node was lost) gives ``Exited`` naming the cause; an actor that sends nothing for
  ``heartbeat_timeout_s`` is ``Unresponsive``; one that Ray could not place on any node within that time
  (no node has its resources free) is ``Unplaced``, and the pool goes on without it.

The credits bound the rollouts in flight exactly as locally: an actor only collects while it holds one.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rltrain.errors import ConfigError
from rltrain.trainers.actors.ray_weights import _MAILBOX, Closing, WeightsNote
from rltrain.trainers.messages import Done, Exited, Failed, Heartbeat, Started, Stop, Unplaced, Unresponsive
from rltrain.trainers.supervise import WorkerContext

TAKE_WAIT_S = 0.5  # a take call returns after this long without messages (the learner re-issues it)
START_TIMEOUT_S = 300.0  # placed, but torch, the algorithm and the envs not loaded yet (as WorkerGroup's start)


@dataclass(frozen=True)
class Placed:
    """actor -> learner, first message: where Ray placed it."""

    index: int
    pid: int
    node_ip: str
    hostname: str
    node_id: str


@dataclass(frozen=True)
class Lost(Exited):
    """The Ray actor is gone (its worker process died or its node was lost); ``reason`` is Ray's word for it."""

    reason: str = ""

    @property
    def description(self) -> str:
        return self.reason


class _Outbox:
    """The 'pipe' of a ``RayContext``: messages wait here until the learner's next ``take``."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()

    def send(self, msg: Any) -> None:
        self.queue.put(msg)


class RayContext(WorkerContext):
    """``WorkerContext`` over an outbox and an inbox instead of a pipe (no listener thread: ``deliver`` fills
    the inbox); the heartbeat thread is the supervision layer's own."""

    def __init__(self, index: int):
        self.outbox = _Outbox()
        super().__init__(index, self.outbox)  # type: ignore[arg-type]


class ActorHost:
    """The Ray actor class (made remote by ``RayGroup``); lives in a Ray worker process on some node."""

    def __init__(self, index: int, heartbeat_s: float):
        import ray

        self.ctx = RayContext(index)
        self.heartbeat_s = heartbeat_s
        # placed: said at once (torch and the envs load later, with the target; the heartbeat covers that)
        node = ray.get_runtime_context().get_node_id()
        self.ctx.send(Placed(index, os.getpid(), ray.util.get_node_ip_address(), socket.gethostname(), node))

    def run(self, target, payload, note: WeightsNote) -> tuple:
        """``target(ctx, payload)`` as ``supervise._bootstrap`` runs it; ('done', result) or ('failed', ...)."""
        ctx = self.ctx
        _MAILBOX.offer(note)
        threading.Thread(target=ctx._heartbeat, args=(self.heartbeat_s,), name="rltrain-heartbeat",
                         daemon=True).start()
        try:
            return ("done", target(ctx, payload))
        except BaseException as err:  # noqa: BLE001 - reported to the learner as Failed
            one_line = isinstance(err, ConfigError)
            return ("failed", str(err) if one_line else f"{type(err).__name__}: {err}", traceback.format_exc(),
                    one_line)
        finally:
            ctx._stop.set()  # ends the heartbeat thread

    def take(self, wait_s: float) -> list:
        """The outbox's messages; waits up to ``wait_s`` for the first."""
        out = []
        try:
            out.append(self.ctx.outbox.queue.get(timeout=wait_s))
            while True:
                out.append(self.ctx.outbox.queue.get_nowait())
        except queue.Empty:
            return out

    def deliver(self, msgs: list) -> None:
        for msg in msgs:
            if isinstance(msg, WeightsNote):
                _MAILBOX.offer(msg)
            elif isinstance(msg, Closing):
                _MAILBOX.closing = True
            elif isinstance(msg, Stop):
                self.ctx.request_stop(msg.reason)
            else:
                self.ctx._inbox.put(msg)


@dataclass(eq=False)
class _Remote:
    index: int
    handle: Any
    run_ref: Any
    take_ref: Any
    created: float
    last_seen: float
    placed: Placed | None = None
    running: bool = False  # its target sent something: from now on, silence is judged by the heartbeat timeout
    extra: dict = field(default_factory=dict)


class RayGroup:
    """Learner side: see the module docstring. ``options`` are the Ray actor options (resources, strategy)."""

    def __init__(self, *, options: dict, heartbeat_s: float = 1.0, heartbeat_timeout_s: float = 60.0,
                 weights=None):
        import ray

        self.ray = ray
        self.remote_cls = ray.remote(ActorHost).options(max_concurrency=4, max_restarts=0, **options)
        self.heartbeat_s, self.heartbeat_timeout_s = heartbeat_s, heartbeat_timeout_s
        self.weights = weights  # ray_weights.RayWeights: the current note goes out with every start
        if weights is not None:
            weights.broadcast = self.broadcast
        self.live: dict[int, _Remote] = {}
        self.placed: dict[int, Placed] = {}
        self._next = 0

    # -- WorkerGroup's interface --------------------------------------------------------------------------------
    def start(self, target, payload) -> int:
        index, self._next = self._next, self._next + 1
        handle = self.remote_cls.remote(index, self.heartbeat_s)
        note = self.weights.note if self.weights is not None else None
        now = time.monotonic()
        self.live[index] = _Remote(index, handle, handle.run.remote(target, payload, note),
                                   handle.take.remote(TAKE_WAIT_S), now, now)
        return index

    def node_of(self, index: int) -> str:
        """``ip`` (``hostname``, node id prefix) where the actor runs; '' before it was placed."""
        p = self.placed.get(index)
        return f"{p.node_ip} ({p.hostname}, node {p.node_id[:8]})" if p else ""

    def placement(self, index: int) -> dict:
        p = self.placed[index]
        return {"node_ip": p.node_ip, "hostname": p.hostname, "node_id": p.node_id, "pid": p.pid}

    def send(self, index: int, msg: Any) -> bool:
        w = self.live.get(index)
        if w is None:
            return False
        w.handle.deliver.remote([msg])
        return True

    def broadcast(self, msg: Any) -> None:
        for w in self.live.values():
            w.handle.deliver.remote([msg])

    def kill(self, index: int) -> None:
        w = self.live.pop(index, None)
        if w is not None:
            self.ray.kill(w.handle, no_restart=True)

    def poll(self, timeout: float = 0.5) -> Iterator[Any]:
        refs = {}
        for w in self.live.values():
            refs[w.run_ref] = ("run", w)
            if w.take_ref is not None:
                refs[w.take_ref] = ("take", w)
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
                w.placed = self.placed[w.index] = msg
                yield Started(w.index, msg.pid)
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
        if outcome[0] == "done":
            yield Done(w.index, outcome[1])
        else:
            yield Failed(w.index, *outcome[1:])

    def _lost(self, w: _Remote, err: BaseException) -> Iterator[Any]:
        self.kill(w.index)
        where = f" on {self.node_of(w.index)}" if w.placed else ""
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        yield Lost(w.index, None, f"was lost{where} (Ray: {first[:200]})")

    def _check_silent(self, now: float) -> Iterator[Any]:
        for w in list(self.live.values()):
            if w.placed is None and now - w.created > self.heartbeat_timeout_s:
                if self._has_worker(w):  # placed, its process still starting (a loaded node): keep waiting
                    w.created = now
                    continue
                self.kill(w.index)
                yield Unplaced(w.index, now - w.created)
            elif w.placed is not None and now - w.last_seen > (self.heartbeat_timeout_s if w.running
                                                                 else START_TIMEOUT_S):
                yield Unresponsive(w.index, now - w.last_seen)

    def _has_worker(self, w: _Remote) -> bool:
        """Whether Ray leased a worker process to the actor (the GCS actor table has its pid): then it was
        placed and is starting; an actor no node can take has none."""
        try:
            from ray._private import state

            return bool(state.actors(w.handle._actor_id.hex()).get("Pid"))
        except Exception:  # noqa: BLE001 - an internal table that moved in another Ray version: not placed
            return False

    def shutdown(self, *, grace_s: float = 30.0, term_s: float = 5.0) -> None:
        """Stop message, wait up to ``grace_s`` for the run calls, then kill every actor of this group."""
        for w in self.live.values():
            w.handle.deliver.remote([Stop("shutdown")])
        runs = [w.run_ref for w in self.live.values() if w.placed is not None]
        if runs:
            self.ray.wait(runs, num_returns=len(runs), timeout=grace_s)
        for index in list(self.live):
            self.kill(index)
