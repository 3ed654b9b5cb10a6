"""Recurrent cores: the optional memory between an encoder and the policy / value heads (``model.core``).

A core state is a plain tuple of tensors, each [num_layers=1, N, H]: ``()`` for the identity core, ``(h,)``
for a GRU (Cho et al. 2014), ``(h, c)`` for an LSTM (Hochreiter & Schmidhuber 1997). Plain tuples pickle,
checkpoint with ``weights_only=True`` and slice by env column without a custom type.

Two forms over the same weights:

- ``step``: one time step for N envs (acting); the caller has already zeroed the state of envs whose
  episode ended (``reset_state``);
- ``sequence``: T steps for N envs (learning), recomputed from the state stored at the rollout's start.
  ``mask[t]`` is 1 - done[t-1]: the state is zeroed where an episode ended BEFORE step t, so the unroll
  never carries memory across an episode boundary (truncated BPTT over one rollout, as in R2D2's
  "stored state" strategy, Kapturowski et al. 2019, and SB3-contrib's RecurrentPPO).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

CoreState = tuple[Tensor, ...]
CORES = ("identity", "lstm", "gru")


class Core(nn.Module):
    """The identity core: features pass through, the state is empty."""

    recurrent = False

    def __init__(self, in_dim: int):
        super().__init__()
        self.out_dim = in_dim

    def initial_state(self, n: int, device: torch.device | None = None) -> CoreState:
        return ()

    def step(self, x: Tensor, state: CoreState) -> tuple[Tensor, CoreState]:
        """x [N, D], state -> (features [N, out_dim], next state)."""
        return x, state

    def sequence(self, x: Tensor, state: CoreState, mask: Tensor, *,
                 keep_states: bool = True) -> tuple[Tensor, list[CoreState]]:
        """x [T, N, D], state at step 0, mask [T, N] (0 where an episode ended before step t) ->
        (features [T, N, out_dim], the state after each step: a list of T states, or [] without
        ``keep_states``)."""
        return x, [state] * x.shape[0] if keep_states else []


class RecurrentCore(Core):
    """One LSTM or GRU layer of width ``size``, stepped with its cell so that the mask applies per step."""

    recurrent = True

    def __init__(self, in_dim: int, *, kind: str, size: int):
        super().__init__(in_dim)
        self.kind, self.out_dim = kind, size
        self.cell: nn.LSTMCell | nn.GRUCell = nn.LSTMCell(in_dim, size) if kind == "lstm" else nn.GRUCell(in_dim, size)
        # orthogonal recurrent weights, zero biases: a common stable start for RL recurrent policies
        for name, p in self.cell.named_parameters():
            if name.startswith("weight_hh"):
                nn.init.orthogonal_(p)
            elif name.startswith("bias"):
                nn.init.zeros_(p)

    def initial_state(self, n: int, device: torch.device | None = None) -> CoreState:
        zeros = torch.zeros(1, n, self.out_dim, device=device)
        return (zeros, zeros.clone()) if self.kind == "lstm" else (zeros,)

    def step(self, x: Tensor, state: CoreState) -> tuple[Tensor, CoreState]:
        if self.kind == "lstm":
            h, c = self.cell(x, (state[0][0], state[1][0]))
            return h, (h[None], c[None])
        h = self.cell(x, state[0][0])
        return h, (h[None],)

    def sequence(self, x: Tensor, state: CoreState, mask: Tensor, *,
                 keep_states: bool = True) -> tuple[Tensor, list[CoreState]]:
        keep = mask.to(x.dtype).unsqueeze(-1)  # [T, N, 1]
        if not keep_states:
            return self._fused(x, state, keep), []
        outs, states = [], []
        for t in range(x.shape[0]):
            state = tuple(s * keep[t] for s in state)
            y, state = self.step(x[t], state)
            outs.append(y)
            states.append(state)
        return torch.stack(outs), states

    def _fused(self, x: Tensor, state: CoreState, keep: Tensor) -> Tensor:
        """The same unroll through PyTorch's multi-step LSTM / GRU kernel (the cell's own weights), one call
        per span between steps where some env starts a new episode: one kernel call instead of T cell calls
        (several times faster forward + backward); it yields no per-step cell state, hence ``keep_states``."""
        T = x.shape[0]
        restarts = torch.nonzero((keep[1:, :, 0] == 0).any(1)).flatten().add_(1).tolist()
        cell = self.cell
        params = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
        outs = []
        for a, b in zip([0, *restarts], [*restarts, T], strict=True):
            state = tuple(s * keep[a] for s in state)
            if self.kind == "lstm":
                y, h, c = torch.lstm(x[a:b], state, params, True, 1, 0.0, self.training, False, False)
                state = (h, c)
            else:
                y, h = torch.gru(x[a:b], state[0], params, True, 1, 0.0, self.training, False, False)
                state = (h,)
            outs.append(y)
        return torch.cat(outs) if len(outs) > 1 else outs[0]


def make_core(kind: str, in_dim: int, size: int) -> Core:
    """``model.core`` over features of width ``in_dim`` (``ModelSettings`` validated ``kind``)."""
    return Core(in_dim) if kind == "identity" else RecurrentCore(in_dim, kind=kind, size=size)


def reset_state(state: CoreState, done: np.ndarray | Tensor) -> CoreState:
    """``state`` with the columns of envs whose episode ended (done [N] bool) zeroed: the next step of
    those envs starts a new episode from the initial (zero) state."""
    if not state:
        return state
    done_t = torch.as_tensor(done, device=state[0].device)
    if not bool(done_t.any()):
        return state
    keep = (~done_t).to(state[0].dtype)[None, :, None]
    return tuple(s * keep for s in state)


def select_state(state: CoreState, index) -> CoreState:
    """The columns ``index`` (env indices) of every tensor of ``state``."""
    return tuple(s[:, index] for s in state)


def put_state(state: CoreState, index, sub: CoreState) -> CoreState:
    """``state`` with columns ``index`` replaced by ``sub`` (a copy: acting runs under inference mode)."""
    out = tuple(s.clone() for s in state)
    for s, part in zip(out, sub, strict=True):
        s[:, index] = part
    return out


def stack_states(states: list[CoreState]) -> CoreState:
    """T states [1, N, H] -> one state per tensor [T, N, H] (the state after each step of a sequence)."""
    if not states or not states[0]:
        return ()
    return tuple(torch.cat(parts, 0) for parts in zip(*states, strict=True))
