"""Environment factory: Gymnasium ids or user import paths -> a lean vector env with same-step autoreset.

``env.id`` is one of
- a registered Gymnasium id (``CartPole-v1``); ids of known namespaces (``ALE/Pong-v5``,
  ``MinAtar/Breakout-v1``) register their package first, or name the pip extra when it is missing;
- Gymnasium's ``module:EnvId`` (``minigrid:MiniGrid-Empty-5x5-v0``): import the module (which registers
  its envs), then ``gym.make`` the id;
- our ``package.module:Factory``: a callable returning a ``gymnasium.Env``, called with ``env.kwargs``.
The two ``a:b`` forms are told apart after the import: ``b`` registered -> an env id, else a factory.

A module is looked for among the installed packages and then in ``env.search_path``: the directory
``rltrain`` was launched from, recorded in the run's config by the CLI (``my_env.py`` beside the user
imports as ``my_env:MyEnv`` without PYTHONPATH). It is a recorded absolute path, so Hydra's change of
working directory, agent / actor / rank processes and SLURM jobs (which start elsewhere) all find it.

``VecEnv.step`` returns, for every env, the *true* next observation (``final_obs``, the terminal one
when an episode ended) and the observation to act on next (already reset). So every step the collector
records is a real transition: Gymnasium 1.x's default NEXT_STEP autoreset would instead hand back one
fake transition per episode boundary that has to be masked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
import sys
from dataclasses import dataclass, field, fields
from typing import Any

import gymnasium as gym

from rltrain.data.agents import AgentsSpec
from rltrain.data.structs import MASK_KEY, EnvSpec
from rltrain.envs import multiagent as pz  # PettingZoo envs
from rltrain.envs.goals import with_goal_reward
from rltrain.envs.multiagent import AgentVecEnv
from rltrain.envs.plugins import register_namespace, register_plugins
from rltrain.envs.spaces import (  # noqa: F401  env_spec, _describe_obs, stacked_frames: re-exported
    MASK_SOURCES,
    ActionMaskObservation,
    TupleAsDict,
    _describe_obs,
    env_spec,
    has_tuple,
    mask_size,
    mask_source,
    stacked_frames,
)
from rltrain.envs.vector import AsyncVecEnv, VecEnv
from rltrain.envs.wrappers import apply_wrappers, with_env_actions
from rltrain.errors import ConfigError, UnknownEnv, UserCodeError, close_matches, described

# id namespace -> (module that registers it, pip extra of rltrain that installs it)
# a top-level package (or a word in a DependencyNotInstalled message) -> rltrain extra
_EXTRAS = {"ale_py": "atari", "opencv": "atari", "cv2": "atari", "minatar": "minatar", "mujoco": "mujoco",
           "Box2D": "box2d", "box2d": "box2d", "pygame": "box2d"}


def make_env(env_id: str, kwargs: dict[str, Any] | None = None, *, wrappers: list | tuple | None = None,
             max_episode_steps: int | None = None, render_mode: str | None = None,
             search_path: str | None = None, action_mask: str = "off") -> gym.Env:
    """Build one env (see the module docstring for ``env_id`` and ``search_path``), then apply
    ``env.wrappers`` in order, then rltrain's own (``envs/spaces.py``): Tuple observations as Dicts, a Discrete
    action space with a start as Discrete(n) (``wrappers.DiscreteStart``), actions cast to the action space's
    own dtype where it is not the policy's (``wrappers.ActionDtype``: a float64 Box gets float64), and with
    ``action_mask`` (a ``spaces.MASK_SOURCES`` entry, or "drop") the env's action mask as an observation key."""
    kwargs = dict(kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if search_path:
        add_search_path(search_path)
    try:
        env = _make_base(env_id, kwargs, max_episode_steps, search_path)
        if pz.is_multiagent(env):  # its agents' spaces and turns are read as they are (envs/multiagent.py)
            if wrappers:
                raise ConfigError(f"env.wrappers apply to a Gymnasium env; env.id={env_id} is a PettingZoo multi-agent "
                                  "env: wrap it in your factory (e.g. with SuperSuit) and set env.wrappers=[]")
            return env
        env = apply_wrappers(env, wrappers) if wrappers else env
        if has_tuple(env.observation_space):
            env = TupleAsDict(env)
        # Discrete(n, start=s): rltrain picks 0..n-1, the env gets index + s; a float64 Box gets float64 actions
        env = with_env_actions(env)
        return ActionMaskObservation(env, action_mask) if action_mask != "off" else env
    except gym.error.DependencyNotInstalled as err:  # from gymnasium, a wrapper or a user factory
        raise ConfigError(f"env.id={env_id} needs a package that is not installed: "
                          f"{_install_hint(str(err))}") from None
    except ImportError as err:  # an optional simulator imported (by us, Gymnasium or a factory), not installed
        if (top := (getattr(err, "name", None) or "").split(".")[0]) not in _EXTRAS:
            raise
        raise ConfigError(f"env.id={env_id} needs {top}, which is not installed: {_install_hint(top)}") from None


def add_search_path(path: str) -> None:
    """Let imports find modules in ``path`` (after the installed packages: a local file never shadows one)."""
    path = os.path.abspath(path)
    if path not in sys.path:
        sys.path.append(path)
        importlib.invalidate_caches()


def _make_base(env_id: str, kwargs: dict[str, Any], max_episode_steps: int | None,
               search_path: str | None) -> gym.Env:
    module_name, sep, name = env_id.partition(":")
    if sep and module_name and "/" not in module_name:
        module = _import(module_name, env_id, search_path)
        if name in gym.registry:
            return _gym_make(name, kwargs, max_episode_steps)
        if "/" in name or not hasattr(module, name):  # an env id never registered, or a missing factory
            script = ("; __main__ is the running program: an env defined in the script that trained is found only "
                      "by a script that defines it (rltrain.evaluate there), or move it to a module: "
                      f"env.id=my_envs:{name}") if module_name == "__main__" else ""
            raise ConfigError(f"env.id={env_id}: {module_name!r} registers no env {name!r} and has no "
                              f"factory {name!r}{close_matches(name, gym.registry.keys())}{script}")
        env = _call_factory(getattr(module, name), env_id, kwargs)
        if pz.is_multiagent(env) or not max_episode_steps:  # a multi-agent env counts its own (envs/multiagent.py)
            return env
        return gym.wrappers.TimeLimit(env, max_episode_steps)
    register_namespace(env_id)
    if env_id not in gym.registry and "/" not in env_id:
        register_plugins()  # ale-py also registers the un-namespaced ids SB3 / CleanRL use (PongNoFrameskip-v4)
    if env_id not in gym.registry:
        raise UnknownEnv(f"env.id: unknown Gymnasium env {env_id!r}{close_matches(env_id, gym.registry.keys())}"
                          " (or give 'module:EnvId' or an import path 'package.module:Factory')")
    return _gym_make(env_id, kwargs, max_episode_steps)


def _import(module_name: str, env_id: str, search_path: str | None):
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        missing = getattr(err, "name", None) or module_name
        top = missing.split(".")[0]
        head = f"env.id={env_id}: cannot import {module_name!r}"
        if top in _EXTRAS:
            raise ConfigError(f"{head}: pip install 'rltrain[{_EXTRAS[top]}]'") from None
        if not isinstance(err, ModuleNotFoundError):  # found, but it failed while importing
            raise ConfigError(f"{head} ({err})") from None
        if not (module_name + ".").startswith(missing + "."):  # found, but a module it imports is missing
            raise ConfigError(f"{head}: it imports {missing!r}, which is not installed") from None
        first = module_name.split(".")[0]
        if missing != first:  # the package is there, the module inside it is not
            raise ConfigError(f"{head}: the package {first!r} has no module {missing!r}") from None
        where = f"the launch directory {search_path} (env.search_path)" if search_path else \
            f"the working directory {os.getcwd()}"
        fix = (f"run rltrain from the directory that holds {first}.py or set env.search_path=DIR"
               if "." not in module_name else
               f"run rltrain from the directory that holds the package {first}/, set env.search_path=DIR or "
               "pip install the package")
        raise ConfigError(f"{head}: no {first}.py or {first}/ in {where} nor among the installed packages "
                          f"({sys.prefix}); {fix}") from None


def _gym_make(env_id: str, kwargs: dict[str, Any], max_episode_steps: int | None) -> gym.Env:
    extra = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    spec = gym.spec(env_id) if env_id in gym.registry else None
    if spec is not None and "mujoco" in str(spec.entry_point):
        _quiet_mujoco()
    try:
        return gym.make(env_id, disable_env_checker=True, **extra, **kwargs)
    except TypeError as err:
        raise ConfigError(f"env.kwargs for {env_id}: {err}") from None


def _quiet_mujoco() -> None:
    """MuJoCo 4 prints each model deprecation warning once per env (16 envs: 16 times) and appends it to
    ``MUJOCO_LOG.TXT`` in the working directory: route its warnings to Python's ``warnings`` (shown once per
    message) and write no log file."""
    import warnings

    import mujoco

    log = mujoco.MjLogConfig.get()
    log.logto_file, log.logto_console = False, False
    log.set()
    mujoco.set_mju_user_warning(lambda text: warnings.warn(f"MuJoCo: {text}", RuntimeWarning, stacklevel=2))


def _call_factory(factory, env_id: str, kwargs: dict[str, Any]) -> gym.Env:
    try:
        env = factory(**kwargs)
    except TypeError as err:
        raise ConfigError(f"env.kwargs for {env_id}: {err}") from None
    except ImportError as err:  # a factory importing an optional simulator
        raise ConfigError(f"env.id={env_id} needs a package that is not installed: "
                          f"{_install_hint(str(err))}") from None
    if not isinstance(env, gym.Env) and not pz.is_multiagent(env):
        raise ConfigError(f"env.id: {env_id!r} returned {type(env).__name__}, not a gymnasium.Env (nor a PettingZoo "
                          "ParallelEnv or AECEnv)")
    return env


def _install_hint(message: str) -> str:
    lowered = message.lower()
    extra = next((v for k, v in _EXTRAS.items() if k.lower() in lowered), None)
    if extra:
        return f"pip install 'rltrain[{extra}]'"
    return message.splitlines()[0] if message else "see the env's docs"


def make_vector_env(env_id: str, num_envs: int, seeds: list[int] | tuple[int, ...], *,
                    kwargs: dict[str, Any] | None = None, wrappers: list | tuple | None = None,
                    max_episode_steps: int | None = None, vectorization: str = "sync",
                    search_path: str | None = None, step_timeout_s: float | None = None,
                    action_mask: str = "off") -> VecEnv | AsyncVecEnv:
    """Build ``num_envs`` envs seeded with ``seeds``, each wrapped by ``wrappers``; ``vectorization`` is
    ``sync`` or ``async``; ``search_path`` and ``action_mask`` as for ``make_env``."""
    if len(seeds) != num_envs:
        raise ValueError(f"need {num_envs} seeds, got {len(seeds)}")
    wrappers = list(wrappers or [])  # a plain list pickles into async workers (no OmegaConf objects)
    fn = functools.partial(make_env, env_id, kwargs, wrappers=wrappers, max_episode_steps=max_episode_steps,
                           search_path=search_path, action_mask=action_mask)
    # no throwaway env first (the run's probe_env built one): sync and async alike build one in this process
    if vectorization == "sync":
        return VecEnv([fn] * num_envs, list(seeds), real_scores=bool(wrappers), step_timeout_s=step_timeout_s)
    if vectorization == "async":
        return AsyncVecEnv([fn] * num_envs, list(seeds), real_scores=bool(wrappers), step_timeout_s=step_timeout_s)
    raise ConfigError(f"env.vectorization={vectorization!r} is not one of: sync, async")


@dataclass(frozen=True, kw_only=True)
class EnvFactory:
    """How this run builds its environments (the ``env`` config group, typed; conf/env/*.yaml are presets that
    set what differs from these defaults). Picklable: it travels to parallel agents, distributed ranks and actor
    processes, each of which builds its own envs from it."""

    id: str  # a Gymnasium id, module:EnvId or package.module:Factory; set by an env preset. Source: rltrain
    num_envs: int = 4  # envs stepped by each process (each worker). Source: CleanRL ppo.py (num_envs=4)
    vectorization: str = "sync"  # sync (one process, a plain list) | async (a subprocess per env). Source: rltrain
    max_episode_steps: int | None = None  # null keeps the env's registered time limit. Source: Gymnasium
    kwargs: dict = field(default_factory=dict)  # passed to gymnasium.make / your factory. Source: Gymnasium
    wrappers: list = field(default_factory=list)  # applied in order in every env, first innermost. Source: rltrain
    solved_return: float | None = None  # the conventional "solved" score, for reference and for
    #                    target_return=${env.solved_return}; env=atari: the game's own DQN score (Mnih et al. 2015),
    #                    null for a game outside its table (docs/guide/pixels.md). Source: env presets
    search_path: str | None = None  # where a module:Attr env.id is also looked for (the launch dir). Source: rltrain
    step_timeout_s: float | None = 60.0  # a step or reset slower than this fails the run naming the env (null:
    #                    no limit); far above a legitimate step, below parallel's heartbeat_timeout_s. Source: rltrain
    action_mask: str = field(default="off", metadata={"internal": True})  # where the env's mask comes from:
    #                    off | key | info | method | drop; set from algo.action_mask by ``probe_env``

    def __post_init__(self) -> None:
        if isinstance(self.num_envs, bool) or not isinstance(self.num_envs, int) or self.num_envs <= 0:
            raise ConfigError(f"env.num_envs={self.num_envs!r} must be a positive integer")
        steps = self.max_episode_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0):
            raise ConfigError(f"env.max_episode_steps={steps!r} must be a positive integer, or null for the env's "
                              "own time limit")
        if self.action_mask not in ("off", "drop", *MASK_SOURCES):
            raise ConfigError(f"env.action_mask={self.action_mask!r}: one of off, drop, {', '.join(MASK_SOURCES)} "
                              "(set algo.action_mask=auto|on|off instead)")
        t = self.step_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 1e9):
            raise ConfigError(f"env.step_timeout_s={t!r} must be a number of seconds > 0, or null for no limit")

    @functools.cached_property
    def multiagent(self) -> bool:
        """The env is a PettingZoo ``ParallelEnv`` / ``AECEnv`` (envs/multiagent.py); found by building one unless
        ``probe_env`` already looked (``known``)."""
        return pz.builds_multiagent(self.make)

    def known(self, *, multiagent: bool) -> EnvFactory:
        """This factory with what ``probe_env``'s one build found: the answer travels with it (pickled to actor
        processes too), so nothing builds an env again to ask."""
        self.__dict__["multiagent"] = multiagent  # functools.cached_property's own slot: no rebuild, no setattr
        return self

    @property
    def real_scores(self) -> bool:
        """Whether episodes are scored by the game's real score (any ``env.wrappers`` list records it)."""
        return bool(self.wrappers)

    def make(self, *, render_mode: str | None = None) -> gym.Env:
        """One env (evaluation, video, spec discovery)."""
        return make_env(self.id, self.kwargs, wrappers=self.wrappers, max_episode_steps=self.max_episode_steps,
                        render_mode=render_mode, search_path=self.search_path, action_mask=self.action_mask)

    def spec(self) -> EnvSpec | AgentsSpec:
        """The env's spaces: an ``EnvSpec``, or an ``AgentsSpec`` for a PettingZoo multi-agent env."""
        env = self.make()
        try:
            multi = pz.is_multiagent(env)
            return pz.agents_spec(env, self.id, masks=self.action_mask != "drop") if multi else env_spec(env, self.id)
        finally:
            env.close()

    def vector(self, seeds: list[int] | tuple[int, ...], *,
               num_envs: int | None = None) -> VecEnv | AsyncVecEnv | AgentVecEnv:
        """``num_envs`` (default ``self.num_envs``) envs seeded with ``seeds``."""
        if self.multiagent:
            return pz.agent_vector(self, seeds, num_envs or self.num_envs)
        return make_vector_env(self.id, num_envs or self.num_envs, seeds, kwargs=self.kwargs, wrappers=self.wrappers,
                               max_episode_steps=self.max_episode_steps, vectorization=self.vectorization,
                               search_path=self.search_path, step_timeout_s=self.step_timeout_s,
                               action_mask=self.action_mask)

    def record(self) -> dict:
        """The plain dict this factory was built from (config.yaml, checkpoints)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@contextlib.contextmanager
def probed_env(factory: EnvFactory):
    """One env of ``factory`` for a look before the run starts, closed after: a factory that raises is one line
    naming the env, not a traceback (``reset_once`` says the same of its ``reset``; what else raises in the block,
    rltrain's own code included, is reported as itself)."""
    try:
        env = factory.make()
    except ConfigError:
        raise
    except Exception as err:  # the user's code: the traceback is kept (error.txt)
        raise UserCodeError(f"env.id={factory.id}: building the env raised {described(err)}; fix the env or its "
                            "env.kwargs") from err
    try:
        yield env
    finally:
        env.close()


def reset_once(env: gym.Env, env_id: str) -> dict:
    """``env.reset(seed=0)``'s info; a reset that raises is one line naming the env (the traceback is kept)."""
    try:
        return env.reset(seed=0)[1]
    except ConfigError:
        raise
    except Exception as err:  # the user's code
        raise UserCodeError(f"env.id={env_id}: reset() raised {described(err)}; fix the env or its env.kwargs") \
            from err


@dataclass(frozen=True)
class ProbedEnv:
    """What one env of a run says about itself, read once before the run starts (``probe_env``)."""

    factory: EnvFactory  # the run's factory, its action mask resolved from algo.action_mask
    spec: EnvSpec | AgentsSpec  # the env as the run builds it (a multi-agent env's agents): what the networks are
    #                             built for, in every process of the run
    line: str | None  # the action-mask line to tell the user (None: nothing to say)


def probe_env(factory: EnvFactory, mask_mode: str = "auto") -> ProbedEnv:
    """Build and reset ONE env of ``factory``: the run's only look at its env before it starts. It resolves the
    action mask from ``algo.action_mask`` (``mask_mode``: auto | on | off) against what the env offers, describes
    the env as the run builds it (the mask key added or dropped), and turns a factory or ``reset`` that raises
    into one line naming the env; ``on`` without a mask, or a mask on actions that take none, is one line too."""
    if mask_mode not in ("auto", "on", "off"):
        raise ConfigError(f"algo.action_mask={mask_mode!r}: one of auto, on, off")
    with probed_env(dataclasses.replace(factory, action_mask="off")) as env:
        if not pz.is_multiagent(env):
            info = reset_once(env, factory.id)
            resolved, line = _mask_choice(factory, mask_mode, mask_source(env, info), env.action_space)
            # the wrapper make_env puts outermost, put around this env: its spaces are the run's
            shown = ActionMaskObservation(env, resolved.action_mask) if resolved.action_mask != "off" else env
            # a goal-conditioned env: its compute_reward travels with the spec (hindsight relabelling, goals.py)
            resolved = resolved.known(multiagent=False)
            return ProbedEnv(resolved, with_goal_reward(env_spec(shown, factory.id), env, resolved), line)
    # a PettingZoo env: its agents' masks and spaces (envs/multiagent.py)
    resolved, line = pz.with_agent_masks(factory.known(multiagent=True), mask_mode)
    resolved = resolved.known(multiagent=True)
    return ProbedEnv(resolved, resolved.spec(), line)  # type: ignore[arg-type]


def _mask_choice(factory: EnvFactory, mode: str, source: str | None,
                 action_space: gym.Space) -> tuple[EnvFactory, str | None]:
    """``factory`` with its ``action_mask`` chosen from ``mode`` and the env's mask ``source``, and the line
    that tells the user (None: nothing to say)."""
    where = {"key": f"its observation key {MASK_KEY!r}", "info": f"info[{MASK_KEY!r}]",
             "method": "its action_masks() method"}.get(source or "", "")
    if source is None:
        if mode == "on":
            raise ConfigError(f"algo.action_mask=on: env.id={factory.id} offers no action mask (info[{MASK_KEY!r}], "
                              f"a Dict observation key {MASK_KEY!r} or an action_masks() method); set "
                              "algo.action_mask=auto")
        return dataclasses.replace(factory, action_mask="off"), None
    if mode == "off" or mask_size(action_space) is None:
        if mode == "on":
            raise ConfigError(f"algo.action_mask=on: env.id={factory.id} offers a mask, but masks apply to "
                              f"Discrete and MultiDiscrete actions, not {action_space}")
        why = "algo.action_mask=off" if mode == "off" else f"its action space {action_space} takes none"
        return (dataclasses.replace(factory, action_mask="drop" if source == "key" else "off"),
                f"env.id={factory.id} offers an action mask ({where}); ignored: {why}")
    return (dataclasses.replace(factory, action_mask=source),
            f"action masking on for env.id={factory.id}: the mask comes from {where} "
            f"(algo.action_mask={mode}; off ignores it)")
