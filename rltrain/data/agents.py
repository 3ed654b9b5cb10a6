"""Data contracts of multi-agent training: the env's agents, the policy groups they map to, their rollouts.

A multi-agent env (PettingZoo's ``ParallelEnv`` or ``AECEnv``, envs/multiagent.py) is described by an
``AgentsSpec``: its agents in ``possible_agents`` order, each agent's own ``EnvSpec`` (observation and action
space) and the global state's space where the env has one. Agents are mapped to *policy groups*
(``AgentGroup``); the agents of a group share one policy, and the group's ``spec`` is what that policy
observes: the agent's own observation, plus its index among the group's agents as a one-hot (``AGENT_ID_KEY``)
when several agents share it, plus the global state (``STATE_KEY``) that only a centralised critic reads.

A group's rollout is an ordinary ``Rollout`` ``[T, S]`` over its *slots* (structs.py): slot ``n * k + j`` is the
group's agent j in env n (k agents in the group), and its column is that agent's own sequence of transitions,
so every learner reads it as it reads a single-agent rollout. ``MultiRollout`` carries one per group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from rltrain.data.records import checked, typed
from rltrain.data.structs import MASK_KEY, EnvSpec, ObsSpace, Rollout

AGENT_ID_KEY = "agent_id"  # the agent's index among its group's agents, one-hot float32 [k]
STATE_KEY = "global_state"  # the global state a centralised critic reads (never the actor)
OBS_KEY = "obs"  # the agent's own observation, when it is not a Dict whose keys can sit beside the others
RESERVED_KEYS = (AGENT_ID_KEY, STATE_KEY)


@dataclass(frozen=True)
class AgentsSpec:
    """What the learners must know about a multi-agent env.

    api:     ``parallel`` (every live agent acts each step) or ``aec`` (one agent acts per step)
    agents:  ``possible_agents`` in the env's order
    specs:   each agent's ``EnvSpec`` (an ``action_mask`` key of its Dict observation is the mask, as for one agent)
    state:   ``env.state()``'s space where it gives an array of numbers, else None (envs/multiagent.py
             ``global_state``)
    joined:  the agents' observations flattened and concatenated (the stand-in for a missing global state;
             Discrete parts one-hot), or None where some observation has a part that does not flatten to numbers
    """

    env_id: str
    api: Literal["parallel", "aec"]
    agents: tuple[str, ...]
    specs: tuple[EnvSpec, ...]
    state: ObsSpace | None = None
    joined: ObsSpace | None = None

    def spec_of(self, agent: str) -> EnvSpec:
        return self.specs[self.agents.index(agent)]

    def to_record(self) -> dict:
        """Plain containers (``EnvSpec.to_record`` per agent): a checkpoint's record of the agents."""
        return {"env_id": self.env_id, "api": self.api, "agents": list(self.agents),
                "specs": [s.to_record() for s in self.specs],
                "state": None if self.state is None else self.state.to_record(),
                "joined": None if self.joined is None else self.joined.to_record()}

    @classmethod
    def from_record(cls, record: dict) -> AgentsSpec:
        """What ``to_record`` wrote; a malformed record (a crafted file) raises ValueError."""
        api = typed(record, "api", str)
        if api not in ("parallel", "aec"):
            raise ValueError(f"api {api!r} is neither 'parallel' nor 'aec'")
        agents = tuple(checked(a, str, "an agent") for a in typed(record, "agents", list))
        specs = tuple(EnvSpec.from_record(checked(s, dict, "an agent's spec")) for s in typed(record, "specs", list))
        if len(specs) != len(agents) or not agents:
            raise ValueError(f"{len(agents)} agents but {len(specs)} agent specs")
        state, joined = (None if record.get(k) is None else ObsSpace.from_record(checked(record[k], dict, k))
                         for k in ("state", "joined"))
        return cls(typed(record, "env_id", str), api, agents, specs, state=state, joined=joined)

    @property
    def steps_per_row(self) -> int:
        """Env steps that give each agent of an env one row: a parallel env's joint step gives every live agent
        one; an AEC env's step is one agent's turn, so it takes about one per agent (the agents taking turns)."""
        return len(self.agents) if self.api == "aec" else 1

    @property
    def homogeneous(self) -> bool:
        """Every agent observes and acts in the same spaces (one policy may serve them all)."""
        return all(same_spaces(s, self.specs[0]) for s in self.specs)


def same_spaces(a: EnvSpec, b: EnvSpec) -> bool:
    """Equal observation and action spaces (the env id aside): the agents can share one policy."""
    keys = ("obs_space", "action_kind", "action_shape", "n_actions", "action_low", "action_high", "nvec",
            "action_start")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def flat_size(space: ObsSpace) -> int | None:
    """Numbers in one observation once flattened (the action mask left out; a Discrete index one-hot, a
    MultiDiscrete one one-hot per component, as the encoders read them), or None where a part has no numbers to
    join (Text)."""
    if space.kind == "dict":
        sizes = [flat_size(sub) for key, sub in space.parts if key != MASK_KEY]
        return None if any(s is None for s in sizes) else sum(sizes)  # type: ignore[misc]
    if space.kind in ("box", "multi_binary"):
        return math.prod(space.shape)
    if space.kind == "discrete":
        return space.n
    if space.kind == "multi_discrete":
        return sum(space.nvec)
    return None


def vector_space(size: int, name: str) -> ObsSpace:
    return ObsSpace("box", (size,), "float32", name=f"Box({name}, ({size},), float32)")


def is_flat_vector(space: ObsSpace) -> bool:
    """A 1-D float Box: an agent index can be appended to it as more numbers (the fast MLP path stays open)."""
    return space.kind == "box" and len(space.shape) == 1 and space.dtype.startswith("float")


def group_observation(agent: ObsSpace, ids: int, state: ObsSpace | None) -> tuple[ObsSpace, bool]:
    """(what a group's policy observes, flat): the agent's own observation, its one-hot index among ``ids``
    agents (0: none) and the global ``state`` (None: none). ``flat``: a float vector with the index appended
    (no state), so the fused MLP can run it; otherwise a Dict: the agent's own keys (or ``OBS_KEY``), then
    ``AGENT_ID_KEY``, then ``STATE_KEY``; the action mask stays a top-level key."""
    if not ids and state is None:
        return agent, False
    if state is None and is_flat_vector(agent):
        return vector_space(agent.shape[0] + ids, "observation + agent id"), True
    parts = agent.parts if agent.kind == "dict" else ((OBS_KEY, agent),)
    clash = [k for k, _ in parts if k in RESERVED_KEYS]
    if clash:
        from rltrain.errors import ConfigError

        raise ConfigError(f"an agent's observation has a key named {clash[0]!r}, which rltrain adds itself for a "
                          "shared policy or a centralised critic; rename that key in the env")
    extra = ((AGENT_ID_KEY, vector_space(ids, "0, 1")),) if ids else ()
    extra += ((STATE_KEY, state),) if state is not None else ()
    name = f"Dict({', '.join(k for k, _ in parts + extra)})"
    return ObsSpace("dict", (), "", parts=tuple(parts) + extra, name=name), False


@dataclass(frozen=True)
class AgentGroup:
    """Agents sharing one policy. ``spec``: what that policy observes and how it acts (``group_observation``);
    ``ids``: width of the one-hot agent index (0: none); ``state``: the critic reads the global state (``env``:
    ``env.state()``, ``joined``: the agents' observations joined, ``""``: no); ``flat``: the index is appended to
    a float vector rather than a Dict key."""

    name: str
    agents: tuple[str, ...]
    spec: EnvSpec
    ids: int = 0
    state: str = ""
    flat: bool = False

    def index(self, agent: str) -> int:
        return self.agents.index(agent)

    def to_record(self) -> dict:
        return {"name": self.name, "agents": list(self.agents), "spec": self.spec.to_record(), "ids": self.ids,
                "state": self.state, "flat": self.flat}

    @classmethod
    def from_record(cls, record: dict) -> AgentGroup:
        agents = tuple(checked(a, str, "an agent") for a in typed(record, "agents", list))
        return cls(typed(record, "name", str), agents,
                   EnvSpec.from_record(typed(record, "spec", dict)), ids=typed(record, "ids", int),
                   state=typed(record, "state", str), flat=typed(record, "flat", bool))


AGENT_SPACES_FORMAT = 2  # the layout of ``AgentsPolicySpaces.to_record`` (a single agent's, structs.py: 1)
CoreShapes = tuple[tuple[int, ...], ...] | None  # a recurrent core's state per tensor for one env; None: feed-forward


@dataclass(frozen=True)
class AgentsPolicySpaces:
    """What a multi-agent run's policies act on, as its checkpoints record it (``meta["spaces"]``, beside the
    single-agent ``PolicySpaces``): enough to build every policy group's network again with no env built and no
    env module imported (``rltrain.load_policy``, ``rltrain-eval``, ``rltrain-export``).

    spec:        the env's agents and their spaces (what the algorithm is built from, as in training)
    groups:      the policy groups the run built: the policy mapping (each group's agents), what each group's
                 policy observes (its one-hot index width, the global state its critic reads)
    core_states: each group's recurrent state shapes (``PolicySpaces.core_state``), in ``groups`` order
    action_mask: the mask source the run's env factory resolved (``key``, ``drop`` or ``off``)
    """

    spec: AgentsSpec
    groups: tuple[AgentGroup, ...]
    core_states: tuple[CoreShapes, ...]
    action_mask: str = "off"

    def to_record(self) -> dict:
        """Plain containers only (``torch.load(weights_only=True)`` reads them back without unpickling a class)."""
        return {"format": AGENT_SPACES_FORMAT, "agents": self.spec.to_record(), "action_mask": self.action_mask,
                "groups": [{**g.to_record(), "core_state": None if c is None else [list(t) for t in c]}
                           for g, c in zip(self.groups, self.core_states, strict=True)]}

    @classmethod
    def from_record(cls, record: dict) -> AgentsPolicySpaces:
        """What ``to_record`` wrote (``record["format"]`` checked by the caller); malformed: ValueError."""
        groups = [checked(g, dict, "a policy group") for g in typed(record, "groups", list)]
        states = tuple(None if g.get("core_state") is None else
                       tuple(tuple(checked(n, int, "core_state") for n in checked(t, list, "core_state"))
                             for t in checked(g["core_state"], list, "core_state")) for g in groups)
        return cls(AgentsSpec.from_record(typed(record, "agents", dict)),
                   tuple(AgentGroup.from_record(g) for g in groups), states, typed(record, "action_mask", str))

    def difference(self, built: AgentsPolicySpaces) -> str | None:
        """How the networks ``built`` from a checkpoint's settings differ from what it records, in words; None:
        they agree (the weights then load into the very layout that wrote them)."""
        mine, theirs = {g.name: g for g in self.groups}, {g.name: g for g in built.groups}
        if list(mine) != list(theirs) or any(mine[n].agents != theirs[n].agents for n in mine):
            def words(groups):
                return "; ".join(f"{g.name}: {', '.join(g.agents)}" for g in groups)

            return f"its policy groups are {{{words(self.groups)}}}, but its settings map the agents to " \
                   f"{{{words(built.groups)}}}"
        for (name, g), state, other in zip(mine.items(), self.core_states, built.core_states, strict=True):
            if g != theirs[name]:
                return f"policy group {name!r} observes {g.spec.observation.name} in it, but its settings build " \
                       f"one that observes {theirs[name].spec.observation.name}"
            if state != other:
                return f"policy group {name!r}'s recurrent state is {state}, but its settings build a network " \
                       f"whose state is {other}"
        return None


@dataclass
class MultiRollout:
    """One collection from a multi-agent env: a ``Rollout`` [T, S_g] per policy group, and what the loop counts.

    groups:          group name -> its rollout; a group's slot s is env ``s // k``, agent ``agents[s % k]``
                     (with self-play the learner's seat in env s, which alternates by episode). Rows padded for
                     an agent that was done while its env went on carry ``Rollout.valid`` False
    env_steps:       env steps taken (a parallel env's joint step, an AEC env's turn): the loop's step count
    episode_returns: each finished episode's return, the mean over its agents (self-play: the learner's)
    agent_returns:   agent -> the returns of its finished episodes
    """

    groups: dict[str, Rollout]
    env_steps: int
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    agent_returns: dict[str, list[float]] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return self.env_steps

    @property
    def policy_version(self) -> np.ndarray:
        return next(iter(self.groups.values())).policy_version
