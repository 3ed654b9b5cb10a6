"""The distributional TD losses of DQN's family, as pure functions of tensors: C51's projected target
(Bellemare et al. 2017, algorithm 1) and QR-DQN's quantile Huber loss (Dabney et al. 2018, eq. 9-10)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def c51_projection(next_probs: Tensor, rewards: Tensor, discounts: Tensor, support: Tensor) -> Tensor:
    """Project the distribution of ``r + discount * Z(s', a*)`` onto the fixed support (Bellemare et al. 2017,
    algorithm 1): each shifted atom ``Tz_j`` (clipped to [v_min, v_max]) splits its probability between its two
    neighbouring atoms in proportion to their distance.

    next_probs [B, K] (p_j(s', a*)), rewards [B], discounts [B] (gamma^k * (1 - terminated): 0 stops the
    bootstrap, leaving all mass at r), support [K] (evenly spaced z_0 .. z_{K-1}) -> target probabilities [B, K].
    """
    K = support.shape[0]
    v_min, v_max = float(support[0]), float(support[-1])
    dz = (v_max - v_min) / (K - 1)
    tz = (rewards[:, None] + discounts[:, None] * support[None, :]).clamp(v_min, v_max)
    b = (tz - v_min) / dz  # [B, K] fractional index of each shifted atom
    lower, upper = b.floor().long(), b.ceil().long()
    # an atom landing exactly on z_l (lower == upper) keeps all its mass there
    to_lower = next_probs * (upper.to(b.dtype) - b + (lower == upper).to(b.dtype))
    to_upper = next_probs * (b - lower.to(b.dtype))
    target = torch.zeros_like(next_probs)
    target.scatter_add_(1, lower, to_lower)
    target.scatter_add_(1, upper, to_upper)
    return target


def quantile_huber_loss(quantiles: Tensor, targets: Tensor, *, kappa: float = 1.0) -> Tensor:
    """QR-DQN's loss per transition (Dabney et al. 2018, eq. 10): for quantile estimates theta_i at the midpoints
    ``tau_i = (2i + 1) / 2N`` and target samples T theta_j, ``sum_i mean_j |tau_i - 1{u_ij < 0}| L_kappa(u_ij) /
    kappa`` with ``u_ij = T theta_j - theta_i`` and L_kappa the Huber loss (sb3-contrib's sum over the quantiles,
    mean over the targets).

    quantiles [B, N] (with gradient), targets [B, N'] (detached) -> loss [B].
    """
    n = quantiles.shape[1]
    tau = (torch.arange(n, device=quantiles.device, dtype=quantiles.dtype) + 0.5) / n  # [N]
    u = targets[:, None, :] - quantiles[:, :, None]  # [B, N, N']
    huber = F.huber_loss(u, torch.zeros_like(u), reduction="none", delta=kappa)
    tau = tau[None, :, None]
    weight = torch.where(u.detach() < 0, 1.0 - tau, tau)  # |tau_i - 1{u_ij < 0}|
    return (weight * huber).sum(1).mean(-1) / kappa
