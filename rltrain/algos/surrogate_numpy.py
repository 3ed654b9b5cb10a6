"""PPO's update on the numpy backend, for ``TwinMLP`` actor-critics on CPU: ``NumpyUpdate``.

The maths is exactly ``ppo.ppo_loss``'s (CleanRL's PPO step): clipped surrogate (Schulman et al. 2017,
eq. 7), clipped value loss, entropy bonus; ``NumpyPPOStep`` writes its hand-written gradient into a
``FlatParams`` gradient buffer; clipping and Adam are ``models/numpy_mlp.py``'s. ``tests/test_ppo.py`` checks
every activation, depth and loss option against autograd (``ppo.TorchUpdate``) on the same minibatches.
"""

from __future__ import annotations

import math

import numpy as np

from rltrain.algos.base import Sync
from rltrain.algos.minibatches import Minibatch
from rltrain.models.numpy_mlp import (
    ACTIVATION_BACKWARD,
    ACTIVATION_FORWARD,
    NEEDS_PRE_ACTIVATION,
    FlatAdam,
    FlatParams,
    adam_group,
    clip_grad_norm,
    single_thread_blas,
)


class NumpyUpdate:
    """PPO's update with numpy forward and backward, the interface of ``ppo.TorchUpdate``: the fused twin-MLP
    actor-critic's parameters as one flat buffer (their tensors are views of it), the loss and its gradient by
    hand (``NumpyPPOStep``), global grad-norm clipping and Adam (``FlatAdam``: torch Adam's state format, so a
    checkpoint resumes on either backend). ``device`` None: its minibatches are numpy arrays."""

    device = None

    def __init__(self, policy, *, lr: float, clip_coef: float, clip_vloss: bool, ent_coef: float, vf_coef: float,
                 max_grad_norm: float, sync: Sync):
        single_thread_blas()
        nets, dist = policy.fused_mlp, policy.dist
        self.policy, self.sync, self.max_grad_norm = policy, sync, max_grad_norm
        # TwinMLP weights, biases, then log_std (box): NumpyPPOStep relies on this order, and both backends'
        # optimiser state (torch Adam's format) is indexed by it
        self.params = policy.param_list()
        self.flat = FlatParams(self.params)
        policy.flat_params = self.flat.flat
        self.optimizer = FlatAdam(self.flat, group=adam_group(lr, 1e-5))  # make_adam's eps
        self.loss = NumpyPPOStep(self.flat, len(nets.weights), activation=nets.activation,
                                 discrete=dist.numpy_kind == "categorical", act_dim=dist.param_dim,
                                 clip_coef=clip_coef, clip_vloss=clip_vloss, ent_coef=ent_coef, vf_coef=vf_coef)

    def rows(self, obs: np.ndarray) -> np.ndarray:
        """[T, N, *obs_shape] -> [T * N, obs_dim] as the nets see it (the normaliser is fixed during an update)."""
        return self.policy.obs_norm.normalise_numpy(obs.reshape(obs.shape[0] * obs.shape[1], -1))

    def values(self, x: np.ndarray) -> np.ndarray:
        """x [B, *obs_shape] raw observations -> V [B] float32, the critic in numpy."""
        return self.loss.value(self.rows(x[None])).astype(np.float32, copy=False)

    def step(self, mb: Minibatch) -> np.ndarray:
        """One optimiser step on ``mb``; returns [policy loss, value loss, entropy, approx KL, clip fraction]."""
        stats = self.loss(mb.obs, mb.actions, mb.old_logp, mb.adv, mb.ret, mb.old_values)
        self.sync.grads(self.params)  # p.grad are views of the flat gradient: reduced in place
        clip_grad_norm(self.flat, self.max_grad_norm)
        self.optimizer.step()
        return stats

    def mean(self, stats: list[np.ndarray]) -> np.ndarray:
        return np.stack(stats).mean(0)


class NumpyPPOStep:
    """One PPO gradient on a minibatch, forward and backward in numpy.

    Layout (see ``layers.TwinMLP``): weights[l] [2, in, out], biases[l] [2, 1, out]; net 0 is the actor
    (outputs ``act_dim`` logits or Gaussian means), net 1 the critic (output column 0 is V).
    """

    def __init__(self, flat: FlatParams, n_layers: int, *, activation: str, discrete: bool, act_dim: int,
                 clip_coef: float, clip_vloss: bool, ent_coef: float, vf_coef: float):
        self.flat, self.L = flat, n_layers
        # the PPO parameter order: TwinMLP weights[0..L-1], biases[0..L-1], then log_std (box)
        self.w, self.b = flat.views[:n_layers], flat.views[n_layers:2 * n_layers]
        self.gw, self.gb = flat.grads[:n_layers], flat.grads[n_layers:2 * n_layers]
        self.act_fn, self.act_grad = ACTIVATION_FORWARD[activation], ACTIVATION_BACKWARD[activation]
        self.keep_pre = activation in NEEDS_PRE_ACTIVATION
        self.discrete, self.A = discrete, act_dim
        if not discrete:
            self.log_std, self.g_log_std = flat.views[2 * n_layers], flat.grads[2 * n_layers]
        self.c, self.clip_vloss = np.float32(clip_coef), clip_vloss
        self.lo, self.hi = 1 - self.c, 1 + self.c  # the ratio's clip range [1 - c, 1 + c]
        self.ent_coef, self.vf_coef = np.float32(ent_coef), np.float32(vf_coef)
        self._g_buf: np.ndarray | None = None
        self._arange: np.ndarray | None = None
        self._ones_row: np.ndarray | None = None

    def _g_out(self, shape: tuple[int, ...]) -> np.ndarray:
        """The output-gradient buffer, zeroed once per shape: each step writes the same entries (actor
        columns of net 0, column 0 of net 1) and the padding stays zero."""
        if self._g_buf is None or self._g_buf.shape != shape:
            self._g_buf = np.zeros(shape, np.float32)
        return self._g_buf

    def _rows(self, B: int) -> np.ndarray:
        if self._arange is None or len(self._arange) != B:
            self._arange = np.arange(B)
        return self._arange

    def _ones(self, B: int) -> np.ndarray:
        if self._ones_row is None or self._ones_row.shape[1] != B:
            self._ones_row = np.ones((1, B), np.float32)
        return self._ones_row

    def value(self, x: np.ndarray) -> np.ndarray:
        """x [B, in] normalised obs -> V [B]: the critic alone (net 1), no activations kept."""
        h = x
        for i in range(self.L):
            h = np.matmul(h, self.w[i][1]) + self.b[i][1]
            if i < self.L - 1:
                h = self.act_fn(h)
        return h[:, 0]

    def __call__(self, x: np.ndarray, act: np.ndarray, old_logp: np.ndarray, adv: np.ndarray,
                 ret: np.ndarray, old_val: np.ndarray) -> np.ndarray:
        """x [B, in] normalised obs, act [B] int64 or [B, A], the rest [B] float32 (``adv``: A, normalised).
        Writes the gradients of pg_loss + vf*v_loss - ent*entropy into the flat gradient
        buffer; returns [pg_loss, v_loss, entropy, approx_kl, clip_frac] as float32."""
        B = x.shape[0]
        inv_b = np.float32(1.0 / B)  # means as sum * (1/B): np.mean's Python wrapper costs more than the sum
        # forward: both nets at once, keeping activations (and, for silu, pre-activations) for the backward
        acts, pres = [x], []
        h: np.ndarray = x
        for i in range(self.L):
            h = np.matmul(h, self.w[i])
            h += self.b[i]  # in place: one array a layer
            if i < self.L - 1:
                if self.keep_pre:
                    pres.append(h)
                h = self.act_fn(h)
                acts.append(h)
        g_out = self._g_out(h.shape)
        logp, entropy, ratio, log_ratio, pg_loss, inside = self._policy_loss_grad(h, g_out, act, old_logp,
                                                                                   adv, inv_b)
        v_loss = self._value_loss_grad(h[1, :, 0], g_out, ret, old_val, inv_b)

        # backward through both MLPs, gradients written straight into the flat buffer
        g, ones = g_out, self._ones(B)
        for i in range(self.L - 1, -1, -1):
            a = acts[i]
            np.matmul(a.swapaxes(-1, -2), g, out=self.gw[i])
            np.matmul(ones, g, out=self.gb[i])  # the batch sum as a BLAS product: ~3x faster here
            if i > 0:
                g = np.matmul(g, self.w[i].swapaxes(-1, -2))
                self.act_grad(g, a, pres[i - 1] if pres else None)
        # sums as np.add.reduce (what ndarray.sum calls, without its Python wrapper)
        ent = np.add.reduce(entropy) * inv_b
        approx_kl = np.add.reduce((ratio - 1) - log_ratio) * inv_b  # k3 estimator (Schulman, "Approximating KL")
        clip_frac = (B - int(np.add.reduce(inside, dtype=np.intp))) * inv_b  # |ratio - 1| > c
        return np.array([pg_loss, v_loss, ent, approx_kl, clip_frac], np.float32)

    def _policy_loss_grad(self, h: np.ndarray, g_out: np.ndarray, act: np.ndarray, old_logp: np.ndarray,
                          adv: np.ndarray, inv_b: np.float32) -> tuple:
        """Clipped surrogate and entropy from the actor outputs h[0, :, :A]; writes their gradient into
        g_out[0] (and log_std's). Returns (logp, entropy, ratio, log_ratio, pg_loss = -L^CLIP, inside the clip)."""
        out, A = h[0, :, :self.A], self.A
        B = out.shape[0]
        if self.discrete:
            # ufunc.reduce instead of ndarray.max/.sum: same result without their Python wrappers
            m = np.maximum.reduce(out, axis=-1, keepdims=True)
            e = np.exp(out - m)
            z = np.add.reduce(e, axis=-1, keepdims=True)
            p = e / z
            logp_all = out - m - np.log(z)
            rows = self._rows(B)
            logp = logp_all[rows, act]
            entropy = -np.add.reduce(p * logp_all, axis=-1)
        else:
            log_std = self.log_std
            std = np.exp(log_std)
            zs = (act - out) / std
            logp = (-0.5 * zs**2 - log_std - np.float32(0.5 * math.log(2 * math.pi))).sum(-1)
            entropy = np.full(B, (np.float32(0.5 + 0.5 * math.log(2 * math.pi)) + log_std).sum(), np.float32)
        log_ratio = logp - old_logp
        ratio = np.exp(log_ratio)
        surr1 = ratio * adv
        lo, hi = self.lo, self.hi
        surr2 = np.minimum(np.maximum(ratio, lo), hi) * adv  # np.clip's wrapper costs ~5x this
        pg_loss = -(np.add.reduce(np.minimum(surr1, surr2)) * inv_b)  # -L^CLIP (eq. 7), a loss to minimise
        # torch.minimum splits the gradient evenly on ties; clamp passes it on [lo, hi] inclusive
        w1 = _tie_weights(surr2, surr1)  # d min(surr1, surr2) / d surr1
        inside = (ratio >= lo) & (ratio <= hi)
        # d min(surr1, surr2) / d ratio over adv: w1 + (1 - w1) * inside, which (w1 in {0, 0.5, 1}, inside in
        # {0, 1}) is exactly max(w1, inside): one op instead of three
        g_ratio = -(adv * np.maximum(w1, inside) * inv_b)
        g_logp = g_ratio * ratio
        if self.discrete:
            g_logits = -g_logp[:, None] * p
            g_logits[rows, act] += g_logp
            # d(-ent_coef * mean H)/dz = ent_coef/B * p * (log p + H)
            g_logits += (self.ent_coef * inv_b) * p * (logp_all + entropy[:, None])
            g_out[0, :, :A] = g_logits
        else:
            g_out[0, :, :A] = g_logp[:, None] * zs / std
            self.g_log_std[:] = (g_logp[:, None] * (zs**2 - 1)).sum(0) - self.ent_coef
        return logp, entropy, ratio, log_ratio, pg_loss, inside

    def _value_loss_grad(self, value: np.ndarray, g_out: np.ndarray, ret: np.ndarray, old_val: np.ndarray,
                         inv_b: np.float32) -> np.float32:
        """Clipped (or plain) squared error of V [B], weighted by vf_coef; its gradient goes to g_out[1, :, 0]."""
        c = self.c
        d = value - ret
        if self.clip_vloss:
            dv = value - old_val
            dc = old_val + np.minimum(np.maximum(dv, -c), c) - ret
            u1, u2 = d * d, dc * dc
            v_loss = 0.5 * np.add.reduce(np.maximum(u1, u2)) * inv_b
            wv = _tie_weights(u1, u2)
            inside_v = (dv >= -c) & (dv <= c)
            g_out[1, :, 0] = (self.vf_coef * inv_b) * (wv * d + (1 - wv) * dc * inside_v)
        else:
            v_loss = 0.5 * np.add.reduce(d * d) * inv_b
            g_out[1, :, 0] = (self.vf_coef * inv_b) * d
        return v_loss


def _tie_weights(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """d max(a, b) / da as torch computes it: 1 where a > b, 0.5 on ties, 0 where a < b (float32)."""
    w = (a > b).astype(np.float32)
    w += np.float32(0.5) * (a == b)
    return w
