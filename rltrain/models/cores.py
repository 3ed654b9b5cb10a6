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

Without per-step states (``keep_states=False``: PPO's minibatches) ``sequence`` runs PyTorch's multi-step LSTM /
GRU kernel (cuDNN, oneDNN on CPU) in one of two plans, whichever ``unroll_costs`` prices lower for the mask at
hand (``plan_unroll``):

- spans: one kernel call over all N envs between steps where some env starts an episode; few calls when
  episodes are long, but up to T single-step calls when they are short (Blackjack: ~1.4 steps);
- segments: every env column cut at its episode starts into segments, which run side by side as the batch of a
  few calls (one per band of lengths, padded to the band's longest) from their own initial state (the carried
  state for a column's first segment, zero after an episode start): the episode start needs no split, as in
  batching variable-length sequences (pack_padded_sequence); here over episode boundaries of one rollout.

Both compute the same maths as stepping the cell, and choosing between them from the mask alone (never from
timings) keeps a run bitwise reproducible.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

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
    """One LSTM or GRU layer of width ``size``: stepped with its cell where per-step states are kept, else fused
    multi-step kernel calls (``_fused``)."""

    recurrent = True
    # the fused unroll's plan: "auto" (the cheaper by ``unroll_costs``), or "spans" / "segments" forced (tests and
    # scripts/bench_throughput.py compare them); the results agree up to float rounding
    unroll_plan: str = "auto"

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
        """The same unroll through PyTorch's multi-step LSTM / GRU kernel (the cell's own weights): x [T, N, D],
        keep [T, N, 1] -> features [T, N, size], in the plan ``plan_unroll`` prices lower (spans between
        restarts, or episode segments side by side); it yields no per-step cell state, hence ``keep_states``."""
        T, N = keep.shape[:2]
        restart = (keep[..., 0] == 0).cpu().numpy()
        costs = unroll_costs(x.device.type, self.kind)
        plan = plan_unroll(restart.tobytes(), T, N, costs, self.unroll_plan)
        if isinstance(plan, SegmentPlan):
            return self._segments(x, state, plan)
        outs = []
        for a, b in zip((0, *plan), (*plan, T), strict=True):
            y, state = self._kernel(x[a:b], tuple(s * keep[a] for s in state))
            outs.append(y)
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    def _segments(self, x: Tensor, state: CoreState, plan: SegmentPlan) -> Tensor:
        """x [T, N, D] gathered into the plan's padded segment batches ([L, S, D] per call), each run from its
        segments' initial states, and scattered back to [T, N, size]. Padding follows a segment's last step (it
        reads step 0's input) and its outputs are dropped: it changes neither the outputs nor, its gradient being
        exactly zero, the gradients."""
        T, N, D = x.shape
        src, inv, first, opens = plan.src, plan.inv, plan.first, plan.opens
        if x.device.type != "cpu":
            src, inv, first, opens = src.to(x.device), inv.to(x.device), first.to(x.device), opens.to(x.device)
        data = x.reshape(T * N, D)[src]  # [sum L * S, D]
        # each batch row's initial state: its column's carried state, or zero where its episode starts
        starts = [torch.where(opens, s[0][first], 0.0) for s in state]  # each [S, H]
        outs, at, row = [], 0, 0
        for length, width in plan.calls:
            y, _ = self._kernel(data[at:at + length * width].view(length, width, D),
                                tuple([s[row:row + width][None] for s in starts]))
            outs.append(y.reshape(length * width, -1))
            at, row = at + length * width, row + width
        return (torch.cat(outs) if len(outs) > 1 else outs[0])[inv].view(T, N, -1)

    def _kernel(self, x: Tensor, state: CoreState) -> tuple[Tensor, CoreState]:
        """One multi-step kernel call: x [L, B, D] from state (each [1, B, H]) -> (outputs [L, B, H], final
        state)."""
        cell = self.cell
        params = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
        if self.kind == "lstm":
            y, h, c = torch.lstm(x, state, params, True, 1, 0.0, self.training, False, False)
            return y, (h, c)
        y, h = torch.gru(x, state[0], params, True, 1, 0.0, self.training, False, False)
        return y, (h,)


@dataclass(frozen=True)
class UnrollCosts:
    """What a fused unroll costs, in row-steps (one env row through one time step, forward + backward): a kernel
    call's fixed cost (launch, input projection, autograd node) and each time step's sequential cost."""

    call: float
    step: float


# Measured on CPU (torch 2.13, one thread, widths 64 and 128, fits of forward + backward times over lengths and
# batch widths): oneDNN's LSTM costs ~50 rows per call and ~1 per step; the GRU runs step by step in ATen, ~20 rows
# per step. On an accelerator a small recurrent batch is bound by launches (several per call and per step, a few
# microseconds each) while a row-step is ~0.1 us of arithmetic: estimated, not measured here.
_UNROLL_COSTS = {("cpu", "lstm"): UnrollCosts(call=50.0, step=1.0), ("cpu", "gru"): UnrollCosts(call=10.0, step=20.0)}
_ACCELERATOR_COSTS = UnrollCosts(call=1000.0, step=250.0)


def unroll_costs(device_type: str, kind: str) -> UnrollCosts:
    """The cost model of ``kind``'s fused unroll on a ``device_type`` ("cpu", "cuda", ...)."""
    return _UNROLL_COSTS.get((device_type, kind), _ACCELERATOR_COSTS)


@dataclass(frozen=True)
class SegmentPlan:
    """Episode segments of a [T, N] rollout batched side by side. ``calls``: (L, S) of each kernel call, in buffer
    order; the buffer holds each call's [L, S] block time-major. ``src`` [sum L * S]: the row-major (t * N + n)
    step each buffer element reads (step 0 for padding); ``inv`` [T * N]: the buffer element of each step;
    ``first`` [sum S]: each batch row's env column; ``opens`` [sum S, 1] bool: whether the row starts from
    the column's carried state (its first segment, not zeroed at step 0) rather than zero. CPU index tensors."""

    calls: tuple[tuple[int, int], ...]
    src: Tensor
    inv: Tensor
    first: Tensor
    opens: Tensor


@functools.lru_cache(maxsize=64)  # the actor and critic cores, and every epoch over the same columns, share a plan
def plan_unroll(restart: bytes, T: int, N: int, costs: UnrollCosts, force: str = "auto"
                ) -> tuple[int, ...] | SegmentPlan:
    """The cheaper plan for restart [T, N] (bool, C order: True where the state is zeroed before step t) under
    ``costs``: the spans' restart steps (a tuple; () for one call over all T steps) or a ``SegmentPlan``.
    ``force`` ("spans", "segments") overrides the choice: tests and benchmarks compare the two."""
    zeroed = np.frombuffer(restart, bool).reshape(T, N)
    spans = tuple(int(t) + 1 for t in np.flatnonzero(zeroed[1:].any(1)))  # where some env starts an episode
    if force == "spans" or (force == "auto" and not spans):
        return spans
    plan, segments_cost = segment_plan(zeroed, costs)
    # the spans: a call per span, all T steps in sequence, every row computed once (no padding)
    if force == "auto" and (len(spans) + 1) * costs.call + T * (costs.step + N) <= segments_cost:
        return spans
    return plan


def segment_plan(zeroed: np.ndarray, costs: UnrollCosts) -> tuple[SegmentPlan, float]:
    """(the segment plan of zeroed [T, N], its cost). Segments fall in bands of lengths (2^(k-1), 2^k] (padding at
    most doubles the work); adjacent bands share a call where ``costs`` say one longer call beats two (on an
    accelerator usually all: one [L, S] call), an exact search over the <= log2(T) + 1 bands."""
    T, N = zeroed.shape
    starts = zeroed.T.copy()  # [N, T]: column-major, so that each column's segments follow in time order
    starts[:, 0] = True  # every column opens a segment at step 0, from its carried state
    pos = np.flatnonzero(starts)  # [S] each segment's first step, as n * T + t
    length = np.diff(pos, append=N * T)  # a column's last segment ends at T - 1: the next column opens one
    band = np.frexp(length - 1)[1]  # ceil(log2(length)): the band of each segment
    present = np.flatnonzero(np.bincount(band))
    band_rows = np.bincount(band)[present]  # segments per present band, shortest band first
    band_len = np.zeros(band.max() + 1, np.int64)
    np.maximum.at(band_len, band, length)
    band_len = band_len[present]
    # best[j]: the cheapest calls over the first j bands; a call over bands i..j-1 pads to band j-1's length
    rows_before = np.concatenate([[0], np.cumsum(band_rows)])
    best, cut = [0.0] + [float("inf")] * len(present), [0] * (len(present) + 1)
    for j in range(1, len(present) + 1):
        for i in range(j):
            cost = best[i] + costs.call + int(band_len[j - 1]) * (costs.step + int(rows_before[j] - rows_before[i]))
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], len(present)
    while j:
        bounds.append((cut[j], j))
        j = cut[j]
    bounds.reverse()
    call_of_band = np.zeros(band.max() + 1, np.int64)
    for k, (i, j) in enumerate(bounds):
        call_of_band[present[i:j]] = k
    call = call_of_band[band]  # [S] each segment's call
    widths = np.bincount(call, minlength=len(bounds))
    lengths = np.array([band_len[j - 1] for _, j in bounds], np.int64)
    order = np.argsort(call, kind="stable")  # buffer row -> segment
    row = np.empty_like(order)
    row[order] = np.arange(order.size)  # segment -> buffer row
    row_start = np.concatenate([[0], np.cumsum(widths)[:-1]])
    at = np.concatenate([[0], np.cumsum(lengths * widths)[:-1]])
    # every step e = n * T + t of the rollout: its segment, its time within it, its buffer element
    step = np.arange(N * T)
    seg = np.cumsum(starts.ravel()) - 1
    in_call = call[seg]
    element = at[in_call] + (step - pos[seg]) * widths[in_call] + row[seg] - row_start[in_call]
    row_major = (step % T) * N + step // T
    src = np.zeros(int((lengths * widths).sum()), np.int64)
    src[element] = row_major
    inv = np.empty(N * T, np.int64)
    inv[row_major] = element
    column = pos[order] // T
    opens = (pos[order] % T == 0) & ~zeroed[0, column]
    calls = tuple((int(length), int(width)) for length, width in zip(lengths, widths, strict=True))
    plan = SegmentPlan(calls, *(torch.from_numpy(a) for a in (src, inv, column, opens[:, None])))
    return plan, best[-1] + costs.call  # + the gather and the scatter


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
