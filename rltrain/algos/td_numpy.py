"""DQN's TD step on the numpy backend, for a Q-network that is a plain MLP over float vectors on CPU:
``NumpyTDStep``.

The maths is exactly ``DQN.update``'s (Mnih et al. 2015; Double DQN, van Hasselt et al. 2016): the target
``r + gamma * (1 - terminated) * max_a' Q_target(s', a')`` (Double DQN: the online net's argmax, valued by the
target net), the Huber (smooth L1) or squared TD error averaged over the batch, its gradient written by hand into
a ``FlatParams`` gradient buffer, then global grad-norm clipping and Adam (``models/numpy_mlp.py``). Why: a
small Q-network's autograd step is ~50 torch ops of dispatch overhead each, for arithmetic numpy does in a
fraction of the time; DQN takes one such step every few env steps. ``tests/test_off_policy.py`` checks the step
against autograd (``DQN.update`` with ``numpy_update=false``) for every loss, activation and Double DQN; the
optimiser state is torch Adam's format, so a checkpoint resumes on either backend.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.algos.base import Sync
from rltrain.data.replay import Batch
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


class NumpyTDStep:
    """One DQN gradient step in numpy. ``linears``: the online Q-network's Linear layers in order (its parameters,
    weight then bias per layer, are re-homed into one flat buffer; their tensors stay views of it), ``target``:
    the target network's in the same order (read as views: target updates copy into them in place)."""

    def __init__(self, linears: list[nn.Linear], target: list[nn.Linear], *, activation: str, lr: float,
                 gamma: float, loss: str, double_dqn: bool, max_grad_norm: float | None, sync: Sync):
        single_thread_blas()
        self.params = [p for m in linears for p in (m.weight, m.bias)]
        self.flat = FlatParams(self.params)
        self.optimizer = FlatAdam(self.flat, group=adam_group(lr, 1e-8))  # make_adam's, as the torch path's
        views = self.flat.views
        self.layers = list(zip(views[0::2], views[1::2], strict=True))  # (weight [out, in], bias [out])
        self.grads = list(zip(self.flat.grads[0::2], self.flat.grads[1::2], strict=True))
        self.target = [(m.weight.detach().numpy(), m.bias.detach().numpy()) for m in target]
        self.act, self.act_backward = ACTIVATION_FORWARD[activation], ACTIVATION_BACKWARD[activation]
        self.keep_z = activation in NEEDS_PRE_ACTIVATION
        self.gamma, self.huber, self.double_dqn = np.float32(gamma), loss == "huber", double_dqn
        self.max_grad_norm, self.sync = max_grad_norm, sync

    def forward(self, layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray,
                keep: list | None = None) -> np.ndarray:
        """x [B, D] -> Q [B, A]; ``keep`` collects each layer's (input, the pre-activation it came from, kept
        only where the activation's derivative needs it)."""
        z = None
        for i, (w, b) in enumerate(layers):
            if i:
                x = self.act(z)
            if keep is not None:
                keep.append((x, z if self.keep_z else None))
            z = x @ w.T
            z += b
        return z

    def step(self, batch: Batch) -> Tensor:
        """One TD step on ``batch``; returns [td_loss, mean Q(s, a)] as ``DQN.update`` does."""
        obs = batch.obs.numpy().reshape(len(batch.rewards), -1).astype(np.float32, copy=False)
        next_obs = batch.next_obs.numpy().reshape(obs.shape[0], -1).astype(np.float32, copy=False)
        actions, rewards = batch.actions.numpy().astype(np.int64, copy=False), batch.rewards.numpy()
        rows = np.arange(obs.shape[0])
        next_q_target = self.forward(self.target, next_obs)
        if self.double_dqn:  # the online net picks a', the target net values it
            next_q = next_q_target[rows, self.forward(self.layers, next_obs).argmax(-1)]
        else:
            next_q = next_q_target.max(-1)
        td_target = rewards + self.gamma * next_q * (np.float32(1.0) - batch.terminated.numpy())
        keep: list = []
        q_all = self.forward(self.layers, obs, keep)
        q = q_all[rows, actions]
        d = q - td_target
        if self.huber:  # smooth L1 (beta 1): 0.5 d^2 inside [-1, 1], |d| - 0.5 outside; gradient clip(d, -1, 1)
            a = np.abs(d)
            loss = float(np.where(a < 1, 0.5 * d * d, a - 0.5).mean())
            grad_q = np.clip(d, -1.0, 1.0) / np.float32(len(d))
        else:
            loss = float((d * d).mean())
            grad_q = d * np.float32(2.0 / len(d))
        dz = np.zeros_like(q_all)
        dz[rows, actions] = grad_q
        self._backward(dz, keep)
        self.sync.grads(self.params)  # all-reduces p.grad, which are views of the flat gradient
        if self.max_grad_norm is not None:
            clip_grad_norm(self.flat, self.max_grad_norm)
        self.optimizer.step()
        return torch.tensor([loss, float(q.mean())], dtype=torch.float32)

    def _backward(self, dz: np.ndarray, keep: list) -> None:
        """dL/dQ [B, A] -> every layer's weight and bias gradient, into the flat gradient buffer."""
        for i in range(len(self.layers) - 1, -1, -1):
            x, z = keep[i]
            gw, gb = self.grads[i]
            np.matmul(dz.T, x, out=gw)
            np.sum(dz, axis=0, out=gb)
            if i:  # through layer i's input, the activation of layer i - 1
                dz = dz @ self.layers[i][0]
                self.act_backward(dz, x, z)
