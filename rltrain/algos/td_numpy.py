"""DQN's TD step on the numpy backend, for a Q-network that is one MLP on CPU: ``NumpyTDStep``. Its input is any
Box (or MultiBinary) observation the MLP encoder reads flattened (float vectors, bool / int / uint8 planes such
as MinAtar's, multi-dimensional boxes), converted as the encoder converts it (``numpy_mlp.flat_float32``).

The maths is exactly ``DQN.update``'s autograd step, for every option that keeps the network one MLP whose last
Linear gives K outputs per action ([B, A * K], action-major as ``QHeads``): the plain head (K = 1, Mnih et al.
2015; the Huber or squared TD error), QR-DQN's quantiles (Dabney et al. 2018; the quantile Huber loss) and C51's
atom logits (Bellemare et al. 2017; cross-entropy to the projected target, ``c51_projection``), each with Double
DQN's target (van Hasselt et al. 2016), n-step returns (the batch's ``discounts``) and prioritised replay's
importance weights (Schaul et al. 2016), handing back the same per-transition priorities. Each loss's gradient
with respect to the chosen action's K outputs is written by hand; backpropagation through the MLP, global
grad-norm clipping and Adam are ``models/numpy_mlp.py``'s. Dueling streams, noisy layers, LayerNorm, action masks,
one-hot (Discrete, MultiDiscrete) inputs and encoders other than the MLP keep autograd (``QPolicy.mlp_layers``).

Why: a small Q-network's autograd step is ~50 torch ops of dispatch overhead each, for arithmetic numpy does in
a fraction of the time; DQN takes one such step every few env steps. ``tests/test_off_policy.py`` and
``tests/test_rainbow.py`` check the step against autograd (``numpy_update=false``) for every loss, activation,
distributional head and replay option; the optimiser state is torch Adam's format, so a checkpoint resumes on
either backend.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.algos.base import Sync
from rltrain.algos.distributional import c51_projection
from rltrain.data.replay import Batch
from rltrain.models.numpy_mlp import (
    ACTIVATION_BACKWARD,
    ACTIVATION_FORWARD,
    NEEDS_PRE_ACTIVATION,
    FlatAdam,
    FlatParams,
    adam_group,
    clip_grad_norm,
    flat_float32,
    single_thread_blas,
)


def log_softmax(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """logits [..., K] -> (log-probabilities, probabilities), shifted by the max so that exp never overflows."""
    shifted = logits - logits.max(-1, keepdims=True)
    e = np.exp(shifted)
    z = e.sum(-1, keepdims=True)
    return shifted - np.log(z), e / z


class NumpyTDStep:
    """One DQN gradient step in numpy. ``linears``: the online Q-network's Linear layers in order (its parameters,
    weight then bias per layer, are re-homed into one flat buffer; their tensors stay views of it), ``target``:
    the target network's in the same order (read as views: target updates copy into them in place).
    ``distributional``: none (``loss`` huber | mse), qr or c51 with ``outputs`` K per action; ``support``: C51's
    atoms z [K]."""

    def __init__(self, linears: list[nn.Linear], target: list[nn.Linear], *, activation: str, lr: float,
                 adam_eps: float, gamma: float, loss: str, double_dqn: bool, max_grad_norm: float | None, sync: Sync,
                 distributional: str = "none", outputs: int = 1, support: Tensor | None = None):
        single_thread_blas()
        self.params = [p for m in linears for p in (m.weight, m.bias)]
        self.flat = FlatParams(self.params)
        self.optimizer = FlatAdam(self.flat, group=adam_group(lr, adam_eps))  # make_adam's, as the torch path's
        views = self.flat.views
        self.layers = list(zip(views[0::2], views[1::2], strict=True))  # (weight [out, in], bias [out])
        self.grads = list(zip(self.flat.grads[0::2], self.flat.grads[1::2], strict=True))
        self.target = [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in target]
        self.act, self.act_backward = ACTIVATION_FORWARD[activation], ACTIVATION_BACKWARD[activation]
        self.keep_z = activation in NEEDS_PRE_ACTIVATION
        self.gamma, self.huber, self.double_dqn = np.float32(gamma), loss == "huber", double_dqn
        self.max_grad_norm, self.sync = max_grad_norm, sync
        self.k, self.support = outputs, support  # C51's atoms as a tensor (for c51_projection) ...
        self.atoms = support.numpy() if support is not None else None  # ... and as an array
        self.loss = {"none": self._scalar_loss, "qr": self._quantile_loss, "c51": self._categorical_loss}[
            distributional]
        self.distributional = distributional
        # QR-DQN's quantile midpoints tau_i = (2i + 1) / 2N as a column [N, 1] (Dabney et al. 2018, lemma 2)
        self.tau = ((np.arange(outputs, dtype=np.float32) + np.float32(0.5)) / np.float32(outputs))[:, None]

    def forward(self, layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray,
                keep: list | None = None) -> np.ndarray:
        """x [B, D] -> the head's outputs [B, A * K]; ``keep`` collects each layer's (input, the pre-activation it
        came from, kept only where the activation's derivative needs it)."""
        z = None
        for i, (w, b) in enumerate(layers):
            if i:
                x = self.act(z)
            if keep is not None:
                keep.append((x, z if self.keep_z else None))
            z = x @ w.T
            z += b
        return z

    def q_values(self, raw: np.ndarray) -> np.ndarray:
        """raw [B, A, K] -> Q [B, A] as ``QHeads.q_values``: the single output, the mean quantile, or E_z[p(z)]."""
        if self.distributional == "qr":
            return raw.mean(-1)
        if self.distributional == "c51":
            return (log_softmax(raw)[1] * self.atoms).sum(-1)
        return raw[..., 0]

    def step(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """One TD step on ``batch``; returns ([td_loss, mean Q(s, a)], the per-transition priorities [B]) as
        ``DQN.update``'s autograd step does."""
        n = len(batch.rewards)
        obs, next_obs = flat_float32(batch.obs.numpy()), flat_float32(batch.next_obs.numpy())  # as FlatInput's
        actions, rewards = batch.actions.numpy().astype(np.int64, copy=False), batch.rewards.numpy()
        rows = np.arange(n)
        # gamma^k (1 - terminated): the bootstrap's weight, k = 1 unless n-step
        gamma = self.gamma if batch.discounts is None else batch.discounts.numpy()
        discounts = gamma * (np.float32(1.0) - batch.terminated.numpy())
        next_target = self.forward(self.target, next_obs).reshape(n, -1, self.k)  # [B, A, K]
        # Double DQN: the online net picks a', the target net values it (reduces overestimation)
        chooser = self.forward(self.layers, next_obs).reshape(n, -1, self.k) if self.double_dqn else next_target
        next_raw = next_target[rows, self.q_values(chooser).argmax(-1)]  # [B, K]: the target's outputs for a'
        keep: list = []
        out = self.forward(self.layers, obs, keep)
        raw = out.reshape(n, -1, self.k)[rows, actions]  # [B, K]
        per_sample, grad, q, priority = self.loss(raw, rewards, discounts, next_raw)
        # prioritised replay corrects its sampling bias with importance weights (Schaul et al. 2016, eq. 4)
        if batch.weights is None:
            loss = float(per_sample.mean())
            grad /= np.float32(n)
        else:
            weights = batch.weights.numpy()
            loss = float((per_sample * weights).mean())
            grad *= (weights / np.float32(n))[:, None]
        dz = np.zeros((n, out.shape[1] // self.k, self.k), np.float32)
        dz[rows, actions] = grad
        self._backward(dz.reshape(out.shape), keep)
        self.sync.grads(self.params)  # all-reduces p.grad, which are views of the flat gradient
        if self.max_grad_norm is not None:
            clip_grad_norm(self.flat, self.max_grad_norm)
        self.optimizer.step()
        return torch.tensor([loss, float(q.mean())], dtype=torch.float32), torch.from_numpy(priority)

    # Each loss: (the chosen action's outputs raw [B, K], rewards [B], discounts [B], the target's outputs for a'
    # [B, K]) -> (loss per transition [B], its gradient with respect to raw [B, K], Q(s, a) [B], priority [B]).

    def _scalar_loss(self, raw, rewards, discounts, next_raw) -> tuple:
        """The TD error d = Q(s, a) - (r + discount * Q_target(s', a')); priority d, as the torch path's."""
        q = raw[:, 0]
        d = q - (rewards + discounts * next_raw[:, 0])
        if self.huber:  # smooth L1 (beta 1): 0.5 d^2 inside [-1, 1], |d| - 0.5 outside; gradient clip(d, -1, 1)
            a = np.abs(d)
            return np.where(a < 1, 0.5 * d * d, a - 0.5), np.clip(d, -1.0, 1.0)[:, None], q, d
        return d * d, (d * np.float32(2.0))[:, None], q, d

    def _quantile_loss(self, raw, rewards, discounts, next_raw) -> tuple:
        """``quantile_huber_loss`` (kappa 1) and its gradient: with u_ij = T theta_j - theta_i, c = clip(u, -1, 1)
        (the Huber loss's derivative) and w_ij = |tau_i - 1{u_ij < 0}|, the loss sum_i mean_j w_ij L(u_ij) with
        L(u) = c (u - c / 2) (0.5 u^2 inside [-1, 1], |u| - 0.5 outside) and d/d theta_i = -mean_j w_ij c_ij.
        Rainbow-style priority: the loss."""
        targets = rewards[:, None] + discounts[:, None] * next_raw  # [B, N']
        u = targets[:, None, :] - raw[:, :, None]  # [B, N, N']
        c = np.clip(u, -1.0, 1.0)
        wc = np.where(u < 0, 1.0 - self.tau, self.tau) * c
        per_sample = (wc * (u - 0.5 * c)).sum(1).mean(-1)
        return per_sample, -wc.mean(-1), raw.mean(-1), per_sample

    def _categorical_loss(self, raw, rewards, discounts, next_raw) -> tuple:
        """Cross-entropy -sum_k m_k log p_k to the projected target m (``c51_projection``, Bellemare et al. 2017,
        algorithm 1); d/d logit_k = p_k sum(m) - m_k (as autograd's log-softmax backward). Priority: the loss
        (Hessel et al. 2018)."""
        to = torch.from_numpy
        target = c51_projection(to(log_softmax(next_raw)[1]), to(rewards), to(np.asarray(discounts, np.float32)),
                                self.support).numpy()
        logp, p = log_softmax(raw)
        per_sample = -(target * logp).sum(-1)
        grad = p * target.sum(-1, keepdims=True) - target
        return per_sample, grad, (p * self.atoms).sum(-1), per_sample

    def _backward(self, dz: np.ndarray, keep: list) -> None:
        """dL/d(outputs) [B, A * K] -> every layer's weight and bias gradient, into the flat gradient buffer."""
        for i in range(len(self.layers) - 1, -1, -1):
            x, z = keep[i]
            gw, gb = self.grads[i]
            np.matmul(dz.T, x, out=gw)
            np.sum(dz, axis=0, out=gb)
            if i:  # through layer i's input, the activation of layer i - 1
                dz = dz @ self.layers[i][0]
                self.act_backward(dz, x, z)
