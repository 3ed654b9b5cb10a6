"""What every off-policy learner does alike, written once: replay, warm-up, updates owed, target networks.

DQN and SAC (and any later replay learner: TD3, DDPG, QR-DQN, C51) subclass ``OffPolicy`` and supply their
networks, their optimisers and ONE gradient step (``update(batch) -> stats``); this module owns the rest:

- **Replay**: a ``ReplayBuffer`` (data/replay.py) sized ``buffer_size``, each observation stored once in its dtype;
  rollouts are written lazily (``UnwrittenSteps``: the steps between two updates in one write, into the same
  slots as one write per step), and go into the checkpoint with ``checkpoint_buffer``.
- **Warm-up**: uniform-random actions (``Algorithm.wants_random_actions``) and no update for the first
  ``learning_starts`` env steps (SB3's ``learning_starts``; CleanRL's).
- **Updates owed** (``UpdateSchedule``): ``gradient_steps`` gradient steps per ``train_frequency`` env steps
  taken after the warm-up, where an env step is one transition of one env of one worker: a rollout of T steps of
  N envs on each of W distributed workers is T*N*W env steps, so a setting means the same whatever
  ``env.num_envs``, the trainer or the world size (with ``learning_starts`` 1000 and ``train_frequency`` 4 the
  rounds fall after env steps 1004, 1008, ..., as SB3's). Counted in integers, so no update is lost to rounding
  over a long run. Steps taken while the buffer cannot fill a batch owe nothing.
- **Collecting in one go**: most env steps owe no update, so ``rollouts_to_collect`` lets the loop collect the
  rollouts up to the next one that does (the end of the warm-up, a round of updates, a target sync, or the
  loop's own next log / evaluation / checkpoint) in one collector call, then call learn() on each in turn: the
  same learn() calls on the same rollouts with the same weights acting, for the per-step costs of the collector
  and the loop paid once. Not while ``explore`` still changes from one learn() to the next (DQN's epsilon
  decay) and acting uses it, where acting must see every step of it.
- **Target networks** (``TargetNetwork``): a Polyak average (``tau`` < 1) or a copy (``tau`` = 1) of an online
  network, either on a schedule in env steps (``sync_targets_every``: DQN's ``target_network_frequency``) or
  after the subclass's own gradient steps (``TargetNetwork.update``: SAC's critic every step, TD3's every
  ``policy_delay`` steps).
- **Hindsight relabelling** (``HindsightSettings``: ``algo.her``): on a goal-conditioned task the batches come
  from ``HindsightSampler`` (data/hindsight.py), the "future" strategy of Andrychowicz et al. 2017, whatever
  the learner.

A subclass's ``update`` receives a sampled ``Batch`` and returns its statistics as one detached 1-D tensor in
the order of ``stat_names`` (the metrics' names); the base averages them over the call's gradient steps and the
workers. A delayed actor (TD3's ``policy_delay``, SAC's ``policy_frequency``: ``actor_delay``) steps on every
``actor_delay``-th gradient step only (``actor_steps_at``), and its ``delayed_stats`` (NaN in the other steps) are
averaged over its own steps: a call without one leaves them out, and the row keeps their last value.
``gradient_steps_taken`` counts every gradient step of the run, the current one included (policy delays read it).
Every count is checkpointed, so a resumed run owes exactly what the uninterrupted one did.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.algos.base import Algorithm, AlgoSettings, Sync, positive, within
from rltrain.data.hindsight import HindsightSampler, goal_keys_missing
from rltrain.data.replay import Batch, ReplayBuffer, UnwrittenSteps
from rltrain.data.structs import EnvSpec, Metrics, Rollout
from rltrain.errors import ConfigError, only_with


class ReplaySettings(Protocol):
    """The fields of an off-policy algorithm's settings dataclass that this module reads (DQNSettings and
    SACSettings have them; so must the next one's)."""

    rollout_len: int  # steps per env between two learn() calls
    buffer_size: int  # replay capacity in observations
    batch_size: int  # transitions per gradient step
    learning_starts: int  # env steps of uniform-random warm-up before the first update
    train_frequency: int  # env steps between two rounds of updates
    gradient_steps: int  # gradient steps per round
    tau: float  # the target networks' update rate: 1 a copy, less a Polyak average (TargetNetwork)
    checkpoint_buffer: bool  # put the replay buffer into state_dict


@dataclass
class UpdateSchedule:
    """``gradient_steps`` gradient steps owed per ``train_frequency`` env steps. ``owed_steps`` are the env steps
    counted toward the next round (always < ``train_frequency`` between calls)."""

    train_frequency: int
    gradient_steps: int
    owed_steps: int = 0

    def rounds_due(self, steps: int) -> int:
        """How many rounds ``owe(steps)`` would make due, without counting the steps."""
        return (self.owed_steps + steps) // self.train_frequency

    def owe(self, steps: int) -> int:
        """Count ``steps`` more env steps; returns the gradient steps due now."""
        rounds = self.rounds_due(steps)
        self.owed_steps += steps - rounds * self.train_frequency
        return rounds * self.gradient_steps

    def first_round(self, *, per_call: int, learning_starts: int, batch_at: int) -> tuple[int, int, int]:
        """Where a run's rounds start when each learn() brings ``per_call`` env steps and the replay first holds a
        batch at ``batch_at`` env steps (``OffPolicy._learn``: the warm-up's steps owe nothing, nor do those of a
        learn() that leaves less than a batch): (the env step of the first learn() that holds a batch, the one
        its owed steps count from, the env step of the first learn() that runs a round)."""
        ready = -(-max(learning_starts, batch_at) // per_call) * per_call
        owed_from = max(ready - per_call, learning_starts)
        return ready, owed_from, max(ready, -(-(owed_from + self.train_frequency) // per_call) * per_call)

    def last_round(self, owed_from: int, *, per_call: int, end: int) -> int:
        """The env step of the last learn() up to ``end`` (a whole number of learn() calls) that runs a round,
        steps owed from ``owed_from`` (``first_round``; ``end`` at or past the first round)."""
        owed = (end - owed_from) // self.train_frequency * self.train_frequency
        return -(-(owed_from + owed) // per_call) * per_call


def first_trained_sync(every: int, *, per_call: int, ready: int, first_round: int) -> int:
    """The env step of the first learn() whose scheduled target update (``sync_targets_every(every)``) follows a
    gradient step: updates run from the first learn() that holds a batch (``ready``), after its gradient steps,
    in each learn() ``every`` env steps or more past the last one (``UpdateSchedule.first_round``'s figures)."""
    step = -(-every // per_call) * per_call
    first = max(step, ready)
    return first + -(-max(first_round - first, 0) // step) * step


class TargetNetwork:
    """A target network (Mnih et al. 2015): ``update()`` moves ``target``'s parameters toward ``online``'s,
    ``target <- target + tau * (online - target)`` (Polyak averaging, Lillicrap et al. 2016) or a copy at
    ``tau`` = 1. Parameters only: buffers (normaliser statistics, DQN's epsilon) are not the target's to follow.
    One foreach call per update, whatever the number of layers."""

    def __init__(self, online: nn.Module, target: nn.Module, *, tau: float):
        self.online = list(online.parameters())
        self.target = list(target.parameters())
        if [p.shape for p in self.online] != [p.shape for p in self.target]:
            raise ValueError("a target network needs the online network's parameter shapes, in its order")
        self.tau = float(tau)

    @torch.no_grad()
    def update(self) -> None:
        if self.tau == 1.0:
            torch._foreach_copy_(self.target, self.online)
        else:
            torch._foreach_lerp_(self.target, self.online, self.tau)


@dataclass(frozen=True, kw_only=True)
class HindsightSettings(AlgoSettings):
    """Hindsight experience replay (data/hindsight.py) for any off-policy learner on a goal-conditioned task, and
    the checks of the ``ReplaySettings`` fields every replay learner has: its settings dataclass subclasses this
    one (SAC, TD3, DDPG, DQN) and calls ``super().__post_init__()`` first."""

    her: bool = False  # relabel sampled transitions with goals reached later in their episode ("future"
    #                    strategy; needs a Dict with achieved_goal / desired_goal and the env's compute_reward).
    #                    Source: Andrychowicz et al. 2017 (off by default, as SB3 without HerReplayBuffer)
    her_k: int = 4  # relabelled goals per real one: the first k / (k + 1) of each batch are relabelled.
    #                 Source: SB3 n_sampled_goal, Andrychowicz et al. 2017

    def __post_init__(self) -> None:
        super().__post_init__()  # gamma
        s: ReplaySettings = self  # type: ignore[assignment]  # a subclass declares the replay's fields
        for key in ("rollout_len", "buffer_size", "batch_size", "train_frequency", "gradient_steps"):
            positive(f"algo.{key}", getattr(s, key))
        positive("algo.learning_starts", s.learning_starts, allow_zero=True)
        # 0 would leave the targets at their initial weights; past 1 the average overshoots the online network
        within("algo.tau", s.tau, 0, 1, open_low=True)
        if s.batch_size > s.buffer_size:  # OffPolicy._learn samples only once the replay holds a batch
            raise ConfigError(f"algo.batch_size={s.batch_size} > algo.buffer_size={s.buffer_size}: the replay never "
                              "holds one batch, so no gradient step would ever be taken; lower algo.batch_size (e.g. "
                              f"{max(s.buffer_size // 2, 1)}) or raise algo.buffer_size (e.g. {2 * s.batch_size})")

    def unread_keys(self, *, action_kind: str | None = None) -> dict[str, str]:
        unread = super().unread_keys(action_kind=action_kind)
        if not self.her:  # hindsight_sampler reads her_k only to build the sampler
            unread["her_k"] = only_with("algo.her=true", self.her)
        return unread


def hindsight_sampler(spec: EnvSpec, buffer: ReplayBuffer, settings: object, name: str) -> HindsightSampler | None:
    """The relabelling sampler ``algo.her`` asks for, or None; one line when the env cannot take it."""
    if not getattr(settings, "her", False):
        return None
    k = settings.her_k  # type: ignore[attr-defined]
    if not isinstance(k, int) or k < 1:
        raise ConfigError(f"algo.her_k={k} must be an integer >= 1 (SB3's n_sampled_goal: 4)")
    why = goal_keys_missing(spec.observation)
    if why is None and spec.goal_reward is None:
        why = "it has no compute_reward(achieved_goal, desired_goal, info) method"
    if why is not None:
        raise ConfigError(f"algo.her=true (algo={name}): env.id={spec.env_id} is not a goal-conditioned task: {why} "
                          "(Gymnasium-Robotics' convention); set algo.her=false")
    return HindsightSampler(buffer, k=k, reward=spec.goal_reward)


class OffPolicy(Algorithm):
    """Base of the replay learners (see the module docstring). A subclass calls ``super().__init__`` first,
    then builds its networks and optimisers, and defines ``update``, ``stat_names``, ``networks_state`` and
    ``load_networks_state``; ``explore`` and ``explore_settled`` where its exploration follows a schedule (DQN's
    epsilon); ``sample`` and a ``buffer_class`` where its minibatches are not uniform one-step transitions (DQN's
    n-step and prioritised replay)."""

    on_policy = False
    stat_names: ClassVar[tuple[str, ...]]  # the metrics ``update`` returns, in order
    delayed_stats: ClassVar[tuple[str, ...]] = ()  # those of them computed on actor steps only (``actor_steps_at``)
    actor_delay = 1  # gradient steps per actor step (a subclass's ``actor_delay_key`` setting)
    # the most transitions (steps x envs) the loop collects in one go: bounds the collector's buffers (Atari
    # frames) and how long a stop request waits for the collection to end
    max_transitions_per_collect: ClassVar[int] = 256

    def __init__(self, spec: EnvSpec, settings: ReplaySettings, *, num_envs: int, device: torch.device,
                 sync: Sync | None = None, frame_stack: int | None = None,
                 buffer_class: Callable[..., ReplayBuffer] = ReplayBuffer):
        """``frame_stack``: K when observations are K-frame stacks to store one frame per row (data/frames.py);
        ``buffer_class``: the replay's (ReplayBuffer's arguments; DQN's prioritised replay)."""
        super().__init__(spec, num_envs=num_envs, device=device, sync=sync)
        if spec.action_kind == "box" and not np.isfinite([*spec.action_low, *spec.action_high]).all():
            # the warm-up draws uniformly inside the bounds, and the actors squash / clip into them
            raise ConfigError(f"algo={self.name} needs finite Box action bounds; env.id={spec.env_id} has low="
                              f"{list(spec.action_low)} high={list(spec.action_high)}: declare the range the env's "
                              "actions mean something in as its Box bounds, or train it with algo=ppo (a Gaussian "
                              "policy needs no bounds)")
        self.settings = settings
        self.rollout_len, self.learning_starts = settings.rollout_len, settings.learning_starts
        self.batch_size, self.frame_stack = settings.batch_size, frame_stack
        # observations keep their dtype in the buffer (EnvSpec.obs_dtype; float32 is what the collector writes
        # where the spec has none); frame stacks are stored one frame per step
        self.buffer = buffer_class(settings.buffer_size, spec.obs_shape, spec.action_shape, spec.action_dtype,
                                   device=device, obs_dtype=getattr(spec, "obs_dtype", np.dtype(np.float32)),
                                   frame_stack=frame_stack, obs_space=spec.observation)
        self.unwritten = UnwrittenSteps(self.buffer)
        self.schedule = UpdateSchedule(settings.train_frequency, settings.gradient_steps)
        # counters in env steps over all workers; checkpointed so that a resumed run keeps its schedules
        self.env_steps = 0
        self.gradient_steps_taken = 0
        self.targets: list[TargetNetwork] = []  # synced every ``target_every`` env steps (sync_targets_every)
        self.target_every = 0
        self.last_target_sync = 0
        self.weight_writes = 0  # gradient steps and scheduled target updates (the loop's finite check reads it)
        # goal-conditioned tasks: batches relabelled with hindsight goals (algo.her), else the buffer's uniform ones
        self.hindsight = hindsight_sampler(spec, self.buffer, settings, self.name)
        self.uniform_batch = self.hindsight.sample if self.hindsight is not None else self.buffer.sample

    @classmethod
    def target_sync_key(cls) -> str | None:
        """The settings field that sets the env steps between its scheduled target updates (``sync_targets_every``:
        DQN's ``target_network_frequency``); None where its targets follow its gradient steps (SAC, TD3, DDPG)."""
        return None

    @classmethod
    def actor_delay_key(cls) -> str | None:
        """The settings field that sets the gradient steps per actor step (TD3's ``policy_delay``, SAC's
        ``policy_frequency``: ``actor_steps_at``); None where every gradient step is the whole update (DQN, DDPG)."""
        return None

    def actor_steps_at(self, gradient_step: int) -> bool:
        """Whether the ``gradient_step``-th gradient step of the run (counted from 1) steps the actor: every
        ``actor_delay``-th, the first at ``actor_delay`` (Fujimoto et al. 2018's ``t mod d``)."""
        return gradient_step % self.actor_delay == 0

    def sync_targets_every(self, env_steps: int, *targets: TargetNetwork) -> None:
        """Update ``targets`` whenever ``env_steps`` env steps have passed since their last update (checked
        after each call's gradient steps, from the first call that trains)."""
        self.target_every, self.targets = env_steps, list(targets)

    def explore(self, progress: float) -> Metrics:
        """Advance the exploration schedule to ``progress`` in [0, 1]; its metrics (none by default)."""
        return {}

    def explore_settled(self, progress: float) -> bool:
        """Whether ``explore`` gives the same from ``progress`` on (no schedule: always)."""
        return True

    def sample(self, progress: float) -> Batch:
        """The minibatch of the next gradient step (uniform here, relabelled where ``algo.her``; DQN's n-step and
        prioritised replay)."""
        return self.uniform_batch(self.batch_size)

    @abstractmethod
    def update(self, batch: Batch) -> Tensor:
        """One gradient step on ``batch``; detached statistics [len(stat_names)]."""

    @abstractmethod
    def networks_state(self) -> dict:
        """The networks' and optimisers' state (the checkpoint's ``algo`` entry, beside ``counters``)."""

    @abstractmethod
    def load_networks_state(self, state: dict) -> None: ...

    # -- the schedule ------------------------------------------------------------------------------------
    def learn(self, rollout: Rollout, *, progress: float) -> Metrics:
        """Stores the rollout and runs the gradient steps now owed. Most calls owe none: they return at once
        and the rollout waits to be written with the next ones (as if written one by one)."""
        return self._learn(rollout, progress, rollouts=1)

    def learn_collected(self, rollout: Rollout, *, rollouts: int, progress: float) -> Metrics:
        """What ``learn()`` on each of the ``rollouts`` gives, in one call: one explore at the last one's
        ``progress`` (before it, the schedule was settled or unused: random warm-up), their env steps owed together
        (none falls due before the last, ``rollouts_to_collect``), their rows written where one write per rollout
        puts them."""
        return self._learn(rollout, progress, rollouts=rollouts)

    def _learn(self, rollout: Rollout, progress: float, *, rollouts: int) -> Metrics:
        before = self.env_steps
        self.env_steps += rollout.num_steps * self.sync.world_size
        metrics = self.explore(progress)
        self.unwritten.add(rollout, rollouts=rollouts)
        if self.env_steps < self.learning_starts:
            return metrics
        steps = self.env_steps - max(before, self.learning_starts)  # the warm-up's steps owe no update
        due = self.schedule.rounds_due(steps) > 0 or self._target_due()
        if not due and self.buffer.ready >= self.batch_size:
            self.schedule.owe(steps)  # nothing due, and the buffer would hold a batch: owe the steps, no more
            return metrics
        self.unwritten.write()  # the buffer now holds every transition so far
        if self.buffer.ready < self.batch_size:
            return metrics  # no batch to sample yet: these steps owe nothing
        stats, actor_steps = [], []
        for _ in range(self.schedule.owe(steps)):
            self.gradient_steps_taken += 1
            self.weight_writes += 1
            actor_steps.append(self.actor_steps_at(self.gradient_steps_taken))
            stats.append(self.update(self.sample(progress)))
        if self._target_due():
            self.last_target_sync = self.env_steps
            self.weight_writes += 1
            for target in self.targets:
                target.update()
        if stats:
            metrics.update(self._mean_stats(torch.stack(stats).cpu().numpy(), actor_steps))
            metrics["train/updates_per_learn"] = float(len(stats))
        return metrics

    def _mean_stats(self, stats: np.ndarray, actor_steps: list[bool]) -> Metrics:
        """Each statistic's mean over the call's gradient steps [steps, stats] that computed it (a delayed one: the
        actor steps), then over the workers; a delayed one no step computed is left out. The placeholders are
        masked, never averaged, so a NaN the update did compute still reaches the loop's finite check; every worker
        follows the same schedule, so all leave out the same."""
        if not self.delayed_stats:  # every step computed every statistic (DQN, DDPG): no mask to build
            return dict(zip(self.stat_names, map(float, self.sync.mean(stats.mean(0))), strict=True))
        computed = np.ones(stats.shape, bool)
        computed[:, [k for k, name in enumerate(self.stat_names) if name in self.delayed_stats]] = \
            np.asarray(actor_steps)[:, None]
        counts = computed.sum(0)
        mean = self.sync.mean(np.where(computed, stats, 0).sum(0) / np.maximum(counts, 1))
        return {name: float(v) for name, v, n in zip(self.stat_names, mean, counts, strict=True) if n}

    def _target_due(self) -> bool:
        return bool(self.targets) and self.env_steps - self.last_target_sync >= self.target_every

    def rollouts_to_collect(self, env_steps: int, *, until: int, total: int) -> int:
        """The rollouts up to the first whose learn() changes anything: the one that reaches the end of the
        warm-up, a round of updates or a target sync (or ``until``, the loop's next event), so that acting uses
        the weights it would have between learn() calls one rollout at a time (see the module docstring). One
        after the warm-up while the exploration schedule moves (acting reads it) or the buffer cannot fill a
        batch (whether a call owes its steps then depends on the writes before it)."""
        if env_steps < self.learning_starts:  # acting uniformly at random: the exploration schedule is unused
            event = self.learning_starts
        elif not self.explore_settled(env_steps / total) or self.buffer.ready < self.batch_size:
            return 1
        else:
            event = env_steps + self.schedule.train_frequency - self.schedule.owed_steps
            if self.targets:
                event = min(event, self.last_target_sync + self.target_every)
        per_rollout = self.rollout_len * self.num_envs * self.sync.world_size
        rollouts = -(-(min(event, until) - env_steps) // per_rollout)  # ceil: the rollout that reaches it
        most = self.max_transitions_per_collect // (self.rollout_len * self.num_envs)
        return max(1, min(rollouts, most))

    # -- checkpoints -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        self.unwritten.write()
        state = self.networks_state()
        state["counters"] = {"env_steps": self.env_steps, "owed_env_steps": self.schedule.owed_steps,
                             "gradient_steps": self.gradient_steps_taken, "last_target_sync": self.last_target_sync}
        if self.settings.checkpoint_buffer:
            state["replay_buffer"] = self.buffer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.load_networks_state(state)
        c = state["counters"]
        self.env_steps = int(c["env_steps"])
        if "owed_env_steps" in c:
            self.schedule.owed_steps = int(c["owed_env_steps"])
        else:  # written before this module: rounds owed as a float, and SAC's count of critic steps
            self.schedule.owed_steps = round(float(c["pending_updates"]) * self.schedule.train_frequency)
        self.gradient_steps_taken = int(c.get("gradient_steps", c.get("critic_steps", 0)))
        self.last_target_sync = int(c.get("last_target_sync", 0))
        self.unwritten.clear()
        if "replay_buffer" in state:
            self.buffer.load_state_dict(state["replay_buffer"])

    def resume_note(self, state: dict) -> str | None:
        if "replay_buffer" in state:
            return None
        if self.env_steps < self.learning_starts:
            refill = f"the random warm-up refills it until algo.learning_starts={self.learning_starts} env steps"
        else:  # the warm-up is over: no second one, the updates go on as soon as a batch can be sampled
            refill = (f"updates wait until it holds algo.batch_size={self.batch_size} transitions (about "
                      f"{self.batch_size * self.sync.world_size} env steps), then sample only what was collected "
                      "since the resume until it fills up again")
        return (f"the replay buffer was not checkpointed (checkpoint.replay_buffer=false): it starts empty; {refill}; "
                "checkpoint.replay_buffer=true keeps it in checkpoints")
