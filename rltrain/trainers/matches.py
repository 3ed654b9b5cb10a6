"""Evaluation on a multi-agent env: whole episodes on separate envs from fixed seeds (episode j from
``eval_seed + j``, as for one agent, trainers/episodes.py), every agent acting with its own policy on its own
observation; or, for self-play, the learner against a fixed opponent, its seat alternating by episode.

``play`` is the one loop: up to ``max_parallel`` episodes side by side, the acting agents grouped by the policy
that acts for them (one forward per policy per step). A seat given no policy plays uniformly random legal
moves (``random_action``), from a generator seeded by the eval seed.

A constant-sum game (every agent's return summing to the same constant in each episode: ``constant_sum``, from
the episodes played; zero-sum games, and games paying 1 to the winner and 0 to the loser) trained without
self-play has a mean over agents that is that constant over the number of agents whatever they learn; its
evaluation plays each agent's policy against random legal moves instead (``AgentsEvaluation``), as self-play's
does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rltrain.data.agents import AgentsSpec
from rltrain.data.structs import MASK_KEY, EnvSpec, Metrics, Policy, obs_buffer, obs_map
from rltrain.envs.multiagent import AgentEnv
from rltrain.envs.pz_warnings import report_env_warnings
from rltrain.models.agents import AgentPolicies, AgentPolicy
from rltrain.models.cores import reset_state
from rltrain.trainers.episodes import NO_LIMIT_CAP
from rltrain.trainers.evaluation import Evaluation
from rltrain.trainers.finite import NonFiniteError, non_finite_line

Seats = Callable[[int, str], Policy | None]  # (episode, agent) -> the policy acting for it, None: random moves
PROBE_EPISODES = 4  # random games the zero-sum checks play (self-play's, and an evaluation's that cannot tell)
PROBE_STEPS = 2000  # ... and at most this many steps in all
CONSTANT_SUM_EPISODES = 4  # episodes a non-zero constant sum is claimed from, at least (``constant_sum``)


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
    """The learner against ``opponent`` (``random``: uniformly random legal moves; ``latest``: the self-play
    pool's newest version) in every other seat, the learner in seat ``j % agents`` in episode j: self-play's one
    policy, or else the policy of the agent in that seat. Returns (the learner's return per episode, its seat
    per episode)."""
    spec, pool = policies.spec, policies.pool
    learner = {a: policies.agent_policy(a) for a in spec.agents}
    other = None
    if opponent == "latest":  # the learner's view of each seat, on the newest pool member's weights
        member, group = pool.members[int(pool.latest)], policies.group_of(spec.agents[0])  # type: ignore[union-attr]
        other = {a: AgentPolicy(member, group, a, spec.spec_of(a)) for a in spec.agents}

    def seats(episode: int, agent: str) -> Policy | None:
        if spec.agents.index(agent) == episode % len(spec.agents):
            return learner[agent]
        return None if other is None else other[agent]

    results = play(make_env, spec, seats, episodes=episodes, eval_seed=eval_seed, deterministic=deterministic,
                   device=device, max_steps=max_steps)
    seat = np.arange(episodes) % len(spec.agents)
    return np.array([r[spec.agents[s]] for r, s in zip(results, seat, strict=True)], np.float64), seat


def step_cap(eval_steps: int | None, env_steps: int | None) -> int:
    """Where an evaluation episode of a multi-agent env ends at the latest: ``eval.max_episode_steps``, else
    ``env.max_episode_steps``, else ``NO_LIMIT_CAP`` (a game with no limit of its own still ends). The run's
    evaluation and the tools' (``rltrain-eval``, ``rltrain.evaluate``) alike."""
    return eval_steps or env_steps or NO_LIMIT_CAP


def headline_vs_random(policies: AgentPolicies, make_env: Callable[..., Any], rets: np.ndarray, *, episodes: int,
                       eval_seed: int, **common: Any) -> tuple[np.ndarray | None, float | None]:
    """Where a run's evaluation headlines the learner against random legal moves (``AgentsEvaluation``): under
    self-play, and in a constant-sum game (``game_constant`` of the head-to-head ``rets`` [episodes, agents]),
    whose mean over agents is the same whatever is learnt. Returns (the learner's return per episode against
    random moves, seats alternating: ``evaluate_match``; the game's constant, 0 under self-play), else
    (None, None)."""
    spec = policies.spec
    constant = 0.0 if policies.pool is not None else game_constant(
        [dict(zip(spec.agents, r, strict=True)) for r in rets.tolist()], make_env, spec, seed=eval_seed)
    if constant is None:
        return None, None
    return evaluate_match(policies, make_env, opponent="random", episodes=episodes, eval_seed=eval_seed,
                          **common)[0], constant


def random_action(spec: EnvSpec, obs: Any, rng: np.random.Generator) -> Any:
    """A uniformly random action, legal under the observation's action mask where it carries one (the
    evaluation opponent, the self-play check)."""
    if spec.masked and spec.action_kind == "discrete":
        return int(rng.choice(np.flatnonzero(np.asarray(obs[MASK_KEY]))))
    if spec.action_kind == "discrete":
        return int(rng.integers(spec.n_actions))
    if spec.action_kind == "multi_discrete":
        return (rng.integers(0, np.asarray(spec.nvec)) + np.asarray(spec.action_start)).reshape(spec.action_shape)
    if spec.action_kind == "multi_binary":
        return rng.integers(0, 2, spec.action_shape).astype(np.int8)
    low, high = np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32)
    return rng.uniform(low, high).astype(np.float32).reshape(spec.action_shape)


def random_games(make: Callable[[], Any], spec: AgentsSpec, *, seed: int = 0) -> list[dict[str, float]]:
    """Every agent's return in each of ``PROBE_EPISODES`` games of random legal moves (``PROBE_STEPS`` steps at
    most in all: a game still going then counts as it stands)."""
    rng = np.random.default_rng(seed)
    env = AgentEnv(make(), spec)
    games, steps = [], 0
    try:
        for episode in range(PROBE_EPISODES):
            env.reset(seed=seed + episode)
            while not env.over and steps < PROBE_STEPS:
                env.step({a: random_action(spec.spec_of(a), env.obs[a], rng) for a in env.acting})
                steps += 1
            games.append(dict(env.returns))
    finally:
        env.close()
    return games


def sums_to_zero(returns: dict[str, float]) -> bool:
    """One episode's returns of all agents add up to zero (up to float rounding)."""
    return _sums_to(returns, 0.0)


def _sums_to(returns: dict[str, float], total: float) -> bool:
    """One episode's returns add up to ``total``, up to float rounding at the returns' own scale."""
    return abs(sum(returns.values()) - total) <= 1e-6 * max(1.0, abs(total), *(abs(r) for r in returns.values()))


def constant_sum(episodes: list[dict[str, float]]) -> float | None:
    """The constant every episode's returns of all agents sum to, where the episodes show a constant-sum game
    (then the mean over agents is that constant over the number of agents, whatever they learn); else None:
    sums that differ, or episodes that cannot tell. Zero (a zero-sum game) is told by any episode with a non-zero
    return: one agent's gain is another's loss. A non-zero constant needs ``CONSTANT_SUM_EPISODES`` episodes at
    least whose splits differ (a win for each side, a draw): one split every time could as well be a fixed
    payout (a cooperative game paying everyone 1), and draws only (0.5 each) tell no more than zeros do."""
    if not episodes:
        return None
    total = sum(episodes[0].values())
    if not all(_sums_to(r, total) for r in episodes):
        return None
    if _sums_to(episodes[0], 0.0):
        return 0.0 if any(v != 0 for r in episodes for v in r.values()) else None
    splits = {tuple(np.round(list(r.values()), 6)) for r in episodes}
    return round(total, 6) if len(episodes) >= CONSTANT_SUM_EPISODES and len(splits) > 1 else None


def game_constant(episodes: list[dict[str, float]], make: Callable[[], Any], spec: AgentsSpec, *,
                  seed: int) -> float | None:
    """``constant_sum`` of the policies' ``episodes`` and of a few games of random legal moves (played where the
    episodes' sums agree: policies that always draw, or always split the same way, tell nothing, and a game that
    sums to a constant only under the policies' moves is not constant-sum)."""
    if episodes and all(_sums_to(r, sum(episodes[0].values())) for r in episodes):
        episodes = episodes + random_games(make, spec, seed=seed)
    return constant_sum(episodes)


def zero_sum_problem(make: Callable[[], Any], spec: AgentsSpec, *, seed: int = 0) -> str | None:
    """Why the env is not a two-player zero-sum game (what self-play needs), or None: two agents with the same
    spaces, whose rewards sum to zero over each of a few games of random legal moves."""
    if len(spec.agents) != 2:
        return f"it has {len(spec.agents)} agents ({', '.join(spec.agents)}), not two players"
    if not spec.homogeneous:
        return "its two players observe or act in different spaces (one policy must play both seats)"
    for game in random_games(make, spec, seed=seed):
        if not sums_to_zero(game):
            returns = ", ".join(f"{a} {r:g}" for a, r in game.items())
            return f"its players' returns do not sum to zero (a game of random moves: {returns})"
    return None


def outcomes(returns: np.ndarray, *, share: float = 0.0) -> dict[str, float]:
    """Win / draw / loss rates of a constant-sum game from one player's returns: above, at or below ``share``,
    its fair share of the constant (the constant over the number of players: 0 in a zero-sum game, 0.5 where a
    win pays 1 and a loss 0)."""
    n = max(len(returns), 1)
    draw = np.isclose(returns, share, rtol=0.0, atol=1e-6 * max(1.0, abs(share)))
    return {"win": float(((returns > share) & ~draw).sum() / n), "draw": float(draw.sum() / n),
            "loss": float(((returns < share) & ~draw).sum() / n)}


class AgentsEvaluation(Evaluation):
    """The loop's evaluations on a multi-agent env (``Evaluation``'s cadence, best checkpoint and timing):
    ``eval/return_mean`` is the mean over agents (and ``eval/return_mean/<agent>`` each agent's); with self-play
    it is the learner's return against random legal moves, with its win / draw / loss rates against them and
    against the pool's newest version. A constant-sum game without self-play (zero-sum included; ``constant``,
    decided at this session's first evaluation from its episodes and a few random games: ``game_constant``) is
    evaluated as self-play is against random moves, each agent's policy in its own seat, its head-to-head
    returns beside. ``LoopState.eval_summary`` keeps what the summary reports of it."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.decided = False  # whether an evaluation has decided ``constant`` yet
        self.constant: float | None = None  # what the agents' returns sum to in every episode (None: no constant)

    def _evaluate(self, final: bool) -> Metrics:
        """(``Evaluation.__call__`` runs it: a stop request ends it at once, a new best is checkpointed after.)"""
        ev, t0 = self.s.eval, time.perf_counter()
        policies: AgentPolicies = self.algo.policy  # type: ignore[assignment]
        agents = policies.spec.agents
        # every episode ends: eval.max_episode_steps, the env's limit, else the cap of an env that has none
        common = {"episodes": ev.episodes, "eval_seed": self.eval_seed, "device": self.device,
                  "max_steps": step_cap(ev.max_episode_steps, self.s.env.max_episode_steps)}
        row: Metrics = {}
        summary: dict = {}
        share = 0.0  # a player's fair share of a constant-sum game's constant: a draw's return
        for deterministic in (ev.deterministic, not ev.deterministic)[: 2 if ev.both_modes else 1]:
            headline = deterministic == ev.deterministic
            opponents: tuple[str, ...] = ("random", "latest")
            if policies.pool is None:
                rets = evaluate_agents(policies, self.s.env.make, deterministic=deterministic, **common)
                per_agent = dict(zip(agents, rets.mean(0).tolist(), strict=True))
                episode, opponents = rets.mean(1), ()
                if (constant := self._constant(rets)) is not None:
                    share = constant / len(agents)
                    if headline:
                        if constant == 0:  # what summaries said before constant sums were told apart: kept
                            summary["zero_sum"] = True
                        summary.update(constant_sum=constant, eval_head_to_head_per_agent=per_agent)
                        row.update({f"eval/head_to_head/{a}": v for a, v in per_agent.items()})
                    opponents = ("random",)
            if opponents:
                episode, seat = evaluate_match(policies, self.s.env.make, opponent="random",
                                               deterministic=deterministic, **common)
                per_agent = {a: float(episode[seat == j].mean()) for j, a in enumerate(agents) if (seat == j).any()}
                for opponent in opponents if headline else ():
                    returns = episode if opponent == "random" else evaluate_match(
                        policies, self.s.env.make, opponent=opponent, deterministic=deterministic, **common)[0]
                    summary[f"eval_vs_{opponent}"] = outcomes(returns, share=share)
                    row.update({f"eval/{k}_vs_{opponent}": v for k, v in summary[f"eval_vs_{opponent}"].items()})
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
        if final:
            self._final_notes(summary)
        return self._record(row, summary, t0)

    def _constant(self, rets: np.ndarray) -> float | None:
        """The constant the game's returns sum to, or None (decided once a session, ``game_constant``): from the
        evaluation's head-to-head episodes (``rets`` [episodes, agents]) and a few games of random moves."""
        if not self.decided:
            spec = self.algo.policy.spec  # type: ignore[union-attr]
            episodes = [dict(zip(spec.agents, r, strict=True)) for r in rets.tolist()]
            self.constant = game_constant(episodes, self.s.env.make, spec, seed=self.eval_seed)
            self.decided = True
        return self.constant

    def _final_notes(self, summary: dict) -> None:
        """What the end of the run says once: a constant-sum game's headline, and PettingZoo's repeated warnings."""
        if "constant_sum" in summary:
            constant, n = summary["constant_sum"], len(summary["eval_head_to_head_per_agent"])
            rates = ", ".join(f"{k} {v:.2f}" for k, v in summary["eval_vs_random"].items())
            game, total = ("zero-sum", "zero") if constant == 0 else ("constant-sum", f"{constant:g}")
            # self-play's probe takes zero-sum games only: suggested where it would be accepted
            tip = "; algo.self_play=true trains one policy against its past versions" if constant == 0 else ""
            print(f"[rltrain] env.id={self.s.env.id} is a {game} game (its agents' returns summed to {total} in every "
                  f"episode): their mean is {constant / n:g} whatever they learn (so is train_return_last100), so "
                  f"final_eval_return is each agent's policy against random legal moves ({rates}; head to head: "
                  f"eval_head_to_head_per_agent){tip}", flush=True)
        report_env_warnings()

    def _record(self, row: Metrics, summary: dict, t0: float) -> Metrics:
        mean = row["eval/return_mean"]
        self.state.last_eval = (mean, row["eval/return_std"])
        self.state.last_eval_modes = {k.rpartition("_")[2]: v for k, v in row.items()
                                      if k.startswith("eval/return_mean_")}
        self.state.eval_summary = summary
        self.state.eval_s += time.perf_counter() - t0
        return row
