"""Data contracts shared by every trainer: environment description, acting output, rollouts.

Rollouts are *time-major* numpy arrays ``[T, N, ...]`` (T steps per env, N envs). They stay numpy
because the collector writes them in place (cheap) and they cross process boundaries as plain buffers;
algorithms turn them into tensors with ``torch.from_numpy`` (zero copy).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.data.records import action_dtype_name, checked, ints, optional_ints, pairs, typed

ActionKind = Literal["discrete", "box", "multi_discrete", "multi_binary"]
ObsKind = Literal["box", "discrete", "multi_discrete", "multi_binary", "dict", "unsupported"]
# A top-level Dict observation key by this name is the action mask (Huang & Ontanon 2022): 1 = legal, one
# entry per action (MultiDiscrete: per component, concatenated). It travels with the observation (rollouts,
# replay, actor pipes) and the policy applies it to its logits instead of encoding it.
MASK_KEY = "action_mask"
Metrics = dict[str, float]


@dataclass(frozen=True)
class ObsSpace:
    """A plain, picklable description of an observation space (or of one key of a Dict space).

    kind:  box | discrete (one integer in [start, start + n)) | multi_discrete (one integer per component,
           ``nvec``) | multi_binary | dict (also a Tuple, keyed "0", "1", ...) | unsupported (e.g. Text:
           kept so that the model can refuse it by key, or drop it with ``model.ignore_keys``)
    shape: shape of one stored observation: () for discrete and dict
    dtype: numpy dtype name of the stored observation ("" for dict and unsupported)
    n:     discrete only: the number of values (encoded one-hot)
    start: discrete only: the smallest value
    parts: dict only: (key, ObsSpace) pairs in the space's key order
    nvec:  multi_discrete only: the number of values of each component (flattened; encoded one-hot each)
    name:  how gymnasium prints the space (the type's name where that is long), for error messages
    high:  integer Box only: the largest value any element may take (tells index grids from pixels)
    """

    kind: ObsKind
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    n: int = 0
    start: int = 0
    parts: tuple[tuple[str, ObsSpace], ...] = ()
    name: str = ""
    nvec: tuple[int, ...] = ()
    high: int | None = None

    def to_record(self) -> dict:
        """This description as plain containers (str, int, lists, dicts): what a checkpoint stores, which
        ``torch.load(weights_only=True)`` reads back without unpickling any class."""
        return {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype, "n": self.n, "start": self.start,
                "parts": [[key, part.to_record()] for key, part in self.parts], "name": self.name,
                "nvec": list(self.nvec), "high": self.high}

    @classmethod
    def from_record(cls, record: dict) -> ObsSpace:
        """The description ``to_record`` wrote; a malformed record (a crafted file) raises ValueError."""
        kind = typed(record, "kind", str)
        if kind not in OBS_KINDS:
            raise ValueError(f"observation kind {kind!r} is not one of {', '.join(OBS_KINDS)}")
        parts = tuple((checked(key, str, "a part's key"), cls.from_record(checked(part, dict, "a part")))
                      for key, part in pairs(record.get("parts", [])))
        high = record.get("high")
        return cls(kind, ints(record, "shape"), typed(record, "dtype", str), n=typed(record, "n", int),
                   start=typed(record, "start", int), parts=parts, name=typed(record, "name", str),
                   nvec=ints(record, "nvec"), high=None if high is None else checked(high, int, "high"))


OBS_KINDS, ACTION_KINDS = get_args(ObsKind), get_args(ActionKind)


def action_mask_of(obs: Any, keys: list[str] | None = None) -> Any:
    """``obs[MASK_KEY]``, the mask a masked policy's observation carries; when it is missing, one ValueError that
    names the key and how to pass it (``keys``: every key the observation needs), where a bare
    ``KeyError: 'action_mask'`` would say neither."""
    if isinstance(obs, dict) and MASK_KEY in obs:
        return obs[MASK_KEY]
    found = f"its keys are {list(obs)}" if isinstance(obs, dict) else f"it is a {type(obs).__name__}, not a dict"
    want = f"the keys {keys}" if keys else f"{MASK_KEY!r} beside the observation's own keys"
    raise ValueError(f"this policy masks its actions, so its observation needs the key {MASK_KEY!r} (1 = legal, "
                     f"one entry per action, as the env offers it: info[{MASK_KEY!r}], an observation key or "
                     f"action_masks()), but {found}; pass a dict with {want}")


def storage_dtype(dtype: str | np.dtype) -> np.dtype:
    """The dtype observations are stored and shipped in: floating point as float32 (what the networks compute
    in), integers and bools as they are, so uint8 / bool frames stay one byte per value from the env to the
    model, which converts and scales them on its device."""
    dtype = np.dtype(dtype or np.float32)
    return np.dtype(np.float32) if dtype.kind == "f" else dtype


# A batch of observations as stored: one array, or (Dict spaces) a dict of them per key, nested like the space.
ObsArray = np.ndarray | dict[str, "ObsArray"]


def obs_buffer(space: ObsSpace, lead: tuple[int, ...], alloc: Callable = np.empty) -> ObsArray:
    """Storage for observations of ``space`` with leading axes ``lead`` (e.g. (T, N)): one array per Dict key,
    each in its ``storage_dtype``. Keys no encoder reads (``unsupported``, e.g. Text) get no storage: the model
    refuses them by name unless ``model.ignore_keys`` drops them, so nothing downstream ever needs them."""
    if space.kind == "dict":
        return {k: obs_buffer(sub, lead, alloc) for k, sub in space.parts if sub.kind != "unsupported"}
    return alloc((*lead, *space.shape), storage_dtype(space.dtype))


def obs_map(fn: Callable[..., Any], first: Any, *others: Any) -> Any:
    """``fn`` applied leaf by leaf to observation trees of the same structure (arrays or tensors, or dicts of
    them); the keys are those of ``first``, so a storage tree as ``first`` drops the keys it does not store."""
    if isinstance(first, dict):
        return {k: obs_map(fn, v, *(o[k] for o in others)) for k, v in first.items()}
    return fn(first, *others)


def obs_put(dst: ObsArray, index: Any, src: Any) -> None:
    """``dst[index] = src`` for every stored key (``src`` may hold more keys than ``dst``)."""
    if isinstance(dst, dict):
        for k, v in dst.items():
            obs_put(v, index, src[k])
    else:
        dst[index] = src


def obs_leaves(obs: Any) -> list:
    """The arrays (or tensors) of an observation tree, in key order."""
    if isinstance(obs, dict):
        return [leaf for v in obs.values() for leaf in obs_leaves(v)]
    return [obs]


def obs_equal(a: Any, b: Any) -> bool:
    """Same observations in every stored key of ``a``."""
    if isinstance(a, dict):
        return all(obs_equal(v, b[k]) for k, v in a.items())
    return bool(np.array_equal(a, b))


@dataclass(frozen=True)
class EnvSpec:
    """What an algorithm must know about an environment to build its networks.

    ``obs_shape`` / ``obs_dtype`` describe a Box (or Discrete, MultiBinary) observation array; ``obs_space``
    describes any observation, Dict included. Without ``obs_space`` the observation is a Box of
    ``obs_shape`` and ``obs_dtype`` (see ``observation``).
    """

    env_id: str
    obs_shape: tuple[int, ...]  # () for discrete and dict observations
    action_kind: ActionKind
    action_shape: tuple[int, ...]  # () for discrete; MultiDiscrete's nvec shape; MultiBinary's shape
    n_actions: int = 0  # discrete only
    action_low: tuple[float, ...] = ()  # box only
    action_high: tuple[float, ...] = ()  # box only
    obs_dtype: str = "float32"  # numpy dtype name of a stored observation ("" for dict)
    obs_space: ObsSpace | None = None
    nvec: tuple[int, ...] = ()  # multi_discrete only: values per component, flattened (C order)
    action_start: tuple[int, ...] = ()  # multi_discrete: each component's smallest value; discrete: (start,) of a
    #   Discrete(n, start) env, stepped with index + start (envs/wrappers.py DiscreteStart), () when 0 (and in a
    #   checkpoint written before a discrete start was recorded)
    env_action_dtype: str = ""  # the env's own action dtype where not ``action_dtype`` (a float64 Box): the env is
    #   stepped with it (envs/wrappers.py ActionDtype, load_policy); "" when the same (and in older checkpoints)
    env_action_shape: tuple[int, ...] | None = None  # a Box of another number of axes than one ((2, 2); a scalar's
    #   ()): the policy acts on its flat ``action_shape`` (prod,) and the env is stepped with this shape (envs/
    #   wrappers.py BoxShape, load_policy, rltrain-export); None when 1-D (and in older checkpoints)
    frame_stack: int | None = None  # K: the observation is a K-frame stack along its first axis (the env's own
    #                                 FrameStackObservation, reset-padded), read from the env by envs/make.py
    # a goal-conditioned env's compute_reward(achieved_goal, desired_goal, info) (envs/goals.py: hindsight
    # relabelling); not part of the record: a checkpoint's policy needs none
    goal_reward: Any = field(default=None, compare=False, repr=False)

    @property
    def observation(self) -> ObsSpace:
        """The observation space's description (a float Box of ``obs_shape`` when none was given)."""
        if self.obs_space is not None:
            return self.obs_space
        return ObsSpace("box", tuple(self.obs_shape), self.obs_dtype, name=f"Box{tuple(self.obs_shape)}")

    @property
    def action_dtype(self) -> np.dtype:
        """How actions are stored and shipped: int64 indices, int8 MultiBinary bits, float32 Box values."""
        return np.dtype({"discrete": np.int64, "multi_discrete": np.int64, "multi_binary": np.int8}
                        .get(self.action_kind, np.float32))

    @property
    def own_action_shape(self) -> tuple[int, ...]:
        """One action's shape as the env takes it (``action_shape`` is what the policy outputs and stores)."""
        return self.action_shape if self.env_action_shape is None else self.env_action_shape

    @property
    def masked(self) -> bool:
        """Whether observations carry an action mask (a top-level Dict key ``MASK_KEY``)."""
        obs = self.observation
        return obs.kind == "dict" and any(k == MASK_KEY for k, _ in obs.parts)

    @property
    def mask_size(self) -> int:
        """Entries of an action mask: n (Discrete) or sum(nvec) (MultiDiscrete, per component, concatenated)."""
        return self.n_actions if self.action_kind == "discrete" else sum(self.nvec)

    def to_record(self) -> dict:
        """This spec as plain containers (``ObsSpace.to_record``): a checkpoint's record of the spaces, from
        which the network is built again without building, or importing, the env."""
        return {"env_id": self.env_id, "obs_shape": list(self.obs_shape), "action_kind": self.action_kind,
                "action_shape": list(self.action_shape), "n_actions": self.n_actions,
                "action_low": [float(x) for x in self.action_low], "action_high": [float(x) for x in self.action_high],
                "obs_dtype": self.obs_dtype, "env_action_dtype": self.env_action_dtype,
                "env_action_shape": None if self.env_action_shape is None else list(self.env_action_shape),
                "obs_space": None if self.obs_space is None else self.obs_space.to_record(),
                "nvec": list(self.nvec), "action_start": list(self.action_start), "frame_stack": self.frame_stack}

    @classmethod
    def from_record(cls, record: dict) -> EnvSpec:
        """The spec ``to_record`` wrote; a malformed record (a crafted file) raises ValueError."""
        kind = typed(record, "action_kind", str)
        if kind not in ACTION_KINDS:
            raise ValueError(f"action kind {kind!r} is not one of {', '.join(ACTION_KINDS)}")
        obs, stack = record.get("obs_space"), record.get("frame_stack")
        bounds = {key: tuple(float(checked(v, float, key)) for v in typed(record, key, list))
                  for key in ("action_low", "action_high")}
        return cls(typed(record, "env_id", str), ints(record, "obs_shape"), kind, ints(record, "action_shape"),
                   n_actions=typed(record, "n_actions", int), **bounds, obs_dtype=typed(record, "obs_dtype", str),
                   obs_space=None if obs is None else ObsSpace.from_record(checked(obs, dict, "obs_space")),
                   nvec=ints(record, "nvec"), action_start=ints(record, "action_start"),
                   env_action_dtype=action_dtype_name(record.get("env_action_dtype", "")),
                   env_action_shape=optional_ints(record, "env_action_shape"),
                   frame_stack=None if stack is None else checked(stack, int, "frame_stack"))

    def describe(self) -> str:
        if self.action_kind == "discrete":
            return f"Discrete({self.n_actions}{f', start={self.action_start[0]}' if self.action_start else ''})"
        if self.action_kind == "multi_discrete":
            return f"MultiDiscrete({list(self.nvec)})"
        if self.action_kind == "multi_binary":
            return f"MultiBinary({list(self.action_shape)})"
        return f"Box(shape={self.own_action_shape})"


SPACES_FORMAT = 1  # the layout of ``PolicySpaces.to_record``; a change that older readers would misread raises it


@dataclass(frozen=True)
class PolicySpaces:
    """What a trained policy acts on, as every checkpoint records it (``meta["spaces"]``): enough to build the
    acting network again with no env built and no env module imported (``rltrain.load_policy``, the tools).

    spec:        the env's spaces as the run built them (frame stack and action-mask key included)
    action_mask: the mask source the run's env factory resolved (envs/make.py ``probe_env``), to step the env
                 again as it was trained (evaluation episodes)
    core_state:  a recurrent core's state, the shape of each tensor for one env ([layers, 1, H]); None:
                 feed-forward
    """

    spec: EnvSpec
    action_mask: str = "off"
    core_state: tuple[tuple[int, ...], ...] | None = None

    @staticmethod
    def state_shapes(state: tuple[Tensor, ...] | None) -> tuple[tuple[int, ...], ...] | None:
        """``core_state`` of a policy's ``initial_state(1)``."""
        return None if state is None else tuple(tuple(t.shape) for t in state)

    def to_record(self) -> dict:
        """Plain containers only: ``torch.load(weights_only=True)`` reads them back without unpickling a class."""
        return {"format": SPACES_FORMAT, "env": self.spec.to_record(), "action_mask": self.action_mask,
                "core_state": None if self.core_state is None else [list(s) for s in self.core_state]}

    @classmethod
    def from_record(cls, record: dict) -> PolicySpaces:
        """What ``to_record`` wrote (``record["format"]`` checked by the caller); malformed: ValueError."""
        state = record.get("core_state")
        shapes = None if state is None else tuple(tuple(checked(n, int, "core_state")
                                                        for n in checked(s, list, "core_state"))
                                                  for s in checked(state, list, "core_state"))
        return cls(EnvSpec.from_record(typed(record, "env", dict)), typed(record, "action_mask", str), shapes)


@dataclass
class ActOutput:
    """Result of ``Policy.act`` for a batch of N observations.

    action:   [N] int64 (discrete), [N, *nvec shape] int64 (multi_discrete), [N, *shape] int8 (multi_binary)
              or [N, A] float32 (box, unclipped sample)
    log_prob: [N] float32, log-probability of ``action`` under the acting policy
    state:    recurrent policies: the core state after this step (a tuple of [1, N, H] tensors); None for
              feed-forward policies
    value:    [N] float32 V(obs) where it comes nearly free with the action (a feed-forward actor-critic whose
              critic reads the actor's torso: one Linear more); None otherwise
    """

    action: torch.Tensor
    log_prob: torch.Tensor
    state: tuple[torch.Tensor, ...] | None = None
    value: torch.Tensor | None = None


@dataclass
class Rollout:
    """T steps of N environments, time-major.

    obs:            [T, N, *obs_shape] in the storage dtype (``storage_dtype``: float32 vectors, uint8 / bool
                    pixels as they are), raw (unnormalised) observation acted on. For a Dict observation
                    space a dict (nested like the space) of such arrays, one per key, each [T, N, *key_shape]
                    in its own storage dtype (``obs_buffer``); keys no encoder reads (Text) are not stored
    actions:        [T, N, *action_shape] in ``EnvSpec.action_dtype`` (int64, int8 or float32)
    log_probs:      [T, N] float32, behaviour log-prob (for PPO ratios, V-trace rhos)
    rewards:        [T, N] float32, raw rewards
    terminated:     [T, N] bool, the MDP ended: no bootstrap
    truncated:      [T, N] bool, cut by a time limit: bootstrap from ``next_obs``
    next_obs:       like ``obs``: the true next observation (the final one when the episode ended;
                    gymnasium's autoreset observation never enters a transition)
    policy_version: [T] int64, version of the weights that chose the actions
    env_ids:        [N] int64 or None, the env stream each column comes from (None: column n is stream n);
                    a replay buffer links a rollout's last step to the next rollout of the same stream
    core_state:     recurrent policies: the core state at the rollout's start (a tuple of CPU tensors
                    [1, N, H], already zeroed for envs that start an episode); None for feed-forward ones
    values:         [T, N] float32 V(obs) from the acting forward, or None. Only a collector acting with the
                    learner's own policy object records it (TrainLoop's), so they are the learner's current
                    values: an actor's lagged copy never fills it
    valid:          [T, N] bool, or None (every row is a transition). False marks a padding row: a multi-agent
                    slot whose agent was done while its env went on (data/agents.py); learners leave it out
    """

    obs: ObsArray
    actions: np.ndarray
    log_probs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_obs: ObsArray
    policy_version: np.ndarray
    episode_returns: list[float] = field(default_factory=list)  # episodes that finished in this rollout
    episode_lengths: list[int] = field(default_factory=list)
    episode_successes: list[bool] = field(default_factory=list)  # info["is_success"] of those that reported one
    env_ids: np.ndarray | None = None
    core_state: tuple[torch.Tensor, ...] | None = None
    values: np.ndarray | None = None
    valid: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.rewards.size)

    @property
    def shape(self) -> tuple[int, int]:
        return self.rewards.shape  # type: ignore[return-value]


class Policy(nn.Module, ABC):
    """What the collector, actors, evaluation, export and the Python API see of any algorithm's policy (the
    only object shipped to actor and agent processes). Acts on a batch of raw observations."""

    @abstractmethod
    def act(self, obs: Tensor, state: tuple[Tensor, ...] | None = None, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        """obs [N, *obs_shape] in the stored dtype (a dict of them for Dict spaces) -> ActOutput(action
        [N, ...], log_prob [N]). A recurrent policy also takes the core ``state`` (its ``initial_state(N)`` at
        the start) and returns the next one in ``ActOutput.state``; feed-forward policies ignore it."""

    # exploration noise the collector adds to Box actions (SAC's algo.action_noise), or None
    action_noise: Any = None
    # whether ``act(deterministic=False)`` draws anything: a deterministic actor's (TD3, DDPG) two modes are one,
    # so evaluation (eval.both_modes) runs it once
    samples: bool = True

    def initial_state(self, n: int) -> tuple[Tensor, ...] | None:
        """The core state of n envs at an episode's start; None for a feed-forward policy (the default)."""
        return None

    def numpy_actor(self) -> Any:
        """A numpy snapshot of the acting branch for the collector's CPU fast path, or None (the default)."""
        return None

    @abstractmethod
    def export_module(self) -> nn.Module:
        """A frozen-ready ``nn.Module``: obs [B, ...] (+ state tensors) -> the deterministic action evaluation
        steps an env with (+ the next state); torch ops only. Its ``state_names`` (a list) names the state
        inputs of a recurrent policy ([] for feed-forward ones), ``state_size`` their width."""
