"""Algorithm and Policy interfaces, and the synchronisation hook that distributed training plugs in.

An ``Algorithm`` owns its networks, optimisers and (off-policy) its replay buffer, and knows nothing of
processes: trainers move rollouts to it and weights out of it. Its hyper-parameters are one frozen, typed,
keyword-only settings dataclass (``settings_class``, defined beside the algorithm: ``PPOSettings`` in ppo.py,
a subclass of ``AlgoSettings``), which validates its values; its fields are the ``algo`` group's schema and the
only place its defaults are written (``cli/schema.py`` hands them to Hydra, ``cli/build.py`` checks keys and
types against them). Its published MLP is one class attribute, ``mlp``: what a null ``model.hidden_sizes``
means for it.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from rltrain.data.streams import split_steps
from rltrain.data.structs import EnvSpec, Metrics, Policy, PolicySpaces, Rollout
from rltrain.errors import ConfigError
from rltrain.models.settings import MLP

if TYPE_CHECKING:
    from rltrain.models.numpy_mlp import FlatAdam


class Sync:
    """No-op synchronisation for one process. ``trainers/distributed.py`` supplies an all-reducing one."""

    world_size: int = 1
    rank: int = 0

    def grads(self, params: list[Tensor]) -> None:
        """Average gradients over workers (in place)."""

    def sum(self, x: np.ndarray) -> np.ndarray:
        """Element-wise sum over workers (normaliser moments)."""
        return x

    def mean(self, x: np.ndarray) -> np.ndarray:
        """Element-wise mean over workers (logged scalars)."""
        return x

    def any(self, flag: bool) -> bool:
        """True when ``flag`` is true on any worker: stop decisions must be agreed, or ranks deadlock."""
        return flag

    def broadcast_object(self, obj, src: int = 0):
        """Rank ``src``'s ``obj`` on every worker (resume: rank 0 loads, every replica starts from it)."""
        return obj

    def gather_object(self, obj) -> list:
        """Every worker's ``obj``, in rank order (summaries: per-rank SPS, parameter digests)."""
        return [obj]


@dataclass(frozen=True, kw_only=True)
class AlgoSettings:
    """What every algorithm's settings share (each ``settings_class`` subclasses it)."""

    action_mask: str = "auto"  # invalid-action masking: auto (use the env's mask when it offers one, and say
    #                            so) | on (refuse an env without one) | off (ignore it); docs/guide/own-env.md.
    #                            Source: rltrain

    def __post_init__(self) -> None:
        """The checks every algorithm's settings share, on the fields a subclass has: a discount in [0, 1] (past 1
        the returns grow without bound; below 0 they alternate in sign). A subclass's ``__post_init__`` calls this
        first, then checks its own fields."""
        if "gamma" in {f.name for f in fields(self)}:
            within("algo.gamma", self.gamma, 0, 1)  # type: ignore[attr-defined]

    def unread_keys(self, *, action_kind: str | None = None) -> dict[str, str]:
        """The keys these values leave unread -> why (``errors.only_with``), e.g. ``{"n_quantiles": "only
        algo.distributional=qr uses it (now none)"}``: a run names the ones the user set in one line each at
        start (cli/unread.py). ``action_kind``: the env's (None: not known). A subclass adds its own keys to
        ``super().unread_keys(...)``; none here."""
        return {}


# model.critic_keys (what only the critic reads) is the actor-critic torsos' (models/actor_critic.py); a Q-network
# (DQN, Rainbow, PQN) is one network, with no actor and critic to share a torso either
ACTOR_CRITIC_ONLY = "only the actor-critic algorithms (ppo, a2c, impala, ippo, mappo) read it"
Q_NETWORK_UNREAD = {"shared": "algo={algo} builds one Q-network: no actor and critic to share a torso",
                    "critic_keys": ACTOR_CRITIC_ONLY}


def box_only(action_kind: str | None, *keys: str) -> dict[str, str]:
    """``keys`` as unread where the env's actions are known and not a Box (a Gaussian's settings)."""
    if action_kind in (None, "box"):
        return {}
    return dict.fromkeys(keys, f"only Box actions use it (the env's are {action_kind})")


@dataclass(frozen=True)
class UpdateSizes:
    """What one update of an algorithm takes per env, its settings' nulls resolved (``Algorithm.update_sizes``)."""

    rollout_len: int  # steps per env between two learn() calls
    num_minibatches: int | None = None  # minibatches per epoch, for an algorithm that splits its batch (PPO)


class Algorithm(ABC):
    """Base of every algorithm. Subclasses define ``__init__(self, spec, settings, *, num_envs, device, sync,
    model)``: ``settings`` an instance of their ``settings_class``, ``model`` the model group's settings."""

    name: ClassVar[str]
    settings_class: ClassVar[type]  # the frozen dataclass of its hyper-parameters (the ``algo`` group's schema)
    mlp: ClassVar[MLP]  # its published MLP widths and activation: what a null model.hidden_sizes means for it
    on_policy: ClassVar[bool] = True
    action_kinds: ClassVar[tuple[str, ...]] = ("discrete", "box", "multi_discrete", "multi_binary")
    suggested_env: ClassVar[dict[str, str]] = {"discrete": "cartpole", "box": "pendulum"}

    policy: Policy
    rollout_len: int  # steps per env between two calls of learn()
    # what the loop reads besides: the env steps of uniform-random warm-up before the first update (off-policy:
    # acting is several times faster than training then, so the progress display measures its rate after it);
    # K when observations are K-frame stacks stored once per frame (the replay); and a count of the writes to
    # the weights (optimiser steps, target updates) where the algorithm keeps one, so that the loop checks
    # the weights for NaN / inf only when they moved (None: any learn() may move them)
    learning_starts: int = 0
    frame_stack: int | None = None
    weight_writes: int | None = None
    # what its networks read of the model group (ModelSettings.unread_keys, said at start by cli/unread.py):
    # whether an MLP of model.hidden_sizes follows a CNN's features (SAC's and TD3's critics read them with the
    # action), and the model keys they never read -> why ("{algo}": the algorithm's name)
    mlp_after_image: ClassVar[bool] = False
    model_keys_unread: ClassVar[dict[str, str]] = {}

    @classmethod
    def update_sizes(cls, settings, *, num_envs: int, recurrent: bool) -> UpdateSizes:
        """The sizes of one update over ``num_envs`` env columns (the algorithm's own ``num_envs``), worked out
        here only: the constructor, the pre-flight checks (cli/preflight.py) and ``rltrain-check`` all call it.
        ``settings``: an instance of ``settings_class``; the default takes its ``rollout_len`` as set."""
        return UpdateSizes(int(settings.rollout_len))

    def __init__(self, spec: EnvSpec, *, num_envs: int, device: torch.device, sync: Sync | None = None):
        self.check_spec(spec)
        self.spec = spec
        self.num_envs = num_envs
        self.device = device
        self.sync = sync or Sync()

    @classmethod
    def check_spec(cls, spec: EnvSpec) -> None:
        if spec.action_kind not in cls.action_kinds and spec.action_kind.startswith("multi_"):
            raise ConfigError(f"algo={cls.name} does not take {spec.describe()} actions (env.id={spec.env_id}); "
                              "algo=ppo, algo=a2c and algo=impala do")
        if spec.action_kind not in cls.action_kinds:
            other = cls.suggested_env[cls.action_kinds[0]]
            need = "a Discrete" if cls.action_kinds == ("discrete",) else "a Box"
            # on the user's own env the fix is another algorithm; on a built-in one, perhaps another env
            raise ConfigError(f"algo={cls.name} needs {need} action space; env.id={spec.env_id} is "
                              f"{spec.describe()}: choose an algorithm that takes its actions (algo=ppo, algo=a2c "
                              f"and algo=impala take every kind), or try algo={cls.name} on env={other}")

    @abstractmethod
    def learn(self, rollout: Rollout, *, progress: float) -> Metrics:
        """Update from ``rollout``; ``progress`` in [0, 1] is the share of the budget spent (LR schedules)."""

    def rollouts_to_collect(self, env_steps: int, *, until: int, total: int) -> int:
        """How many ``rollout_len``-step rollouts the loop may collect in one go, calling ``learn()`` on each in
        turn afterwards, given ``env_steps`` taken so far, the loop's next event at ``until`` env steps (a log,
        evaluation or checkpoint, or the budget's end) and the budget ``total``: 1 here (an on-policy learner's
        update changes the policy that acts next); an off-policy learner asks for more while no update would
        fall due (algos/off_policy.py)."""
        return 1

    def learn_collected(self, rollout: Rollout, *, rollouts: int, progress: float) -> Metrics:
        """``rollouts`` (> 1) consecutive ``rollout_len``-step rollouts that ``rollouts_to_collect`` let the loop
        collect in one go, concatenated along time: what ``learn()`` on each in turn gives. ``progress`` is the
        last one's (an algorithm asks for several only where its schedules do not matter before the last)."""
        metrics: Metrics = {}
        for piece in split_steps(rollout, self.rollout_len):
            metrics = self.learn(piece, progress=progress) or metrics
        return metrics

    def wants_random_actions(self, env_steps: int) -> bool:
        """Off-policy warm-up: act uniformly at random before ``learning_starts`` env steps."""
        return env_steps < self.learning_starts

    def policy_spaces(self, action_mask: str) -> PolicySpaces:
        """What its checkpoints record of the spaces its policy acts on (structs.py ``PolicySpaces``), from which
        the tools build the acting network again with no env; ``action_mask``: the run's resolved mask source."""
        return PolicySpaces(self.spec, action_mask, PolicySpaces.state_shapes(self.policy.initial_state(1)))

    def policy_state(self) -> dict[str, Tensor]:
        """CPU copy of the acting weights (and normaliser buffers) for actors."""
        return {k: v.detach().cpu().clone() for k, v in self.policy.state_dict().items()}

    @abstractmethod
    def state_dict(self) -> dict: ...

    @abstractmethod
    def load_state_dict(self, state: dict) -> None: ...

    def resume_note(self, state: dict) -> str | None:
        """One line on what a resume from ``state`` (a checkpoint's ``algo`` entry, just loaded) did not restore
        and how that changes the run (trainers/checkpointing.py prints it at start); None where it restored
        everything."""
        return None


def positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Fail with the key name when a size or rate is not positive, or not finite (nan passes ``value < 0``)."""
    if not np.isfinite(value):
        raise ConfigError(f"{name}={value} must be a finite number {'>= 0' if allow_zero else '> 0'}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name}={value} must be {'>= 0' if allow_zero else '> 0'}")


def within(name: str, value: float, low: float, high: float, *, open_low: bool = False, why: str = "") -> None:
    """Fail with the key name, its value and the range when ``value`` lies outside [low, high] (``open_low``:
    (low, high]); nan lies in no range. ``why``: what a value outside it does, said after the range."""
    inside = low < value <= high if open_low else low <= value <= high
    if not inside:  # nan: every comparison is False
        span = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        raise ConfigError(f"{name}={value} must lie in {span}" + (f": {why}" if why else ""))


def check_epsilon_schedule(settings) -> None:
    """An epsilon-greedy schedule (DQN's, PQN's): ``start_e`` and ``end_e`` are probabilities, and the decay over
    the first ``exploration_fraction`` of the budget must end within the run. A rising epsilon (start_e < end_e)
    is odd but a schedule all the same: allowed."""
    within("algo.start_e", settings.start_e, 0, 1, why="a probability of acting at random")
    within("algo.end_e", settings.end_e, 0, 1, why="a probability of acting at random")
    within("algo.exploration_fraction", settings.exploration_fraction, 0, 1, open_low=True,
           why=f"the share of total_env_steps over which epsilon goes from algo.start_e to algo.end_e; past 1 the "
               f"run ends before epsilon reaches algo.end_e={settings.end_e}")


def refuse_recurrent(where: str, core: str, *, why: str = "replay of sequences is not implemented") -> None:
    """One line for the learners without sequences: the off-policy ones need replay of whole sequences (R2D2's
    stored-state replay), which the replay buffer does not do; ``why`` says it for one that has no replay (PQN);
    PPO, A2C and IMPALA take any core."""
    if core != "identity":
        raise ConfigError(f"model.core={core}: {where} does not support a recurrent core ({why}: use algo=ppo, "
                          "a2c or impala); set model.core=identity")


def set_lr(optimizer, lr: float, *, anneal: bool, progress: float) -> float:
    """The learning rate for this update, set on every param group (or a ``FlatAdam``'s ``lr``): ``lr`` decayed
    linearly to 0 over the budget with ``anneal`` (``progress`` in [0, 1]), else constant. Returns it."""
    lr = lr * max(1.0 - progress, 0.0) if anneal else lr
    if hasattr(optimizer, "param_groups"):
        for group in optimizer.param_groups:
            group["lr"] = lr
    else:
        optimizer.lr = lr
    return lr


class RewardScaler:
    """Divides rewards by the running std of the discounted return (as Gymnasium's NormalizeReward).

    The per-env discounted return is carried across rollouts; its variance lives in a RunningNorm so it
    is checkpointed and (distributed) reduced like the observation statistics.
    """

    def __init__(self, gamma: float, num_envs: int):
        from rltrain.models.layers import RunningNorm

        self.gamma = gamma
        self.norm = RunningNorm(())
        self.disc = np.zeros(num_envs, np.float64)

    def __call__(self, rollout: Rollout, sync: Sync) -> np.ndarray:
        T, N = rollout.shape
        if self.disc.shape[0] != N:
            self.disc = np.zeros(N, np.float64)
        disc_seq = np.empty((T, N), np.float64)
        done = rollout.terminated | rollout.truncated
        for t in range(T):
            self.disc = self.disc * self.gamma + rollout.rewards[t]
            disc_seq[t] = self.disc
            self.disc[done[t]] = 0.0
        # a multi-agent rollout's padding rows (``Rollout.valid`` False) hold no reward anyone received: left out
        seen = disc_seq if rollout.valid is None else disc_seq[rollout.valid]
        self.norm.update_from_moments(sync.sum(self.norm.moments(seen, 0)))
        std = float(np.sqrt(self.norm.var.item() + 1e-8))
        # clipped at +-10 as Gymnasium's NormalizeReward + TransformReward in CleanRL's continuous PPO
        return np.clip(rollout.rewards / std, -10.0, 10.0).astype(np.float32)

    def state_dict(self) -> dict:
        return {"norm": self.norm.state_dict(), "disc": torch.from_numpy(self.disc.copy())}

    def load_state_dict(self, state: dict) -> None:
        self.norm.load_state_dict(state["norm"])
        self.disc = state["disc"].numpy().copy()


class ActorCriticState:
    """``state_dict`` / ``load_state_dict`` shared by the on-policy learners (ppo, a2c, impala): the policy
    (normaliser statistics included), the optimiser and, when reward scaling is on, its running statistics.
    Mixed in before ``Algorithm`` so it provides the abstract methods.

    Layout: ``{"policy": ActorCritic.state_dict(), "optimizer": torch optimiser state_dict() over
    ``ActorCritic.param_list()``, "reward_scaler": ... (only with norm_reward)}``. PPO's numpy ``FlatAdam``
    writes and reads torch Adam's format, so a checkpoint resumes on either update path."""

    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer | FlatAdam
    reward_scaler: RewardScaler | None

    def state_dict(self) -> dict:
        state = {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.reward_scaler:
            state["reward_scaler"] = self.reward_scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.reward_scaler and "reward_scaler" in state:
            self.reward_scaler.load_state_dict(state["reward_scaler"])


def takes_model(cls: type) -> bool:
    """Whether the algorithm class builds from the model group: its ``__init__`` takes ``model``, or passes its
    ``**kwargs`` on to a base class's that does (``Rainbow(DQN)``: reading its own signature alone dropped the
    whole model group, silently)."""
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters
        if "model" in params:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return False
    return False


def unread_keys(algo_class: type, algo: Any, model: Any, spec: Any) -> dict[str, str]:
    """Every ``algo`` and ``model`` key that a run of ``algo_class`` with these settings will not read -> why,
    set or not: what the start line says of the user's keys (cli/unread.py) and what a resume does not compare
    (run/resume_rules.py). ``model``: ``ModelSettings``; ``spec``: the env's (``EnvSpec``; a multi-agent
    ``AgentsSpec`` has no one observation or action kind, so only what the settings alone decide is said there);
    None: nothing about the env is known."""
    observation = getattr(spec, "observation", None)
    # a user's algorithm need not subclass AlgoSettings / Algorithm: it then says nothing of its own keys
    own = getattr(algo, "unread_keys", None)
    found = {f"algo.{key}": why for key, why in
             (own(action_kind=getattr(spec, "action_kind", None)) if own else {}).items()}
    if takes_model(algo_class):  # it builds from the model group
        keys = model.unread_keys(observation, mlp_after_image=getattr(algo_class, "mlp_after_image", False))
        name = getattr(algo_class, "name", algo_class.__name__)
        keys |= {key: why.format(algo=name) for key, why in getattr(algo_class, "model_keys_unread", {}).items()}
        found |= {f"model.{key}": why for key, why in keys.items()}
    return found
