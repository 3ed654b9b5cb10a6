"""Independent PPO (IPPO) on a multi-agent env: one PPO per policy group (de Witt et al. 2020, "Is Independent
Learning All You Need in the StarCraft Multi-Agent Challenge?"). ``algo=ppo`` on a multi-agent env means this.

Agents map to policy groups (``algo.policies``, algos/groups.py):

- ``auto``: agents with equal observation and action spaces share one policy that reads the agent's one-hot
  index (parameter sharing with an agent indicator, Terry et al. 2020, "Revisiting Parameter Sharing in
  Multi-Agent Deep Reinforcement Learning"; ``algo.agent_id=false`` leaves the index out); an agent with
  spaces of its own gets its own policy, so heterogeneous agents need no padding to a common space;
- ``shared``: one policy for all (their spaces must agree); ``per_agent``: one each; or a mapping
  ``{agent: policy name}`` naming every agent.

Each group learns from its own rollout [T, slots] with ``GroupPPO``: PPO's update unchanged (ppo.py), its
hyper-parameters the ``algo`` group's. T is one for all groups (the collector fills every slot to T rows): the
``algo.rollout_len`` rows per slot, or 2048 // env.num_envs (PPO's 2048-env-step batch).

Self-play (``algo.self_play=true``, two-player zero-sum games): one policy, ``main``, learns from the seat it
holds in each env while the other seat is played by a past version of it drawn from a pool
(``OpponentPool``: ``algo.self_play_pool`` versions, one added every ``algo.self_play_every`` updates,
``algo.self_play_sampling`` uniform over the pool or the latest; Bansal et al. 2018, "Emergent Complexity via
Multi-Agent Competition", sample past opponents uniformly). The learner's seat alternates every episode.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from rltrain.algos.base import Algorithm, Sync, UpdateSizes, positive
from rltrain.algos.groups import GroupPPO, policy_groups
from rltrain.algos.ppo import PPOSettings, auto_minibatches, auto_rollout_len
from rltrain.data.agents import STATE_KEY, AgentGroup, AgentsPolicySpaces, AgentsSpec, MultiRollout
from rltrain.data.structs import Metrics, ObsSpace, PolicySpaces
from rltrain.errors import ConfigError, only_with
from rltrain.models.agents import AgentPolicies, OpponentPool
from rltrain.models.settings import SB3_MLP, ModelSettings

SAMPLINGS = ("uniform", "latest")


@dataclass(frozen=True, kw_only=True)
class IPPOSettings(PPOSettings):
    """PPO's hyper-parameters (ppo.py) and how the agents map to policies (module docstring)."""

    policies: str | dict = "auto"  # auto | shared | per_agent | {agent: policy name}. Source: rltrain
    agent_id: bool = True  # a shared policy reads the agent's one-hot index. Source: Terry et al. 2020
    self_play: bool = False  # two-player zero-sum games: learn against a pool of past versions. Source: rltrain
    self_play_pool: int = 10  # past versions kept. Source: rltrain
    self_play_every: int = 10  # updates between two versions added to the pool. Source: rltrain
    self_play_sampling: str = "uniform"  # uniform over the pool | latest. Source: Bansal et al. 2018 (uniform)

    def __post_init__(self) -> None:
        super().__post_init__()
        positive("algo.self_play_pool", self.self_play_pool)
        positive("algo.self_play_every", self.self_play_every)
        if self.self_play_sampling not in SAMPLINGS:
            raise ConfigError(f"algo.self_play_sampling={self.self_play_sampling!r}: one of {', '.join(SAMPLINGS)}")

    def unread_keys(self, *, action_kind: str | None = None) -> dict[str, str]:
        """The opponent pool's settings without self-play; the agent's index where no policy is shared."""
        unread = super().unread_keys(action_kind=action_kind)
        if not self.self_play:  # the pool (OpponentPool) exists only under self-play
            unread |= dict.fromkeys(("self_play_pool", "self_play_every", "self_play_sampling"),
                                    only_with("algo.self_play=true", False))
        if self.policies == "per_agent" and not self.self_play:  # policy_groups: an index only in a group of several
            unread["agent_id"] = "only a policy shared by several agents reads the agent's index (now " \
                                 "algo.policies=per_agent)"
        return unread

    def ppo(self, **changes) -> PPOSettings:
        """These settings as one group's ``PPOSettings``."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(PPOSettings)}
        return PPOSettings(**{**fields, **changes})


def group_minibatches(requested: int, batch: int, slots: int, *, recurrent: bool) -> int:
    """Minibatches for one group: ``requested`` where it splits the group's batch (a recurrent core's: its
    slots), else the largest count below it that does (groups differ in size, T is common)."""
    whole = slots if recurrent else batch
    return max(d for d in range(1, min(requested, whole) + 1) if whole % d == 0)


class IPPO(Algorithm):
    name = "ippo"
    settings_class = IPPOSettings
    mlp = SB3_MLP  # PPO's (SB3's MlpPolicy: 64x64 tanh), every group's actor and critic
    learner_class: type[GroupPPO] = GroupPPO

    def __init__(self, spec: AgentsSpec, settings: IPPOSettings = IPPOSettings(), *, num_envs: int,
                 device: torch.device, sync: Sync | None = None, model: ModelSettings | None = None):
        """``num_envs``: the envs of one collection (each holds every agent); ``model``: the model group."""
        if not isinstance(spec, AgentsSpec):
            raise ConfigError(f"algo={self.name} trains the agents of a PettingZoo multi-agent env; "
                              f"env.id={spec.env_id} is a single-agent Gymnasium env: use algo=ppo")
        self.spec, self.num_envs, self.device, self.sync = spec, num_envs, device, sync or Sync()
        s = self.settings = settings
        model = (model or ModelSettings()).with_mlp(*self.mlp)
        self.groups = self.plan_groups(spec, s)
        slots = {g.name: num_envs * (1 if s.self_play else len(g.agents)) for g in self.groups}
        recurrent = model.core != "identity"
        sizes = self.update_sizes(s, num_envs=num_envs, recurrent=recurrent)
        self.rollout_len, requested = sizes.rollout_len, sizes.num_minibatches
        self.learners: dict[str, GroupPPO] = {}
        for g in self.groups:
            n = group_minibatches(requested, self.rollout_len * slots[g.name], slots[g.name], recurrent=recurrent)
            critic_keys = model.critic_keys + ((STATE_KEY,) if g.state else ())
            self.learners[g.name] = self.learner_class(
                g.spec, s.ppo(rollout_len=self.rollout_len, num_minibatches=n), num_envs=slots[g.name],
                device=device, sync=self.sync, model=dataclasses.replace(model, critic_keys=critic_keys))
        pool = OpponentPool(self.learners["main"].policy, s.self_play_pool) if s.self_play else None
        self.policy = AgentPolicies(spec, self.groups, {n: lr.policy for n, lr in self.learners.items()}, pool)
        self.updates = 0

    @classmethod
    def update_sizes(cls, settings: IPPOSettings, *, num_envs: int, recurrent: bool) -> UpdateSizes:
        """Rows per agent slot (``algo.rollout_len``; null: a 2048-env-step batch, 2048 // env.num_envs rows, as
        PPO's) and the minibatch count asked of each group (``group_minibatches`` fits it to the group)."""
        requested = settings.num_minibatches or auto_minibatches(num_envs, recurrent=recurrent)
        return UpdateSizes(settings.rollout_len or auto_rollout_len(num_envs, requested), requested)

    def networks(self) -> dict[str, torch.nn.Module]:
        """Each policy group's network, named with its agents (what the run prints and writes to model.txt)."""
        pool = self.policy.pool
        extra = f"; and {pool.size} past versions of it for self-play" if pool is not None else ""
        return {f"policy {g.name} (agents {', '.join(g.agents)}{extra})": self.learners[g.name].policy
                for g in self.groups}

    def policy_spaces(self, action_mask: str) -> AgentsPolicySpaces:  # type: ignore[override]
        """Every policy group's spaces and recurrent state shapes, the agents' own spaces and the policy mapping
        (data/agents.py ``AgentsPolicySpaces``): the tools build these networks from them with no env."""
        shapes = tuple(PolicySpaces.state_shapes(self.learners[g.name].policy.initial_state(1)) for g in self.groups)
        return AgentsPolicySpaces(self.spec, self.groups, shapes, action_mask)

    @classmethod
    def plan_groups(cls, spec: AgentsSpec, settings: IPPOSettings) -> tuple[AgentGroup, ...]:
        """The policy groups these settings make of ``spec``'s agents, before any network is built (what the
        constructor builds, and what ``rltrain-check`` shows)."""
        return policy_groups(spec, policies=settings.policies, agent_id=settings.agent_id,
                             state=cls.global_state(spec, settings), self_play=settings.self_play)

    @classmethod
    def global_state(cls, spec: AgentsSpec, settings: IPPOSettings) -> tuple[str, ObsSpace] | None:
        """What a centralised critic reads (MAPPO); IPPO's critics read what their actors read."""
        return None

    def learn(self, rollout: MultiRollout, *, progress: float) -> Metrics:  # type: ignore[override]
        """One PPO update per group on its own rollout; the metrics are the groups' means, and each group's
        under ``<metric>/<group>`` when there are several."""
        per = {name: self.learners[name].learn(r, progress=progress) for name, r in rollout.groups.items()}
        self.updates += 1
        pool = self.policy.pool
        if pool is not None and self.updates % self.settings.self_play_every == 0:
            pool.push(self.learners["main"].policy, self.updates)
        keys = next(iter(per.values())).keys()
        metrics = {k: float(np.mean([m[k] for m in per.values() if math.isfinite(m[k])] or [math.nan]))
                   for k in keys}
        if len(per) > 1:
            metrics.update({f"{k}/{name}": v for name, m in per.items() for k, v in m.items() if k != "train/lr"})
        return metrics

    def state_dict(self) -> dict:
        """The policy (every group's weights, the self-play pool), and each group's learner state without its
        policy (optimiser, reward scaler, value normaliser)."""
        learners = {n: {k: v for k, v in lr.state_dict().items() if k != "policy"} for n, lr in self.learners.items()}
        return {"policy": self.policy.state_dict(), "learners": learners, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        for name, learner in self.learners.items():
            learner.load_state_dict({**state["learners"][name], "policy": learner.policy.state_dict()})
        self.updates = int(state.get("updates", 0))
