"""Trainer ``subprocess_actors``: A actors collect, one learner learns (IMPALA / APPO style).

Actors (``actor.py``) step their envs with a copy of the policy and send rollouts; the learner batches them
(``batches.py``: a bounded queue with credit backpressure, async with ``max_policy_lag`` or sync with
preemption), merges each batch along the env axis into one ``[T, batch_rollouts * envs_per_actor]`` rollout
(``rollouts.py``), runs the algorithm's ``learn()`` and publishes the new weights (``hooks.py``).

This trainer decides placement only: which backend runs the actors (``trainer.backend``, ``backends.py``: local
processes with shared-memory weights, or Ray actors with weights in the object store, both behind the
Protocols of ``seams.py``), which device each side uses and which seeds each actor generation gets. It hands
each part what it needs: the pool (``pool.py``: start, restart, credit, stop) the event source and the weights
transport, the queue the pool and the batch plan, the accounting (``stats.py``) to whoever reports to it.

The budget loop, logging, eval cadence, checkpoints, summary and resume are ``TrainLoop``'s; the actors only
replace the "collect" half of each iteration. The policy version is the learner's update count, so a resumed
run continues it.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import time
from pathlib import Path

from rltrain.run.device import pick_device
from rltrain.run.seeding import SeedTree, derive
from rltrain.run.signals import StopFlag, exit_now
from rltrain.run.summary import newest_checkpoint, record_lost
from rltrain.trainers.actors.actor import ActorSpec
from rltrain.trainers.actors.backends import make_backend
from rltrain.trainers.actors.batches import BatchPlan, BatchQueue
from rltrain.trainers.actors.hooks import ActorHooks
from rltrain.trainers.actors.pool import ActorPool
from rltrain.trainers.actors.rollouts import ActorSource
from rltrain.trainers.actors.seams import WeightsHandle
from rltrain.trainers.actors.stats import ActorsProgress, ActorStats
from rltrain.trainers.base import Capabilities, Trainer, UpdateSize, agent_turns
from rltrain.trainers.hooks import Placement, TrainerParts
from rltrain.trainers.loop import TrainLoop
from rltrain.trainers.settings import RunSettings, SubprocessActorsSettings

LOST_GRACE_S = 30.0  # after the machines are lost: how long the run may take to stop before it exits at once
_ACTOR_BRANCH = 7  # actor seeds hang below spawn key (7, actor, generation): disjoint from the learner's


class SubprocessActorsTrainer(Trainer):
    """See the module docstring. Its ``trainer.*`` keys: ``SubprocessActorsSettings`` (trainers/settings.py)."""

    name = "subprocess_actors"
    settings_class = SubprocessActorsSettings
    capabilities = Capabilities(batched_rollouts=True)

    def __init__(self, *, settings: RunSettings, run_dir: Path,
                 trainer: SubprocessActorsSettings = SubprocessActorsSettings()):
        super().__init__(settings=settings, run_dir=run_dir)
        t = trainer
        self.num_actors = t.num_actors
        self.envs_per_actor = t.envs_per_actor or settings.env.num_envs
        self.rollout_len = t.rollout_len
        self.batch_rollouts = t.batch_rollouts or t.num_actors
        self.queue_out_of_sync_factor, self.start_method, self.sync = t.queue_out_of_sync_factor, t.start_method, t.sync
        self.max_policy_lag, self.compress, self.preemption = t.max_policy_lag, t.compress, t.preemption
        self.actor_device, self.learner_device = t.actor_device, t.learner_device or settings.device
        self.on_actor_failure, self.max_restarts = t.on_actor_failure, t.max_restarts
        self.actor_timeout_s = t.actor_timeout_s
        self.backend = make_backend(t.backend, ray=dataclasses.asdict(t.ray), start_method=t.start_method,
                                    num_actors=t.num_actors, env=settings.env)

    def actor_seeds(self, actor_id: int, generation: int) -> SeedTree:
        return derive(self.settings.seed, self.envs_per_actor, path=(_ACTOR_BRANCH, actor_id, generation))

    def learner_envs(self) -> int:  # the columns of the rollouts one update merges
        return self.batch_rollouts * self.envs_per_actor

    def update_size(self) -> UpdateSize:  # the learner merges batch_rollouts rollouts of envs_per_actor envs
        sizes, envs, batches = self.algo_sizes(), self.envs_per_actor, self.batch_rollouts
        steps = self.rollout_len or sizes.rollout_len
        turns, said = agent_turns(self.settings.env_spec)
        text = f"trainer.batch_rollouts ({batches}) x envs per actor ({envs}) x rollout_len ({steps}){said}"
        return UpdateSize(batches * envs * steps * turns, text, self.num_actors * envs, steps, sizes.num_minibatches,
                          turns=turns > 1)

    def seed_trees(self) -> dict[str, SeedTree]:
        return {}  # recorded in train(): the actors' generations are known only after the resume

    def planned_seed_trees(self) -> dict[str, SeedTree]:
        # a fresh run's: the learner's torch and eval seeds (its envs are the actors'), each actor's first start
        return {"learner": derive(self.settings.seed, 0),
                **{f"actor_{k}_gen_0": self.actor_seeds(k, 0) for k in range(self.num_actors)}}

    def train(self, stop: StopFlag) -> dict:
        s = self.settings
        device = pick_device(self.learner_device)
        pick_device(self.actor_device)  # fail now, with the key's message, not inside an actor
        trees: dict[str, SeedTree] = {"learner": derive(s.seed, 1)}
        # Ray: refuses (one line) before the loop writes anything into the run dir; a stop is honoured meanwhile
        lost: list[str] = []
        ended = threading.Event()
        with stop.raising("the Ray connection"):
            events = self.backend.connect(actor_timeout_s=self.actor_timeout_s,
                                          on_lost=functools.partial(self._lost, lost, ended, stop),
                                          run_dir=self.run_dir)

        def record(spec: ActorSpec) -> None:
            trees[f"actor_{spec.actor_id}_gen_{spec.generation}"] = spec.seeds
            self.record_seeds(trees)

        plan = self._batch_plan()
        pool = ActorPool(events, self.num_actors, on_failure=self.on_actor_failure, max_restarts=self.max_restarts,
                         actor_timeout_s=self.actor_timeout_s, on_restart=record,
                         traceback_file=self.run_dir / "error.txt")
        stats = ActorStats()
        queue = BatchQueue(plan, pool, stats)
        parts = TrainerParts(hooks=ActorHooks(pool, stats), source_factory=lambda algo: ActorSource(queue, stats, stop),
                             progress_factory=functools.partial(ActorsProgress, rows=lambda: stats.progress_rows(
                                 pool.slots, queued=len(queue), capacity=plan.capacity)),
                             num_envs=self.learner_envs(), ends_at=self.ends_at(), updates=self.budget_updates())
        try:
            loop = TrainLoop(s, Placement(self.run_dir, trees["learner"], device, title="learner"), stop, parts)
            loop.resume()  # before the actors start: their generations (and seeds) come from the checkpoint
            # every generation the run has started, earlier sessions' too (each a new process with its own seeds,
            # derived from (actor, generation) alone): seeds.json is rewritten whole, and must still list them
            for k, last in enumerate(pool.generations):
                for gen in range(last + 1):
                    trees[f"actor_{k}_gen_{gen}"] = self.actor_seeds(k, gen)
            self.record_seeds(trees)
            version, env_steps = loop.counters["updates"], loop.counters["env_steps"]
            stats.version = version
            weights = self.backend.weights(loop.algo.policy_state(), version=version, env_steps=env_steps)
            rollout_len = self.update_size().rollout_len
            pool.start(functools.partial(self._make_spec, plan=plan, rollout_len=rollout_len), weights)
            summary = loop.run()
        finally:
            pool.stop()
            self.backend.close()  # Ray: disconnect; a private instance is stopped
            ended.set()
        if pool.failure:  # 2 where the user's env failed the actors, as it ends a single-process run
            summary["exit_code"] = pool.exit_code
        if lost:  # the machines went away: a failed run, whatever checkpoint the stop wrote
            summary.update(status="failed", error=lost[0], last_checkpoint=summary.get("checkpoint"), exit_code=1)
        return summary

    def _lost(self, lost: list[str], ended: threading.Event, stop: StopFlag, why: str) -> None:
        """The backend lost the machines (a Ray head), from its watch thread: ``failed`` in summary.json at once
        (Ray may end this process any moment), the loop stopped at its next safe point (it checkpoints; ``train``
        then returns a failed summary, whose one line the CLI prints). Calls into the dead cluster may never
        return: if the run has not ended ``LOST_GRACE_S`` later, the summary is made failed again (over the
        loop's own) and this thread says the one line and exits; if it ended but the process lingers in Ray's
        own shutdown, it exits too."""
        lost.append(why)
        record_lost(self.run_dir, why)
        stop.request(why)
        if ended.wait(LOST_GRACE_S):
            time.sleep(LOST_GRACE_S)  # the CLI prints the line and exits; Ray's exit hook may wait on the head
            exit_now(1)
        record_lost(self.run_dir, why, only_running=False)
        ckpt = newest_checkpoint(self.run_dir)
        print(f"rltrain: error: {why}; the run could not stop within {LOST_GRACE_S:g} s and exits; its last "
              f"checkpoint: {ckpt or 'none'} (summary.json says failed)", file=sys.stderr, flush=True)
        exit_now(1)

    def _batch_plan(self) -> BatchPlan:
        return BatchPlan(num_actors=self.num_actors, batch_rollouts=self.batch_rollouts,
                         queue_out_of_sync_factor=self.queue_out_of_sync_factor, sync=self.sync,
                         max_policy_lag=self.max_policy_lag, fraction_workers=self.preemption.fraction_workers,
                         fraction_samples=self.preemption.fraction_samples)

    def _make_spec(self, weights: WeightsHandle, actor_id: int, generation: int, *, plan: BatchPlan,
                   rollout_len: int) -> ActorSpec:
        return ActorSpec(actor_id=actor_id, generation=generation, seeds=self.actor_seeds(actor_id, generation),
                         algo=self.settings.algo, env=self.settings.env, env_spec=self.settings.env_spec,
                         num_envs=self.envs_per_actor,
                         rollout_len=rollout_len, weights=weights, device=self.actor_device, sync=self.sync,
                         share=plan.share(actor_id), compress=self.compress,
                         torch_threads=self.settings.torch_threads, credits=plan.credits(actor_id))
