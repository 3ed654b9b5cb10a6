"""The model family: ``ModelSettings`` (the ``model`` config group) and the networks built from them.

An algorithm asks for a network by what it needs, never by observation space:

    policy = make_actor_critic(spec, settings, norm_obs=..., init_log_std=...)   # PPO, A2C, IMPALA
    q_net = make_q_network(spec, settings)                                       # DQN
    actor = make_sac_actor(spec, settings); q = make_continuous_q(spec, settings)  # SAC (non-vector obs)

Both take observations as tensors ([B, *obs_shape], or a dict of them) and follow the interface of
``actor_critic.ActorCritic`` (which ``make_actor_critic`` returns itself for float vectors with separate
MLP torsos: same maths, and PPO's numpy fast path).

``make_encoder`` (``encoders.py``) picks the torso from ``spec.observation`` (MLP, Nature / IMPALA /
MinAtar CNN, multi-input for Dict), ``heads.py`` supplies the outputs. Observations go in as tensors in
their stored dtype ([B, *obs_shape], or a dict of them for Dict spaces) on any device; the model moves
and converts them itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rltrain.data.structs import ActOutput, EnvSpec, ObsSpace, Policy, obs_leaves, obs_map
from rltrain.errors import ConfigError, close_matches
from rltrain.models.actor_critic import ActorCritic
from rltrain.models.cores import CORES, CoreState, make_core
from rltrain.models.encoders import ENCODERS, Encoder, Obs, image_layout, make_encoder
from rltrain.models.heads import CategoricalHead, GaussianHead, QHead, SquashedGaussianHead, ValueHead
from rltrain.models.layers import ACTIVATIONS, RunningNorm, mlp

DEFAULT_MLP, DEFAULT_ACTIVATION = (64, 64), "tanh"  # when neither the model group nor the algorithm says


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """The ``model`` config group, typed. The CLI builds it from ``conf/model/*.yaml``.

    encoder:      auto | mlp | nature | impala | minatar (auto: by observation space and frame size)
    hidden_sizes: MLP widths for vector / Discrete / MultiBinary inputs and after a Dict's concatenation
    activation:   of the MLP layers (tanh, relu, elu, silu); CNNs use ReLU as their papers do
    cnn_features: width of a CNN's last Linear; None keeps the paper's (nature 512, impala 256, minatar 128)
    shared:       one torso for actor and critic (as CleanRL's Atari PPO) instead of one each
    ignore_keys:  Dict observation keys to drop (e.g. a Text key no encoder reads)
    core:         identity | lstm | gru: the memory between encoder and heads (models/cores.py)
    core_size:    the hidden width of an lstm / gru core
    """

    encoder: str = "auto"
    hidden_sizes: tuple[int, ...] | None = None  # None: the algorithm's algo.hidden_sizes
    activation: str | None = None  # None: the algorithm's algo.activation
    cnn_features: int | None = None
    shared: bool = False
    ignore_keys: tuple[str, ...] = ()
    core: str = "identity"
    core_size: int = 128

    def __post_init__(self) -> None:
        # YAML lists arrive as lists: store tuples so the settings stay hashable and immutable
        if self.hidden_sizes is not None:
            object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        object.__setattr__(self, "ignore_keys", tuple(self.ignore_keys))
        _one_of("model.encoder", self.encoder, ENCODERS)
        if self.activation is not None:
            _one_of("model.activation", self.activation, tuple(ACTIVATIONS))
        if any(not isinstance(h, int) or isinstance(h, bool) or h <= 0 for h in self.hidden_sizes or ()):
            raise ConfigError(f"model.hidden_sizes={list(self.hidden_sizes)}: every width must be a positive "
                              "integer (e.g. model.hidden_sizes=[64,64])")
        if self.cnn_features is not None and (isinstance(self.cnn_features, bool) or self.cnn_features <= 0):
            raise ConfigError(f"model.cnn_features={self.cnn_features}: must be a positive integer or null")
        _one_of("model.core", self.core, CORES)
        if isinstance(self.core_size, bool) or not isinstance(self.core_size, int) or self.core_size <= 0:
            raise ConfigError(f"model.core_size={self.core_size}: must be a positive integer")


    def with_mlp(self, hidden_sizes, activation: str) -> ModelSettings:
        """These settings with the MLP widths / activation filled in where the model group leaves them null:
        an algorithm passes its own ``algo.hidden_sizes`` / ``algo.activation``, so the presets and command
        lines that set them there keep working; ``model.hidden_sizes`` / ``model.activation`` win when set."""
        return dataclasses.replace(self, hidden_sizes=tuple(self.hidden_sizes or hidden_sizes),
                                   activation=self.activation or activation)


def _one_of(key: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value}: unknown{close_matches(str(value), valid)} (valid: {', '.join(valid)})")


def is_float_vector(obs: ObsSpace) -> bool:
    return obs.kind == "box" and image_layout(obs.shape) is None and obs.dtype.startswith("float")


class ModularActorCritic(Policy):
    """Encoder torso(s) + a policy head + a value head; the interface of ``actor_critic.ActorCritic``.

    ``shared``: one encoder feeds both heads (CleanRL's Atari PPO); otherwise actor and critic each own
    one. ``obs_norm`` normalises float vector observations when enabled (a ``RunningNorm`` the algorithm
    updates); for images, Discrete and Dict observations it stays disabled: the encoder scales them.

    ``model.core`` (lstm / gru) puts a recurrent core between each encoder and its head (one per torso:
    shared with ``shared``). The policy's state is then the actor core's state followed by the critic
    core's (``initial_state``); ``act`` steps both, so the state stored at a rollout's start lets the
    learner recompute actor and critic over the rollout (``unroll``).
    """

    def __init__(self, spec: EnvSpec, settings: ModelSettings, *, norm_obs: bool = False,
                 init_log_std: float = 0.0):
        super().__init__()
        settings = settings.with_mlp(DEFAULT_MLP, DEFAULT_ACTIVATION)
        obs = spec.observation
        if norm_obs and not is_float_vector(obs):
            raise ConfigError(f"algo.norm_obs=true normalises float vector observations only; env.id={spec.env_id} "
                              f"observes {obs.name} (the encoder scales it itself): set algo.norm_obs=false")
        self.discrete = spec.action_kind == "discrete"
        self.act_dim = spec.n_actions if self.discrete else int(torch.Size(spec.action_shape).numel())
        self.shared = settings.shared
        self.obs_norm = RunningNorm(obs.shape if is_float_vector(obs) else (), enabled=norm_obs)
        self.actor_encoder = make_encoder(obs, settings)
        self.critic_encoder: Encoder | None = None if self.shared else make_encoder(obs, settings, warn=False)
        self.actor_core = make_core(settings.core, self.actor_encoder.out_dim, settings.core_size)
        self.critic_core = None if self.shared else make_core(settings.core, self.actor_encoder.out_dim,
                                                              settings.core_size)
        self.recurrent = self.actor_core.recurrent
        self._actor_state_len = len(self.actor_core.initial_state(0))
        width = self.actor_core.out_dim
        self.actor_head: CategoricalHead | GaussianHead = (
            CategoricalHead(width, self.act_dim) if self.discrete
            else GaussianHead(width, self.act_dim, init_log_std=init_log_std))
        self.critic_head = ValueHead(width)

    def param_list(self) -> list[nn.Parameter]:
        """The parameters in one fixed order (the optimiser state's index order in checkpoints)."""
        return list(self.parameters())

    @property
    def log_std(self) -> nn.Parameter:
        """Box actions: the state-independent log-std [A] of the Gaussian head."""
        if self.discrete:
            raise AttributeError("a discrete-action policy has no log_std")
        return self.actor_head.log_std  # type: ignore[return-value]

    def _normalised(self, obs: Obs) -> Obs:
        if not self.obs_norm.enabled:
            return obs
        return self.obs_norm(obs.float())  # type: ignore[union-attr]

    def initial_state(self, n: int) -> CoreState | None:
        """The zero state of n envs (actor core's tensors, then the critic core's), or None: feed-forward."""
        if not self.recurrent:
            return None
        device = self.critic_head.linear.weight.device
        critic = () if self.critic_core is None else self.critic_core.initial_state(n, device)
        return self.actor_core.initial_state(n, device) + critic

    def _split(self, state: CoreState | None, n: int) -> tuple[CoreState, CoreState]:
        state = self.initial_state(n) if state is None else state
        return state[: self._actor_state_len], state[self._actor_state_len:]

    def forward(self, obs: Obs) -> tuple[Tensor, Tensor]:
        """obs [B, *obs_shape] (or a dict of them) -> (logits or Gaussian mean [B, A], value [B]).
        Feed-forward only: a recurrent policy learns through ``unroll``."""
        if self.recurrent:
            raise TypeError("a recurrent policy has no stateless forward: use unroll(obs, state, mask)")
        obs = self._normalised(obs)
        features = self.actor_encoder(obs)
        critic_features = features if self.critic_encoder is None else self.critic_encoder(obs)
        return self.actor_head(features), self.critic_head(critic_features)

    def act(self, obs: Obs, state: CoreState | None = None, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        """obs [N, ...], state (recurrent: the state the envs' previous step ended in, zero after an
        episode's end) -> ActOutput(action [N] int64 or [N, A] float32, log_prob [N], state: the next state).
        Feed-forward: actor only, except that a torso shared with the critic also gives V(obs) (the critic
        head alone: it spares the learner a second forward through the torso). Recurrent: the critic core
        steps too, so its state stays current."""
        obs = self._normalised(obs)
        if not self.recurrent:
            features = self.actor_encoder(obs)
            value = self.critic_head(features) if self.critic_encoder is None else None
            return ActOutput(*self.actor_head.sample(self.actor_head(features), deterministic, generator),
                             value=value)
        actor_state, critic_state = self._split(state, len(obs_leaves(obs)[0]))
        features, actor_state = self.actor_core.step(self.actor_encoder(obs), actor_state)
        if self.critic_core is not None:
            _, critic_state = self.critic_core.step(self.critic_encoder(obs), critic_state)  # type: ignore[misc]
        out = self.actor_head(features)
        return ActOutput(*self.actor_head.sample(out, deterministic, generator), state=actor_state + critic_state)

    def value(self, obs: Obs, state: CoreState | None = None) -> Tensor:
        """obs [B, ...], state (recurrent: the state before this observation; None: the initial state)
        -> V(obs) [B]; critic only."""
        obs = self._normalised(obs)
        encoder = self.actor_encoder if self.critic_encoder is None else self.critic_encoder
        features = encoder(obs)
        if self.recurrent:
            actor_state, critic_state = self._split(state, features.shape[0])
            core = self.actor_core if self.critic_core is None else self.critic_core
            features, _ = core.step(features, actor_state if self.critic_core is None else critic_state)
        return self.critic_head(features)

    def unroll(self, obs: Obs, state: CoreState, mask: Tensor, *,
               keep_states: bool = True) -> tuple[Tensor, Tensor, list[CoreState]]:
        """A recurrent policy over a rollout: obs [T, N, ...] (or a dict of them), state at step 0, mask [T, N]
        (0 where an episode ended before step t) -> (logits or Gaussian mean [T, N, A], value [T, N], the
        state after each step: a list of T states, actor then critic tensors, each [1, N, H]; [] without
        ``keep_states``, which lets the cores run fused multi-step kernels)."""
        T, N = mask.shape
        x = self._normalised(obs_map(lambda o: o.reshape(T * N, *o.shape[2:]), obs))
        actor_state, critic_state = self._split(state, N)
        actor_out, actor_states = self.actor_core.sequence(self.actor_encoder(x).reshape(T, N, -1), actor_state,
                                                           mask, keep_states=keep_states)
        if self.critic_core is None:
            critic_out, critic_states = actor_out, [()] * len(actor_states)
        else:
            critic_features = self.critic_encoder(x).reshape(T, N, -1)  # type: ignore[misc]
            critic_out, critic_states = self.critic_core.sequence(critic_features, critic_state, mask,
                                                                  keep_states=keep_states)
        states = [a + c for a, c in zip(actor_states, critic_states, strict=True)]
        return self.actor_head(actor_out), self.critic_head(critic_out), states

    def evaluate(self, obs: Obs, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """obs [B, ...], action [B] or [B, A] -> (log_prob [B], entropy [B], value [B])."""
        out, value = self(obs)
        logp, entropy = self.actor_head.log_prob_entropy(out, action.to(out.device))
        return logp, entropy, value


class QNetwork(nn.Module):
    """Encoder + Q head: obs [B, ...] (or a dict of them) -> Q-values [B, n_actions] (DQN)."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings):
        super().__init__()
        if spec.action_kind != "discrete":
            raise ConfigError(f"a Q-network needs Discrete actions; env.id={spec.env_id} has {spec.describe()}: "
                              "use algo=sac for Box actions")
        self.n_actions = spec.n_actions
        self.encoder = make_encoder(spec.observation, settings.with_mlp(DEFAULT_MLP, DEFAULT_ACTIVATION))
        self.head = QHead(self.encoder.out_dim, spec.n_actions)

    def forward(self, obs: Obs) -> Tensor:
        return self.head(self.encoder(obs))


def make_actor_critic(spec: EnvSpec, settings: ModelSettings, *, norm_obs: bool = False,
                      init_log_std: float = 0.0) -> ActorCritic | ModularActorCritic:
    """The actor-critic for ``spec`` (PPO, A2C, IMPALA): encoder(s) by observation space + policy and value
    heads. ``norm_obs`` and ``init_log_std`` stay algorithm hyper-parameters.

    Float vectors with separate MLP torsos get ``ActorCritic``: the same maths (two MLPs, same init) run as
    one ``TwinMLP``, which keeps PPO's numpy fast path and the checkpoints of existing runs loadable.
    A recurrent ``model.core`` always gets ``ModularActorCritic`` (the fast path is feed-forward only).
    """
    settings = settings.with_mlp(DEFAULT_MLP, DEFAULT_ACTIVATION)
    obs = spec.observation
    if is_float_vector(obs) and settings.encoder in ("auto", "mlp") and not settings.shared and not \
            settings.ignore_keys and settings.core == "identity":
        return ActorCritic(spec, hidden_sizes=list(settings.hidden_sizes), activation=settings.activation,
                           norm_obs=norm_obs, init_log_std=init_log_std)
    return ModularActorCritic(spec, settings, norm_obs=norm_obs, init_log_std=init_log_std)


def make_q_network(spec: EnvSpec, settings: ModelSettings) -> QNetwork:
    """The Q-network for ``spec`` (DQN; build a second one for the target network and load_state_dict)."""
    return QNetwork(spec, settings)


class EncodedSquashedGaussianActor(Policy):
    """SAC's actor over any observation: encoder -> squashed Gaussian head (Haarnoja et al. 2018)."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings):
        super().__init__()
        self.encoder = make_encoder(spec.observation, settings)
        low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
        shape = torch.Size(spec.action_shape)
        self.head = SquashedGaussianHead(self.encoder.out_dim, shape.numel(), low.reshape(-1), high.reshape(-1))

    def sample(self, obs: Obs, *, deterministic: bool = False,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """obs [B, ...] (or a dict of them, stored dtype) -> (action [B, A] in bounds, log_prob [B])."""
        return self.head(self.encoder(obs), deterministic=deterministic, generator=generator)

    def act(self, obs: Obs, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        return ActOutput(*self.sample(obs, deterministic=deterministic, generator=generator))


class ContinuousQNetwork(nn.Module):
    """Q(s, a) over any observation: encoder(obs) ++ action -> MLP -> Q [B] (SAC's critic; each critic owns
    its encoder, as the SAC-AE / DrQ critics do, so the twin estimates stay independent)."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings):
        super().__init__()
        self.encoder = make_encoder(spec.observation, settings, warn=False)
        act_dim = torch.Size(spec.action_shape).numel()
        self.q = mlp(self.encoder.out_dim + act_dim, settings.hidden_sizes, 1, activation=settings.activation)

    def forward(self, obs: Obs, action: Tensor) -> Tensor:
        """obs [B, ...] (or a dict of them), action [B, A] -> Q [B]."""
        features = self.encoder(obs)
        return self.q(torch.cat([features, action.to(features.device)], -1)).squeeze(-1)


def make_sac_actor(spec: EnvSpec, settings: ModelSettings) -> EncodedSquashedGaussianActor:
    """SAC's actor for ``spec``: encoder by observation space + squashed Gaussian (Box actions)."""
    if spec.action_kind != "box":
        raise ConfigError(f"a squashed Gaussian actor needs Box actions; env.id={spec.env_id} has "
                          f"{spec.describe()}: use algo=ppo or algo=dqn for Discrete actions")
    return EncodedSquashedGaussianActor(spec, settings.with_mlp((256, 256), "relu"))


def make_continuous_q(spec: EnvSpec, settings: ModelSettings) -> ContinuousQNetwork:
    """One SAC critic for ``spec`` (build four: twin critics and their targets)."""
    return ContinuousQNetwork(spec, settings.with_mlp((256, 256), "relu"))
