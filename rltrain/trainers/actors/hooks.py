"""The ``subprocess_actors`` learner's ``LoopHooks``: publish the weights after each update, the ``actors/*``
columns in the log, the actor generations and drop counts in the checkpoint, the actors in the summary."""

from __future__ import annotations

from collections.abc import Mapping

from rltrain.algos.base import Algorithm
from rltrain.data.structs import Metrics, Rollout
from rltrain.trainers.actors.pool import ActorPool
from rltrain.trainers.actors.stats import ActorStats
from rltrain.trainers.hooks import LoopHooks


class ActorHooks(LoopHooks):
    def __init__(self, pool: ActorPool, stats: ActorStats):
        self.pool, self.stats = pool, stats

    def on_resume(self, state: dict) -> None:
        actors = state.get("actors", {})
        self.pool.resume(list(actors.get("generations", [])))
        self.stats.load_state_dict(actors.get("stats", {}))

    def extend_checkpoint(self, state: dict, *, algo: Algorithm) -> None:
        state["actors"] = {"generations": self.pool.generations, "stats": self.stats.state_dict()}

    def after_learn(self, rollout: Rollout, learn_s: float, *, algo: Algorithm, counters: Mapping) -> None:
        self.pool.publish(algo.policy_state(), version=counters["updates"], env_steps=counters["env_steps"])
        self.stats.learned(version=counters["updates"], steps=rollout.num_steps, learn_s=learn_s)

    def log_row(self) -> Metrics:
        return self.stats.row(restarts=self.pool.total_restarts)

    def extend_summary(self, summary: dict, status: str, *, algo: Algorithm) -> None:
        summary.update({"num_actors": len(self.pool.slots), "policy_version": summary["updates"],
                        "restarts": self.pool.total_restarts,
                        "dropped_rollouts": int(self.stats.counts["dropped_rollouts"])})
        if self.pool.placements:  # where the event source names machines (Ray): the node of every generation
            summary["actor_nodes"] = dict(self.pool.placements)
        if self.pool.failure:  # the actors failed (abort, or out of restarts): the run failed, whatever stopped it
            summary.update(status="failed", error=self.pool.failure)
            summary.pop("resume_command", None)
            summary["last_checkpoint"] = summary.get("checkpoint")
