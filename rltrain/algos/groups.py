"""Policy groups: which agents of a multi-agent env share a policy, and PPO on one group's rollout.

``policy_groups`` maps agents to groups (``algo.policies``, algos/ippo.py); ``GroupPPO`` is PPO (ppo.py, the
same update) on a group's rollout, leaving out the padding rows of agents that were done while their env went
on (``Rollout.valid``): they are in no minibatch, no advantage normalisation and no loss. A recurrent policy
still unrolls over them (the state is zeroed after an episode's end anyway), and only the valid rows enter its
loss (MAPPO's "death masking" keeps dead agents out of the loss the same way, Yu et al. 2022).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator

import numpy as np
import torch

from rltrain.algos.minibatches import ColumnMinibatches, RowMinibatches, SequenceMinibatch
from rltrain.algos.ppo import PPO
from rltrain.data.agents import AgentGroup, AgentsSpec, group_observation, same_spaces
from rltrain.data.structs import ObsSpace, Rollout, obs_map
from rltrain.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _mapping(spec: AgentsSpec, policies: str | dict) -> dict[str, str]:
    """agent -> policy name from ``algo.policies`` (module docstring of algos/ippo.py)."""
    agents = spec.agents
    if isinstance(policies, dict):
        unknown = [a for a in policies if a not in agents]
        if unknown:
            raise ConfigError(f"algo.policies: {unknown[0]!r} is not an agent of env.id={spec.env_id} (agents: "
                              f"{', '.join(agents)})")
        missing = [a for a in agents if a not in policies]
        if missing:
            raise ConfigError(f"algo.policies maps no policy to agent {missing[0]!r} of env.id={spec.env_id}: name "
                              f"one for every agent ({', '.join(agents)}), or use algo.policies=auto")
        bad = [str(n) for n in policies.values() if not isinstance(n, str) or not _NAME.match(n)]
        if bad:
            raise ConfigError(f"algo.policies: policy name {bad[0]!r} must be a word (letters, digits, _ or -)")
        return {a: str(policies[a]) for a in agents}
    if policies == "per_agent":
        return {a: a for a in agents}
    if policies == "shared":
        return dict.fromkeys(agents, "shared")
    if policies != "auto":
        raise ConfigError(f"algo.policies={policies!r}: auto, shared, per_agent or a mapping {{agent: policy name}}")
    kinds: list[list[str]] = []  # agents with equal spaces, in order of first appearance
    for a in agents:
        same = next((k for k in kinds if same_spaces(spec.spec_of(k[0]), spec.spec_of(a))), None)
        same.append(a) if same is not None else kinds.append([a])
    if len(kinds) == 1 and len(agents) > 1:
        return dict.fromkeys(agents, "shared")
    names = {}
    for kind in kinds:
        name = kind[0] if len(kind) == 1 else os.path.commonprefix(kind).rstrip("_-0123456789") or kind[0]
        while name in names.values() or (len(kind) > 1 and name in agents and name not in kind):
            name += "_"
        names.update(dict.fromkeys(kind, name))
    return names


def policy_groups(spec: AgentsSpec, *, policies: str | dict, agent_id: bool, state: tuple[str, ObsSpace] | None,
                  self_play: bool) -> tuple[AgentGroup, ...]:
    """The policy groups of ``spec`` in agent order. ``agent_id``: a group of several agents reads the agent's
    one-hot index; ``state``: (``env`` | ``joined``, its space) for a centralised critic, or None. With
    ``self_play`` one policy plays every seat, so no mapping may be asked for beside it."""
    if self_play and policies != "auto":
        raise ConfigError(f"algo.policies={_words(policies)} with algo.self_play=true: self-play trains one policy "
                          "that plays every seat (against its past versions), so there are no policies to map; drop "
                          "algo.policies, or set algo.self_play=false to train the mapped policies against each other")
    mapping = dict.fromkeys(spec.agents, "main") if self_play else _mapping(spec, policies)
    groups = []
    for name in dict.fromkeys(mapping.values()):
        agents = tuple(a for a in spec.agents if mapping[a] == name)
        first = spec.spec_of(agents[0])
        other = next((a for a in agents if not same_spaces(spec.spec_of(a), first)), None)
        if other is not None:
            other_spec = spec.spec_of(other)
            raise ConfigError(f"algo.policies: agents {agents[0]!r} and {other!r} share the policy {name!r} but act "
                              f"or observe in different spaces ({first.observation.name} -> {first.describe()} vs "
                              f"{other_spec.observation.name} -> {other_spec.describe()}); give them policies of "
                              "their own (algo.policies=auto does)")
        ids = len(agents) if agent_id and len(agents) > 1 else 0
        obs, flat = group_observation(first.observation, ids, state[1] if state else None)
        group_spec = dataclasses.replace(first, obs_space=obs, obs_shape=obs.shape, obs_dtype=obs.dtype or "float32",
                                         frame_stack=None)
        groups.append(AgentGroup(name, agents, group_spec, ids=ids, state=state[0] if state else "", flat=flat))
    return tuple(groups)


def _words(policies: str | dict) -> str:
    """``algo.policies`` as the command line spells it: ``per_agent``, ``{a:x,b:y}``."""
    if isinstance(policies, dict):
        return "{" + ",".join(f"{a}:{n}" for a, n in policies.items()) + "}"
    return str(policies)


class GroupPPO(PPO):
    """PPO on one policy group's rollout [T, slots] (module docstring): padding rows left out."""

    def _minibatches(self, rollout: Rollout, inputs: tuple | None, adv: np.ndarray, ret: np.ndarray,
                     values: np.ndarray) -> RowMinibatches | ColumnMinibatches:
        valid = rollout.valid
        if valid is None or valid.all():
            return super()._minibatches(rollout, inputs, adv, ret, values)
        s = self.settings
        if inputs is not None:
            return ValidColumnMinibatches(*inputs, rollout, adv, ret, values, minibatches=self.num_minibatches,
                                          norm_adv=s.norm_adv, device=self.device, valid=valid)
        keep = np.flatnonzero(valid.reshape(-1))
        minibatches = self.num_minibatches  # the same count on every worker: distributed steps all-reduce together
        if len(keep) < minibatches:  # rows repeated (none valid: neutral rows, see _neutral) to fill each minibatch
            keep = np.resize(keep, minibatches) if len(keep) else np.arange(minibatches)
            if not valid.reshape(-1)[keep].any():
                adv, ret = _neutral(adv, values)
        # an equal split: the rows over a multiple of the minibatch count are dropped, drawn at random
        keep = np.sort(keep[torch.randperm(len(keep)).numpy()[: len(keep) // minibatches * minibatches]])

        def rows(x: np.ndarray) -> np.ndarray:  # [T, N, ...] -> the kept rows as a one-column [B, 1, ...]
            return x.reshape(-1, *x.shape[2:])[keep][:, None]

        kept = Rollout(obs=obs_map(rows, rollout.obs), actions=rows(rollout.actions), log_probs=rows(rollout.log_probs),
                       rewards=rows(rollout.rewards), terminated=rows(rollout.terminated),
                       truncated=rows(rollout.truncated), next_obs=obs_map(rows, rollout.obs),
                       policy_version=rollout.policy_version[:1])
        return RowMinibatches(self.update.rows(kept.obs), kept, rows(adv), rows(ret), rows(values),
                              epochs=s.update_epochs, minibatches=minibatches, norm_adv=s.norm_adv,
                              device=self.update.device)


class ValidSequenceMinibatch(SequenceMinibatch):
    """Whole columns unrolled as ``SequenceMinibatch``, of which only the valid rows (``keep``, into the
    [T * n] unroll order) enter the loss; the other fields hold those rows only."""

    keep: torch.Tensor | None = None

    def outputs(self, policy):
        out, value, _ = policy.unroll(self.obs, self.start, self.mask, keep_states=False)
        B = self.mask.numel()
        return out.reshape(B, -1)[self.keep], value.reshape(B)[self.keep]


class ValidColumnMinibatches(ColumnMinibatches):
    """``ColumnMinibatches`` whose minibatches carry only the valid rows into the loss, advantages normalised
    over those rows."""

    def __init__(self, *args, valid: np.ndarray, norm_adv: bool, **kwargs):
        super().__init__(*args, norm_adv=norm_adv, **kwargs)
        self.valid = torch.from_numpy(valid).to(self.device)

    def epoch(self, e: int) -> Iterator[SequenceMinibatch]:
        N = self.mask.shape[1]
        width = N // self.minibatches
        perm = torch.randperm(N)  # torch RNG, as ColumnMinibatches
        for k in range(self.minibatches):
            cols = perm[k * width:(k + 1) * width].to(self.device)
            B = self.mask[:, cols].numel()
            keep = torch.nonzero(self.valid[:, cols].reshape(B)).squeeze(1)
            neutral = keep.numel() == 0  # every step of a distributed update is taken on every worker
            keep = torch.arange(B, device=self.device) if neutral else keep
            old_logp, adv, ret, old_values = (x[:, cols].reshape(B)[keep] for x in self.old)
            if neutral:
                adv, ret = torch.zeros_like(adv), old_values
            if self.norm_adv and keep.numel() > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            actions = self.actions[:, cols]
            mb = ValidSequenceMinibatch(obs_map(lambda x, c=cols: x[:, c], self.obs),
                                        actions.reshape(B, *actions.shape[2:])[keep], old_logp, adv, ret, old_values,
                                        start=tuple(x[:, cols] for x in self.start), mask=self.mask[:, cols])
            mb.keep = keep
            yield mb


def _neutral(adv: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Targets for a minibatch with no valid row (a group whose agents were all done for the whole rollout): no
    advantage and the old values as returns, so its step moves the weights by little more than the entropy
    bonus. Taken rather than skipped: under distributed training every worker takes every step together."""
    return np.zeros_like(adv), values.astype(np.float32)
