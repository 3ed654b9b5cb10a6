"""numpy machinery for small MLPs on CPU: one flat parameter buffer, Adam over it, grad-norm clipping, and
hidden-layer activations with their exact derivatives.

Why: on a small CPU a torch op on a [128, 64] tensor costs 5-50 us of dispatch overhead, and one
autograd update step (forward, backward, grad clipping, Adam) runs ~100 of them. numpy does the same
arithmetic with ~1-3 us per op, and keeping every parameter (and gradient) in one flat buffer makes
the global grad norm one dot product and Adam a handful of vector ops. An algorithm's own loss gradient
(e.g. ``algos/surrogate_numpy.py`` for PPO) writes into the flat gradient buffer.

The torch ``nn.Parameter`` objects stay the source of truth: their ``.data`` and ``.grad`` are views
into the flat buffers, so ``state_dict``, checkpoints, ``policy_state()``, evaluation and ``Sync.grads``
(which all-reduces ``p.grad`` in place) all see what numpy writes. ``FlatAdam`` checkpoints in
``torch.optim.Adam``'s own format, so a run resumes on either path (CPU numpy <-> torch / CUDA).
"""

from __future__ import annotations

import ctypes
import glob
import math
import os
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads")
_BLAS_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads")


def _blas_call(names: tuple[str, ...], *args: int) -> int | None:
    """Call the first of ``names`` that numpy's OpenBLAS exports, in every such library; its last result, None
    where none could be called."""
    result = None
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        fn = next((f for f in (getattr(lib, name, None) for name in names) if f is not None), None)
        if fn is not None:
            result = int(fn(*args) or 0)  # a getter's count; a setter returns nothing (0)
    return result


def blas_threads() -> int | None:
    """numpy's OpenBLAS thread count (None where it cannot be read): ``rltrain.train`` puts it back after a run."""
    return _blas_call(_BLAS_GETTERS)


def set_blas_threads(n: int) -> bool:
    """Set numpy's OpenBLAS thread count (best effort; True when it worked)."""
    return _blas_call(_BLAS_SETTERS, n) is not None


def single_thread_blas() -> bool:
    """Limit numpy's OpenBLAS to one thread in this process (best effort; True when it worked).

    Small matmuls gain nothing from threads, and OpenBLAS's spinning threads made a [128, 64] matmul
    several times slower on a busy 2-core machine. Like ``torch.set_num_threads(1)`` for torch.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # for child processes started later
    return set_blas_threads(1)


def flat_float32(obs: np.ndarray) -> np.ndarray:
    """A Box or MultiBinary batch [B, *shape] in its stored dtype -> float32 [B, prod(shape)]: the numbers
    ``FlatInput`` (encoders.py) hands an MLP encoder, for the numpy paths that replace one. As its ``to_float``:
    uint8 divided by 255 in float32 (the same rounding as torch's ``div_``), bool, int and float cast."""
    x = obs.reshape(len(obs), -1)
    if x.dtype == np.uint8:
        return np.divide(x, np.float32(255.0), dtype=np.float32)
    return x.astype(np.float32, copy=False)


# Hidden-layer activations: forward f(z) -> new array, and backward g *= f'(z) in place, given the
# output a = f(z) and the pre-activation z. tanh, relu and elu have derivatives computable from a alone;
# silu's needs z (the caller keeps it only when ``NEEDS_PRE_ACTIVATION``). Derivatives at the kinks
# follow torch's autograd: relu'(0) = 0, elu'(0) = 1.
def _sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-z)), from exp(-|z|) <= 1 so it never overflows and keeps full relative precision for
    z << 0 (where 0.5 + 0.5 tanh(z / 2) cancels)."""
    e = np.exp(-np.abs(z))
    r = 1 / (1 + e)
    return np.where(z >= 0, r, e * r)


def _relu_backward(g: np.ndarray, a: np.ndarray, z: np.ndarray | None) -> None:
    g *= a > 0


def _tanh_backward(g: np.ndarray, a: np.ndarray, z: np.ndarray | None) -> None:
    g *= 1 - a * a


def _elu_forward(z: np.ndarray) -> np.ndarray:
    # exp(z) - 1 >= z everywhere, with equality only at 0: max(expm1(min(z, 0)), z) is elu (alpha 1)
    # in three ufuncs, without np.where's extra passes
    a = np.expm1(np.minimum(z, 0))
    return np.maximum(a, z, out=a)


def _elu_backward(g: np.ndarray, a: np.ndarray, z: np.ndarray | None) -> None:
    # z <= 0: d(exp(z) - 1)/dz = exp(z) = a + 1; z > 0 (equivalently a > 0): 1 = min(a, 0) + 1
    d = np.minimum(a, 0)
    d += 1
    g *= d


def _silu_backward(g: np.ndarray, a: np.ndarray, z: np.ndarray | None) -> None:
    # d(z s(z))/dz = s + z s (1 - s) (Elfwing et al. 2018)
    s = _sigmoid(z)  # type: ignore[arg-type]
    g *= s * (1 + z * (1 - s))


ACTIVATION_FORWARD: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "relu": lambda z: np.maximum(z, 0, dtype=np.float32),
    "elu": _elu_forward,
    "silu": lambda z: z * _sigmoid(z),
}
ACTIVATION_BACKWARD: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray | None], None]] = {
    "tanh": _tanh_backward, "relu": _relu_backward, "elu": _elu_backward, "silu": _silu_backward,
}
NEEDS_PRE_ACTIVATION = frozenset({"silu"})


class FlatParams:
    """Re-homes ``params`` (CPU, float32) into one flat buffer, with a flat gradient buffer beside it.

    ``data`` / ``grad``: [P] numpy views of the buffers; ``views[i]`` / ``grads[i]``: numpy views shaped
    like parameter i; ``split(buf)`` cuts any [P] tensor into such views.
    """

    def __init__(self, params: list[nn.Parameter]):
        total = sum(p.numel() for p in params)
        self.flat = torch.zeros(total)
        self.flat_grad = torch.zeros(total)
        self.shapes = [p.shape for p in params]
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

    def split(self, buf: Tensor) -> list[Tensor]:
        """[P] -> views shaped like each parameter, in order."""
        return [part.view(shape) for part, shape in zip(buf.split([s.numel() for s in self.shapes]), self.shapes,
                                                        strict=True)]


def adam_group(lr: float, eps: float, *, fused: bool = True) -> dict:
    """The param group (without ``params``) of ``torch.optim.Adam(params, lr=lr, eps=eps, fused=fused)``,
    read from Adam's signature defaults; ``tests/test_ppo.py`` checks it against a constructed one."""
    import inspect

    defaults = {k: p.default for k, p in inspect.signature(torch.optim.Adam.__init__).parameters.items()
                if k not in ("self", "params") and p.default is not inspect.Parameter.empty}
    return {**defaults, "lr": lr, "eps": eps, "fused": fused}


class FlatAdam:
    """``torch.optim.Adam``'s update rule over one flat parameter buffer, checkpointed in its format.

    ``group`` is the param group of the torch Adam this one stands in for (``adam_group(lr, eps)``: what
    ``make_adam(params, lr, eps).param_groups[0]`` holds, without constructing a torch optimiser, whose first
    construction imports torch._dynamo: seconds of start-up). ``state_dict()`` returns what that Adam's
    ``state_dict()`` would after the same steps (per-parameter ``step`` / ``exp_avg`` / ``exp_avg_sq``, its
    ``param_groups``), so either path loads the other's checkpoints. The conversion happens only there, never
    in ``step()``.
    """

    def __init__(self, flat: FlatParams, *, group: dict):
        _check_plain_adam(group)
        self.flat = flat
        self._group = {k: v for k, v in group.items() if k != "params"}
        self.lr, self.betas, self.eps = float(group["lr"]), tuple(group["betas"]), float(group["eps"])
        self.exp_avg = torch.zeros_like(flat.flat)
        self.exp_avg_sq = torch.zeros_like(flat.flat)
        self._m, self._v = self.exp_avg.numpy(), self.exp_avg_sq.numpy()
        self._tmp = np.empty_like(self._m)
        self.steps = 0

    def step(self) -> None:
        # Subnormal floats flushed to zero for the step (this thread's CPU flags), then restored. A parameter whose
        # gradient stays 0 (a dead ReLU's weights) decays its moments through float32's subnormal range
        # (exp_avg_sq for ~16k steps at beta2 0.999), where x86 arithmetic is 20-35x slower: one such tensor made
        # a whole off-policy run's Adam cost a third of its CPU. Results differ from unflushed Adam only below
        # 1.2e-38. Two plain calls, no context manager: PPO's update takes 16 steps (scripts/hot_path_counts.py).
        # FusedAdam (algos/adam.py) does the same.
        flushing = torch.set_flush_denormal(True)
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
        tmp += self.eps  # eps after the bias-corrected square root, as torch (Kingma & Ba 2015, Alg. 1)
        np.divide(m, tmp, out=tmp)
        tmp *= self.lr / bc1
        self.flat.data -= tmp
        if flushing:
            torch.set_flush_denormal(False)

    def state_dict(self) -> dict:
        """``torch.optim.Adam.state_dict()`` for the same parameters after the same steps (copies)."""
        state: dict[int, dict[str, Tensor]] = {}
        if self.steps:  # torch has no entry for a parameter before its first step
            moments = zip(self.flat.split(self.exp_avg), self.flat.split(self.exp_avg_sq), strict=True)
            for i, (m, v) in enumerate(moments):
                # torch keeps Adam's step as a float32 scalar tensor
                state[i] = {"step": torch.tensor(float(self.steps), dtype=torch.float32),
                            "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
        group = {**self._group, "lr": self.lr, "betas": self.betas, "eps": self.eps,
                 "params": list(range(len(self.flat.shapes)))}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state: dict) -> None:
        """Load a ``torch.optim.Adam`` state dict (written by this class or by torch, on any device)."""
        groups = state["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.flat.shapes):
            raise ValueError(f"optimizer state has {[len(g['params']) for g in groups]} parameters in its groups; "
                             f"this model has {len(self.flat.shapes)} in one group")
        group = groups[0]
        _check_plain_adam(group)
        entries = [state["state"].get(i) for i in group["params"]]
        steps = {int(round(float(e["step"]))) for e in entries if e is not None}
        if len(steps) > 1 or (steps and any(e is None for e in entries)):
            raise ValueError(f"optimizer state has per-parameter step counts {sorted(steps)} (or missing entries); "
                             "FlatAdam keeps one count for all parameters")
        self.exp_avg.zero_()
        self.exp_avg_sq.zero_()
        for e, m, v, shape in zip(entries, self.flat.split(self.exp_avg), self.flat.split(self.exp_avg_sq),
                                  self.flat.shapes, strict=True):
            if e is not None:
                m.copy_(e["exp_avg"].reshape(shape))
                v.copy_(e["exp_avg_sq"].reshape(shape))
        self.steps = steps.pop() if steps else 0
        self._group.update({k: v for k, v in group.items() if k != "params"})
        self.lr, self.betas, self.eps = float(group["lr"]), tuple(group["betas"]), float(group["eps"])


def adam_state_from_flat(old: dict, shapes: list[torch.Size], group: dict) -> dict:
    """Optimiser state as FlatAdam wrote it before it took torch's format (``{step, exp_avg, exp_avg_sq, lr}``
    over the flat [P] buffer) -> ``torch.optim.Adam``'s format for parameters of ``shapes`` (in flat order),
    with ``group``'s hyper-parameters and the old state's lr: old checkpoints keep resuming, on either path."""
    steps = int(old["step"])
    sizes = [s.numel() for s in shapes]
    if old["exp_avg"].numel() != sum(sizes):
        raise ValueError(f"flat optimizer state has {old['exp_avg'].numel()} entries; the parameters have {sum(sizes)}")
    state = {}
    if steps:
        pairs = zip(old["exp_avg"].split(sizes), old["exp_avg_sq"].split(sizes), shapes, strict=True)
        for i, (m, v, shape) in enumerate(pairs):
            state[i] = {"step": torch.tensor(float(steps), dtype=torch.float32),
                        "exp_avg": m.reshape(shape).clone(), "exp_avg_sq": v.reshape(shape).clone()}
    return {"state": state, "param_groups": [{**group, "lr": float(old["lr"]), "params": list(range(len(shapes)))}]}


def _check_plain_adam(group: dict) -> None:
    """FlatAdam implements Adam without weight decay, amsgrad or maximize: refuse anything else."""
    if group.get("weight_decay") or group.get("amsgrad") or group.get("maximize"):
        raise ValueError("FlatAdam implements Adam without weight_decay, amsgrad or maximize; got "
                         f"weight_decay={group.get('weight_decay')}, amsgrad={group.get('amsgrad')}, "
                         f"maximize={group.get('maximize')}")


def clip_grad_norm(flat: FlatParams, max_norm: float) -> float:
    """Global grad-norm clipping as ``torch.nn.utils.clip_grad_norm_`` (coef max_norm / (norm + 1e-6), <= 1)."""
    norm = math.sqrt(float(np.dot(flat.grad, flat.grad)))
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        flat.grad *= np.float32(coef)
    return norm
