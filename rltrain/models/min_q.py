"""min(Q1, Q2) of two critic MLPs over one input, with a gradient into that input only: SAC's actor loss.

SAC's actor maximises E[min(Q1, Q2)(s, a~pi) - alpha log pi] (Haarnoja et al. 2018; the clipped double-Q of
Fujimoto et al. 2018). The loss trains the actor alone, so what it needs from the critics is the gradient of
the min with respect to the action. Autograd computes that through both critics over the whole batch, although
the min's gradient is zero for every row where a critic is not the smaller one: half of each critic's backward
products multiply zeros. Here each critic's backward runs over the rows where it is the min (a tie sends half of
the gradient into each, as ``torch.minimum``'s derivative does), so the two critics' backward products cover the
batch once instead of twice: one [B, width] x [width, width] product fewer per update (of 16 in a SAC update
with two hidden layers).

The critics' weights are read detached: this loss gives them no gradient, whatever ``backward`` is asked for
(the same as ``backward(inputs=actor_params)`` on the autograd path). MLPs whose layers are Linear and ReLU or
tanh take this path, on CPU; others (ELU, SiLU: their derivative is not a function of their output) go through
autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rltrain.models.layers import MLP


def fits(net: nn.Module) -> bool:
    """An MLP of Linear layers with ReLU or tanh between them, ending in a Linear of one output."""
    if type(net) is not MLP or not len(net) or type(net[-1]) is not nn.Linear or net[-1].out_features != 1:
        return False
    return all(type(m) in (nn.Linear, nn.ReLU, nn.Tanh) for m in net)


def on_cpu(x: Tensor) -> bool:
    """Where this path runs: choosing each critic's rows (``nonzero``) would make the host wait for an
    accelerator every update, so there autograd's dense backward stays."""
    return x.device.type == "cpu"


def twin_min(x: Tensor, q1: MLP, q2: MLP) -> Tensor:
    """x [B, F + A] (the critics' common input: features ++ action) -> min(Q1(x), Q2(x)) [B]; its gradient
    reaches ``x`` (and through it the action), never the critics' weights. ``fits(q1)`` and ``fits(q2)``."""
    return _MinQ.apply(x, q1, q2)


def _forward(net: MLP, x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """net(x) [B] and each activation's output (what its derivative is read from), in layer order."""
    outputs = []
    for layer in net:
        kind = type(layer)
        if kind is nn.Linear:
            x = torch.addmm(layer.bias, x, layer.weight.t())
        else:  # in place on the Linear's fresh output, as MLP.forward does (the same bits)
            x = x.relu_() if kind is nn.ReLU else x.tanh_()
            outputs.append(x)
    return x.squeeze(-1), outputs


def _backward(net: MLP, grad: Tensor, outputs: list[Tensor], rows: Tensor) -> Tensor:
    """d(sum grad * Q) / dx over ``rows`` [n] of the batch: grad [n] -> [n, F + A]."""
    g = grad.unsqueeze(-1)
    acts = iter(reversed(outputs))
    for layer in reversed(net):
        kind = type(layer)
        if kind is nn.Linear:
            g = g @ layer.weight  # [n, out] x [out, in]: reads an input-major weight by rows (layers.input_major)
        else:
            y = next(acts).index_select(0, rows)
            # relu' = 1[y > 0], tanh' = 1 - y^2: the kernels autograd's own backward nodes run
            g = torch.ops.aten.threshold_backward(g, y, 0) if kind is nn.ReLU else torch.ops.aten.tanh_backward(g, y)
    return g


class _MinQ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, q1: MLP, q2: MLP) -> Tensor:  # runs without grad: the weights are constants
        v1, out1 = _forward(q1, x)
        v2, out2 = _forward(q2, x)
        ctx.nets = q1, q2
        ctx.save_for_backward(v1, v2, *out1, *out2)
        ctx.split = len(out1)
        return torch.minimum(v1, v2)

    @staticmethod
    def backward(ctx, grad: Tensor):
        v1, v2, *outs = ctx.saved_tensors
        outs1, outs2 = outs[:ctx.split], outs[ctx.split:]
        grad_x = grad.new_zeros((grad.shape[0], ctx.nets[0][0].in_features))
        tie = v1 == v2
        half = torch.where(tie, grad * 0.5, grad)  # torch.minimum's derivative: a tie splits the gradient
        for net, outputs, rows in ((ctx.nets[0], outs1, (v1 <= v2).nonzero().squeeze(-1)),
                                   (ctx.nets[1], outs2, (v2 <= v1).nonzero().squeeze(-1))):
            if rows.numel():
                grad_x.index_add_(0, rows, _backward(net, half.index_select(0, rows), outputs, rows))
        return grad_x, None, None
