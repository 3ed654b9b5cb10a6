"""The actor-critic every on-policy algorithm (ppo, a2c, impala) acts and learns through.

Actor and critic MLPs over optionally normalised observations, both run as one ``TwinMLP``. On CPU,
``act`` without autograd runs a numpy snapshot of the actor (``numpy_actor()``), which the collector also
uses for its rollouts: torch's per-op overhead is most of the cost of a tiny forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.data.structs import ActOutput, EnvSpec, Policy
from rltrain.models.layers import (
    NumpyActor,
    RunningNorm,
    TwinMLP,
    categorical_logp_entropy,
    categorical_sample,
    gaussian_logp_entropy,
    gaussian_sample,
)


class ActorCritic(Policy):
    """Actor and critic MLPs (same hidden sizes, separate weights) over optionally normalised observations.

    Both nets run as one ``TwinMLP`` (one batched matmul per layer for both). ``numpy_actor()`` hands the
    collector a numpy copy of the actor for fast CPU acting.
    """

    def __init__(self, spec: EnvSpec, *, hidden_sizes: Sequence[int], activation: str, norm_obs: bool,
                 init_log_std: float = 0.0):
        super().__init__()
        obs_dim = int(np.prod(spec.obs_shape))
        self.discrete = spec.action_kind == "discrete"
        self.act_dim = spec.n_actions if self.discrete else int(np.prod(spec.action_shape))
        self.obs_norm = RunningNorm(spec.obs_shape, enabled=norm_obs)
        # a small last-layer gain keeps the initial policy near uniform / zero-mean (Andrychowicz et al. 2021)
        self.nets = TwinMLP(obs_dim, hidden_sizes, (self.act_dim, 1), activation=activation, out_stds=(0.01, 1.0))
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((self.act_dim,), float(init_log_std)))
        # set by a learner whose update runs in numpy (every parameter in one flat CPU buffer, in
        # ``param_list()`` order): enables numpy inference in act()
        self.flat_params: Tensor | None = None
        self._snapshot: tuple[np.ndarray, tuple, NumpyActor] | None = None

    def param_list(self) -> list[nn.Parameter]:
        """The parameters in one fixed order: TwinMLP weights [2, in, out] per layer, biases [2, 1, out] per
        layer, then log_std [A] (Box). Every on-policy learner builds its optimiser over this list, so
        optimiser state index i means the same tensor in every checkpoint (ppo, a2c, impala; numpy or torch)."""
        return [*self.nets.weights, *self.nets.biases] + ([] if self.discrete else [self.log_std])

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """obs [B, *obs_shape] -> (logits or Gaussian mean [B, A], value [B])."""
        out, value = self.nets(self.obs_norm(obs.flatten(1).float()))  # uint8 / bool obs arrive as they are
        return out, value.squeeze(-1)

    def act(self, obs: Tensor, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        if not torch.is_grad_enabled() and obs.device.type == "cpu" and self._flat_is_live():
            return self._act_numpy(obs, deterministic, generator)
        out, _ = self(obs)
        if self.discrete:
            return ActOutput(*categorical_sample(out, deterministic, generator))
        return ActOutput(*gaussian_sample(out, self.log_std, deterministic, generator))

    def value(self, obs: Tensor) -> Tensor:
        """obs [B, *obs_shape] -> V(obs) [B]."""
        return self(obs)[1]

    def evaluate(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """obs [B, ...], action [B, ...] -> (log_prob [B], entropy [B], value [B])."""
        out, value = self(obs)
        if self.discrete:
            logp, ent = categorical_logp_entropy(out, action)
        else:
            logp, ent = gaussian_logp_entropy(out, self.log_std, action)
        return logp, ent, value

    def _flat_is_live(self) -> bool:
        flat = self.flat_params
        return flat is not None and flat.device.type == "cpu" and flat.data_ptr() == self.nets.weights[0].data_ptr()

    def _act_numpy(self, obs: Tensor, deterministic: bool, generator: torch.Generator | None) -> ActOutput:
        """``act`` without autograd on CPU through a cached numpy copy of the actor (evaluation acts one
        observation at a time, where torch's per-op overhead is ~5x the arithmetic). The noise is drawn
        from the same torch generator, with the same shape, as the torch path draws it."""
        flat = self.flat_params.numpy()  # type: ignore[union-attr]
        norm_key = (self.obs_norm._mean32, self.obs_norm._std32)
        snap = self._snapshot
        # valid while the weights hold the same values, however they were changed (numpy, copy_, load)
        if snap is None or snap[1][0] is not norm_key[0] or snap[1][1] is not norm_key[1] or \
                not np.array_equal(snap[0], flat):
            snap = self._snapshot = (flat.copy(), norm_key, self.numpy_actor())  # type: ignore[assignment]
        actor = snap[2]
        out = actor.forward(obs.numpy())
        if deterministic:
            noise = np.zeros_like(out)
            action = out.argmax(-1) if self.discrete else out.astype(np.float32)
        else:
            draw = torch.rand if self.discrete else torch.randn
            noise = draw(out.shape, generator=generator).numpy()
            action = actor.action(out, actor.perturb(noise))
        return ActOutput(torch.from_numpy(action), torch.from_numpy(actor.log_prob(out, action, noise)))

    def numpy_actor(self) -> NumpyActor | None:
        """A numpy snapshot of the acting branch, or None when the weights live on an accelerator."""
        if self.nets.weights[0].device.type != "cpu":
            return None
        norm = self.obs_norm
        return NumpyActor(self.nets.numpy_layers(0), activation=self.nets.activation, discrete=self.discrete,
                          log_std=None if self.discrete else self.log_std.detach().numpy().copy(),
                          obs_mean=norm._mean32.numpy().reshape(-1).copy() if norm.enabled else None,
                          obs_std=norm._std32.numpy().reshape(-1).copy() if norm.enabled else None,
                          obs_clip=norm.clip)
