"""The one Adam factory of the torch update paths: ``make_adam`` gives ``FusedAdam``, which is
``torch.optim.Adam(..., fused=True)``'s update through the same fused kernel, without constructing a
``torch.optim.Optimizer``. (PPO's numpy update keeps its own ``FlatAdam`` over a flat buffer, models/numpy_mlp.py:
a fused backend of the same rule, in the same checkpoint format.)

Why: ``Optimizer.__init__`` runs ``add_param_group``, which is wrapped in ``torch._disable_dynamo``; the
wrapper's first call imports ``torch._dynamo`` and with it the compiler stack (over a second of start-up on
a small CPU, for a run that never compiles anything). ``Optimizer.step``'s wrapper also pays for profiler
hooks on every step, which a DQN doing thousands of tiny updates feels.

``FusedAdam.step`` is ``torch.optim.adam._fused_adam`` for one device and dtype: the float32 ``step``
counters are incremented with ``torch._foreach_add_`` and ``torch._fused_adam_`` updates parameters and
moments in place, so the weights are bit for bit what torch's fused Adam gives (but for subnormal floats,
which the step flushes to zero, as ``FlatAdam.step`` in models/numpy_mlp.py says). ``state_dict`` /
``load_state_dict`` use torch Adam's own format (per-parameter ``step`` / ``exp_avg`` / ``exp_avg_sq``, its
``param_groups``), so checkpoints load into either, and ``param_groups`` holds the one group as torch's does
(``algos.base.set_lr`` anneals its ``lr``). Where the fused kernel is missing (an old torch, parameters that are
not float32) ``make_adam`` falls back to ``torch.optim.Adam``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rltrain.models.numpy_mlp import adam_group


class FusedAdam:
    """Plain Adam (no weight decay, amsgrad or maximize) over ``params``, one param group."""

    def __init__(self, params: list[Tensor], *, lr: float, eps: float, betas: tuple[float, float] = (0.9, 0.999)):
        self.params = list(params)
        if not self.params:
            raise ValueError("optimizer got an empty parameter list")
        self.group = {**adam_group(lr, eps), "betas": tuple(betas), "params": self.params}
        self.param_groups = [self.group]
        # one float32 step counter per parameter, as torch keeps them, but as views into one vector: when every
        # parameter has a gradient (the common case) one in-place add moves them all, where torch's per-tensor
        # _foreach_add_ on CPU converts the scalar and launches an add per parameter
        self.step_vector = torch.zeros(len(self.params), dtype=torch.float32, device=self.params[0].device)
        self.steps = list(self.step_vector.unbind())
        # parameters not stored row-major (models.layers.input_major): autograd gives their gradients their layout;
        # a gradient set by hand may not have it (row-major ones are trusted: every path here writes them so)
        self.strided = [p for p in self.params if not p.is_contiguous()]
        self.exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step on the parameters that have a gradient (as torch: the others keep their state)."""
        for p in self.strided:  # the fused kernel reads parameter, gradient and moments in memory order: a
            #                     gradient written by hand in another layout than its parameter's is copied into it
            if p.grad is not None and p.grad.stride() != p.stride():
                p.grad = torch.empty_like(p).copy_(p.grad)
        grads = [p.grad for p in self.params]
        if all(g is not None for g in grads):  # the common case: no per-parameter lists to build
            params, steps, exp_avgs, exp_avg_sqs = self.params, self.steps, self.exp_avgs, self.exp_avg_sqs
        else:
            live = [i for i, g in enumerate(grads) if g is not None]
            if not live:
                return
            params, grads = [self.params[i] for i in live], [grads[i] for i in live]
            steps, exp_avgs = [self.steps[i] for i in live], [self.exp_avgs[i] for i in live]
            exp_avg_sqs = [self.exp_avg_sqs[i] for i in live]
        beta1, beta2 = self.group["betas"]
        if steps is self.steps:
            self.step_vector.add_(1.0)
        else:
            torch._foreach_add_(steps, 1)
        # subnormals flushed for the step: a dead unit's moments decay through them, 20-35x slower on x86
        # (models/numpy_mlp.py, FlatAdam.step, says more)
        flushing = torch.set_flush_denormal(True)
        torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=self.group["lr"],
                           beta1=beta1, beta2=beta2, weight_decay=0.0, eps=self.group["eps"], maximize=False,
                           grad_scale=None, found_inf=None)
        if flushing:
            torch.set_flush_denormal(False)

    def state_dict(self) -> dict:
        """What ``torch.optim.Adam(params, fused=True).state_dict()`` holds after the same steps (copies)."""
        state = {}
        for i, step in enumerate(self.steps):
            if float(step) > 0:  # torch has no entry for a parameter before its first step
                state[i] = {"step": step.clone(), "exp_avg": self.exp_avgs[i].clone(),
                            "exp_avg_sq": self.exp_avg_sqs[i].clone()}
        return {"state": state, "param_groups": [{**self.group, "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state: dict) -> None:
        """Load a torch Adam state dict (this class's or ``torch.optim.Adam``'s, any device)."""
        groups = state["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"optimizer state has {[len(g['params']) for g in groups]} parameters in its groups; "
                             f"this optimiser has {len(self.params)} in one group")
        group = groups[0]
        if group.get("weight_decay") or group.get("amsgrad") or group.get("maximize"):
            raise ValueError("FusedAdam implements Adam without weight_decay, amsgrad or maximize")
        entries = state["state"]
        for i, index in enumerate(group["params"]):
            entry = entries.get(index)
            if entry is None:
                self.steps[i].zero_()
                self.exp_avgs[i].zero_()
                self.exp_avg_sqs[i].zero_()
                continue
            self.steps[i].copy_(torch.as_tensor(entry["step"], dtype=torch.float32))
            self.exp_avgs[i].copy_(entry["exp_avg"])
            self.exp_avg_sqs[i].copy_(entry["exp_avg_sq"])
        # as torch: the saved hyper-parameters win (a resumed run keeps its learning rate)
        self.group.update({k: v for k, v in group.items() if k in ("lr", "eps", "betas")})
        self.group["betas"] = tuple(self.group["betas"])


def make_adam(params, lr: float, *, eps: float) -> FusedAdam | torch.optim.Adam:
    """Adam over ``params`` (one group): ``FusedAdam`` where torch has the fused CPU/GPU kernel and the parameters
    are float32, else ``torch.optim.Adam``. ``eps`` is each algorithm's published value (PPO 1e-5, CleanRL; DQN
    and SAC 1e-8, SB3 / torch's default)."""
    params = list(params)
    if hasattr(torch, "_fused_adam_") and all(p.dtype == torch.float32 for p in params):
        return FusedAdam(params, lr=lr, eps=eps)
    return torch.optim.Adam(params, lr=lr, eps=eps)


@torch.no_grad()
def clip_grad_norm(params: list[Tensor], max_norm: float) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)`` for parameters on one device and
    dtype, with the same ops (so the same bits) and none of its per-call grouping; returns the total norm."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    coef = torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)
    if coef.device.type != "cpu" or float(coef) != 1.0:  # a product with exactly 1.0 changes no bit: skip it on CPU
        torch._foreach_mul_(grads, coef)
    return norm
