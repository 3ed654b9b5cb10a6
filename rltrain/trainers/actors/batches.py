"""The learner's queue of actor rollouts and the batches it takes out of it (``trainer=subprocess_actors``).

``BatchPlan`` is the batching the trainer was configured with; ``BatchQueue`` holds up to ``batch_rollouts x
queue_out_of_sync_factor`` rollouts and assembles each batch:

- async (default): the first ``batch_rollouts`` rollouts in arrival order; one more than ``max_policy_lag``
  versions old is dropped (counted). IMPALA's V-trace (Espeholt et al. 2018) or PPO's clipped ratio against the
  behaviour log-prob (APPO) corrects the lag that remains.
- sync: each actor delivers its share of the batch made with the *current* version; anything older is dropped,
  anything beyond an actor's share waits for the next batch. ``fraction_workers`` ends the wait once that share
  of actors delivered all of theirs, ``fraction_samples`` once that share of the batch is in (whichever comes
  first). The batch is in actor order, not arrival order, so a seeded sync run learns the same batches every time.

Backpressure is the credits (``actor.py``): a rollout taken out of the queue, used or dropped, gives its actor
one credit back (``ActorPool.grant``); the credits add up to the queue's capacity, so the data in flight, hence
the policy lag, stays bounded.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass

from rltrain.run.signals import StopFlag
from rltrain.trainers.actors.actor import RolloutMsg
from rltrain.trainers.actors.pool import ActorPool
from rltrain.trainers.actors.stats import ActorStats


@dataclass(frozen=True)
class BatchPlan:
    """How the learner batches its actors' rollouts (the ``trainer.*`` keys of the same names)."""

    num_actors: int
    batch_rollouts: int
    queue_out_of_sync_factor: int
    sync: bool
    max_policy_lag: int | None
    fraction_workers: float  # sync: stop waiting once this share of actors delivered theirs (trainer.preemption)
    fraction_samples: float  # sync: stop waiting once this share of the batch is in (trainer.preemption)

    @property
    def capacity(self) -> int:
        return self.batch_rollouts * self.queue_out_of_sync_factor

    def share(self, actor_id: int) -> int:
        """Rollouts actor ``actor_id`` delivers per batch (sync: per version)."""
        n, a = self.batch_rollouts, self.num_actors
        return n // a + (actor_id < n % a)

    def credits(self, actor_id: int) -> int:
        """Rollouts the actor may have in flight: the queue's capacity split over the actors."""
        cap, a = self.capacity, self.num_actors
        return max(cap // a + (actor_id < cap % a), self.share(actor_id))

    def stale(self, lag: int) -> bool:
        return lag > 0 if self.sync else (self.max_policy_lag is not None and lag > self.max_policy_lag)


class BatchQueue:
    """The bounded queue between the pool's rollouts and the learner's batches; accounts in ``stats``."""

    def __init__(self, plan: BatchPlan, pool: ActorPool, stats: ActorStats):
        self.plan, self.pool, self.stats = plan, pool, stats
        self.queue: deque[RolloutMsg] = deque()

    def __len__(self) -> int:
        return len(self.queue)

    def next_batch(self, version: int, stop: StopFlag) -> list[RolloutMsg]:
        """``batch_rollouts`` usable rollouts (sync: fewer when a preemption threshold is met); [] if stopped.
        ``ActorPool.poll`` raises ``ActorFailure`` when an actor failed and the pool may not restart it."""
        plan, pool = self.plan, self.pool
        need = plan.batch_rollouts
        if plan.sync:
            # an actor no machine could take (Ray backend) delivers nothing
            per_actor = [0 if slot.dropped else plan.share(slot.actor_id) for slot in pool.slots]
            need = sum(per_actor)
            enough_samples = math.ceil(plan.fraction_samples * need)
            enough_workers = math.ceil(plan.fraction_workers * plan.num_actors)
            delivered = [0] * plan.num_actors
        batch: list[RolloutMsg] = []
        held: list[RolloutMsg] = []  # sync: an actor's rollouts beyond its share wait for the next batch
        t0 = time.perf_counter()
        self.stats.queue_fill(len(self.queue) / plan.capacity)
        while True:
            while self.queue and len(batch) < need:
                msg = self.queue.popleft()
                if plan.stale(version - msg.version):
                    self.stats.dropped(msg)
                    pool.grant(msg)
                    continue
                if plan.sync and delivered[msg.actor_id] >= per_actor[msg.actor_id]:
                    held.append(msg)
                    continue
                batch.append(msg)
                pool.grant(msg)
                if plan.sync:
                    delivered[msg.actor_id] += 1
            self.queue.extendleft(reversed(held))
            held.clear()
            if len(batch) >= need:
                break
            if plan.sync and batch:
                done = sum(d >= p for d, p in zip(delivered, per_actor, strict=True))
                if len(batch) >= enough_samples or done >= enough_workers:
                    self.stats.preempted()
                    break
            if stop.requested:
                return []
            msgs = pool.poll(0.2)  # credits bound what can arrive
            self.stats.received(msgs)
            self.queue.extend(msgs)
        self.stats.waited(time.perf_counter() - t0)
        if plan.sync:
            batch.sort(key=lambda m: m.actor_id)
        return batch
