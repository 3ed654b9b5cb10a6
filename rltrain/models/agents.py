"""The policies of a multi-agent env: one per policy group, a pool of past versions for self-play, and a
per-agent view that acts on that agent's own observation.

Each group's network is the model factory's actor-critic, built by the group's learner from the group's spec
(data/agents.py). ``AgentPolicies`` holds them under ``groups.<name>`` (and the self-play pool under ``pool``):
one module, so its ``state_dict`` is the weights that travel to actors, ranks and checkpoints, in one place.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rltrain.data.agents import AGENT_ID_KEY, OBS_KEY, STATE_KEY, AgentGroup, AgentsSpec
from rltrain.data.structs import ActOutput, EnvSpec, Policy


class OpponentPool(nn.Module):
    """``size`` past versions of a learner's policy (a ring: the oldest is replaced), for self-play. Starts
    holding the initial weights. ``versions[i]``: the update at which member i was taken."""

    def __init__(self, policy: Policy, size: int):
        super().__init__()
        members = []
        for _ in range(size):
            member = copy.deepcopy(policy)
            for attr in ("flat_params", "_snapshot"):  # acting caches of the learner's numpy backend
                if hasattr(member, attr):
                    setattr(member, attr, None)
            members.append(member.requires_grad_(False))
        self.members = nn.ModuleList(members)
        self.register_buffer("count", torch.tensor(1))
        self.register_buffer("latest", torch.tensor(0))
        self.register_buffer("versions", torch.zeros(size, dtype=torch.int64))

    @property
    def size(self) -> int:
        return len(self.members)

    def push(self, policy: nn.Module, version: int) -> None:
        """Keep a copy of ``policy``'s weights now (taken at update ``version``)."""
        slot = (int(self.latest) + 1) % self.size
        self.members[slot].load_state_dict(policy.state_dict())
        self.latest.fill_(slot)
        self.count.fill_(min(int(self.count) + 1, self.size))
        self.versions[slot] = version

    def draw(self, rng: np.random.Generator, sampling: str) -> int:
        """A member's index: ``uniform`` over the versions held (Bansal et al. 2018), or the ``latest``."""
        if sampling == "latest":
            return int(self.latest)
        return int(rng.integers(int(self.count)))


class AgentPolicies(nn.Module):
    """Every policy group's actor-critic (``groups[name]``) and, with self-play, the opponent pool."""

    def __init__(self, spec: AgentsSpec, groups: tuple[AgentGroup, ...], policies: dict[str, Policy],
                 pool: OpponentPool | None = None):
        super().__init__()
        self.spec, self.group_list = spec, groups
        self.groups = nn.ModuleDict(policies)
        self.pool = pool
        self._group_of = {agent: g for g in groups for agent in g.agents}

    def group_of(self, agent: str) -> AgentGroup:
        return self._group_of[agent]

    def agent_policy(self, agent: str) -> AgentPolicy:
        """The policy ``agent`` acts with, on its own observation."""
        group = self.group_of(agent)
        return AgentPolicy(self.groups[group.name], group, agent, self.spec.spec_of(agent))

    def per_agent(self) -> dict[str, AgentPolicy]:
        return {agent: self.agent_policy(agent) for agent in self.spec.agents}


def group_obs(group: AgentGroup, agent: str, obs: Any, state: Any = None) -> Any:
    """An agent's observation batch [B, ...] (tensors) as its group's policy reads it (data/agents.py
    ``group_observation``): its one-hot index appended or added as a key, the global state added as a key
    (zeros when not given: only the critic reads it, and acting needs no critic)."""
    if not group.ids and not group.state:
        return obs
    first = obs if isinstance(obs, Tensor) else next(iter(obs.values()))
    n, device = first.shape[0], first.device
    ids = F.one_hot(torch.full((n,), group.index(agent), device=device), group.ids).float() if group.ids else None
    if group.flat:
        return torch.cat([obs.float(), ids], 1)
    out = dict(obs) if isinstance(obs, dict) else {OBS_KEY: obs}
    if ids is not None:
        out[AGENT_ID_KEY] = ids
    if group.state:
        space = dict(group.spec.observation.parts)[STATE_KEY]
        out[STATE_KEY] = state if state is not None else torch.zeros((n, *space.shape), device=device)
    return out


class AgentPolicy(Policy):
    """One agent's policy on its own observation (what ``rltrain.load_policy`` returns per agent): the group's
    network, with the agent's index (and a zero global state for a critic the actor never reads) added."""

    def __init__(self, policy: Policy, group: AgentGroup, agent: str, spec: EnvSpec):
        super().__init__()
        self.policy, self.group, self.agent, self.spec = policy, group, agent, spec
        self.recurrent = bool(getattr(policy, "recurrent", False))

    def act(self, obs, state=None, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        return self.policy.act(group_obs(self.group, self.agent, obs), state, deterministic=deterministic,
                               generator=generator)

    def initial_state(self, n: int):
        return self.policy.initial_state(n)

    def export_module(self) -> nn.Module:
        return AgentExport(self.policy.export_module(), self.group, self.agent)


class AgentExport(nn.Module):
    """The group's exported actor, taking this agent's own observation (its index added inside)."""

    def __init__(self, inner: nn.Module, group: AgentGroup, agent: str):
        super().__init__()
        self.inner, self.group, self.agent = inner, group, agent
        self.state_names = list(getattr(inner, "state_names", []))
        self.state_size = getattr(inner, "state_size", 0)

    def forward(self, obs, *state: Tensor):
        return self.inner(group_obs(self.group, self.agent, obs), *state)
