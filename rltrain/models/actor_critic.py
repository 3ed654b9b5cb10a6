"""The actor-critic every on-policy algorithm (PPO, A2C, IMPALA) acts and learns through.

    obs -> [running normalisation] -> torso: encoder(s) -> core(s) -> policy parameters [B, P], V [B]
        -> action distribution (by action space: ``distributions.py``) -> action, log-prob, entropy

One class; the torso is one of two executions of the same graph:

- ``EncoderTorso``: an encoder per observation kind (``encoders.py``), an optional recurrent core
  (``cores.py``), a policy Linear and a value head; actor and critic own one each, or share them
  (``model.shared``).
- ``TwinMLPTorso``: separate actor and critic MLPs over float vectors, run as one ``layers.TwinMLP`` (one
  batched matmul per layer for both). This is what the numpy backend runs: ``numpy_actor()`` hands the
  collector a numpy copy of the actor, and PPO's numpy update (``algos/surrogate_numpy.py``) computes its
  gradient in place over the same parameters. Same maths as an ``EncoderTorso`` with MLP encoders.

Checkpoints written before the two torsos were one class still load (``load_state_dict`` renames keys).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.data.structs import ActOutput, EnvSpec, ObsSpace, Policy, action_mask_of, obs_leaves, obs_map
from rltrain.errors import ConfigError
from rltrain.models.cores import CoreState, make_core
from rltrain.models.distributions import ActionDistribution, make_action_distribution, mask_logits
from rltrain.models.encoders import Encoder, Obs, image_layout, make_encoder, shares_torso
from rltrain.models.heads import POLICY_GAIN, ValueHead
from rltrain.models.layers import NumpyActor, RunningNorm, TwinMLP
from rltrain.models.settings import ModelSettings


def is_float_vector(obs: ObsSpace) -> bool:
    return obs.kind == "box" and image_layout(obs.shape) is None and obs.dtype.startswith("float")


class TwinMLPTorso(nn.Module):
    """Actor and critic MLPs (same widths, separate weights) over flattened float vectors, as one TwinMLP whose
    last layer gives the policy parameters (gain 0.01: a near-uniform / zero-mean start, Andrychowicz et al.
    2021) and V (gain 1)."""

    recurrent = False

    def __init__(self, obs: ObsSpace, param_dim: int, settings: ModelSettings):
        super().__init__()
        self.nets = TwinMLP(math.prod(obs.shape), settings.hidden_sizes, (param_dim, 1),
                            activation=settings.activation, out_stds=(POLICY_GAIN, 1.0))

    def param_list(self, dist_params: list[nn.Parameter]) -> list[nn.Parameter]:
        """TwinMLP weights [2, in, out] per layer, biases [2, 1, out] per layer, then the distribution's: the
        order PPO's numpy update and every optimiser state index by."""
        return [*self.nets.weights, *self.nets.biases, *dist_params]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        out, value = self.nets(x.reshape(x.shape[0], -1))  # a scalar Box's [B] too
        return out, value.squeeze(-1)

    def act(self, x: Tensor, state: CoreState) -> tuple[Tensor, Tensor | None, CoreState]:
        return self(x)[0], None, state

    def actor(self, x: Tensor, state: CoreState) -> tuple[Tensor, CoreState]:
        return self(x)[0], state

    def value(self, x: Tensor, state: CoreState) -> Tensor:
        return self(x)[1]

    def initial_state(self, n: int) -> CoreState:
        return ()


class EncoderTorso(nn.Module):
    """Encoder -> core -> policy Linear for the actor; encoder -> core -> value head for the critic, or one
    encoder and core for both (``shared``, as CleanRL's Atari PPO). A recurrent state is the actor core's
    tensors followed by the critic core's."""

    def __init__(self, obs: ObsSpace, param_dim: int, settings: ModelSettings):
        super().__init__()
        keys = [k for k, _ in obs.parts]
        missing = [k for k in settings.critic_keys if k not in keys]
        if missing:
            raise ConfigError(f"model.critic_keys: {missing[0]!r} is not a key of the observation {obs.name}")
        shared = shares_torso(settings.shared, obs) and not settings.critic_keys
        # the actor never reads ``critic_keys`` (a centralised critic's global state): they are dropped for it
        actor_settings = dataclasses.replace(settings, ignore_keys=settings.ignore_keys + settings.critic_keys)
        self.actor_encoder: Encoder = make_encoder(obs, actor_settings)
        self.critic_encoder: Encoder | None = None if shared else make_encoder(obs, settings, warn=False)
        width = self.actor_encoder.out_dim
        self.actor_core = make_core(settings.core, width, settings.core_size)
        self.critic_core = None if shared else make_core(settings.core, width, settings.core_size)
        self.recurrent = self.actor_core.recurrent
        self._actor_state_len = len(self.actor_core.initial_state(0))
        self.actor_out = nn.Linear(self.actor_core.out_dim, param_dim)
        nn.init.orthogonal_(self.actor_out.weight, POLICY_GAIN)
        nn.init.zeros_(self.actor_out.bias)
        self.critic_head = ValueHead(self.actor_core.out_dim)

    def param_list(self, dist_params: list[nn.Parameter]) -> list[nn.Parameter]:
        """Registration order with the distribution's parameters after the policy Linear (the order of every
        checkpoint's optimiser state since the model family began)."""
        head = [*self.actor_out.parameters(), *dist_params]
        body = [p for name, p in self.named_parameters() if not name.startswith(("actor_out.", "critic_head."))]
        return [*body, *head, *self.critic_head.parameters()]

    def _split(self, state: CoreState, n: int) -> tuple[CoreState, CoreState]:
        state = state or self.initial_state(n)
        return state[: self._actor_state_len], state[self._actor_state_len:]

    def initial_state(self, n: int) -> CoreState:
        if not self.recurrent:
            return ()
        device = self.critic_head.linear.weight.device
        critic = () if self.critic_core is None else self.critic_core.initial_state(n, device)
        return self.actor_core.initial_state(n, device) + critic

    def forward(self, x: Obs) -> tuple[Tensor, Tensor]:
        """Feed-forward only: (policy parameters [B, P], V [B])."""
        if self.recurrent:
            raise TypeError("a recurrent policy has no stateless forward: use unroll(obs, state, mask)")
        features = self.actor_encoder(x)
        critic_features = features if self.critic_encoder is None else self.critic_encoder(x)
        return self.actor_out(features), self.critic_head(critic_features)

    def act(self, x: Obs, state: CoreState) -> tuple[Tensor, Tensor | None, CoreState]:
        """(policy parameters, V(obs) where it comes nearly free (a torso shared with the critic: one Linear
        more, which spares the learner a second forward), the next state). The critic core steps too, so
        its state stays current."""
        if not self.recurrent:
            features = self.actor_encoder(x)
            value = self.critic_head(features) if self.critic_encoder is None else None
            return self.actor_out(features), value, state
        actor_state, critic_state = self._split(state, len(obs_leaves(x)[0]))
        features, actor_state = self.actor_core.step(self.actor_encoder(x), actor_state)
        if self.critic_core is not None:
            _, critic_state = self.critic_core.step(self.critic_encoder(x), critic_state)  # type: ignore[misc]
        return self.actor_out(features), None, actor_state + critic_state

    def actor(self, x: Obs, state: CoreState) -> tuple[Tensor, CoreState]:
        """The actor alone (export): (policy parameters, the actor core's next state)."""
        features, state = self.actor_core.step(self.actor_encoder(x), state)
        return self.actor_out(features), state

    def value(self, x: Obs, state: CoreState) -> Tensor:
        encoder = self.actor_encoder if self.critic_encoder is None else self.critic_encoder
        features = encoder(x)
        if self.recurrent:
            actor_state, critic_state = self._split(state, features.shape[0])
            core = self.actor_core if self.critic_core is None else self.critic_core
            features, _ = core.step(features, actor_state if self.critic_core is None else critic_state)
        return self.critic_head(features)

    def unroll(self, x: Obs, state: CoreState, mask: Tensor, *,
               keep_states: bool = True) -> tuple[Tensor, Tensor, list[CoreState]]:
        T, N = mask.shape
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
        return self.actor_out(actor_out), self.critic_head(critic_out), states


class ActorCritic(Policy):
    """Running observation normalisation + a torso (``EncoderTorso`` or ``TwinMLPTorso``) + the action
    distribution of the env's action space. ``obs_norm`` normalises float vector observations when enabled (a
    ``RunningNorm`` the algorithm updates); images, Discrete and Dict observations are scaled by their encoder.
    """

    def __init__(self, spec: EnvSpec, settings: ModelSettings, *, norm_obs: bool = False,
                 init_log_std: float = 0.0, torso: type[nn.Module] = EncoderTorso):
        super().__init__()
        obs = spec.observation
        if norm_obs and not is_float_vector(obs):
            raise ConfigError(f"algo.norm_obs=true normalises float vector observations only; env.id={spec.env_id} "
                              f"observes {obs.name} (the encoder scales it itself): set algo.norm_obs=false")
        self.spec = spec
        self.obs_norm = RunningNorm(obs.shape if is_float_vector(obs) else (), enabled=norm_obs)
        self.dist: ActionDistribution = make_action_distribution(spec, init_log_std=init_log_std)
        self.masked = spec.masked
        if self.masked and spec.action_kind not in ("discrete", "multi_discrete"):
            raise ConfigError(f"env.id={spec.env_id}: action masks apply to Discrete and MultiDiscrete actions, "
                              f"not {spec.describe()}; set algo.action_mask=off")
        self.torso = torso(obs, self.dist.param_dim, settings)
        self.recurrent = self.torso.recurrent
        # the TwinMLP and its weight list held outside the module registry (a tuple is a plain attribute): act()
        # reads them every step, and each nn.Module attribute lookup costs a __getattr__ call
        self._twin: tuple = (self.torso.nets, self.torso.nets.weights) if isinstance(self.torso, TwinMLPTorso) else ()
        # set by a learner whose update runs in numpy (every parameter in one flat CPU buffer, in
        # ``param_list()`` order): enables numpy inference in act()
        self.flat_params: Tensor | None = None
        self._snapshot: tuple[np.ndarray, tuple, NumpyActor] | None = None

    def param_list(self) -> list[nn.Parameter]:
        """The parameters in one fixed order (the optimiser state's index order in every checkpoint)."""
        return self.torso.param_list(list(self.dist.parameters()))

    @property
    def fused_mlp(self) -> TwinMLP | None:
        """The TwinMLP that the numpy backend runs, or None (encoders, cores)."""
        return self._twin[0] if self._twin else None

    def _inputs(self, obs: Obs) -> Obs:
        if not self.obs_norm.enabled:
            return obs
        return self.obs_norm(obs.float())  # type: ignore[union-attr]

    def initial_state(self, n: int) -> CoreState | None:
        """The zero state of n envs (actor core's tensors, then the critic core's), or None: feed-forward."""
        return self.torso.initial_state(n) if self.recurrent else None

    def forward(self, obs: Obs) -> tuple[Tensor, Tensor]:
        """obs [B, *obs_shape] (or a dict of them) -> (policy parameters [B, P], value [B]). Feed-forward
        only: a recurrent policy learns through ``unroll``."""
        params, value = self.torso(self._inputs(obs))
        return self._masked(params, obs), value

    def _masked(self, params: Tensor, obs: Obs) -> Tensor:
        """params [B, P] with the illegal actions' logits at the dtype's minimum where the observation carries
        an action mask (``MASK_KEY`` [B, P]; Huang & Ontanon 2022), so acting, the loss (log-prob and entropy
        under the mask) and evaluation all see the masked distribution."""
        return mask_logits(params, action_mask_of(obs)) if self.masked else params

    def act(self, obs: Obs, state: CoreState | None = None, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        """obs [N, ...], state (recurrent: the state the envs' previous step ended in, zero after an
        episode's end) -> ActOutput(action [N] int64 or [N, A] float32, log_prob [N], next state, V(obs)
        where it came free)."""
        if self.flat_params is not None and not torch.is_grad_enabled() and self._numpy_is_live(obs):
            return self._act_numpy(obs, deterministic, generator)  # type: ignore[arg-type]
        params, value, next_state = self.torso.act(self._inputs(obs), state or ())
        action, log_prob = self.dist.sample(self._masked(params, obs), deterministic, generator)
        return ActOutput(action, log_prob, state=next_state if self.recurrent else None, value=value)

    def value(self, obs: Obs, state: CoreState | None = None) -> Tensor:
        """obs [B, ...], state (recurrent: the state before this observation; None: the initial state)
        -> V(obs) [B]; critic only."""
        return self.torso.value(self._inputs(obs), state or ())

    def unroll(self, obs: Obs, state: CoreState, mask: Tensor, *,
               keep_states: bool = True) -> tuple[Tensor, Tensor, list[CoreState]]:
        """A recurrent policy over a rollout: obs [T, N, ...] (or a dict of them), state at step 0, mask [T, N]
        (0 where an episode ended before step t) -> (policy parameters [T, N, P], value [T, N], the state after
        each step: a list of T states, actor then critic tensors, each [1, N, H]; [] without
        ``keep_states``, which lets the cores run fused multi-step kernels)."""
        T, N = mask.shape
        x = self._inputs(obs_map(lambda o: o.reshape(T * N, *o.shape[2:]), obs))
        params, value, states = self.torso.unroll(x, state, mask, keep_states=keep_states)
        return self._masked(params, x).reshape(T, N, -1), value.reshape(T, N), states

    def evaluate(self, obs: Obs, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """obs [B, ...], action [B] or [B, A] -> (log_prob [B], entropy [B], value [B])."""
        params, value = self(obs)
        logp, entropy = self.dist.log_prob_entropy(params, action.to(params.device))
        return logp, entropy, value

    def export_module(self) -> nn.Module:
        return ExportedActor(self)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return super().load_state_dict(upgrade_actor_critic_keys(state_dict), strict=strict, assign=assign)

    # -- the numpy backend (TwinMLPTorso on CPU) -------------------------------------------------------
    def _numpy_is_live(self, obs: Obs) -> bool:
        """The numpy update's flat buffer still holds the TwinMLP's weights (no ``.to(device)`` or assigning load
        moved them off it) and the observation is a CPU tensor."""
        flat, twin = self.flat_params, self._twin
        return (flat is not None and bool(twin) and isinstance(obs, Tensor) and obs.is_cpu and flat.is_cpu
                and flat.data_ptr() == twin[1][0].data_ptr())

    def _act_numpy(self, obs: Tensor, deterministic: bool, generator: torch.Generator | None) -> ActOutput:
        """``act`` without autograd on CPU through a cached numpy copy of the actor (evaluation acts one
        observation at a time, where torch's per-op overhead is ~5x the arithmetic). The noise is drawn
        from the same torch generator, with the same shape, as the torch path draws it."""
        flat = self.flat_params.numpy()  # type: ignore[union-attr]
        norm_key = self.obs_norm.cache_key()
        snap = self._snapshot
        # valid while the weights hold the same values, however they were changed (numpy, copy_, load)
        if snap is None or snap[1][0] is not norm_key[0] or snap[1][1] is not norm_key[1] or \
                not np.array_equal(snap[0], flat):
            snap = self._snapshot = (flat.copy(), norm_key, self.numpy_actor())  # type: ignore[assignment]
        actor = snap[2]
        out = actor.forward(obs.numpy())
        if deterministic:
            noise = np.zeros_like(out)
            action = out.argmax(-1) if actor.discrete else out.astype(np.float32)
        else:
            draw = torch.rand if actor.discrete else torch.randn
            noise = draw(out.shape, generator=generator).numpy()
            action = actor.action(out, actor.perturb(noise))
        return ActOutput(torch.from_numpy(action), torch.from_numpy(actor.log_prob(out, action, noise)))

    def numpy_actor(self) -> NumpyActor | None:
        """A numpy snapshot of the acting branch, or None where the numpy backend does not apply (encoders,
        cores, a distribution without a numpy sampler, weights on an accelerator)."""
        nets = self.fused_mlp
        kind = self.dist.numpy_kind
        if nets is None or kind is None or nets.weights[0].device.type != "cpu":
            return None
        discrete = kind == "categorical"
        norm = self.obs_norm
        mean, std = norm.numpy_moments() if norm.enabled else (None, None)
        return NumpyActor(nets.numpy_layers(0), activation=nets.activation, discrete=discrete,
                          log_std=None if discrete else self.dist.log_std.detach().numpy().copy(),
                          obs_mean=mean, obs_std=std, obs_clip=norm.clip)


class ExportedActor(nn.Module):
    """obs [B, *obs_shape] (or a dict of them) [+ the actor core's state tensors, each [1, B, H]] -> the action
    evaluation steps the env with (the distribution's mode; Box actions clipped to the bounds) [+ the next
    state]. Torch ops only, frozen, no numpy backend, no sampling: what ``rltrain-export`` traces.
    ``state_names``: the state inputs of a recurrent policy (LSTM h, c; GRU h), [] for feed-forward ones."""

    def __init__(self, policy: ActorCritic):
        super().__init__()
        self.policy = policy
        spec = policy.spec
        core = getattr(policy.torso, "actor_core", None)
        self.state_names = (["h", "c"] if core.kind == "lstm" else ["h"]) if policy.recurrent else []
        self.state_size = core.out_dim if policy.recurrent else 0
        self.action_shape = tuple(spec.action_shape)
        self.box = box = spec.action_kind == "box"
        self.register_buffer("low", torch.tensor(spec.action_low if box else (), dtype=torch.float32))
        self.register_buffer("high", torch.tensor(spec.action_high if box else (), dtype=torch.float32))

    def forward(self, obs: Obs, *state: Tensor):
        p = self.policy
        x = p._inputs(obs)
        params, next_state = p.torso.actor(x, tuple(state))
        action = p.dist.mode(p._masked(params, obs))
        if self.box:
            action = action.reshape(action.shape[0], *self.action_shape)
            action = torch.maximum(torch.minimum(action, self.high), self.low)
        return (action, *next_state) if self.state_names else action


def upgrade_actor_critic_keys(state: dict) -> dict:
    """State-dict keys of the two actor-critic classes before the model family was one (``ActorCritic`` with
    ``nets.*`` / ``log_std``; ``ModularActorCritic`` with ``actor_encoder.*`` ... ``actor_head.linear.*``) ->
    today's ``torso.*`` / ``dist.*`` names. Current keys pass through unchanged."""
    if any(k.startswith(("torso.", "dist.")) for k in state):
        return state
    renames = (("nets.", "torso.nets."), ("log_std", "dist.log_std"), ("actor_head.linear.", "torso.actor_out."),
               ("actor_head.log_std", "dist.log_std"), ("actor_encoder.", "torso.actor_encoder."),
               ("critic_encoder.", "torso.critic_encoder."), ("actor_core.", "torso.actor_core."),
               ("critic_core.", "torso.critic_core."), ("critic_head.", "torso.critic_head."))
    out = type(state)()
    for key, value in state.items():
        for old, new in renames:
            if key == old or (old.endswith(".") and key.startswith(old)):
                key = new + key[len(old):]
                break
        out[key] = value
    return out
