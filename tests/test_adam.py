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
