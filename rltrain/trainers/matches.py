"""Evaluation on a multi-agent env: whole episodes on separate envs from fixed seeds (episode j from
``eval_seed + j``, as for one agent, trainers/episodes.py), every agent acting with its own policy on its own
observation; or, for self-play, the learner against a fixed opponent, its seat alternating by episode.

``play`` is the one loop: up to ``max_parallel`` episodes side by side, the acting agents grouped by the policy
that acts for them (one forward per policy per step). A seat given no policy plays uniformly random legal
moves (``random_action``), from a generator seeded by the eval seed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rltrain.data.agents import AgentsSpec
from rltrain.data.structs import Metrics, Policy, obs_buffer, obs_map
from rltrain.envs.multiagent import AgentEnv, random_action
from rltrain.models.agents import AgentPolicies, AgentPolicy
from rltrain.models.cores import reset_state
from rltrain.trainers.episodes import NO_LIMIT_CAP
from rltrain.trainers.evaluation import Evaluation
from rltrain.trainers.finite import NonFiniteError, non_finite_line

Seats = Callable[[int, str], Policy | None]  # (episode, agent) -> the policy acting for it, None: random moves


def play(make_env: Callable[..., Any], spec: AgentsSpec, seats: Seats, *, episodes: int, eval_seed: int,
         deterministic: bool = True, device: torch.device | None = None, max_steps: int | None = None,
         max_parallel: int = 16) -> list[dict[str, float]]:
    """Each episode's return of every agent (``AgentEnv.returns``), in episode order."""
    device = device or torch.device("cpu")
    width = max(1, min(episodes, max_parallel))
    envs = [AgentEnv(make_env(), spec, max_steps=max_steps) for _ in range(width)]
    templates = {a: obs_buffer(s.observation, (0,)) for a, s in zip(spec.agents, spec.specs, strict=True)}
    gen = torch.Generator(device=device).manual_seed(eval_seed)
    rng = np.random.default_rng(eval_seed)
    results: list[dict[str, float]] = [{} for _ in range(episodes)]
    episode_of = [-1] * width
    states: dict[tuple[int, str], tuple] = {}  # recurrent policies: (env, agent) -> its core state [1, 1, H]
    started = 0
    for k in range(width):
        envs[k].reset(seed=eval_seed + started)
        episode_of[k], started = started, started + 1
    active = list(range(width))
    try:
        with torch.inference_mode():
            while active:
                batches: dict[tuple[int, str], tuple[Policy, str, list[int]]] = {}
                actions: dict[int, dict] = {k: {} for k in active}
                for k in active:
                    for agent in envs[k].acting:
                        policy = seats(episode_of[k], agent)
                        if policy is None:
                            actions[k][agent] = random_action(spec.spec_of(agent), envs[k].obs[agent], rng)
                        else:
                            batches.setdefault((id(policy), agent), (policy, agent, []))[2].append(k)
                for policy, agent, ks in batches.values():
                    obs = obs_map(lambda t, *xs: torch.as_tensor(np.stack([np.asarray(x, t.dtype) for x in xs]),
                                                                 device=device),
                                  templates[agent], *[envs[k].obs[agent] for k in ks])
                    state = None
                    if getattr(policy, "recurrent", False):
                        parts = [states.get((k, agent)) or policy.initial_state(1) for k in ks]
                        state = tuple(torch.cat(xs, 1) for xs in zip(*parts, strict=True))
                    out = policy.act(obs, state, deterministic=deterministic, generator=gen)
                    for j, (k, a) in enumerate(zip(ks, out.action.cpu().numpy(), strict=True)):
                        actions[k][agent] = _env_action(spec, agent, a)
                        if state is not None:
                            states[(k, agent)] = tuple(x[:, j:j + 1] for x in out.state)
                still = []
                for k in active:
                    for c in envs[k].step(actions[k]):
                        if (k, c.agent) in states and (c.terminated or c.truncated):
                            states[(k, c.agent)] = reset_state(states[(k, c.agent)], np.ones(1, bool))
                    if not envs[k].over:
                        still.append(k)
                        continue
                    results[episode_of[k]] = dict(envs[k].returns)
                    states = {key: v for key, v in states.items() if key[0] != k}
                    if started < episodes:
                        envs[k].reset(seed=eval_seed + started)
                        episode_of[k], started = started, started + 1
                        still.append(k)
                active = still
    finally:
        for env in envs:
            env.close()
    return results


def _env_action(spec: AgentsSpec, agent: str, action: np.ndarray):
    s = spec.spec_of(agent)
    if s.action_kind == "discrete":
        return int(action)
    if s.action_kind == "box":
        low = np.asarray(s.action_low, np.float32).reshape(s.action_shape)
        return np.clip(action, low, np.asarray(s.action_high, np.float32).reshape(s.action_shape))
    return action


def evaluate_agents(policies: AgentPolicies, make_env: Callable[..., Any], *, episodes: int, eval_seed: int,
                    deterministic: bool = True, device: torch.device | None = None,
                    max_steps: int | None = None) -> np.ndarray:
    """Every agent with its own policy: returns [episodes, agents] (agents in ``possible_agents`` order)."""
    per_agent = policies.per_agent()
    results = play(make_env, policies.spec, lambda _, agent: per_agent[agent], episodes=episodes,
                   eval_seed=eval_seed, deterministic=deterministic, device=device, max_steps=max_steps)
    return np.array([[r.get(a, 0.0) for a in policies.spec.agents] for r in results], np.float64)


def evaluate_match(policies: AgentPolicies, make_env: Callable[..., Any], *, opponent: str, episodes: int,
                   eval_seed: int, deterministic: bool = True, device: torch.device | None = None,
                   max_steps: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Self-play's learner against ``opponent`` (``random``: uniformly random legal moves; ``latest``: the
    pool's newest version), the learner in seat ``j % 2`` in episode j. Returns (the learner's return per
    episode, its seat per episode)."""
    spec, pool = policies.spec, policies.pool
    learner = {a: policies.agent_policy(a) for a in spec.agents}
    other = None
    if opponent == "latest":  # the learner's view of each seat, on the newest pool member's weights
        member, group = pool.members[int(pool.latest)], policies.group_of(spec.agents[0])  # type: ignore[union-attr]
        other = {a: AgentPolicy(member, group, a, spec.spec_of(a)) for a in spec.agents}

    def seats(episode: int, agent: str) -> Policy | None:
        if spec.agents.index(agent) == episode % 2:
            return learner[agent]
        return None if other is None else other[agent]

    results = play(make_env, spec, seats, episodes=episodes, eval_seed=eval_seed, deterministic=deterministic,
                   device=device, max_steps=max_steps)
    seat = np.arange(episodes) % 2
    return np.array([r[spec.agents[s]] for r, s in zip(results, seat, strict=True)], np.float64), seat


def outcomes(returns: np.ndarray) -> dict[str, float]:
    """Win / draw / loss rates of a zero-sum game from one player's returns (> 0, == 0, < 0)."""
    n = max(len(returns), 1)
    return {"win": float((returns > 0).sum() / n), "draw": float((returns == 0).sum() / n),
            "loss": float((returns < 0).sum() / n)}


class AgentsEvaluation(Evaluation):
    """The loop's evaluations on a multi-agent env (``Evaluation``'s cadence, best checkpoint and timing):
    ``eval/return_mean`` is the mean over agents (and ``eval/return_mean/<agent>`` each agent's); with self-play
    it is the learner's return against random legal moves, with its win / draw / loss rates against them and
    against the pool's newest version. ``LoopState.eval_summary`` keeps what the summary reports of it."""

    def _evaluate(self, final: bool) -> Metrics:
        """(``Evaluation.__call__`` runs it: a stop request ends it at once, a new best is checkpointed after.)"""
        ev, t0 = self.s.eval, time.perf_counter()
        policies: AgentPolicies = self.algo.policy  # type: ignore[assignment]
        # every episode ends: eval.max_episode_steps, the env's limit, else the cap of an env that has none
        common = {"episodes": ev.episodes, "eval_seed": self.eval_seed, "device": self.device,
                  "max_steps": ev.max_episode_steps or self.s.env.max_episode_steps or NO_LIMIT_CAP}
        row: Metrics = {}
        summary: dict = {}
        for deterministic in (ev.deterministic, not ev.deterministic)[: 2 if ev.both_modes else 1]:
            headline = deterministic == ev.deterministic
            if policies.pool is None:
                rets = evaluate_agents(policies, self.s.env.make, deterministic=deterministic, **common)
                per_agent = dict(zip(policies.spec.agents, rets.mean(0).tolist(), strict=True))
                episode = rets.mean(1)
            else:
                episode, seat = evaluate_match(policies, self.s.env.make, opponent="random",
                                               deterministic=deterministic, **common)
                per_agent = {a: float(episode[seat == j].mean()) for j, a in enumerate(policies.spec.agents)
                             if (seat == j).any()}
                if headline:
                    summary["eval_vs_random"] = outcomes(episode)
                    latest, _ = evaluate_match(policies, self.s.env.make, opponent="latest",
                                               deterministic=deterministic, **common)
                    summary["eval_vs_latest"] = outcomes(latest)
                    row.update({f"eval/{k}_vs_random": v for k, v in summary["eval_vs_random"].items()})
                    row.update({f"eval/{k}_vs_latest": v for k, v in summary["eval_vs_latest"].items()})
            mean = float(episode.mean())
            if not math.isfinite(mean):
                counters = self.state.counters
                raise NonFiniteError(non_finite_line(f"evaluation return={mean}", counters["updates"],
                                                     counters["env_steps"], self.state.last_checkpoint))
            row.setdefault("eval/return_mean", mean)
            row.setdefault("eval/return_std", float(episode.std()))
            if headline:
                row.update({f"eval/return_mean/{a}": v for a, v in per_agent.items()})
                summary["final_eval_return_per_agent"] = per_agent
            if ev.both_modes:
                row[f"eval/return_mean_{'deterministic' if deterministic else 'stochastic'}"] = mean
        return self._record(row, summary, t0)

    def _record(self, row: Metrics, summary: dict, t0: float) -> Metrics:
        mean = row["eval/return_mean"]
        self.state.last_eval = (mean, row["eval/return_std"])
        self.state.last_eval_modes = {k.rpartition("_")[2]: v for k, v in row.items()
                                      if k.startswith("eval/return_mean_")}
        self.state.eval_summary = summary
        self.state.eval_s += time.perf_counter() - t0
        return row
