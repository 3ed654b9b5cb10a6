"""IMPALA's learner (Espeholt et al. 2018): actor-critic trained on V-trace targets.

The rollout carries the behaviour policy's log-probs mu(a|x) (written by the collector, wherever it ran);
the learner recomputes pi(a|x) with its current weights, and the importance ratios rho = pi / mu,
clipped at ``rho_bar`` (value targets), ``c_bar`` (trace cutting) and ``pg_rho_bar`` (policy gradient),
correct for the lag between actor and learner weights. Under ``trainer=sequential`` the rollout was
collected by these very weights, so rho = 1 and V-trace reduces to n-step returns: the on-policy
correctness check (``train/rho_mean`` is logged and stays at 1 there). The real use is with lagging
actors (``trainer=subprocess_actors``).

Loss (paper, section 4.2): -rho_pg * A_vtrace * log pi + baseline_coef * 0.5 (v_s - V)^2 - ent_coef * H.
The network comes from the model family (``models.factory.build(..., "actor_critic")``); checkpoints share PPO's layout
(``ActorCriticState``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rltrain.algos.a2c import ActorCriticLearner, check_optimizer
from rltrain.algos.base import Algorithm, AlgoSettings, Sync, box_only, positive, set_lr
from rltrain.algos.sequences import evaluate_rollout
from rltrain.data.returns import vtrace
from rltrain.data.structs import EnvSpec, Metrics, Rollout
from rltrain.errors import ConfigError
from rltrain.models.factory import ModelSettings
from rltrain.models.layers import RunningNorm
from rltrain.models.settings import SB3_MLP


@dataclass(frozen=True, kw_only=True)
class IMPALASettings(AlgoSettings):
    """IMPALA's hyper-parameters (``algo=impala``): generic defaults from Espeholt et al. 2018 (paper: its table
    of shallow-model hyper-parameters) and torchbeast, its PyTorch port, for the RMSprop details, but for
    ``optimizer_eps``, ``anneal_lr``, ``num_epochs`` and ``max_grad_norm``, whose paper values suit a billion Atari
    frames and not a small task (the fields say why; experiment=impala_atari keeps the paper's). Tuned settings
    live in presets (conf/experiment/impala_*.yaml)."""

    rollout_len: int = 20  # unroll length per env. Source: paper
    lr: float = 6e-4  # learning rate. Source: paper
    optimizer: str = "rmsprop"  # rmsprop (momentum 0, decay 0.99) | adam. Source: paper
    optimizer_eps: float = 1e-5  # the optimiser's epsilon. Source: SB3's A2C (RMSprop eps), not the paper's
    #                              0.01: that is TensorFlow's eps inside the square root, set for Atari's clipped
    #                              rewards; torch adds it to sqrt(v), which a small task's gradients keep far below
    #                              0.01, so every step shrank ~10x (a cue-recall memory task stayed at the
    #                              memoryless 0). experiment=impala_atari keeps the paper's 0.01
    anneal_lr: bool = False  # linear decay of lr to 0 over total_env_steps. Source: rltrain (constant), not the
    #                          paper's annealing, which spans 1e9-2e9 frames: over a small task's budget it halves
    #                          the mean rate and stops the late updates. Constant, on tasks nobody tuned for (3
    #                          seeds): greedy 476 vs 406 on CartPole and -239 vs -362 on Acrobot at 100k steps,
    #                          0.33 vs 0.20 on a Dict task at 50k. experiment=impala_atari keeps the paper's, and
    #                          the presets tuned with it (impala_minatar, impala_lstm_cartpole_novel) pin it
    gamma: float = 0.99  # discount. Source: paper
    rho_bar: float = 1.0  # clip of the importance weights in the value targets. Source: paper
    c_bar: float = 1.0  # clip of the trace-cutting coefficients. Source: paper
    pg_rho_bar: float = 1.0  # clip of the importance weights in the policy gradient. Source: paper
    ent_coef: float = 0.01  # entropy cost. Source: paper
    vf_coef: float = 0.5  # baseline cost. Source: paper
    max_grad_norm: float = 0.5  # global gradient norm clip. Source: SB3's A2C and PPO (0.5), not the paper's 40
    #                             (torchbeast's too), which a small network's gradients never reach: with two passes
    #                             per batch (num_epochs) the clip at 0.5 is what kept CartPole-v1 stable (greedy
    #                             500 on 3 seeds at 100k steps, against 278 with the clip at 40).
    #                             experiment=impala_atari keeps the paper's 40
    norm_adv: bool = False  # normalise the V-trace policy-gradient advantages over the batch. Source: paper
    norm_obs: bool = False  # running observation normalisation. Source: paper (none)
    norm_reward: bool = False  # scale rewards by the running std of the discounted return. Source: paper
    #                            (none; it clips rewards on Atari, env.wrappers here)
    num_epochs: int = 2  # gradient steps on each batch, each a pass over all of it with V-trace recomputed
    #                      against the current weights (rho then corrects the earlier passes' drift as it
    #                      corrects an actor's lag). Source: rltrain, not the paper's 1 (each batch used once, for
    #                      throughput over 1e9 frames); RLlib's IMPALA has the option too (num_epochs). One step per
    #                      80-step batch left the policy near uniform for 20k steps on a Dict image task; with 2
    #                      passes and the clip at 0.5 (3 seeds, experiment=none): greedy 0.83 vs 0.33 on it at 50k
    #                      steps, 500 vs 476 on CartPole-v1 and -89 vs -239 on Acrobot-v1 at 100k, 1.0 either way
    #                      on a cue-recall memory task (LSTM), at about 1.3-2.1x the CPU per step.
    #                      experiment=impala_atari keeps the paper's 1
    init_log_std: float = 0.0  # Box actions: initial log std of the Gaussian. Source: SB3 log_std_init=0.0
    #                            (the paper has discrete actions only)

    def __post_init__(self) -> None:
        super().__post_init__()  # gamma
        for key in ("rollout_len", "num_epochs", "lr", "max_grad_norm", "rho_bar", "c_bar", "pg_rho_bar",
                    "optimizer_eps"):
            positive(f"algo.{key}", getattr(self, key))
        if self.c_bar > self.rho_bar:
            # the paper assumes c_bar <= rho_bar (its fixed point analysis)
            raise ConfigError(f"algo.c_bar={self.c_bar} must not exceed algo.rho_bar={self.rho_bar}")
        check_optimizer(self.optimizer)

    def unread_keys(self, *, action_kind: str | None = None) -> dict[str, str]:
        return {**super().unread_keys(action_kind=action_kind), **box_only(action_kind, "init_log_std")}


class IMPALA(ActorCriticLearner, Algorithm):
    name = "impala"
    on_policy = True  # learns from (nearly) current-policy data; V-trace absorbs bounded lag
    settings_class = IMPALASettings
    mlp = SB3_MLP  # SB3's MlpPolicy: 64x64 tanh, actor and critic (the paper's agents see pixels)

    def __init__(self, spec: EnvSpec, settings: IMPALASettings = IMPALASettings(), *, num_envs: int,
                 device: torch.device, sync: Sync | None = None, model: ModelSettings | None = None):
        """``model``: the model group (encoder by observation space, cli/build.py); None: its defaults."""
        super().__init__(spec, num_envs=num_envs, device=device, sync=sync)
        self._build_learner(spec, settings, num_envs=num_envs, model=model)

    def learn(self, rollout: Rollout, *, progress: float) -> Metrics:
        s, dev = self.settings, self.device
        T, N = rollout.shape
        rewards = self.reward_scaler(rollout, self.sync) if self.reward_scaler else rollout.rewards
        actions = torch.from_numpy(rollout.actions.reshape(T * N, *self.spec.action_shape)).to(dev)
        lr = set_lr(self.optimizer, s.lr, anneal=s.anneal_lr, progress=progress)
        # ``num_epochs`` passes over the whole batch, each against the current weights: pass k > 0 learns from
        # data that k updates of its own made off-policy, and recomputing rho = pi / mu each pass lets V-trace
        # correct that lag exactly as it corrects an actor's. The rho statistics are the first pass's: the lag
        # between the actors' weights and the learner's as the batch arrived (1 under trainer=sequential).
        passes = [self._step(rollout, rewards, actions) for _ in range(s.num_epochs)]
        # Observation statistics move after the update.
        if self.policy.obs_norm.enabled:
            self.policy.obs_norm.update_from_moments(
                self.sync.sum(RunningNorm.moments(rollout.obs, len(self.spec.obs_shape))))
        losses = np.mean([p[:3] for p in passes], axis=0)
        lag = rollout.policy_version.max() - rollout.policy_version.min()
        m = self.sync.mean(np.array([*losses, *passes[0][3:], float(lag)]))
        return {"loss/policy": float(m[0]), "loss/value": float(m[1]), "loss/entropy": float(m[2]),
                "train/rho_mean": float(m[3]), "train/rho_clip_frac": float(m[4]),
                "train/policy_version_spread": float(m[5]), "train/lr": lr}

    def _step(self, rollout: Rollout, rewards: np.ndarray, actions: torch.Tensor) -> tuple[float, ...]:
        """One gradient step on the whole batch: (policy loss, value loss, entropy, mean rho, rho clip fraction)."""
        s, dev = self.settings, self.device
        T, N = rollout.shape
        # 1. The learner's log pi(a|x), entropy and V(x) (with grad), V(next_obs) (without), and the log
        #    importance ratios log rho = log pi - log mu against the behaviour policy mu.
        logp, entropy, value, values, next_values = evaluate_rollout(self.policy, rollout, actions, dev,
                                                                     recurrent=self.recurrent)
        log_rhos = logp.detach().cpu().numpy().reshape(T, N) - rollout.log_probs

        # 2. V-trace targets v_s and policy-gradient advantages rho_pg (r + gamma v_{s+1} - V) (paper, eq. 1).
        vs, pg_adv = vtrace(log_rhos, rewards, values, next_values, rollout.terminated, rollout.truncated,
                            gamma=s.gamma, rho_bar=s.rho_bar, c_bar=s.c_bar, pg_rho_bar=s.pg_rho_bar)
        b_vs = torch.from_numpy(vs.reshape(-1)).to(dev)
        b_adv = torch.from_numpy(pg_adv.reshape(-1)).to(dev)
        if s.norm_adv:
            b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)

        # 3. The loss (section 4.2): -rho_pg A log pi + baseline cost * 0.5 (v_s - V)^2 - entropy cost * H.
        pg_loss = -(b_adv * logp).mean()
        v_loss = 0.5 * ((b_vs - value) ** 2).mean()
        ent = entropy.mean()
        loss = pg_loss + s.vf_coef * v_loss - s.ent_coef * ent

        # 4. One optimiser step.
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.sync.grads(self.params)
        nn.utils.clip_grad_norm_(self.params, s.max_grad_norm, foreach=True)
        self.optimizer.step()
        clipped = float(np.mean(log_rhos > np.log(s.rho_bar) + 1e-6))
        return pg_loss.item(), v_loss.item(), ent.item(), float(np.exp(log_rhos).mean()), clipped
