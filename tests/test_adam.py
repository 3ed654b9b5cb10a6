"""``algos/adam.py``'s FusedAdam against ``torch.optim.Adam(fused=True)``: the same weights, moments and step
counts bit for bit, through steps where some parameters have no gradient, and checkpoints that load either way."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rltrain.algos.adam import FusedAdam, make_adam

pytestmark = pytest.mark.skipif(not hasattr(torch, "_fused_adam_"), reason="this torch has no fused Adam kernel")


def _pair():
    torch.manual_seed(0)
    ours = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    theirs = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _step(net, opt, x, *, freeze_first: bool = False):
    opt.zero_grad(set_to_none=True)
    loss = net(x).pow(2).mean()
    # a step where the first layer has no gradient: it must keep its moments and its step count
    loss.backward(inputs=list(net[2].parameters()) if freeze_first else None)
    opt.step()


def test_fused_adam_is_torch_fused_adam_bit_for_bit():
    ours, theirs = _pair()
    opt = make_adam(ours.parameters(), 1e-2, eps=1e-8)
    assert isinstance(opt, FusedAdam)
    ref = torch.optim.Adam(theirs.parameters(), lr=1e-2, eps=1e-8, fused=True)
    gen = torch.Generator().manual_seed(1)
    for i in range(7):
        x = torch.randn(16, 3, generator=gen)
        _step(ours, opt, x, freeze_first=i in (2, 3))
        _step(theirs, ref, x, freeze_first=i in (2, 3))
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)
    mine, torchs = opt.state_dict(), ref.state_dict()
    assert [float(mine["state"][i]["step"]) for i in range(4)] == [5.0, 5.0, 7.0, 7.0]
    for i in range(4):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(mine["state"][i][key], torchs["state"][i][key]), (i, key)


def test_fused_adam_checkpoints_load_both_ways_and_keep_counting():
    ours, theirs = _pair()
    opt = FusedAdam(list(ours.parameters()), lr=1e-2, eps=1e-8)
    ref = torch.optim.Adam(theirs.parameters(), lr=1e-2, eps=1e-8, fused=True)
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(2))
    for _ in range(3):
        _step(ours, opt, x)
        _step(theirs, ref, x)
    # torch's state into a fresh FusedAdam, and a FusedAdam's state into a fresh torch Adam: both continue alike
    again = FusedAdam(list(ours.parameters()), lr=1.0, eps=1e-8)
    again.load_state_dict(ref.state_dict())
    assert again.param_groups[0]["lr"] == 1e-2  # the saved hyper-parameters win, as torch's
    back = torch.optim.Adam(theirs.parameters(), lr=1e-2, eps=1e-8, fused=True)
    back.load_state_dict(opt.state_dict())
    _step(ours, again, x)
    _step(theirs, back, x)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)
    assert [float(s) for s in again.steps] == [4.0] * 4
    # the checkpoint is a copy: stepping on does not change what was saved
    saved = again.state_dict()
    _step(ours, again, x)
    assert float(saved["state"][0]["step"]) == 4.0 and float(again.steps[0]) == 5.0


def test_input_major_weights_train_as_row_major_ones():
    """``models.layers.input_major``: a widening Linear stores its weight by columns. Autograd hands it gradients
    in that layout (``torch._fused_adam_`` reads the parameter, gradient and moments in memory order: a gradient
    in another layout would be applied to the wrong entries), and training follows a row-major copy to round-off
    through forward, backward, FusedAdam and a checkpoint round trip."""
    from rltrain.models.layers import hidden_mlp

    torch.manual_seed(0)
    ours, _ = hidden_mlp(3, (64, 64), "relu")
    ours.append(nn.Linear(64, 2))
    assert ours[0].weight.stride() == (1, 64) and ours[2].weight.stride() == (64, 1)  # widening / square
    theirs = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    theirs.load_state_dict({k: v.contiguous() for k, v in ours.state_dict().items()})
    assert theirs[0].weight.is_contiguous()
    opt, ref = make_adam(ours.parameters(), 1e-2, eps=1e-8), torch.optim.Adam(theirs.parameters(), lr=1e-2, eps=1e-8)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(256, 3, generator=gen)
        _step(ours, opt, x)
        _step(theirs, ref, x)
        assert all(p.grad.stride() == p.stride() for p in ours.parameters())
    for (key, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=key)
    # a checkpoint keeps the values; loading one (row-major or not) keeps the layout the model was built with
    again, _ = hidden_mlp(3, (64, 64), "relu")
    again.append(nn.Linear(64, 2))
    again.load_state_dict(theirs.state_dict())
    assert again[0].weight.stride() == (1, 64) and torch.equal(again[0].weight, theirs[0].weight)


def test_a_gradient_in_another_layout_than_its_parameter_is_applied_entry_by_entry():
    """A gradient set by hand in row-major order on an input-major weight: FusedAdam moves each weight by its own
    gradient entry (the fused kernel alone would pair them by memory position), as torch's Adam does."""
    torch.manual_seed(0)
    weight = torch.randn(3, 8).t()  # [8, 3], input-major
    ours, theirs = nn.Parameter(weight.clone(memory_format=torch.preserve_format)), nn.Parameter(weight.contiguous())
    assert ours.stride() == (1, 8)
    grad = torch.randn(8, 3)  # row-major
    ours.grad, theirs.grad = grad.clone(), grad.clone()
    opt = make_adam([ours], 1e-2, eps=1e-8)
    opt.step()
    ref = torch.optim.Adam([theirs], lr=1e-2, eps=1e-8)
    ref.step()
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=1e-7)
    assert ours.stride() == (1, 8)
