"""The actor process of ``trainer=subprocess_actors``: collect with a copy of the policy, send rollouts.

An actor builds its envs and a policy-only copy of the algorithm, attaches the learner's weights (the
backend's transport, ``seams.WeightsReader``) and loops: reload weights when the version moved, collect
``rollout_len`` steps with the shared ``RolloutCollector`` (so a transition is exactly what the sequential
trainer records, tagged with the policy version that chose it), send it to the learner through its
``WorkerContext`` (locally its own pipe, ``trainers/supervise.py``: heartbeats, forwarded tracebacks, stop
messages; under Ray the actor host's outbox).

Backpressure is credit-based: an actor may have ``credits`` rollouts in flight (in its pipe or in the
learner's queue) and gets one back when the learner takes one out of the queue. The credits add up to
the queue's capacity (``batch_rollouts x queue_out_of_sync_factor``), so the data in flight, and with it
the policy lag, stays bounded; socket buffers would otherwise hold dozens of stale rollouts.

Messages are typed dataclasses: ``RolloutMsg`` (actor -> learner) and ``Credit`` (learner -> actor).
Everything an actor needs arrives in one picklable ``ActorSpec`` of plain containers (no DictConfig),
so fork, forkserver and spawn all work.
"""

from __future__ import annotations

import pickle
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rltrain.data.agents import AgentsSpec
from rltrain.data.structs import EnvSpec, Rollout
from rltrain.envs.deadline import EnvCallAbandoned
from rltrain.envs.make import EnvFactory
from rltrain.run.process import init_process
from rltrain.run.seeding import SeedTree, seed_process
from rltrain.trainers.actors.seams import WeightsHandle
from rltrain.trainers.supervise import WorkerContext


# -- messages -----------------------------------------------------------------------------------------------
@dataclass
class ActorSpec:
    """Start-up data for one actor (generation = how many times this actor slot was (re)started)."""

    actor_id: int
    generation: int
    seeds: SeedTree
    algo: Callable[..., Any]  # the run's algorithm factory (settings.algo): a policy-only copy acts here
    env: EnvFactory  # the run's env factory (settings.env)
    env_spec: EnvSpec | None  # the env as the run probed it (settings.env_spec); None: probed here
    num_envs: int
    rollout_len: int
    weights: WeightsHandle  # the backend's weights transport: ``attach()`` gives this actor's reader
    device: str = "cpu"
    sync: bool = False
    share: int = 1  # sync mode: rollouts to deliver per policy version
    compress: str = "none"
    torch_threads: int = 1
    credits: int = 1  # rollouts it may have in flight (in its pipe or the learner's queue)


@dataclass
class RolloutMsg:
    """One rollout; ``payload`` is the Rollout itself or its compressed pickle (``codec`` lz4/zlib)."""

    actor_id: int
    generation: int
    version: int  # policy version that produced every step of it
    num_steps: int
    collect_s: float  # seconds the actor spent collecting it (actor SPS = num_steps / collect_s)
    episodes: int  # the actor's finished episodes so far
    codec: str
    payload: object = field(repr=False)

    def rollout(self) -> Rollout:
        return decode(self.payload, self.codec)


@dataclass
class Credit:
    """The learner took ``n`` of this actor's rollouts out of its queue: it may send ``n`` more."""

    n: int = 1


# -- payload compression ------------------------------------------------------------------------------------
def encode(rollout: Rollout, codec: str) -> object:
    """Compress only what crosses the pipe; ``none`` lets the pipe pickle the arrays directly."""
    if codec == "none":
        return rollout
    raw = pickle.dumps(rollout, protocol=pickle.HIGHEST_PROTOCOL)
    if codec == "zlib":
        return zlib.compress(raw, 1)
    if codec == "lz4":
        import lz4.frame

        return lz4.frame.compress(raw)
    raise ValueError(f"unknown codec {codec!r}")


def decode(payload: object, codec: str) -> Rollout:
    if codec == "none":
        rollout: Rollout = payload  # type: ignore[assignment]
        groups = getattr(rollout, "groups", None)  # a multi-agent env's MultiRollout: a Rollout per policy group
        first = next(iter(groups.values())) if groups else rollout
        if not first.rewards.flags.writeable:  # Ray hands out read-only views of its object store: a rollout
            #  that the learner owns, as a pipe's unpickled one is (torch.from_numpy warns on, and must never
            #  write through, a read-only array)
            import copy

            rollout = copy.deepcopy(rollout)
        return rollout
    if codec == "zlib":
        return pickle.loads(zlib.decompress(payload))  # type: ignore[arg-type]
    import lz4.frame

    return pickle.loads(lz4.frame.decompress(payload))  # type: ignore[arg-type]


# -- the process ---------------------------------------------------------------------------------------------
def actor_main(ctx: WorkerContext, spec: ActorSpec) -> dict:
    """The target every event source runs (``seams.ActorEvents.start``): heartbeats and tracebacks are the
    event source's business, the loop is this."""
    init_process(torch_threads=spec.torch_threads)
    return _ActorLoop(ctx, spec).run()


class _ActorLoop:
    def __init__(self, ctx: WorkerContext, spec: ActorSpec):
        from rltrain.trainers.collector import RolloutCollector
        from rltrain.trainers.multiagent import MultiAgentCollector

        self.ctx, self.spec = ctx, spec
        seed_process(spec.seeds.torch_seed)
        espec = spec.env_spec or spec.env.spec()
        device = torch.device(spec.device)
        self.algo = spec.algo(espec, num_envs=spec.num_envs, device=device)
        self.weights = spec.weights.attach()
        self.version = -1
        self._reload()
        venv = spec.env.vector(spec.seeds.env_seeds, num_envs=spec.num_envs)
        if isinstance(espec, AgentsSpec):  # an actor steps whole multi-agent envs: every agent's slots
            self.collector = MultiAgentCollector(venv, self.algo.policy, espec, device=device,
                                                 sampling=self.algo.settings.self_play_sampling)
        else:
            self.collector = RolloutCollector(venv, self.algo.policy, espec, device=device)
        ctx.stop_listeners.append(venv.watch.abandon)  # the learner's stop also ends an env call that is stuck
        self.credits = spec.credits
        self.env_ids = spec.actor_id * spec.num_envs + np.arange(spec.num_envs, dtype=np.int64)

    def _reload(self) -> bool:
        update = self.weights.read_if_newer(self.version)
        if update is None:
            return False
        self.version, state = update
        self.algo.policy.load_state_dict(state)
        return True

    def _should_stop(self, wait_s: float = 0.0) -> bool:
        """Takes the learner's credits; true once it asked us to stop (message or closing flag)."""
        msg = self.ctx.recv(wait_s)
        while msg is not None:
            if isinstance(msg, Credit):
                self.credits += msg.n
            else:  # the weights transport's, where it rides the event source (Ray's version notes)
                self.weights.receive(msg)
            msg = self.ctx.recv()
        return self.ctx.stop_requested or self.weights.closing

    def run(self) -> dict:
        spec = self.spec
        produced = 0  # rollouts sent with the current version (sync mode delivers `share` per version)
        sent = 0
        try:
            while not self._should_stop():
                if self._reload():
                    produced = 0
                if spec.sync and produced >= spec.share:
                    time.sleep(0.001)  # wait for the learner's next version
                    continue
                if self.credits <= 0:  # the learner's queue holds enough of ours: backpressure
                    self._should_stop(wait_s=0.05)
                    continue
                random = self.algo.wants_random_actions(self.weights.env_steps)
                t0 = time.perf_counter()
                try:
                    rollout = self.collector.collect(spec.rollout_len, policy_version=self.version,
                                                     random_actions=random)
                except EnvCallAbandoned:
                    break  # asked to stop while an env call was stuck: the rollout is given up
                # stable stream ids per actor slot: the learner's replay links successors across batches by them
                rollout.env_ids = self.env_ids
                collect_s = time.perf_counter() - t0
                self.ctx.send(RolloutMsg(spec.actor_id, spec.generation, self.version, rollout.num_steps, collect_s,
                                         self.collector.episodes, spec.compress, encode(rollout, spec.compress)))
                produced += 1
                sent += 1
                self.credits -= 1
        finally:
            self.collector.venv.close()
            self.weights.close()
        return {"rollouts": sent, "episodes": self.collector.episodes}
