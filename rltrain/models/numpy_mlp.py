"""PPO's minibatch step in numpy with a hand-written backward, for ``TwinMLP`` actor-critics on CPU.

Why: on a small CPU a torch op on a [128, 64] tensor costs 5-50 us of dispatch overhead, and one
autograd PPO step (forward, backward, grad clipping, Adam) runs ~100 of them. numpy does the same
arithmetic with ~1-3 us per op, and keeping every parameter (and gradient) in one flat buffer makes
the global grad norm one dot product and Adam a handful of vector ops. The maths is CleanRL's PPO step
exactly: clipped surrogate, clipped value loss, entropy bonus, global grad-norm clipping, Adam (torch's
update rule, bias-corrected, eps added after the square root). ``tests/test_ppo.py`` checks the
gradients against autograd.

The torch ``nn.Parameter`` objects stay the source of truth: their ``.data`` and ``.grad`` are views
into the flat buffers, so ``state_dict``, checkpoints, ``policy_state()``, evaluation and ``Sync.grads``
(which all-reduces ``p.grad`` in place) all see what numpy writes.
"""

from __future__ import annotations

import ctypes
import glob
import math
import os

import numpy as np
import torch
from torch import nn

SUPPORTED_ACTIVATIONS = ("tanh", "relu")  # derivatives computable from the activation's output
_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads")


def single_thread_blas() -> bool:
    """Limit numpy's OpenBLAS to one thread in this process (best effort; True when it worked).

    Small matmuls gain nothing from threads, and OpenBLAS's spinning threads made a [128, 64] matmul
    6x slower on a busy 2-core machine (measured). Like ``torch.set_num_threads(1)`` for torch.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # for child processes started later
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*"))
    done = False
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _BLAS_SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(1)
                done = True
                break
    return done


class FlatParams:
    """Re-homes ``params`` (CPU, float32) into one flat buffer, with a flat gradient buffer beside it.

    ``data`` / ``grad``: [P] numpy views of the buffers; ``views[i]`` / ``grads[i]``: numpy views shaped
    like parameter i.
    """

    def __init__(self, params: list[nn.Parameter]):
        total = sum(p.numel() for p in params)
        self.flat = torch.zeros(total)
        self.flat_grad = torch.zeros(total)
        off = 0
        for p in params:
            n = p.numel()
            self.flat[off:off + n].copy_(p.data.reshape(-1))
            p.data = self.flat[off:off + n].view_as(p)
            p.grad = self.flat_grad[off:off + n].view_as(p)
            off += n
        self.data = self.flat.numpy()
        self.grad = self.flat_grad.numpy()
        self.views = [p.data.numpy() for p in params]
        self.grads = [p.grad.numpy() for p in params]


class FlatAdam:
    """Adam over one flat parameter buffer, with torch.optim.Adam's update rule (no weight decay)."""

    def __init__(self, flat: FlatParams, *, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-5):
        self.flat, self.lr, self.betas, self.eps = flat, lr, betas, eps
        self.exp_avg = torch.zeros_like(flat.flat)
        self.exp_avg_sq = torch.zeros_like(flat.flat)
        self._m, self._v = self.exp_avg.numpy(), self.exp_avg_sq.numpy()
        self._tmp = np.empty_like(self._m)
        self.steps = 0

    def step(self) -> None:
        b1, b2 = self.betas
        g, m, v, tmp = self.flat.grad, self._m, self._v, self._tmp
        self.steps += 1
        m *= b1
        m += (1 - b1) * g
        v *= b2
        np.multiply(g, g, out=tmp)
        tmp *= 1 - b2
        v += tmp
        bc1, bc2 = 1 - b1**self.steps, 1 - b2**self.steps
        np.sqrt(v, out=tmp)
        tmp /= math.sqrt(bc2)
        tmp += self.eps
        np.divide(m, tmp, out=tmp)
        tmp *= self.lr / bc1
        self.flat.data -= tmp

    def state_dict(self) -> dict:
        return {"step": self.steps, "exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone(),
                "lr": self.lr}

    def load_state_dict(self, state: dict) -> None:
        self.steps = int(state["step"])
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.lr = float(state["lr"])


class NumpyPPOStep:
    """One PPO gradient step on a minibatch, forward and backward in numpy.

    Layout (see ``nets.TwinMLP``): weights[l] [2, in, out], biases[l] [2, 1, out]; net 0 is the actor
    (outputs ``act_dim`` logits or Gaussian means), net 1 the critic (output column 0 is V).
    """

    def __init__(self, flat: FlatParams, n_layers: int, *, activation: str, discrete: bool, act_dim: int,
                 clip_coef: float, clip_vloss: bool, ent_coef: float, vf_coef: float):
        self.flat, self.L = flat, n_layers
        # parameters() order of ActorCritic: TwinMLP weights[0..L-1], biases[0..L-1], then log_std (box)
        self.w, self.b = flat.views[:n_layers], flat.views[n_layers:2 * n_layers]
        self.gw, self.gb = flat.grads[:n_layers], flat.grads[n_layers:2 * n_layers]
        self.tanh = activation == "tanh"
        self.discrete, self.A = discrete, act_dim
        if not discrete:
            self.log_std, self.g_log_std = flat.views[2 * n_layers], flat.grads[2 * n_layers]
        self.c, self.clip_vloss = np.float32(clip_coef), clip_vloss
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
                h = np.tanh(h, out=h) if self.tanh else np.maximum(h, 0, out=h)
        return h[:, 0]

    def __call__(self, x: np.ndarray, act: np.ndarray, old_logp: np.ndarray, neg_adv: np.ndarray,
                 ret: np.ndarray, old_val: np.ndarray) -> np.ndarray:
        """x [B, in] normalised obs, act [B] int64 or [B, A], the rest [B] float32 (``neg_adv`` = -A,
        normalised). Writes the gradients of pg_loss + vf*v_loss - ent*entropy into the flat gradient
        buffer; returns [pg_loss, v_loss, entropy, approx_kl, clip_frac] as float32."""
        B, A, c = x.shape[0], self.A, self.c
        inv_b = np.float32(1.0 / B)  # means as sum * (1/B): np.mean's Python wrapper costs more than the sum
        # forward: both nets at once, keeping activations for the backward
        acts = [x]
        h: np.ndarray = x
        for i in range(self.L):
            h = np.matmul(h, self.w[i]) + self.b[i]
            if i < self.L - 1:
                h = np.tanh(h) if self.tanh else np.maximum(h, 0, dtype=np.float32)
                acts.append(h)
        out, value = h[0, :, :A], h[1, :, 0]
        g_out = self._g_out(h.shape)

        # policy: log-probs, entropy and their gradients w.r.t. the actor's outputs
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
        l1 = neg_adv * ratio
        l2 = neg_adv * np.minimum(np.maximum(ratio, 1 - c), 1 + c)  # np.clip's wrapper costs ~5x this
        pg_loss = np.maximum(l1, l2).sum() * inv_b
        # torch.maximum splits the gradient evenly on ties; clamp passes it on [lo, hi] inclusive
        w1 = _tie_weights(l1, l2)
        inside = (ratio >= 1 - c) & (ratio <= 1 + c)
        g_ratio = neg_adv * (w1 + (1 - w1) * inside) * inv_b
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

        # value: clipped (or plain) squared error, weighted by vf_coef
        d = value - ret
        if self.clip_vloss:
            dv = value - old_val
            dc = old_val + np.minimum(np.maximum(dv, -c), c) - ret
            u1, u2 = d * d, dc * dc
            v_loss = 0.5 * np.maximum(u1, u2).sum() * inv_b
            wv = _tie_weights(u1, u2)
            inside_v = (dv >= -c) & (dv <= c)
            g_out[1, :, 0] = (self.vf_coef * inv_b) * (wv * d + (1 - wv) * dc * inside_v)
        else:
            v_loss = 0.5 * (d * d).sum() * inv_b
            g_out[1, :, 0] = (self.vf_coef * inv_b) * d

        # backward through both MLPs, gradients written straight into the flat buffer
        g = g_out
        for i in range(self.L - 1, -1, -1):
            a = acts[i]
            np.matmul(a.swapaxes(-1, -2), g, out=self.gw[i])
            np.matmul(self._ones(B), g, out=self.gb[i])  # the batch sum as a BLAS product: ~3x faster here
            if i > 0:
                g = np.matmul(g, self.w[i].swapaxes(-1, -2))
                g *= (1 - a * a) if self.tanh else (a > 0)
        ent = entropy.sum() * inv_b
        approx_kl = ((ratio - 1) - log_ratio).sum() * inv_b  # k3 estimator (Schulman, "Approximating KL")
        clip_frac = (B - np.count_nonzero(inside)) * inv_b  # |ratio - 1| > c
        return np.array([pg_loss, v_loss, ent, approx_kl, clip_frac], np.float32)


def _tie_weights(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """d max(a, b) / da as torch computes it: 1 where a > b, 0.5 on ties, 0 where a < b (float32)."""
    w = (a > b).astype(np.float32)
    w += np.float32(0.5) * (a == b)
    return w


def clip_grad_norm(flat: FlatParams, max_norm: float) -> float:
    """Global grad-norm clipping as ``torch.nn.utils.clip_grad_norm_`` (coef max_norm / (norm + 1e-6), <= 1)."""
    norm = math.sqrt(float(np.dot(flat.grad, flat.grad)))
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        flat.grad *= np.float32(coef)
    return norm
