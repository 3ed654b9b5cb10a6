"""PettingZoo envs as rltrain steps them: who acts now, and what each acting agent's transition turned out to be.

An ``env.id`` whose factory returns a PettingZoo ``ParallelEnv`` or ``AECEnv`` is multi-agent (``is_multiagent``).
``AgentEnv`` puts both APIs behind one interface of *turns*:

- ``acting``: the agents that act now (a parallel env: every live agent; an AEC env: the selected agent);
- ``step({agent: action})`` -> the transitions that closed: for each agent, the reward it received from its
  action until it is next asked to act (AEC: PettingZoo's cumulative reward), whether it is done, and its next
  observation. A parallel env closes every acting agent's transition in the same step; an AEC env closes an
  agent's when its turn comes back, or at its dead step once it is done (the dead step is taken here).

``AgentVecEnv`` holds N of them with the single-agent vector env's fault reporting (one line naming the env
and its step, ``env.step_timeout_s``) and pickles them for resume when they pickle.

PettingZoo's env warnings (``pettingzoo.utils.env_logger``: an illegal move, an action out of bounds) are shown
once each and then counted (envs/pz_warnings.py).

Each agent's action reaches the env as its own action space's (envs/wrappers.py ``env_action``, the translation
a single-agent env gets from its wrappers): a ``Discrete(n, start=s)`` agent's policy picks an index 0..n-1 and
the env gets ``index + s``, a float64 Box agent gets float64 values.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rltrain.data.agents import AgentsSpec, flat_size, vector_space
from rltrain.data.structs import MASK_KEY, ObsSpace
from rltrain.envs.deadline import ENV_CALLS, CallWatch, EnvCallAbandoned, EnvFault, env_fault
from rltrain.envs.pz_warnings import ENV_WARNINGS, report_env_warnings
from rltrain.envs.spaces import _describe_obs, env_spec
from rltrain.envs.wrappers import env_action
from rltrain.errors import ConfigError


def is_multiagent(env: Any) -> bool:
    """A PettingZoo ``ParallelEnv`` or ``AECEnv`` (wrapped or not)."""
    if "pettingzoo.utils.env" not in sys.modules:
        return False  # no such env exists before its base classes' module is loaded: a Gymnasium run never imports it
    try:
        from pettingzoo.utils.env import AECEnv, ParallelEnv
    except ImportError:
        return False
    return isinstance(env, (AECEnv, ParallelEnv))


def api_of(env: Any) -> str:
    from pettingzoo.utils.env import AECEnv

    return "aec" if isinstance(env, AECEnv) else "parallel"


def with_agent_masks(factory: Any, mode: str) -> tuple[Any, str | None]:
    """``probe_env``'s action-mask choice for a PettingZoo env (envs/make.py): its masks are the ``action_mask``
    keys of the agents' Dict observations (PettingZoo's classic games), kept (``key``) or dropped (``drop``)."""
    spec = dataclasses.replace(factory, action_mask="key").spec()
    masked = [a for a, s in zip(spec.agents, spec.specs, strict=True) if s.masked]  # type: ignore[union-attr]
    if not masked:
        if mode == "on":
            raise ConfigError(f"algo.action_mask=on: no agent of env.id={factory.id} has a {MASK_KEY!r} key in its "
                              "observation; set algo.action_mask=auto")
        return dataclasses.replace(factory, action_mask="off"), None
    if mode == "off":
        return (dataclasses.replace(factory, action_mask="drop"),
                f"env.id={factory.id} offers action masks (the {MASK_KEY!r} key of its agents' observations); "
                "ignored: algo.action_mask=off")
    return (dataclasses.replace(factory, action_mask="key"),
            f"action masking on for env.id={factory.id}: the masks come from the {MASK_KEY!r} key of the "
            f"observations of {', '.join(masked)} (algo.action_mask={mode}; off ignores them)")


def builds_multiagent(make: Callable[[], Any]) -> bool:
    """``make()`` builds a PettingZoo env (built once, then closed)."""
    env = make()
    try:
        return is_multiagent(env)
    finally:
        env.close()


def agent_vector(factory: Any, seeds: list[int] | tuple[int, ...], num_envs: int) -> AgentVecEnv:
    """``num_envs`` envs of a multi-agent env factory (``envs.make.EnvFactory``) seeded with ``seeds``."""
    if len(seeds) != num_envs:
        raise ValueError(f"need {num_envs} seeds, got {len(seeds)}")
    return AgentVecEnv([factory.make] * num_envs, list(seeds), factory.spec(), max_steps=factory.max_episode_steps,
                       step_timeout_s=factory.step_timeout_s)


class _Spaces:
    """The two spaces of one agent, shaped as ``envs.make.env_spec`` reads a gymnasium env."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space):
        self.observation_space, self.action_space = observation_space, action_space


def agents_spec(env: Any, env_id: str, *, masks: bool = True) -> AgentsSpec:
    """The ``AgentsSpec`` of a PettingZoo env (reset here once: the global state is read from a live episode).
    An agent whose space rltrain cannot take is one line naming the agent. ``masks=False`` leaves the
    ``action_mask`` keys out of the agents' observations (``algo.action_mask=off``)."""
    agents = tuple(env.possible_agents)
    if not agents:
        raise ConfigError(f"env.id={env_id}: the PettingZoo env has no possible_agents")
    specs = []
    for agent in agents:
        space = env.action_space(agent)
        # Discrete(n, start=s): the policy picks 0..n-1 and AgentEnv steps the env with index + s (as DiscreteStart
        # does for one agent); the spec records s for the tools that hand actions to the user's env
        start = int(space.start) if isinstance(space, gym.spaces.Discrete) else 0
        try:
            spec = env_spec(_Spaces(env.observation_space(agent), gym.spaces.Discrete(int(space.n)) if start
                                    else space), env_id)
            specs.append(dataclasses.replace(spec, action_start=(start,)) if start else spec)
        except ConfigError as err:  # the same line as for one agent, naming which, and the fix for a PettingZoo env
            what = str(err).split("; wrap the env", 1)[0]
            what = what.replace(f"env.id={env_id}:", f"env.id={env_id}: agent {agent!r}:", 1)
            raise ConfigError(f"{what}; make your env factory return agents with spaces rltrain takes (e.g. with "
                              "SuperSuit's wrappers)") from None
        if not masks and specs[-1].masked:
            obs = specs[-1].observation
            parts = tuple((k, sub) for k, sub in obs.parts if k != MASK_KEY)
            specs[-1] = dataclasses.replace(specs[-1], obs_space=dataclasses.replace(obs, parts=parts))
    env.reset(seed=0)
    state, value = None, global_state(env)
    if value is not None:
        space = getattr(env, "state_space", None)
        state = _describe_obs(space) if isinstance(space, gym.spaces.Box) else \
            ObsSpace("box", value.shape, value.dtype.name, name=f"Box{value.shape}")
    sizes = [flat_size(s.observation) for s in specs]
    joined = None if any(n is None for n in sizes) else vector_space(sum(sizes), "joined observations")
    return AgentsSpec(env_id, api_of(env), agents, tuple(specs), state=state, joined=joined)  # type: ignore[arg-type]


def global_state(env: Any) -> np.ndarray | None:
    """``env.state()`` as an array of numbers, or None where the env has no global state: no ``state`` method
    (PettingZoo's raw rock-paper-scissors keeps a dict named ``state`` that shadows it, so its wrappers' ``state()``
    raises TypeError), one that raises (NotImplementedError is PettingZoo's default; any other error is taken
    the same way: the run goes on with the joined observations, and ``algo.global_state=env`` is refused), or a
    value that is not an array of numbers."""
    method = getattr(env, "state", None)
    if not callable(method):
        return None
    try:
        value = np.asarray(method())
    except Exception:
        return None
    return value if value.dtype.kind in "biuf" and value.size else None


def flatten_obs(obs: Any, space: ObsSpace) -> np.ndarray:
    """One observation's numbers in one float32 vector, the action mask left out (the joined global state): a
    Discrete index one-hot (as the encoders read it), a MultiDiscrete one one-hot per component."""
    if space.kind == "dict":  # a Tuple's parts are keyed "0", "1", ...
        parts = [flatten_obs(obs[k] if isinstance(obs, dict) else obs[int(k)], sub)
                 for k, sub in space.parts if k != MASK_KEY]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)
    if space.kind == "discrete":
        return np.eye(space.n, dtype=np.float32)[int(obs) - space.start]
    if space.kind == "multi_discrete":
        return np.concatenate([np.eye(n, dtype=np.float32)[int(v)]
                               for n, v in zip(space.nvec, np.asarray(obs).reshape(-1), strict=True)])
    return np.asarray(obs, np.float32).reshape(-1)


class UnknownAgent(ValueError):
    """An agent the env's ``possible_agents`` does not list: no policy was built for it (the vector env's
    ``EnvFault`` line names the env and its step)."""


@dataclass
class Closed:
    """An agent's transition, closed: the reward it received since it acted, whether it is done, its next
    observation (the last one when done)."""

    agent: str
    reward: float
    terminated: bool
    truncated: bool
    obs: Any


class AgentEnv:
    """One PettingZoo env as turns (module docstring). ``max_steps`` (``env.max_episode_steps``) truncates every
    agent after that many steps (AEC: turns). ``returns``: each agent's rewards summed over the episode."""

    def __init__(self, env: Any, spec: AgentsSpec, *, max_steps: int | None = None):
        self.env, self.spec, self.max_steps = env, spec, max_steps
        ENV_WARNINGS.install()
        self.aec = spec.api == "aec"
        self.acting: list[str] = []
        self.obs: dict[str, Any] = {}
        self.latest: dict[str, Any] = {}  # every agent's last observation (the joined global state)
        self.open: set[str] = set()  # AEC: agents that acted and await their next turn
        self.returns = dict.fromkeys(spec.agents, 0.0)
        self.steps, self.over = 0, False
        self.to_env = self._translations()

    def _translations(self) -> dict[str, Any]:
        """The agents whose actions need translating into their own space's, found once (the others' pass as
        they are)."""
        return {a: f for a in self.spec.agents if (f := env_action(self.env.action_space(a))) is not None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "to_env" not in state:  # envs a checkpoint saved mid-episode before actions were translated
            self.to_env = self._translations()

    def reset(self, seed: int | None = None) -> None:
        self.steps, self.over, self.open = 0, False, set()
        self.returns = dict.fromkeys(self.spec.agents, 0.0)
        self.latest = {}
        if self.aec:
            self.env.reset(seed=seed)
            self._advance()
        else:
            obs, _ = self.env.reset(seed=seed)
            self._known(obs, self.env.agents)
            self.obs = dict(obs)
            self.latest.update(obs)
            self.acting = list(self.env.agents)
        if not self.acting:
            raise RuntimeError("reset() left no agent to act")

    def step(self, actions: dict[str, Any]) -> list[Closed]:
        """Act for ``acting`` (a dict over exactly those agents); the transitions that closed."""
        self.steps += 1
        ENV_CALLS[0] += 1  # progress, for a worker's heartbeat (evaluation steps envs outside a vector env)
        cut = bool(self.max_steps) and self.steps >= self.max_steps
        to_env = self.to_env
        if self.aec:
            agent = self.acting[0]
            self.env.step(to_env[agent](actions[agent]) if agent in to_env else actions[agent])
            self.open.add(agent)
            return self._truncate_all() if cut and self.env.agents else self._advance()
        obs, rewards, terms, truncs, _ = self.env.step(
            {a: to_env[a](x) if a in to_env else x for a, x in actions.items()} if to_env else actions)
        self._known(obs, self.env.agents)
        closed = []
        for agent in actions:
            reward = float(rewards.get(agent, 0.0))
            self.returns[agent] += reward
            term = bool(terms.get(agent, False))
            closed.append(Closed(agent, reward, term, (bool(truncs.get(agent, False)) or cut) and not term,
                                 obs.get(agent, self.latest.get(agent))))
        self.latest.update(obs)
        self.obs = dict(obs)
        self.acting = [] if cut else [a for a in self.env.agents if a in obs]
        self.over = not self.acting
        return closed

    def _advance(self) -> list[Closed]:
        """AEC: close the transitions of the agents met on the way to the next live agent (dead steps taken)."""
        env, closed = self.env, []
        while env.agents:
            agent = env.agent_selection
            self._known((agent,))
            obs, reward, term, trunc, _ = env.last()
            self.returns[agent] += float(reward)
            self.latest[agent] = obs
            if agent in self.open:
                self.open.discard(agent)
                closed.append(Closed(agent, float(reward), bool(term), bool(trunc) and not term, obs))
            if term or trunc:
                env.step(None)  # the dead step PettingZoo asks of a done agent
                continue
            self.acting, self.obs = [agent], {agent: obs}
            return closed
        self.acting, self.over = [], True
        return closed

    def _known(self, *groups: Any) -> None:
        """Where the env's output is first read: an agent ``possible_agents`` does not list is one line naming it,
        not a KeyError deep in the model (the policies are built for those agents only, before the first step)."""
        for agent in (a for group in groups for a in group if a not in self.returns):
            raise UnknownAgent(f"agent {agent!r} of env.id={self.spec.env_id} is not in its possible_agents "
                               f"{list(self.spec.agents)}: list every agent that may appear there")

    def _truncate_all(self) -> list[Closed]:
        """AEC at ``max_steps``: every agent that acted is cut, with the rewards it has received since."""
        rewards = self.env._cumulative_rewards
        closed = []
        for agent in list(self.env.agents):
            reward = float(rewards.get(agent, 0.0))
            self.returns[agent] += reward
            if agent in self.open:
                closed.append(Closed(agent, reward, False, True, self.env.observe(agent)))
        self.open, self.acting, self.over = set(), [], True
        return closed

    def state(self, mode: str) -> np.ndarray:
        """The global state now: ``env.state()`` (``mode="env"``), or (``joined``) every agent's observation
        flattened and concatenated in ``possible_agents`` order, zeros for an agent not in the episode."""
        if mode == "env":
            return np.asarray(self.env.state())
        parts = []
        for agent, spec in zip(self.spec.agents, self.spec.specs, strict=True):
            obs = self.env.observe(agent) if self.aec and agent in self.env.agents else self.latest.get(agent)
            parts.append(np.zeros(flat_size(spec.observation) or 0, np.float32) if obs is None
                         else flatten_obs(obs, spec.observation))
        return np.concatenate(parts)

    def close(self) -> None:
        self.env.close()


class AgentVecEnv:
    """N ``AgentEnv``s stepped by the collector; reset with ``seeds`` (each env's first reset; later resets
    continue the env's own generator). Faults are one line naming the env and its step (``EnvFault``)."""

    def __init__(self, fns: list[Callable[[], Any]], seeds: list[int], spec: AgentsSpec, *,
                 max_steps: int | None = None, step_timeout_s: float | None = None):
        self.watch = CallWatch(step_timeout_s)
        self.spec, self.seeds = spec, list(seeds)
        self.envs = [AgentEnv(fn(), spec, max_steps=max_steps) for fn in fns]
        self.num_envs = len(self.envs)
        self.steps = 0

    def reset(self, i: int | None = None) -> None:
        """Reset env ``i`` (None: all of them, each with its seed)."""
        for k in range(self.num_envs) if i is None else (i,):
            self._call(k, lambda env, k=k: env.reset(seed=self.seeds[k] if i is None else None), "reset()")

    def step(self, i: int, actions: dict[str, Any]) -> list[Closed]:
        self.steps += 1
        return self._call(i, lambda env: env.step(actions), "step()")

    def _call(self, i: int, fn: Callable[[AgentEnv], Any], what: str):
        watch = self.watch
        watch.begin(self.steps)
        watch.env = i
        try:
            return fn(self.envs[i])
        except (EnvFault, EnvCallAbandoned):
            raise
        except Exception as err:  # the user's env: one line naming it (the traceback is chained)
            raise env_fault(err, i, self.envs[i].steps, what) from err
        finally:
            watch.end()

    def get_state(self) -> bytes | None:
        """The envs mid-episode (with whose turn it is and who awaits one), or None when they do not pickle."""
        buffer = io.BytesIO()
        try:
            _StatePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(self.envs)
        except Exception:
            return None
        return buffer.getvalue()

    def set_state(self, blob: bytes) -> None:
        for env in self.envs:
            env.close()
        self.envs = pickle.loads(blob)

    def pop_real_episodes(self) -> None:
        return None

    def pop_successes(self) -> list[bool]:
        return []  # the agents' episodes report returns per agent, no success flag

    def close(self) -> None:
        self.watch.close()
        for env in self.envs:
            env.close()
        report_env_warnings()


class _StatePickler(pickle.Pickler):
    """Pickles an object that pickles itself by its constructor's arguments (gymnasium's ``EzPickle``, which
    PettingZoo's envs use: unpickled, it would be a fresh env at its first step) by its attributes instead, so
    the env comes back mid-episode."""

    def reducer_override(self, obj):
        if "_ezpickle_args" in getattr(obj, "__dict__", {}):
            return _bare, (type(obj),), obj.__dict__, None, None, _set_attributes  # not EzPickle's __setstate__
        if type(obj).__module__.startswith("pygame."):  # a render surface (MPE makes one unasked): not the episode
            return _none, ()
        return NotImplemented


def _bare(cls: type) -> Any:
    return cls.__new__(cls)


def _none() -> None:
    return None


def _set_attributes(obj: Any, state: dict) -> None:
    obj.__dict__.update(state)
