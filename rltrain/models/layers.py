"""Network pieces: MLP torsos, running normalisers, categorical and Gaussian heads.

The heads sample without ``torch.distributions`` objects: building a distribution object per step costs
more than the forward pass for small nets (it capped acting near 23k steps/s on 2 cores). Discrete
actions use the Gumbel-max trick, Gaussian ones ``mean + std * eps``; log-probs are written out.

Two pieces exist for speed on CPU, where a torch op on a tiny tensor costs 5-50 us of overhead:
``TwinMLP`` runs an actor and a critic torso as one batched matmul per layer, and ``NumpyActor`` is a
frozen numpy copy of the actor that the collector acts with (a numpy op on a [4, 64] array costs ~1 us).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
# Gumbel-max's uniform noise is clipped into (0, 1) on both sides: a float32 draw that rounds to 1.0 would
# give -log(-log 1) = inf and force that action whatever the policy says. The upper bound is the largest
# float32 below 1 (1 - 2^-24).
UNIFORM_LOW, UNIFORM_HIGH = 1e-10, 1.0 - 2.0**-24
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}
TORCH_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"tanh": torch.tanh, "relu": torch.relu, "elu": F.elu,
                                                            "silu": F.silu}
NUMPY_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}


def layer_init(layer: nn.Module, gain: float = math.sqrt(2)) -> nn.Module:
    """Orthogonal weights with ``gain`` and zero biases (Saxe et al. 2014), for a Linear or a Conv2d: the init of
    every layer the model family builds, as CleanRL's (Engstrom et al. 2020, "Implementation Matters", list it
    among the details that matter). Returns the layer."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class MLP(nn.Sequential):
    """Linear and activation layers: an ``nn.Sequential`` (the same parameters, ``state_dict`` keys and printout)
    whose forward calls ``F.linear`` and the activation function itself, the ops the layers' own forwards run,
    so the results are bit for bit theirs. One module call per MLP instead of one per layer: on CPU the cost of a
    module call is that of a small layer's arithmetic, and off-policy learners run thousands of small forwards.
    (Hooks registered on the layers inside are therefore not called; register them on the MLP.)

    A ReLU or tanh right after a Linear runs in place on the Linear's fresh output: the Linear's backward reads
    its input and weight, never its output, and these two activations' backwards read their result, so autograd
    is unchanged and the bits are the same, without allocating and writing a second [B, width] tensor per
    layer (on CPU the memory traffic of those elementwise ops costs about as much as the small matmuls)."""

    def forward(self, x: Tensor) -> Tensor:
        fresh = False  # x is a Linear's output that nothing else holds
        for layer in self:
            kind = type(layer)
            if kind is nn.Linear:
                x, fresh = F.linear(x, layer.weight, layer.bias), True
            else:
                x, fresh = (_IN_PLACE_FNS[kind](x) if fresh and kind in _IN_PLACE_FNS else _LAYER_FNS[kind](x)), False
        return x


_LAYER_FNS: dict[type, Callable[[Tensor], Tensor]] = {ACTIVATIONS[name]: fn for name, fn in TORCH_ACTIVATIONS.items()}
_IN_PLACE_FNS: dict[type, Callable[[Tensor], Tensor]] = {nn.ReLU: torch.relu_, nn.Tanh: torch.tanh_}


def hidden_mlp(in_dim: int, hidden_sizes: Sequence[int], activation: str, *,
               last_gain: float = math.sqrt(2)) -> tuple[MLP, int]:
    """Linear + activation per hidden size (orthogonal, gain sqrt(2); ``last_gain`` for the last hidden layer);
    returns (net, output width)."""
    layers: list[nn.Module] = []
    last = in_dim
    for i, width in enumerate(hidden_sizes):
        gain = last_gain if i == len(hidden_sizes) - 1 else math.sqrt(2)
        layers += [input_major(layer_init(nn.Linear(last, width), gain)), ACTIVATIONS[activation]()]
        last = width
    return MLP(*layers), last


def input_major(layer: nn.Linear) -> nn.Linear:
    """A Linear that widens (fewer inputs than outputs: an MLP's first layer over a small observation) gets its
    [out, in] weight stored input-major (strides (1, out): the memory of its [in, out] transpose). The values,
    shapes and ``state_dict`` are unchanged; what changes is the layout autograd derives its products from: the
    weight gradient is then ``x.T @ grad`` and the input gradient ``grad @ W`` reads W by rows, where the
    row-major weight makes autograd compute ``(grad.T @ x).T``, a [B, out] x [B, in] product that MKL runs 3-5x
    slower than its transpose when ``in`` is a few columns (a SAC update on Pendulum spent 4.5% of its time in
    five such products). Autograd gives the gradient the weight's strides, and Adam's moments are made
    ``zeros_like`` it; a gradient written by hand must be too (``torch._fused_adam_`` reads every tensor of a
    parameter in its memory order). Layers that keep or narrow the width stay row-major: there the layouts run
    alike, or the input-major one slower."""
    if layer.in_features < layer.out_features:
        layer.weight = nn.Parameter(layer.weight.detach().t().contiguous().t())
    return layer


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, *, activation: str = "tanh",
        out_std: float = 1.0) -> MLP:
    """``hidden_mlp`` and an output Linear (gain ``out_std``)."""
    net, last = hidden_mlp(in_dim, hidden, activation)
    net.append(layer_init(nn.Linear(last, out_dim), out_std))
    return net


class RunningNorm(nn.Module):
    """Running mean/variance (Chan et al. parallel update) kept as buffers, so they travel with weights.

    ``update`` takes batch moments, so distributed ranks can all-reduce (count, sum, sum of squares)
    first and every rank applies the same update.
    """

    def __init__(self, shape: Sequence[int], *, clip: float = 10.0, eps: float = 1e-8, enabled: bool = True):
        super().__init__()
        self.enabled = enabled
        self.clip = clip
        self.eps = eps
        self.register_buffer("mean", torch.zeros(tuple(shape), dtype=torch.float64))
        self.register_buffer("var", torch.ones(tuple(shape), dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self._mean32 = torch.zeros(tuple(shape))
        self._std32 = torch.ones(tuple(shape))

    @staticmethod
    def moments(x: np.ndarray, feature_dims: int) -> np.ndarray:
        """Flat [count, sum..., sumsq...] of ``x`` over all leading dims (float64)."""
        flat = x.reshape(-1, *x.shape[x.ndim - feature_dims:]).astype(np.float64) if feature_dims else \
            x.reshape(-1).astype(np.float64)
        return np.concatenate([[flat.shape[0]], flat.sum(0).ravel(), (flat**2).sum(0).ravel()])

    def update_from_moments(self, m: np.ndarray) -> None:
        size = self.mean.numel()
        n, s, ss = float(m[0]), torch.from_numpy(m[1:1 + size]), torch.from_numpy(m[1 + size:])
        if n <= 0:
            return
        b_mean = (s / n).reshape(self.mean.shape)
        b_var = (ss / n).reshape(self.mean.shape) - b_mean**2
        delta = b_mean - self.mean
        tot = self.count + n
        self.mean += delta * n / tot
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / tot
        self.var.copy_(m2 / tot)
        self.count.fill_(tot)
        self.refresh()

    def refresh(self) -> None:
        """Cache float32 mean/std for the hot path (call after loading a state dict)."""
        self._mean32 = self.mean.float()
        self._std32 = torch.sqrt(self.var + self.eps).float()

    def cache_key(self) -> tuple[Tensor, Tensor]:
        """The float32 (mean, std) the hot path uses; new objects whenever the statistics change."""
        return self._mean32, self._std32

    def numpy_moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the float32 (mean, std), flattened, for a numpy actor or update."""
        return self._mean32.numpy().reshape(-1).copy(), self._std32.numpy().reshape(-1).copy()

    def normalise_numpy(self, x: np.ndarray) -> np.ndarray:
        """``forward`` in numpy on flattened rows: x [B, prod(shape)] float32 -> clip((x - mean) / std) float32."""
        if not self.enabled:
            return x
        mean, std = self._mean32.numpy().reshape(-1), self._std32.numpy().reshape(-1)
        return np.clip((x - mean) / std, -self.clip, self.clip).astype(np.float32, copy=False)

    def _load_from_state_dict(self, *args, **kwargs):  # keep the float32 cache in step with loads
        super()._load_from_state_dict(*args, **kwargs)
        self.refresh()

    def forward(self, x: Tensor) -> Tensor:
        if not self.enabled:
            return x
        return torch.clamp((x - self._mean32) / self._std32, -self.clip, self.clip)


def categorical_sample(logits: Tensor, deterministic: bool, generator: torch.Generator | None = None,
                       *, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """logits [B, A] -> (action [B] int64, log_prob [B]). Gumbel-max: argmax(logits + Gumbel noise).

    ``noise`` [B, A] uniform in [0, 1) replaces the draw (tests compare against ``NumpyActor``)."""
    logp_all = torch.log_softmax(logits, dim=-1)
    if deterministic:
        action = logits.argmax(-1)
    else:
        u = noise if noise is not None else torch.rand(logits.shape, generator=generator, device=logits.device)
        u = u.clamp(UNIFORM_LOW, UNIFORM_HIGH)
        action = (logits - torch.log(-torch.log(u))).argmax(-1)
    return action, logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)


def categorical_logp_entropy(logits: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
    """logits [B, A], action [B] -> (log_prob [B], entropy [B])."""
    logp_all = torch.log_softmax(logits, dim=-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1), entropy


def gaussian_sample(mean: Tensor, log_std: Tensor, deterministic: bool, generator: torch.Generator | None = None,
                    *, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """mean [B, A], log_std [A] or [B, A] -> (action [B, A], log_prob [B]) of a diagonal Gaussian.

    ``noise`` [B, A] standard normal replaces the draw."""
    if deterministic:
        action = mean
        eps = torch.zeros_like(mean)
    else:
        eps = noise if noise is not None else torch.randn(mean.shape, generator=generator, device=mean.device)
        action = mean + log_std.exp() * eps
    logp = (-0.5 * eps**2 - log_std - _LOG_SQRT_2PI).sum(-1)
    return action, logp


def gaussian_logp_entropy(mean: Tensor, log_std: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
    """Diagonal Gaussian log-prob [B] of ``action`` [B, A] and entropy [B]."""
    log_std = log_std.expand_as(mean)
    z = (action - mean) / log_std.exp()
    logp = (-0.5 * z**2 - log_std - _LOG_SQRT_2PI).sum(-1)
    entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum(-1)
    return logp, entropy


class TwinMLP(nn.Module):
    """An actor and a critic MLP with the same hidden sizes, evaluated together.

    Layer k of both nets is one ``baddbmm`` over a weight stack ``[2, in, out]`` (index 0 actor, 1 critic),
    so a forward and a backward cost half the torch calls of two separate MLPs. The output layer is
    stacked too, padded to ``P = max(actor_out, critic_out)`` columns: the padding columns start at zero,
    feed no output, get zero gradients and so stay zero under Adam (the maths is that of two MLPs).
    Init as CleanRL: orthogonal, gain sqrt(2) in the torso, ``out_stds`` on the output layers.
    """

    def __init__(self, in_dim: int, hidden: Sequence[int], out_dims: tuple[int, int], *,
                 activation: str = "tanh", out_stds: tuple[float, float] = (0.01, 1.0)):
        super().__init__()
        self.activation = activation
        self.act_fn = TORCH_ACTIVATIONS[activation]
        self.out_dims = out_dims
        sizes = [in_dim, *hidden]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            self._add_layer(fan_in, (fan_out, fan_out), (math.sqrt(2), math.sqrt(2)))
        self._add_layer(sizes[-1], out_dims, out_stds)

    def _add_layer(self, fan_in: int, fan_outs: tuple[int, int], stds: tuple[float, float]) -> None:
        width = max(fan_outs)
        w = torch.zeros(2, fan_in, width)
        for k in range(2):
            wk = torch.empty(fan_outs[k], fan_in)  # nn.Linear's [out, in] layout, so init matches CleanRL's
            nn.init.orthogonal_(wk, stds[k])
            w[k, :, : fan_outs[k]] = wk.t()
        self.weights.append(nn.Parameter(w))
        self.biases.append(nn.Parameter(torch.zeros(2, 1, width)))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, in] -> (actor out [B, actor_out], critic out [B, critic_out])."""
        h = x.unsqueeze(0).expand(2, *x.shape)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = self.act_fn(h)
        return h[0, :, : self.out_dims[0]], h[1, :, : self.out_dims[1]]

    def numpy_layers(self, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Copies of net ``k``'s (weight [in, out], bias [out]) per layer, padding removed."""
        layers = []
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            width = self.out_dims[k] if i == last else w.shape[2]
            layers.append((w[k, :, :width].detach().cpu().numpy().copy(),
                           b[k, 0, :width].detach().cpu().numpy().copy()))
        return layers


class NumpyActor:
    """A frozen numpy copy of an actor MLP (+ observation normaliser) for acting on CPU.

    Used by ``RolloutCollector`` for a whole rollout, so weights are copied once per rollout. Noise comes
    from the caller (drawn for the whole rollout in one call from a seeded ``np.random.Generator``):
    uniform [.., A] for Gumbel-max (discrete), standard normal [.., A] for a Gaussian (box). Given the
    same noise it picks the same actions and log-probs as ``categorical_sample`` / ``gaussian_sample``.
    """

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]], *, activation: str, discrete: bool,
                 log_std: np.ndarray | None = None, obs_mean: np.ndarray | None = None,
                 obs_std: np.ndarray | None = None, obs_clip: float = 10.0):
        self.layers = layers
        self.act_fn = NUMPY_ACTIVATIONS[activation]
        self.discrete = discrete
        self.out_dim = layers[-1][0].shape[1]
        self.log_std = log_std
        self.obs_mean, self.obs_std, self.obs_clip = obs_mean, obs_std, obs_clip

    def forward(self, obs: np.ndarray) -> np.ndarray:
        """obs [N, *obs_shape] float32 -> logits or Gaussian mean [N, A]."""
        x = obs.reshape(obs.shape[0], -1)
        if self.obs_mean is not None:
            x = np.clip((x - self.obs_mean) / self.obs_std, -self.obs_clip, self.obs_clip)
        *hidden, (w_out, b_out) = self.layers
        for w, b in hidden:
            x = np.matmul(x, w)
            x += b  # in place: one array a layer
            x = self.act_fn(x)
        x = np.matmul(x, w_out)
        x += b_out
        return x

    def perturb(self, noise: np.ndarray) -> np.ndarray:
        """Turn raw noise [..., A] into what ``action`` adds to the net output: Gumbel(0, 1) or std * eps."""
        if self.discrete:
            # maximum / minimum: np.clip's numbers without its Python wrapper
            return -np.log(-np.log(np.minimum(np.maximum(noise, np.float32(UNIFORM_LOW)), np.float32(UNIFORM_HIGH))))
        return np.exp(self.log_std) * noise

    def action(self, out: np.ndarray, perturbation: np.ndarray) -> np.ndarray:
        """out [N, A], perturbation [N, A] (from ``perturb``) -> action [N] int64 or [N, A] float32."""
        if self.discrete:
            return (out + perturbation).argmax(-1)
        return (out + perturbation).astype(np.float32)

    def log_prob(self, out: np.ndarray, action: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Batched log-probs [...] of ``action`` given net outputs ``out`` [..., A] and raw ``noise``."""
        if self.discrete:
            # ufunc.reduce and an index instead of max / sum / take_along_axis: the same numbers without their
            # Python wrappers (evaluation calls this every step)
            m = np.maximum.reduce(out, axis=-1, keepdims=True)
            lse = np.log(np.add.reduce(np.exp(out - m), axis=-1)) + m[..., 0]
            picked = np.take_along_axis(out, action[..., None], -1)[..., 0] if out.ndim != 2 else \
                out[np.arange(len(out)), action]
            return (picked - lse).astype(np.float32)
        return (-0.5 * noise**2 - self.log_std - _LOG_SQRT_2PI).sum(-1).astype(np.float32)
