"""The non-finite guard of the training loop: the first NaN / inf in a rollout, a learner metric, a gradient or
a parameter, named so that the run can stop as ``failed`` in one line (design 6, "a failure is never reported
as success").

A NaN spreads: one NaN reward gives NaN advantages, NaN gradients, then NaN weights in every later checkpoint,
while the run still counts env steps and ends ``completed``. The checks are cheap on purpose: learner metrics
are floats already; parameters get one L1 norm per tensor in one foreach call (NaN / inf when any element is,
barring overflow of values ~1e38, which is itself a broken run), read back once per update, and only when one is
not finite are the gradients (first) and parameters searched for the one to name;
rollout arrays get one ``np.isfinite`` each, and integer / bool arrays (pixels, discrete actions, done flags)
are skipped, they cannot hold a NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from rltrain.algos.base import Algorithm, Sync
from rltrain.data.structs import Metrics, Rollout
from rltrain.errors import ConfigError
from rltrain.trainers.state import LoopState


class NonFiniteError(ConfigError):
    """A NaN / inf reached the learner. A ConfigError so every CLI path prints it as one line (exit 2); the
    cause is usually input: a hyper-parameter that diverges, an env that returns NaN."""


def non_finite_line(problem: str, update: int, env_step: int, ckpt: Path | None) -> str:
    """The one line the run ends with: what, when, and the checkpoint to go back to."""
    where = f"the last finite checkpoint is {ckpt}" if ckpt else "no checkpoint was written before it"
    return f"non-finite {problem} at update {update} (env step {env_step}); {where}"


def _first_bad(array: np.ndarray) -> str | None:
    """``"nan (rollout step t, env n, element [...])"`` for the first non-finite element of a float [T, N, ...]
    array; None when all are finite."""
    if not np.issubdtype(array.dtype, np.floating):
        return None
    bad = ~np.isfinite(array)
    if not bad.any():
        return None
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    where = f"rollout step {index[0]}, env {index[1]}" if len(index) >= 2 else f"index {index}"
    rest = f", element {list(index[2:])}" if len(index) > 2 else ""
    return f"{array[index]} ({where}{rest})"


def _fields(value, name: str) -> Iterator[tuple[str, np.ndarray]]:
    if isinstance(value, dict):  # Dict observations
        for key, part in value.items():
            yield from _fields(part, f"{name}.{key}")
    elif isinstance(value, np.ndarray):
        yield name, value


def rollout_problem(rollout: Rollout) -> str | None:
    """The first non-finite observation or reward of a rollout ([T, N, ...], index = step, env), or None. A
    multi-agent rollout's groups are checked in turn (``env`` is then the group's slot)."""
    groups = getattr(rollout, "groups", None)
    if groups is not None:
        found = ((name, rollout_problem(r)) for name, r in groups.items())
        return next((f"{p} (policy group {name})" for name, p in found if p), None)
    arrays = (rollout.obs, rollout.rewards, rollout.next_obs)
    if all(isinstance(a, np.ndarray) and (a.dtype.kind != "f" or np.isfinite(a).all()) for a in arrays):
        return None  # the common case in one pass per array (a single-step rollout is checked every step)
    for field in ("obs", "rewards", "next_obs"):
        for name, array in _fields(getattr(rollout, field), field):
            found = _first_bad(array)
            if found is not None:
                what = {"obs": "observation", "rewards": "reward", "next_obs": "next observation"}[field]
                return f"{what}{name[len(field):]}={found} from the env"
    return None


# Diagnostics that are NaN by definition in a healthy run: explained variance is 1 - Var(R - V) / Var(R),
# undefined when the returns of a batch do not vary (an env whose return is constant). Not a fault.
UNDEFINED_MAY_BE_NAN = ("train/explained_variance",)


def metrics_problem(metrics: Metrics) -> str | None:
    """The first learner metric (losses, KL, norms) that is NaN or inf, as ``key=value``."""
    for key, value in metrics.items():
        if isinstance(value, float) and not math.isfinite(value):
            if math.isnan(value) and key in UNDEFINED_MAY_BE_NAN:
                continue
            return f"{key}={value}"
    return None


def named_tensors(owner) -> list[tuple[str, torch.Tensor]]:
    """Every trainable tensor an algorithm owns: the parameters of its ``nn.Module`` attributes (policy,
    critics) and its bare leaf tensors (e.g. SAC's ``log_alpha``) that take gradients, each named once. Target
    networks (frozen copies) are left out: they only ever receive the online weights, which are checked first."""
    seen: set[int] = set()
    out: list[tuple[str, torch.Tensor]] = []
    for attr, value in vars(owner).items():
        if isinstance(value, nn.Module):
            pairs = [(f"{attr}.{n}", p) for n, p in value.named_parameters() if p.requires_grad]
        elif isinstance(value, torch.Tensor) and value.is_floating_point() and value.is_leaf and value.requires_grad:
            pairs = [(attr, value)]
        else:
            continue
        for name, tensor in pairs:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                out.append((name, tensor))
    return out


@torch.no_grad()
def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element is finite: each tensor's L1 norm (inf / NaN when any element is) in one foreach
    call, summed, read back once. Off-policy learners check after thousands of small updates: one call, not
    three ops per tensor."""
    return not tensors or math.isfinite(float(torch.stack(torch._foreach_norm(tensors, 1)).sum()))


def tensors_problem(tensors: list[tuple[str, torch.Tensor]]) -> str | None:
    """The first non-finite gradient or parameter, as ``gradient/<name>=nan``; one read-back when all are fine."""
    params = [t for _, t in tensors]
    if _all_finite([t.grad for t in params if t.grad is not None] + params):
        return None
    grads = [(n, t.grad) for n, t in tensors if t.grad is not None]
    for kind, group in (("gradient", grads), ("parameter", tensors)):
        for name, t in group:
            t = t.detach()
            bad = ~torch.isfinite(t)
            if bad.any():
                return f"{kind}/{name}={t[bad].flatten()[0].item()}"
    return None


# weight writes (gradient steps, target syncs) of an off-policy learner between two reads of its weights
WEIGHT_CHECK_WRITES = 16


class FiniteGuard:
    """The loop's guard: rollouts before ``learn()``, metrics and weights after it, weights again before a
    checkpoint is written. Workers agree first (one tiny all-reduce), so every rank stops at the same
    update."""

    def __init__(self, algo: Algorithm, sync: Sync, state: LoopState):
        self.algo, self.sync, self.state = algo, sync, state
        self.tensors = named_tensors(algo)
        self.params = [t for _, t in self.tensors]
        self._checked_writes: int | None = None  # the algorithm's weight_writes when last found finite

    def check_rollout(self, rollout: Rollout, update: int, env_step: int) -> None:
        # before learn(): a NaN observation or reward would reach the weights (and every rank must agree
        # first, or the healthy ones wait in learn()'s all-reduce forever)
        self._stop_if(rollout_problem(rollout), update, env_step)

    def check_update(self, metrics: Metrics, update: int, env_step: int) -> None:
        # the weights are checked only when they changed: an algorithm that counts its weight writes
        # (off-policy learners update on a fraction of the env steps) says so, and is checked once per
        # WEIGHT_CHECK_WRITES of them (SAC writes every env step, and one read of the norms is a tenth of a
        # small update); a NaN weight in between shows in the next update's losses, which metrics_problem reads
        # every time, and check_weights runs before every checkpoint. Others are checked every time.
        writes = self.algo.weight_writes
        if writes is None:
            stale = True
        elif self._checked_writes is None:
            stale = writes > 0
        else:
            stale = writes - self._checked_writes >= WEIGHT_CHECK_WRITES
        # the weights first: a non-finite gradient reaches them in the same step (Adam's moments, clipping's
        # norm), so finite weights clear the gradients too; the named search (gradients first) runs only then
        moved = stale and not _all_finite(self.params)
        self._stop_if(metrics_problem(metrics) or (tensors_problem(self.tensors) if moved else None), update,
                      env_step)
        if stale:
            self._checked_writes = writes

    def check_weights(self) -> None:
        """This worker's weights, before a checkpoint: never write NaN weights over the last finite one."""
        problem = tensors_problem(self.tensors)
        if problem:
            c = self.state.counters
            last = self.state.last_checkpoint
            raise NonFiniteError(non_finite_line(problem, c["updates"], c["env_steps"], last))

    def _stop_if(self, problem: str | None, update: int, env_step: int) -> None:
        """Stop the run (``NonFiniteError``: status failed, one line) when ``problem`` is set on any
        worker."""
        if not self.sync.any(problem is not None):
            return
        # every rank raises the same line: the first rank's problem, rank 0's last checkpoint
        last = self.state.last_checkpoint
        found = self.sync.gather_object((problem, str(last) if last else None))
        rank, first = next((r, p) for r, (p, _) in enumerate(found) if p is not None)
        if self.sync.world_size > 1:
            first = f"{first} on rank {rank}"
        ckpt = found[0][1]
        raise NonFiniteError(non_finite_line(first, update, env_step, Path(ckpt) if ckpt else None))

