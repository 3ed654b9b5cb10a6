"""SAC's actor-loss min over the twin critics (models/min_q.py): the values and the action gradient autograd gives
through ``torch.min`` of both critics, with each critic's backward over the rows where it is the min."""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest
import torch

from rltrain.algos.sac import SAC, SACSettings
from rltrain.envs.make import env_spec
from rltrain.models.factory import ModelSettings
from rltrain.models.layers import mlp
from rltrain.models.min_q import fits, twin_min


def _reference(x: torch.Tensor, q1, q2) -> torch.Tensor:
    return torch.minimum(q1(x).squeeze(-1), q2(x).squeeze(-1))


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_value_and_input_gradient_match_autograd_through_torch_min(activation):
    torch.manual_seed(3)
    q1, q2 = (mlp(5, (32, 16), 1, activation=activation) for _ in range(2))
    assert fits(q1) and fits(q2)
    x = torch.randn(64, 5, requires_grad=True)
    weights = torch.randn(64)  # a loss that weighs rows differently: each row's gradient lands on its own row
    (twin_min(x, q1, q2) * weights).sum().backward()
    ours, x.grad = x.grad.clone(), None
    (_reference(x, q1, q2) * weights).sum().backward(inputs=[x])
    torch.testing.assert_close(twin_min(x, q1, q2), _reference(x, q1, q2), rtol=0, atol=0)
    torch.testing.assert_close(ours, x.grad, rtol=1e-6, atol=1e-6)
    assert ours.abs().sum() > 0
    # both critics are the min somewhere in this batch: both backward passes ran
    v1, v2 = q1(x).squeeze(-1), q2(x).squeeze(-1)
    assert (v1 < v2).any() and (v2 < v1).any()


def test_a_tie_sends_half_of_the_gradient_into_each_critic_as_torch_minimum():
    torch.manual_seed(4)
    q1 = mlp(4, (16,), 1, activation="relu")
    q2 = copy.deepcopy(q1)  # equal critics: every row ties
    x = torch.randn(8, 4, requires_grad=True)
    twin_min(x, q1, q2).sum().backward()
    ours, x.grad = x.grad.clone(), None
    _reference(x, q1, q2).sum().backward(inputs=[x])
    torch.testing.assert_close(ours, x.grad)
    x.grad = None
    q1(x).sum().backward(inputs=[x])  # half from each of two equal critics: one critic's whole gradient
    torch.testing.assert_close(ours, x.grad)


def test_the_critics_weights_get_no_gradient_from_it():
    q1, q2 = mlp(3, (8,), 1, activation="relu"), mlp(3, (8,), 1, activation="relu")
    x = torch.randn(10, 3, requires_grad=True)
    twin_min(x, q1, q2).sum().backward()  # no ``inputs``: everything the graph reaches
    assert all(p.grad is None for p in [*q1.parameters(), *q2.parameters()])


def test_activations_without_an_output_derivative_fall_back_to_autograd():
    assert not fits(mlp(3, (8,), 1, activation="elu"))
    assert not fits(mlp(3, (8,), 2, activation="relu"))  # two outputs: not a Q value
    spec = env_spec(gym.make("Pendulum-v1"), "Pendulum-v1")
    algo = SAC(spec, SACSettings(), num_envs=1, device=torch.device("cpu"),
               model=ModelSettings(activation="elu"))
    obs, a = torch.randn(16, 3), torch.randn(16, 1, requires_grad=True)
    algo.critic.min_q(obs, a).sum().backward(inputs=[a])
    assert a.grad is not None and a.grad.abs().sum() > 0


@pytest.mark.parametrize("shared", [False, True])
def test_sacs_critics_take_it_in_both_layouts(shared):
    spec = env_spec(gym.make("Pendulum-v1"), "Pendulum-v1")
    torch.manual_seed(0)
    algo = SAC(spec, SACSettings(), num_envs=1, device=torch.device("cpu"),
               model=ModelSettings(shared=shared))
    critic = algo.critic
    features = critic.features(torch.randn(32, 3)).detach()
    a = torch.randn(32, 1, requires_grad=True)
    critic.min_q(features, a).mean().backward(inputs=[a])
    ours, a.grad = a.grad.clone(), None
    torch.min(*critic.heads(features, a)).mean().backward(inputs=[a])
    torch.testing.assert_close(ours, a.grad, rtol=1e-6, atol=1e-7)
