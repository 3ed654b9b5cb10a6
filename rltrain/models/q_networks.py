"""Q-functions: Q(s, .) over discrete actions (DQN's network and its epsilon-greedy policy) and Q(s, a) over
continuous ones (SAC's critics). Encoders come from ``encoders.py`` like every other network's.

Checkpoints written before these lived here (DQN's flat ``q.<i>`` MLP over float vectors) still load:
``QPolicy.load_state_dict`` renames their keys.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rltrain.data.structs import MASK_KEY, ActOutput, EnvSpec, Policy, action_mask_of
from rltrain.errors import ConfigError
from rltrain.models.distributions import mask_logits
from rltrain.models.encoders import Encoder, MLPEncoder, Obs, make_encoder
from rltrain.models.heads import QHead
from rltrain.models.layers import ACTIVATIONS, NumpyActor, mlp
from rltrain.models.numpy_mlp import flat_float32
from rltrain.models.q_heads import LayerNormMLP, NormedFeatures, QHeadOptions, QHeads
from rltrain.models.settings import ModelSettings


class QNetwork(nn.Module):
    """Encoder + Q head: obs [B, ...] (or a dict of them) -> Q-values [B, n_actions] (Mnih et al. 2015). With
    ``options`` other than the plain head (q_heads.py): dueling streams, distributional outputs, noisy layers,
    a LayerNorm MLP; ``raw(obs)`` then gives the head's [B, A, K] outputs and ``forward`` their Q-values."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings, options: QHeadOptions | None = None):
        super().__init__()
        if spec.action_kind != "discrete":
            raise ConfigError(f"a Q-network needs Discrete actions; env.id={spec.env_id} has {spec.describe()}: "
                              "algo=sac takes Box actions; algo=ppo, a2c and impala take any action space")
        self.n_actions = spec.n_actions
        self.options = options = options or QHeadOptions()
        self.encoder = make_encoder(spec.observation, settings)
        if options.layer_norm:
            if isinstance(self.encoder, MLPEncoder):  # the same widths, a LayerNorm after each hidden Linear
                self.encoder = LayerNormMLP(spec.observation, hidden_sizes=settings.hidden_sizes,
                                            activation=settings.activation)
            else:  # a CNN or a Dict's encoders: normalise the features they hand the head
                self.encoder = NormedFeatures(self.encoder)
        out_dim = self.encoder.out_dim
        self.head = QHead(out_dim, spec.n_actions) if options.one_linear else QHeads(out_dim, spec.n_actions, options)

    def raw(self, obs: Obs) -> Tensor:
        """obs -> the head's outputs [B, A, K] (K = 1 for the plain head)."""
        if isinstance(self.head, QHead):
            return self.forward(obs).unsqueeze(-1)
        return self.head(self.encoder(obs))

    def forward(self, obs: Obs) -> Tensor:
        if isinstance(self.head, QHeads):
            return self.head.q_values(self.head(self.encoder(obs)))
        linear = self.head.linear  # QHead's one Linear, called as a function: DQN runs thousands of small forwards
        return F.linear(self.encoder(obs), linear.weight, linear.bias)


class QPolicy(Policy):
    """Q(s, .) and epsilon-greedy acting. ``epsilon`` is a buffer so it ships to actors with the weights."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings, options: QHeadOptions | None = None):
        super().__init__()
        self.spec = spec
        self.n_actions = spec.n_actions
        self.q = QNetwork(spec, settings, options)
        self.masked = spec.masked
        self.register_buffer("epsilon", torch.tensor(1.0))
        # an MLP over a flattened Box or MultiBinary observation (float vectors, bool / int / uint8 planes, which
        # numpy converts as FlatInput does: numpy_mlp.flat_float32; not Discrete's one-hot), no mask, and a head
        # that is one Linear (K outputs per action: the plain head, QR-DQN's quantiles, C51's atoms): DQN's numpy
        # TD step applies, and numpy acting where Q is the outputs' mean (plain, QR-DQN: Dabney et al. 2018).
        # mlp_layers: its Linear layers in order (encoder MLP, then the head), mlp_activation: between them
        o = self.q.options
        flat_box = spec.observation.kind in ("box", "multi_binary")
        mlp_head = not self.masked and flat_box and type(self.q.encoder) is MLPEncoder  # not a subclass's encode
        one_stream = mlp_head and not (o.dueling or o.noisy or o.layer_norm)
        encoder_linears = [m for m in self.q.encoder.mlp if isinstance(m, nn.Linear)] if mlp_head else []
        head = self.q.head.linear if o.one_linear else self.q.head.advantage
        self.mlp_layers = encoder_linears + [head] if one_stream else []
        self.mlp_activation = next((name for name, cls in ACTIVATIONS.items() for m in self.q.encoder.mlp
                                    if isinstance(m, cls)), "relu") if mlp_head else ""
        self.actor_layers = self.mlp_layers if o.distributional != "c51" else []  # C51's Q is an expectation
        self.quantiles = o.atoms if o.distributional == "qr" else 1
        self._actor: tuple[tuple[int, ...], EpsilonGreedyActor] | None = None  # (weight addresses, actor)

    def forward(self, obs: Obs) -> Tensor:
        """obs [B, *obs_shape] (stored dtype) -> Q-values [B, n_actions]; with an action mask in the observation
        the illegal actions' values are the dtype's minimum, so every argmax and max (acting, the target, Double
        DQN's selection) is over legal actions only."""
        q = self.q(obs)
        return mask_logits(q, action_mask_of(obs)) if self.masked else q

    def q_and_raw(self, obs: Obs) -> tuple[Tensor, Tensor]:
        """obs -> (Q-values [B, A] masked as ``forward``'s, the head's raw outputs [B, A, K]) from one forward:
        the distributional targets pick the next action by the first and read its distribution from the second."""
        raw = self.q.raw(obs)
        q = self.q.head.q_values(raw) if isinstance(self.q.head, QHeads) else raw.squeeze(-1)
        return (mask_logits(q, action_mask_of(obs)) if self.masked else q), raw

    def act(self, obs: Obs, state=None, *, deterministic: bool = False,
            generator: torch.Generator | None = None) -> ActOutput:
        """Epsilon-greedy: with probability epsilon a uniform action (among the legal ones), else argmax Q. (The
        collector acts on CPU through ``numpy_actor`` where it applies.)"""
        greedy = self(obs).argmax(-1)
        device = greedy.device
        if deterministic:
            return ActOutput(greedy, torch.zeros(greedy.shape, device=device))
        eps = float(self.epsilon)
        # the random draws are made where the generator lives (the collector's is on CPU: the same exploration on
        # CPU and CUDA; an evaluation's is on the policy's device), then move to the Q-values' device
        where = generator.device if generator is not None else torch.device("cpu")
        explore = (torch.rand(greedy.shape, generator=generator, device=where) < eps).to(device)
        if self.masked:  # explore uniformly among the legal actions
            legal = action_mask_of(obs).to(device=where, dtype=torch.float32)
            uniform = torch.multinomial(legal, 1, generator=generator).squeeze(-1).to(device)
            n_legal = legal.sum(-1).to(device)
        else:
            uniform = torch.randint(0, self.n_actions, greedy.shape, generator=generator, device=where).to(device)
            n_legal = torch.full(greedy.shape, float(self.n_actions), device=device)
        action = torch.where(explore, uniform, greedy)
        # behaviour probability of the chosen action under epsilon-greedy (for logging / off-policy checks)
        prob = eps / n_legal + (1.0 - eps) * (action == greedy).float()
        return ActOutput(action, prob.log())

    def numpy_actor(self) -> EpsilonGreedyActor | None:
        """Q(s, .) of an MLP over a flattened Box on CPU in numpy (``mlp_layers``), acting epsilon-greedily at this
        epsilon, for the collector's fast path (a torch forward of a small MLP on one observation is mostly
        per-op overhead); None for anything else (encoders with weights before the MLP, action masks, C51, an
        accelerator). The actor holds views
        of the weights, so it follows every update in place; it is rebuilt when they move (``to``, ``assign``)."""
        linears = self.actor_layers
        if not linears or self.epsilon.device.type != "cpu":
            return None
        where = tuple(p.data_ptr() for m in linears for p in (m.weight, m.bias))
        if self._actor is None or self._actor[0] != where:
            layers = [(m.weight.detach().numpy().T, m.bias.detach().numpy()) for m in linears]
            self._actor = where, EpsilonGreedyActor(layers, activation=self.mlp_activation, epsilon=0.0,
                                                    quantiles=self.quantiles)
        actor = self._actor[1]
        actor.epsilon = np.float32(float(self.epsilon))
        return actor

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_actor": None}  # pickled (to actors) or deep-copied (the target): rebuilt there

    def export_module(self) -> nn.Module:
        return GreedyActor(self)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return super().load_state_dict(upgrade_flat_q_keys(state_dict), strict=strict, assign=assign)


class EpsilonGreedyActor(NumpyActor):
    """Epsilon-greedy over a numpy copy of Q(s, .) (``QPolicy.numpy_actor``), in ``NumpyActor``'s protocol: the
    collector's uniform noise [..., A] per step decides, its first column whether to explore (< epsilon) and its
    last which action then (uniform over the A). ``quantiles`` K > 1: the net outputs K quantiles per action
    ([..., A * K], action-major as ``QHeads``), and Q is their mean (QR-DQN)."""

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]], *, activation: str, epsilon: float,
                 quantiles: int = 1):
        super().__init__(layers, activation=activation, discrete=True)
        self.epsilon = np.float32(epsilon)
        self.quantiles = quantiles
        self.out_dim //= quantiles

    def forward(self, obs: np.ndarray) -> np.ndarray:
        out = super().forward(flat_float32(obs))  # as the torch path, which flattens and casts (FlatInput) first
        if self.quantiles > 1:
            out = out.reshape(*out.shape[:-1], self.out_dim, self.quantiles).mean(-1)
        return out

    def perturb(self, noise: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """noise [T, N, A] -> per step (explore [N] bool, the uniform action [N]), for the whole rollout at once."""
        explore = noise[..., 0] < self.epsilon
        uniform = np.minimum((noise[..., -1] * self.out_dim).astype(np.int64), self.out_dim - 1)
        return list(zip(explore, uniform, strict=True))

    def action(self, out: np.ndarray, perturbation: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        explore, uniform = perturbation
        return np.where(explore, uniform, out.argmax(-1))

    def log_prob(self, out: np.ndarray, action: np.ndarray, noise: np.ndarray) -> np.ndarray:
        greedy = action == out.argmax(-1)
        return np.log(self.epsilon / self.out_dim + (1 - self.epsilon) * greedy).astype(np.float32)


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
    """Q(s, a): encoder(obs) ++ action -> MLP -> Q [B] (SAC's critic). With ``flat_input`` vectors go in
    flattened, a Dict of them concatenated, as in CleanRL's and SB3's SAC (the MLP is the whole network);
    otherwise through an encoder of its own first (``model.shared=false`` on images: one per critic)."""

    def __init__(self, spec: EnvSpec, settings: ModelSettings, *, flat_input: bool):
        super().__init__()
        self.encoder: Encoder = make_encoder(spec.observation, settings, warn=False, flat=flat_input)
        act_dim = torch.Size(spec.action_shape).numel()
        self.q = mlp(self.encoder.out_dim + act_dim, settings.hidden_sizes, 1, activation=settings.activation)

    def forward(self, obs: Obs, action: Tensor) -> Tensor:
        """obs [B, ...] (or a dict of them), action [B, A] -> Q [B]."""
        return self.value(self.mlp_input(obs, action))

    def mlp_input(self, obs: Obs, action: Tensor) -> Tensor:
        """obs [B, ...] (or a dict of them), action [B, A] -> the MLP's input, encoder(obs) ++ action [B, F + A]."""
        features = self.encoder(obs)
        return torch.cat([features, action.to(features.device)], -1)

    def value(self, x: Tensor) -> Tensor:
        """The MLP's input [B, F + A] -> Q [B]."""
        return self.q(x).squeeze(-1)
