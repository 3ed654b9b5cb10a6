"""MAPPO (Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games"): IPPO whose
critics read the global state (centralised training, decentralised execution).

- The critic's input is the *agent-specific global state*: the env's global state (``env.state()`` where the
  env implements it, else every agent's observation flattened and joined, as the paper builds MPE's) beside the
  agent's own observation and one-hot index (the paper's "AS"/"FP" inputs). The actor never reads it
  (``model.critic_keys``), so the policy acts on its own observation alone.
- Value normalisation (the paper's first listed detail): the value head predicts returns standardised by a
  running mean and variance (``ValueNorm``, the paper's debiased running moments, beta = 0.99999); GAE sees the
  values de-standardised, the value loss compares standardised returns.

Everything else is PPO (ppo.py) per policy group, as IPPO (ippo.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rltrain.algos.base import Sync
from rltrain.algos.groups import GroupPPO
from rltrain.algos.ippo import IPPO, IPPOSettings
from rltrain.data.agents import AgentsSpec
from rltrain.data.structs import ObsSpace, Rollout
from rltrain.errors import ConfigError
from rltrain.models.settings import MLP

STATE_SOURCES = ("auto", "env", "joined")


@dataclass(frozen=True, kw_only=True)
class MAPPOSettings(IPPOSettings):
    """IPPO's settings and the centralised critic's; the PPO settings are the paper's common ones where it gives
    them (its table of common hyper-parameters, MPE), PPO's generic defaults otherwise."""

    num_minibatches: int | None = 1  # one minibatch on MPE. Source: Yu et al. 2022 ("avoid splitting data
    #                                  into mini-batches")
    lr: float = 7e-4  # actor and critic learning rate on MPE. Source: Yu et al. 2022
    ent_coef: float = 0.01  # entropy bonus. Source: Yu et al. 2022
    vf_coef: float = 1.0  # value loss weight (value_loss_coef 1). Source: Yu et al. 2022
    max_grad_norm: float = 10.0  # global gradient norm clip. Source: Yu et al. 2022
    global_state: str = "auto"  # auto: env.state() where the env has it, else joined | env | joined. Source: rltrain
    norm_value: bool = True  # standardise value targets by running moments. Source: Yu et al. 2022

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.global_state not in STATE_SOURCES:
            raise ConfigError(f"algo.global_state={self.global_state!r}: one of {', '.join(STATE_SOURCES)}")


class ValueNorm:
    """Running mean and variance of value targets as Yu et al.'s implementation keeps them: exponential moments
    with weight ``beta`` and a debiasing term (so early estimates are not pulled to 0); the variance is clamped
    at 1e-2. Moments are summed over distributed workers, so every replica holds the same statistics."""

    def __init__(self, beta: float = 0.99999, eps: float = 1e-5):
        self.beta, self.eps = beta, eps
        self.moments = np.zeros(3)  # running mean, running mean of squares, debiasing term

    def update(self, x: np.ndarray, sync: Sync) -> None:
        total, squares, count = sync.sum(np.array([x.sum(), np.square(x, dtype=np.float64).sum(), x.size], np.float64))
        if count:
            batch = np.array([total / count, squares / count, 1.0])
            self.moments = self.beta * self.moments + (1.0 - self.beta) * batch

    def _mean_std(self) -> tuple[float, float]:
        mean, squares, debias = self.moments
        if debias == 0:  # no target seen yet
            return 0.0, 1.0
        mean, squares = mean / max(debias, self.eps), squares / max(debias, self.eps)
        return float(mean), float(np.sqrt(max(squares - mean * mean, 1e-2)))

    def normalize(self, x: np.ndarray) -> np.ndarray:
        mean, std = self._mean_std()
        return ((x - mean) / std).astype(np.float32)

    def denormalize(self, x: np.ndarray) -> np.ndarray:
        mean, std = self._mean_std()
        return (x * std + mean).astype(np.float32)


class ValueNormPPO(GroupPPO):
    """``GroupPPO`` whose critic predicts standardised returns (``ValueNorm``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.value_norm = ValueNorm()

    def _values(self, rollout: Rollout, inputs: tuple | None) -> tuple[np.ndarray, np.ndarray]:
        values, next_values = super()._values(rollout, inputs)
        return self.value_norm.denormalize(values), self.value_norm.denormalize(next_values)

    def _minibatches(self, rollout: Rollout, inputs, adv: np.ndarray, ret: np.ndarray, values: np.ndarray):
        self.value_norm.update(ret if rollout.valid is None else ret[rollout.valid], self.sync)
        return super()._minibatches(rollout, inputs, adv, self.value_norm.normalize(ret),
                                    self.value_norm.normalize(values))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "value_norm": torch.from_numpy(self.value_norm.moments.copy())}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "value_norm" in state:
            self.value_norm.moments = state["value_norm"].numpy().astype(np.float64).copy()


class MAPPO(IPPO):
    name = "mappo"
    settings_class = MAPPOSettings
    mlp = MLP((64, 64), "relu")  # Yu et al. 2022: 64-wide MLPs on MPE, ReLU (use_ReLU)

    @property
    def learner_class(self) -> type[GroupPPO]:  # type: ignore[override]
        return ValueNormPPO if self.settings.norm_value else GroupPPO

    @classmethod
    def global_state(cls, spec: AgentsSpec, settings: MAPPOSettings) -> tuple[str, ObsSpace] | None:  # type: ignore[override]
        """(``env`` | ``joined``, its space) as ``algo.global_state`` asks, or one line where it cannot be had."""
        mode = settings.global_state
        if mode in ("auto", "env") and spec.state is not None:
            return "env", spec.state
        if mode == "env":
            raise ConfigError(f"algo.global_state=env: env.id={spec.env_id} has no usable state() (missing, "
                              "raising, or not an array of numbers); use algo.global_state=joined or auto")
        if spec.joined is None:
            parts = ", ".join(f"{a}: {s.observation.name}" for a, s in zip(spec.agents, spec.specs, strict=True))
            raise ConfigError(f"algo=mappo needs a global state: env.id={spec.env_id} has no state() and its agents' "
                              f"observations do not join into one vector of numbers ({parts}); use algo=ippo")
        return "joined", spec.joined
