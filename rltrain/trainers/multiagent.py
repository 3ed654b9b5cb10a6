"""``MultiAgentCollector``: the rollout source of a multi-agent env, for every trainer (the loop's collector in
one process, a distributed rank's, an actor's).

Each collection fills every policy group's slots (trainers/slots.py) to T rows: the envs are stepped together,
each acting agent's observation goes into its slot's next row, each group acts in one batch, and the answers
close the rows. An env stops stepping as soon as one of its slots has its T rows (so no slot runs ahead of the
others in its env, and nothing but an AEC move awaiting its outcome is carried over); the others are padded.
A finished episode is recorded (each agent's return, their mean) and its env reset at once.

Self-play: the learner holds one seat per env (``seat``, alternating every episode) and a past version of the
policy (``opponent``, drawn from the pool at every episode's start) the other; only the learner's rows are
recorded. The pool's weights travel with the policy's, so an actor's opponents are the learner's.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from rltrain.data.agents import AgentsSpec, MultiRollout
from rltrain.data.structs import obs_buffer, obs_map
from rltrain.envs.multiagent import AgentVecEnv, Closed
from rltrain.models.agents import AgentPolicies, group_obs
from rltrain.models.cores import put_state, reset_state, select_state
from rltrain.trainers.slots import SlotRows


class MultiAgentCollector:
    def __init__(self, venv: AgentVecEnv, policy: AgentPolicies, spec: AgentsSpec, *, device: torch.device,
                 episode_window: int = 100, sampling: str = "uniform"):
        self.venv, self.policy, self.spec, self.device = venv, policy, spec, device
        self.num_envs = n = venv.num_envs
        self.pool, self.sampling = policy.pool, sampling
        self.groups = {g.name: g for g in policy.group_list}
        per_env = {g.name: 1 if self.pool is not None else len(g.agents) for g in policy.group_list}
        self.rows = {name: SlotRows(g, n * per_env[name]) for name, g in self.groups.items()}
        # the slots of each env, per group: env i holds slots i*k .. i*k+k-1 of a group of k
        self.env_cols = [[(name, np.arange(i * k, (i + 1) * k)) for name, k in per_env.items()] for i in range(n)]
        self.core = {name: policy.groups[name].initial_state(r.slots) for name, r in self.rows.items()}
        self.acted_from = {name: self._clone(c) for name, c in self.core.items()}  # the state each open row acted from
        self.seat = np.arange(n) % 2  # self-play: the learner's agent (index into spec.agents) in each env
        self.opponent = np.zeros(n, np.int64)
        learner = next(iter(self.groups.values()))
        self.opponent_core = policy.groups[learner.name].initial_state(n) if self.pool is not None else None
        self.templates = {a: obs_buffer(s.observation, (0,)) for a, s in zip(spec.agents, spec.specs, strict=True)}
        self.rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,)).item()))
        self.recent_returns: deque[float] = deque(maxlen=episode_window)
        self.recent_lengths: deque[int] = deque(maxlen=episode_window)
        self.agent_returns = {a: deque(maxlen=episode_window) for a in spec.agents}
        self.episodes = 0
        venv.reset()
        for i in range(n):
            self._new_opponent(i)

    @staticmethod
    def _clone(state):
        return None if state is None else tuple(x.clone() for x in state)

    # -- which slot an agent's transitions go to -------------------------------------------------------
    def _slot(self, i: int, agent: str) -> tuple[str, int] | None:
        if self.pool is not None:
            return ("main", i) if agent == self.spec.agents[self.seat[i]] else None
        group = self.policy.group_of(agent)
        return group.name, i * len(group.agents) + group.index(agent)

    def _index(self, i: int, agent: str) -> int:
        """The agent's index among its group's (its one-hot input); with self-play its seat."""
        return self.spec.agents.index(agent) if self.pool is not None else self.policy.group_of(agent).index(agent)

    def _full(self, i: int, T: int) -> bool:
        return any((self.rows[name].fill[cols] >= T).any() for name, cols in self.env_cols[i])

    def _new_opponent(self, i: int) -> None:
        if self.pool is not None:
            self.opponent[i] = self.pool.draw(self.rng, self.sampling)
            if self.opponent_core is not None:
                self.opponent_core = reset_state(self.opponent_core, np.arange(self.num_envs) == i)

    # -- collection -----------------------------------------------------------------------------------
    def collect(self, rollout_len: int, *, policy_version: int = 0, random_actions: bool = False) -> MultiRollout:
        """Fill every slot to ``rollout_len`` rows (module docstring)."""
        T = rollout_len
        for r in self.rows.values():
            r.begin(T)
        start = {}
        for name, r in self.rows.items():  # the state before each slot's first row: an open row's own
            core, acted = self.core[name], self.acted_from[name]
            start[name] = None if core is None else tuple(
                torch.where(torch.from_numpy(r.open).to(c.device)[None, :, None], a, c)
                for a, c in zip(acted, core, strict=True))
        returns, lengths, per_agent, steps = [], [], {a: [] for a in self.spec.agents}, 0
        active = [i for i in range(self.num_envs) if not self._full(i, T)]
        with torch.inference_mode():
            while active:
                actions = self._act(active)
                outcomes: dict[str, list] = {name: [] for name in self.rows}
                ended = []
                for i in active:
                    self._close(i, self.venv.step(i, actions[i]), outcomes)
                    steps += 1
                    if self.venv.envs[i].over:
                        ended.append(i)
                self._write_outcomes(outcomes)
                for i in ended:  # after their outcomes are written: a self-play seat changes at the reset
                    ret, length = self._episode_end(i, per_agent)
                    returns.append(ret)
                    lengths.append(length)
                active = [i for i in active if not self._full(i, T)]
        self.episodes += len(returns)
        self.recent_returns.extend(returns)
        self.recent_lengths.extend(lengths)
        groups = {name: r.rollout(T, policy_version, self._cpu(start[name])) for name, r in self.rows.items()}
        return MultiRollout(groups, steps, episode_returns=returns, episode_lengths=lengths, agent_returns=per_agent)

    @staticmethod
    def _cpu(state):
        return None if state is None else tuple(x.detach().cpu().clone() for x in state)

    def _act(self, active: list[int]) -> dict[int, dict]:
        """Every acting agent's action in ``active`` envs: the learner's groups one batch each (their rows
        opened), the self-play opponents one batch per (pool member, seat)."""
        actions: dict[int, dict] = {i: {} for i in active}
        mine: dict[str, list] = {name: [] for name in self.rows}
        theirs: dict[tuple[int, str], list[int]] = {}
        for i in active:
            env = self.venv.envs[i]
            for agent in env.acting:
                slot = self._slot(i, agent)
                if slot is None:
                    theirs.setdefault((int(self.opponent[i]), agent), []).append(i)
                else:
                    mine[slot[0]].append((i, agent, slot[1]))
        for name, items in mine.items():
            if items:
                self._act_group(name, items, actions)
        for (member, agent), envs in theirs.items():
            policy = self.pool.members[member]  # type: ignore[union-attr]
            obs = self._stack(agent, [self.venv.envs[i].obs[agent] for i in envs])
            batch = group_obs(self.groups["main"], agent, obs) if self.groups["main"].ids else obs
            state = None if self.opponent_core is None else select_state(self.opponent_core, envs)
            out = policy.act(batch, state)
            if state is not None:
                self.opponent_core = put_state(self.opponent_core, envs, out.state)
            for i, a in zip(envs, out.action.cpu().numpy(), strict=True):
                actions[i][agent] = self._env_action(name="main", action=a)
        return actions

    def _act_group(self, name: str, items: list, actions: dict[int, dict]) -> None:
        rows, group = self.rows[name], self.groups[name]
        cols = np.array([c for _, _, c in items])
        states = [self.venv.envs[i].state(group.state) for i, _, _ in items] if group.state else None
        rows.write_obs("obs", rows.fill[cols], cols, [self.venv.envs[i].obs[a] for i, a, _ in items],
                       [self._index(i, a) for i, a, _ in items], states)
        batch = obs_map(lambda x: torch.from_numpy(x).to(self.device), rows.batch(cols))
        core = self.core[name]
        if core is None:
            out = self.policy.groups[name].act(batch)
        else:
            before = select_state(core, cols)
            out = self.policy.groups[name].act(batch, before)
            self.acted_from[name] = put_state(self.acted_from[name], cols, before)
            self.core[name] = put_state(core, cols, out.state)
        action, logp = out.action.cpu().numpy(), out.log_prob.cpu().numpy()
        rows.act(cols, action, logp)
        for (i, agent, _), a in zip(items, action, strict=True):
            actions[i][agent] = self._env_action(name=name, action=a)

    def _env_action(self, *, name: str, action: np.ndarray):
        spec = self.groups[name].spec
        if spec.action_kind == "discrete":
            return int(action)
        if spec.action_kind == "box":
            return np.clip(action, np.asarray(spec.action_low, np.float32).reshape(spec.action_shape),
                           np.asarray(spec.action_high, np.float32).reshape(spec.action_shape))
        return action

    def _stack(self, agent: str, observations: list) -> object:
        """Agent observations as one batch of tensors, in their stored keys and dtypes."""
        return obs_map(lambda t, *xs: torch.as_tensor(np.stack([np.asarray(x, t.dtype) for x in xs]),
                                                      device=self.device), self.templates[agent], *observations)

    def _close(self, i: int, closed: list[Closed], outcomes: dict[str, list]) -> None:
        """Close the rows of env i's closed transitions; their next observations are queued per group."""
        env, state = self.venv.envs[i], None
        for c in closed:
            slot = self._slot(i, c.agent)
            if slot is None:
                continue
            name, col = slot
            rows, group = self.rows[name], self.groups[name]
            if group.state and state is None:
                state = env.state(group.state)
            row = rows.close(col, c.reward, c.terminated, c.truncated)
            outcomes[name].append((row, col, c.obs, self._index(i, c.agent), state))
            if self.core[name] is not None and (c.terminated or c.truncated):
                self.core[name] = reset_state(self.core[name], np.arange(rows.slots) == col)

    def _write_outcomes(self, outcomes: dict[str, list]) -> None:
        """The next observations of this step's closed rows, one write per group."""
        for name, items in outcomes.items():
            if items:
                rows, cols, obs, ids, states = zip(*items, strict=True)
                self.rows[name].write_obs("next_obs", np.array(rows), np.array(cols), list(obs), list(ids),
                                          list(states) if self.groups[name].state else None)

    def _episode_end(self, i: int, per_agent: dict[str, list]) -> tuple[float, int]:
        """Record env i's finished episode, reset the env (self-play: swap seats, draw a new opponent)."""
        env = self.venv.envs[i]
        if self.pool is not None:
            agent = self.spec.agents[self.seat[i]]
            ret = float(env.returns[agent])
            for seat in self.spec.agents:  # NaN in the seat it did not play: each seat's window is then the same
                value = ret if seat == agent else np.nan  # episodes as the learner's (trainers/rows.py)
                per_agent[seat].append(value)
                self.agent_returns[seat].append(value)
            self.seat[i] = 1 - self.seat[i]
            self._new_opponent(i)
        else:
            for agent, r in env.returns.items():
                per_agent[agent].append(float(r))
                self.agent_returns[agent].append(float(r))
            ret = float(np.mean(list(env.returns.values())))
        length = env.steps
        self.venv.reset(i)
        return ret, length

    # -- the rollout source's other duties ------------------------------------------------------------
    def env_state(self) -> bytes | None:
        return self.venv.get_state()

    def close(self) -> None:
        self.venv.close()

    def state_dict(self) -> dict:
        core = {name: None if c is None else [x.cpu().clone() for x in c] for name, c in self.core.items()}
        acted = {name: None if c is None else [x.cpu().clone() for x in c] for name, c in self.acted_from.items()}
        return {"rows": {name: r.state_dict() for name, r in self.rows.items()}, "core": core, "acted_from": acted,
                "seat": torch.from_numpy(self.seat.copy()), "opponent": torch.from_numpy(self.opponent.copy()),
                "opponent_core": None if self.opponent_core is None else [x.clone() for x in self.opponent_core],
                "recent_returns": list(self.recent_returns), "recent_lengths": list(self.recent_lengths),
                "agent_returns": {a: list(d) for a, d in self.agent_returns.items()}, "episodes": self.episodes,
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict, venv_blob: bytes | None) -> bool:
        """Episode statistics always; with ``venv_blob`` (the pickled envs) also the envs mid-episode, the open
        rows, core states, seats and opponents, so the run continues exactly. Whether the envs continue (else they
        stand reset, as built: ``reseed``)."""
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state["recent_lengths"])
        for agent, returns in state["agent_returns"].items():
            self.agent_returns[agent].extend(returns)
        self.episodes = int(state["episodes"])
        self.rng.bit_generator.state = state["rng"]
        if venv_blob is None:
            return False
        self.venv.set_state(venv_blob)
        for name, r in self.rows.items():
            r.load_state_dict(state["rows"][name])
        to = lambda s: None if s is None else tuple(x.to(self.device) for x in s)  # noqa: E731
        self.core = {name: to(c) for name, c in state["core"].items()}
        self.acted_from = {name: to(c) for name, c in state["acted_from"].items()}
        self.seat, self.opponent = state["seat"].numpy().copy(), state["opponent"].numpy().copy()
        self.opponent_core = to(state["opponent_core"])
        return True

    def reseed(self, seeds: list[int]) -> None:
        """Reset the envs, not yet stepped since they were built, with other ``seeds`` (``RolloutCollector.reseed``)."""
        self.venv.seeds = list(seeds)
        self.venv.reset()
