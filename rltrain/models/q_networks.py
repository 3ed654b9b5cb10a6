"""Q-functions: Q(s, .) over discrete actions (DQN's network and its epsilon-greedy policy) and Q(s, a) over
continuous ones (SAC's critics). Encoders come from ``encoders.py`` like every other network's.

Checkpoints written before these lived here (DQN's flat ``q.<i>`` MLP over float vectors) still load:
``QPolicy.load_state_dict`` renames their keys.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rltrain.data.structs import MASK_KEY, ActOutput, EnvSpec, Policy, action_mask_of
from rltrain.errors import ConfigError
from rltrain.models.distributions import mask_logits
from rltrain.models.encoders import Encoder, FlatInput, Obs, make_encoder
from rltrain.models.heads import QHead
from rltrain.models.layers import mlp
from rltrain.models.settings import ModelSettings


class QNetwork(nn.Module):
    """Encoder + Q head: obs [B, ...] (or a dict of them) -> Q-values [B, n_actions] (Mnih et al. 2015)."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings):
        super().__init__()
        if spec.action_kind != "discrete":
            raise ConfigError(f"a Q-network needs Discrete actions; env.id={spec.env_id} has {spec.describe()}: "
                              "algo=sac takes Box actions; algo=ppo, a2c and impala take any action space")
        self.n_actions = spec.n_actions
        self.encoder = make_encoder(spec.observation, settings)
        self.head = QHead(self.encoder.out_dim, spec.n_actions)

    def forward(self, obs: Obs) -> Tensor:
        return self.head(self.encoder(obs))


class QPolicy(Policy):
    """Q(s, .) and epsilon-greedy acting. ``epsilon`` is a buffer so it ships to actors with the weights."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings):
        super().__init__()
        self.spec = spec
        self.n_actions = spec.n_actions
        self.q = QNetwork(spec, settings)
        self.masked = spec.masked
        self.register_buffer("epsilon", torch.tensor(1.0))

    def forward(self, obs: Obs) -> Tensor:
        """obs [B, *obs_shape] (stored dtype) -> Q-values [B, n_actions]; with an action mask in the observation
        the illegal actions' values are the dtype's minimum, so every argmax and max (acting, the target, Double
        DQN's selection) is over legal actions only."""
        q = self.q(obs)
        return mask_logits(q, action_mask_of(obs)) if self.masked else q

    def act(self, obs: Obs, state=None, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        greedy = self(obs).argmax(-1)
        device = greedy.device
        if deterministic:
            return ActOutput(greedy, torch.zeros(greedy.shape, device=device))
        eps = float(self.epsilon)
        # the random draws come from the CPU generator (the same exploration on CPU and CUDA), then move over
        explore = (torch.rand(greedy.shape, generator=generator) < eps).to(device)
        if self.masked:  # explore uniformly among the legal actions
            legal = action_mask_of(obs).to(torch.float32).cpu()
            uniform = torch.multinomial(legal, 1, generator=generator).squeeze(-1).to(device)
            n_legal = legal.sum(-1).to(device)
        else:
            uniform = torch.randint(0, self.n_actions, greedy.shape, generator=generator).to(device)
            n_legal = torch.full(greedy.shape, float(self.n_actions), device=device)
        action = torch.where(explore, uniform, greedy)
        # behaviour probability of the chosen action under epsilon-greedy (for logging / off-policy checks)
        prob = eps / n_legal + (1.0 - eps) * (action == greedy).float()
        return ActOutput(action, prob.log())

    def export_module(self) -> nn.Module:
        return GreedyActor(self)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return super().load_state_dict(upgrade_flat_q_keys(state_dict), strict=strict, assign=assign)


class GreedyActor(nn.Module):
    """obs [B, ...] -> argmax_a Q(obs, a) [B] int64 (what ``rltrain-export`` traces)."""

    state_names: list[str] = []

    def __init__(self, policy: QPolicy):
        super().__init__()
        self.q = policy.q
        self.masked = policy.masked

    def forward(self, obs: Obs) -> Tensor:
        q = self.q(obs)
        return (mask_logits(q, obs[MASK_KEY]) if self.masked else q).argmax(-1)  # type: ignore[index]


def upgrade_flat_q_keys(state: dict) -> dict:
    """DQN checkpoints from before the model family built its MLP (``q.0.weight`` ... ``q.<2L>.bias``: L hidden
    Linear + activation pairs, then the output Linear) -> ``q.encoder.mlp.<i>`` and ``q.head.linear``."""
    if "q.0.weight" not in state:
        return state
    last = max(int(k.split(".")[1]) for k in state if k.startswith("q."))
    out = type(state)()
    for key, value in state.items():
        if key.startswith("q."):
            _, index, rest = key.split(".", 2)
            key = "q.head.linear." + rest if int(index) == last else f"q.encoder.mlp.{index}.{rest}"
        out[key] = value
    return out


class ContinuousQNetwork(nn.Module):
    """Q(s, a): encoder(obs) ++ action -> MLP -> Q [B] (SAC's critic). Float vectors go in flattened, as in
    CleanRL's SAC (the MLP is the whole network); images and Dicts through their encoder first, one per
    critic, as the SAC-AE / DrQ critics do, so the twin estimates stay independent."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings, *, flat_input: bool):
        super().__init__()
        self.encoder: Encoder = FlatInput(spec.observation) if flat_input else \
            make_encoder(spec.observation, settings, warn=False)
        act_dim = torch.Size(spec.action_shape).numel()
        self.q = mlp(self.encoder.out_dim + act_dim, settings.hidden_sizes, 1, activation=settings.activation)

    def forward(self, obs: Obs, action: Tensor) -> Tensor:
        """obs [B, ...] (or a dict of them), action [B, A] -> Q [B]."""
        features = self.encoder(obs)
        return self.q(torch.cat([features, action.to(features.device)], -1)).squeeze(-1)
