"""Proximal Policy Optimization (Schulman et al. 2017), clipped surrogate, for discrete and Box actions.

Hyper-parameter names follow CleanRL's ppo.py so settings carry over. Implementation details follow
"The 37 Implementation Details of PPO" (Huang et al. 2022): orthogonal init, GAE, advantage
normalisation per minibatch, clipped value loss, global grad-norm clipping, linear LR annealing, Adam
eps 1e-5, state-independent log-std for continuous actions.

Recurrent cores (``model.core=lstm|gru``): the collector stores the core state at each rollout's start;
the learner recomputes log-probs and values over the whole rollout from it, zeroing the state at episode
boundaries (truncated BPTT over one rollout), and minibatches split the envs (columns), never time, so
every sequence stays whole (as SB3-contrib's RecurrentPPO; Kapturowski et al. 2019 on stored states).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from rltrain.algos.base import ActorCriticState, Algorithm, RewardScaler, Sync, make_adam, positive
from rltrain.algos.sequences import join_successors, sequence_inputs, successor_rows, successor_values
from rltrain.algos.surrogate_numpy import NumpyPPOStep
from rltrain.data.returns import gae
from rltrain.data.structs import EnvSpec, Metrics, ObsArray, Rollout, obs_map
from rltrain.errors import ConfigError
from rltrain.models.encoders import batch_layout
from rltrain.models.factory import ModelSettings, build
from rltrain.models.layers import RunningNorm
from rltrain.models.numpy_mlp import (
    FlatAdam,
    FlatParams,
    adam_group,
    adam_state_from_flat,
    clip_grad_norm,
    single_thread_blas,
)

GENERIC_BATCH = 2048  # SB3's n_steps=2048 with one env; Schulman et al. 2017's T=2048 (MuJoCo)


def auto_rollout_len(num_envs: int, num_minibatches: int) -> int:
    """``algo.rollout_len=null``: steps per env for a batch of about ``GENERIC_BATCH`` steps over ``num_envs``
    envs, rounded down to a multiple that ``num_minibatches`` divides (at least one such multiple)."""
    positive("env.num_envs", num_envs)
    positive("algo.num_minibatches", num_minibatches)
    step = num_minibatches // math.gcd(num_envs, num_minibatches)  # rollout_len * num_envs % num_minibatches == 0
    return max(step, GENERIC_BATCH // num_envs // step * step)


def auto_minibatches(num_envs: int, *, recurrent: bool) -> int:
    """``algo.num_minibatches=null``: 32 (minibatches of 64 steps at the 2048-step batch: SB3's batch_size=64, the
    paper's 64); with a recurrent core, whose minibatches are whole env sequences, the largest divisor of
    ``num_envs`` up to 4 (CleanRL's ppo_atari_lstm: 4 minibatches of envs)."""
    positive("env.num_envs", num_envs)
    if not recurrent:
        return 32
    return max(d for d in range(1, min(4, num_envs) + 1) if num_envs % d == 0)


class PPO(ActorCriticState, Algorithm):
    name = "ppo"

    def __init__(
        self,
        spec: EnvSpec,
        *,
        num_envs: int,
        device: torch.device,
        sync: Sync | None = None,
        model: ModelSettings | None = None,  # the model group: encoder by observation space (cli/build.py)
        rollout_len: int | None = None,  # steps per env per update; None: a 2048-step batch (SB3 n_steps, paper T)
        update_epochs: int = 10,  # SB3, paper  # passes over the batch per update
        num_minibatches: int | None = None,  # minibatches per epoch; None: auto_minibatches; must divide the batch
        lr: float = 3e-4,  # Adam learning rate (SB3, paper)
        anneal_lr: bool = False,  # linear decay to 0 over total_env_steps (SB3: constant)
        gamma: float = 0.99,  # discount
        gae_lambda: float = 0.95,  # GAE lambda
        clip_coef: float = 0.2,  # surrogate clipping epsilon
        clip_vloss: bool = False,  # clip the value loss around the old values (SB3: no)
        ent_coef: float = 0.0,  # entropy bonus (SB3, paper on MuJoCo)
        vf_coef: float = 0.5,  # value loss weight
        max_grad_norm: float = 0.5,  # global gradient norm clip
        norm_adv: bool = True,  # normalise advantages per minibatch
        target_kl: float | None = None,  # stop the epochs early when approx KL exceeds it
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        norm_obs: bool = False,  # running observation normalisation (stats checkpointed)
        norm_reward: bool = False,  # scale rewards by the running std of the discounted return
        init_log_std: float = 0.0,  # Box actions: initial log std of the Gaussian
        numpy_update: bool = True,  # on CPU: numpy forward/backward (same maths and checkpoints, ~4x faster)
    ):
        super().__init__(spec, num_envs=num_envs, device=device, sync=sync)
        model = model or ModelSettings()
        self.recurrent = model.core != "identity"
        if num_minibatches is None:
            num_minibatches = auto_minibatches(num_envs, recurrent=self.recurrent)
        rollout_len = auto_rollout_len(num_envs, num_minibatches) if rollout_len is None else rollout_len
        for key, value in [("algo.rollout_len", rollout_len), ("algo.update_epochs", update_epochs),
                           ("algo.num_minibatches", num_minibatches), ("algo.lr", lr), ("env.num_envs", num_envs)]:
            positive(key, value)
        for key, value in [("algo.max_grad_norm", max_grad_norm), ("algo.clip_coef", clip_coef)]:
            positive(key, value)
        if target_kl is not None:  # a KL is >= 0: a threshold <= 0 would end every update after one minibatch
            positive("algo.target_kl", target_kl)
        if not 0 <= gamma <= 1 or not 0 <= gae_lambda <= 1:
            raise ConfigError(f"algo.gamma={gamma} and algo.gae_lambda={gae_lambda} must lie in [0, 1]")
        if activation not in ("tanh", "relu", "elu", "silu"):
            raise ConfigError(f"algo.activation={activation!r} is not one of: tanh, relu, elu, silu")
        batch = rollout_len * num_envs
        if batch % num_minibatches:
            raise ConfigError(f"algo.num_minibatches={num_minibatches} does not divide the batch: "
                              f"algo.rollout_len ({rollout_len}) x env.num_envs ({num_envs}) = {batch}")
        self.rollout_len = rollout_len
        self.update_epochs, self.num_minibatches = update_epochs, num_minibatches
        self.lr, self.anneal_lr = lr, anneal_lr
        self.gamma, self.gae_lambda = gamma, gae_lambda
        self.clip_coef, self.clip_vloss = clip_coef, clip_vloss
        self.ent_coef, self.vf_coef, self.max_grad_norm = ent_coef, vf_coef, max_grad_norm
        self.norm_adv, self.target_kl = norm_adv, target_kl
        if self.recurrent and num_envs % num_minibatches:
            raise ConfigError(f"algo.num_minibatches={num_minibatches}: a recurrent core splits minibatches by env, "
                              f"so it must divide env.num_envs={num_envs}; set algo.num_minibatches to a divisor")
        self.policy = build(spec, model.with_mlp(hidden_sizes, activation), "actor_critic",
                            norm_obs=norm_obs, init_log_std=init_log_std).to(device)
        # TwinMLP weights, biases, then log_std (box): the numpy update relies on this order, and both
        # paths' optimiser state (torch Adam's format) is indexed by it
        self.params = self.policy.param_list()
        # the numpy update is the numpy backend of the fused twin-MLP torso (float vectors) with a categorical
        # or Gaussian distribution; encoders, cores and other action spaces learn in torch
        nets, numpy_kind = self.policy.fused_mlp, self.policy.dist.numpy_kind
        self.numpy_update = numpy_update and device.type == "cpu" and nets is not None and numpy_kind is not None
        self.optimizer: torch.optim.Optimizer | FlatAdam
        if self.numpy_update:
            single_thread_blas()
            self.flat = FlatParams(self.params)
            self.policy.flat_params = self.flat.flat
            self.optimizer = FlatAdam(self.flat, group=adam_group(lr, 1e-5))  # make_adam's eps
            self._numpy_step = NumpyPPOStep(
                self.flat, len(nets.weights), activation=nets.activation, discrete=numpy_kind == "categorical",
                act_dim=self.policy.dist.param_dim, clip_coef=clip_coef, clip_vloss=clip_vloss, ent_coef=ent_coef,
                vf_coef=vf_coef)
        else:
            self.optimizer = make_adam(self.params, lr)
        self.reward_scaler = RewardScaler(gamma, num_envs) if norm_reward else None

    def load_state_dict(self, state: dict) -> None:
        """``ActorCriticState``'s, also for checkpoints from before the numpy path wrote torch Adam's format."""
        opt = state["optimizer"]
        if "param_groups" not in opt and "exp_avg" in opt:
            group = {k: v for k, v in self.optimizer.state_dict()["param_groups"][0].items() if k != "params"}
            state = {**state, "optimizer": adam_state_from_flat(opt, [p.shape for p in self.params], group)}
        super().load_state_dict(state)

    def learn(self, rollout: Rollout, *, progress: float) -> Metrics:
        T, N = rollout.shape
        rewards = self.reward_scaler(rollout, self.sync) if self.reward_scaler else rollout.rewards

        if self.recurrent:
            return self._learn_recurrent(rollout, rewards, progress)
        # 1. Values of every observation and every true successor.
        values, next_values = self._values(rollout)
        adv, ret = gae(rewards, values, next_values, rollout.terminated, rollout.truncated,
                       gamma=self.gamma, lam=self.gae_lambda)

        lr = self._set_lr(progress)

        # 2. Epochs of clipped-surrogate updates over shuffled minibatches (all gathered up front).
        stats: list = []
        if self.numpy_update:
            batches = self._minibatches(self._normalised_obs(rollout.obs), rollout, adv, ret, values)
            step = self._numpy_step_and_update
        else:
            obs = obs_map(lambda x: batch_layout(torch.from_numpy(x.reshape(T * N, *x.shape[2:])).to(self.device)),
                          rollout.obs)
            batches = self._minibatches(obs, rollout, adv, ret, values)
            step = self._minibatch_step
        for epoch in range(self.update_epochs):
            for k in range(epoch * self.num_minibatches, (epoch + 1) * self.num_minibatches):
                stats.append(step(*(b[k] for b in batches)))
            # the KL of the epoch's last minibatch, averaged over workers: every rank must take the same
            # decision, or the ranks still in the epoch loop would wait forever in the gradient all-reduce
            if self.target_kl is not None:
                kl = float(self.sync.mean(np.asarray([stats[-1][3]], np.float64))[0])
                if kl > self.target_kl:
                    break

        return self._finish(rollout, stats, values, ret, lr)

    def _set_lr(self, progress: float) -> float:
        lr = self.lr * max(1.0 - progress, 0.0) if self.anneal_lr else self.lr
        if isinstance(self.optimizer, FlatAdam):
            self.optimizer.lr = lr
        else:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        return lr

    def _finish(self, rollout: Rollout, stats: list, values: np.ndarray, ret: np.ndarray, lr: float) -> Metrics:
        """3. Observation statistics move after the update, so this update's ratios start at exactly 1."""
        pol = self.policy
        if pol.obs_norm.enabled:
            pol.obs_norm.update_from_moments(self.sync.sum(RunningNorm.moments(rollout.obs, len(self.spec.obs_shape))))
        s = np.stack(stats).mean(0) if self.numpy_update else torch.stack(stats).mean(0).cpu().numpy()
        y, var_y = ret.reshape(-1), float(np.var(ret))
        explained = float("nan") if var_y == 0 else 1.0 - float(np.var(y - values.reshape(-1))) / var_y
        s = self.sync.mean(np.append(s, explained))
        return {"loss/policy": float(s[0]), "loss/value": float(s[1]), "loss/entropy": float(s[2]),
                "train/approx_kl": float(s[3]), "train/clip_frac": float(s[4]),
                "train/explained_variance": float(s[5]), "train/lr": lr}

    def _values(self, rollout: Rollout) -> tuple[np.ndarray, np.ndarray]:
        """(V(obs), V(next_obs)), both [T, N]; V(next_obs) is 0 where the episode terminated (unused there).
        V(obs) is the rollout's own where acting computed it with these weights (``Rollout.values``: a torso
        shared with the critic, as CleanRL's and SB3's rollouts keep theirs); otherwise one forward over the
        observations. The successors of their own (``successor_rows``) join that forward; on the numpy path
        the critic runs in numpy (a torch forward here cost ~3 ms per update)."""
        if rollout.values is not None:  # acting ran the torch policy: its successors the same way
            return rollout.values, successor_values(self.policy, rollout, rollout.values, None, self.device)
        T, N = rollout.rewards.shape
        own = successor_rows(rollout)
        v = self._value_batch(obs_map(lambda o, n: np.concatenate([o.reshape(T * N, *o.shape[2:]), n[own]]),
                                      rollout.obs, rollout.next_obs))
        values = v[: T * N].reshape(T, N)
        return values, join_successors(values, own, v[T * N:], rollout.terminated)

    # -- recurrent cores: whole sequences from the stored start state ------------------------------------
    def _learn_recurrent(self, rollout: Rollout, rewards: np.ndarray, progress: float) -> Metrics:
        """PPO over sequences: the same epochs and losses, with minibatches of whole env columns [T, N / M]."""
        T, N = rollout.shape
        dev = self.device
        obs, start, mask_t = sequence_inputs(rollout, dev)  # [T, N, ...], each [1, N, H], [T, N]
        with torch.inference_mode():
            _, value, states = self.policy.unroll(obs, start, mask_t)
            values = value.cpu().numpy().astype(np.float32)
            next_values = successor_values(self.policy, rollout, values, states, dev)
        adv, ret = gae(rewards, values, next_values, rollout.terminated, rollout.truncated,
                       gamma=self.gamma, lam=self.gae_lambda)
        lr = self._set_lr(progress)
        act = torch.from_numpy(rollout.actions).to(dev)
        old = [torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(dev)
               for a in (rollout.log_probs, adv, ret, values)]
        width = N // self.num_minibatches
        stats: list = []
        for _ in range(self.update_epochs):
            perm = torch.randperm(N)  # torch RNG: seeded and checkpointed
            for k in range(self.num_minibatches):
                cols = perm[k * width:(k + 1) * width].to(dev)
                stats.append(self._sequence_step(obs_map(lambda x, c=cols: x[:, c], obs),
                                                 tuple(x[:, cols] for x in start), mask_t[:, cols],
                                                 act[:, cols], *(a[:, cols] for a in old)))
            if self.target_kl is not None:
                kl = float(self.sync.mean(np.asarray([stats[-1][3].item()], np.float64))[0])
                if kl > self.target_kl:
                    break
        return self._finish(rollout, stats, values, ret, lr)

    def _sequence_step(self, obs: ObsArray, start: tuple, mask: Tensor, act: Tensor, old_logp: Tensor,
                       adv: Tensor, ret: Tensor, old_val: Tensor) -> Tensor:
        """One gradient step on whole sequences: obs [T, n, ...], mask / old_logp / adv / ret / old_val [T, n],
        act [T, n] or [T, n, A]; the unroll restarts from the stored state ``start`` (each [1, n, H])."""
        out, value, _ = self.policy.unroll(obs, start, mask, keep_states=False)  # fused kernels (models/cores.py)
        B = mask.numel()
        adv = adv.reshape(B)
        if self.norm_adv and B > 1:  # one sample has no spread (SB3 skips it too)
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        act = act.reshape(B, *act.shape[2:])
        return self._surrogate_step(out.reshape(B, -1), value.reshape(B), act, old_logp.reshape(B), -adv,
                                    ret.reshape(B), old_val.reshape(B))

    def _value_batch(self, x: ObsArray) -> np.ndarray:
        """x [B, *obs_shape] raw observations (a dict of them for Dict spaces) -> V [B] float32."""
        if self.numpy_update:
            return self._numpy_step.value(self._normalised_obs(x[None])).astype(np.float32, copy=False)
        with torch.inference_mode():
            return self.policy.value(obs_map(lambda a: torch.from_numpy(a).to(self.device), x)).cpu().numpy()

    def _normalised_obs(self, obs: np.ndarray) -> np.ndarray:
        """[T, N, *obs_shape] -> [T * N, obs_dim] as the nets see it (the normaliser is fixed during an update)."""
        return self.policy.obs_norm.normalise_numpy(obs.reshape(obs.shape[0] * obs.shape[1], -1))

    def _minibatches(self, obs: np.ndarray | Tensor | dict, rollout: Rollout, adv: np.ndarray, ret: np.ndarray,
                     values: np.ndarray) -> list:
        """Every epoch's shuffled minibatches: [E * M] each of (obs, action, old log-prob, -advantage, return,
        old value), as numpy arrays (numpy update) or tensors. One gather per array per update instead of one
        per minibatch; advantages are normalised per minibatch (as CleanRL) in one vectorised op for all of
        them. The permutations come from the torch RNG (seeded, saved). On the torch path the observations
        are gathered minibatch by minibatch as the steps ask (``MinibatchRows``): all epochs' pixels at once
        would hold E copies of the rollout. A Dict observation is gathered per key: its minibatches are dicts."""
        E, M, dev = self.update_epochs, self.num_minibatches, self.device
        B = rollout.rewards.size
        idx = torch.argsort(torch.rand(E, B), dim=1).reshape(-1).numpy()  # E independent permutations
        shape = (E * M, B // M)

        def gather(x: np.ndarray | Tensor, time_major: bool = True) -> np.ndarray:
            # rollout arrays are [T, N, ...]; the observations come already flattened to [T * N, ...]
            # (deciding by x.shape[0] != B would skip the reshape when N == 1)
            x = x.reshape(B, *x.shape[2:]) if time_major else x
            return x[idx].reshape(*shape, *x.shape[1:])

        act, g_adv = gather(rollout.actions), gather(adv)
        if self.norm_adv and g_adv.shape[1] > 1:  # a one-sample minibatch has no spread (SB3 skips it too)
            g_adv = (g_adv - g_adv.mean(1, keepdims=True)) / (g_adv.std(1, ddof=1, keepdims=True) + 1e-8)
        # the surrogate uses -A (a loss to minimise); negate once here rather than in every step
        arrays = [act, gather(rollout.log_probs), (-g_adv).astype(np.float32), gather(ret), gather(values)]
        if self.numpy_update:
            return [gather(obs, False), *arrays]
        tensors = [torch.as_tensor(a).to(dev) for a in arrays]
        return [MinibatchRows(obs, torch.from_numpy(idx.reshape(shape)).to(dev)), *(t.unbind(0) for t in tensors)]

    def _numpy_step_and_update(self, *batch: np.ndarray) -> np.ndarray:
        stats = self._numpy_step(*batch)
        self.sync.grads(self.params)  # p.grad are views of the flat gradient: reduced in place
        clip_grad_norm(self.flat, self.max_grad_norm)
        self.optimizer.step()
        return stats

    def _minibatch_step(self, obs: Tensor, act: Tensor, old_logp: Tensor, neg_adv: Tensor, ret: Tensor,
                        old_val: Tensor) -> Tensor:
        """One gradient step; returns detached [pg_loss, v_loss, entropy, approx_kl, clip_frac].

        obs [mb, ...], act [mb] int64 (discrete) or [mb, A], the rest [mb]; ``neg_adv`` is -advantage,
        already normalised."""
        out, value = self.policy(obs)
        return self._surrogate_step(out, value, act, old_logp, neg_adv, ret, old_val)

    def _surrogate_step(self, out: Tensor, value: Tensor, act: Tensor, old_logp: Tensor, neg_adv: Tensor,
                        ret: Tensor, old_val: Tensor) -> Tensor:
        """The clipped surrogate, value and entropy losses for policy outputs ``out`` [mb, A] and ``value``
        [mb]; one optimiser step. Returns detached [pg_loss, v_loss, entropy, approx_kl, clip_frac]."""
        logp, entropy = self.policy.dist.log_prob_entropy(out, act)
        log_ratio = logp - old_logp
        ratio = log_ratio.exp()
        pg_loss = torch.max(neg_adv * ratio, neg_adv * ratio.clamp(1 - self.clip_coef, 1 + self.clip_coef)).mean()
        if self.clip_vloss:
            v_clipped = old_val + (value - old_val).clamp(-self.clip_coef, self.clip_coef)
            v_loss = 0.5 * torch.max((value - ret).square(), (v_clipped - ret).square()).mean()
        else:
            v_loss = 0.5 * (value - ret).square().mean()
        ent = entropy.mean()
        loss = (pg_loss + self.vf_coef * v_loss) - self.ent_coef * ent
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.sync.grads(self.params)
        nn.utils.clip_grad_norm_(self.params, self.max_grad_norm, foreach=True)
        self.optimizer.step()
        with torch.no_grad():
            # k3 estimator of KL(old || new) (Schulman, "Approximating KL divergence")
            approx_kl = ((ratio - 1) - log_ratio).mean()
            clip_frac = ((ratio - 1.0).abs() > self.clip_coef).float().mean()
            return torch.stack([pg_loss, v_loss, ent, approx_kl, clip_frac])


class MinibatchRows(Sequence):
    """Minibatch k of ``obs`` ([B, ...] tensors, or a dict of them) on demand: rows ``rows[k]`` ([E * M, mb]).
    Advanced indexing keeps a channels-last batch channels-last (``index_select`` would not)."""

    def __init__(self, obs: Tensor | dict, rows: Tensor):
        self.obs, self.rows = obs, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, k):  # type: ignore[override]
        return obs_map(lambda x: x[self.rows[k]], self.obs)
