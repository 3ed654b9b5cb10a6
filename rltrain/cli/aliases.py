"""An unknown key in one line: the closest real key, or the rltrain key behind another library's name for it.

Settings carry over from Stable-Baselines3 (SB3: its algorithms' constructor arguments, ``learn()``'s
``total_timesteps``, ``policy_kwargs``), CleanRL (its scripts' ``Args``), rl-baselines3-zoo (its hyper-parameter
files) and torchbeast (IMPALA's flags), so a user types their names: ``algo.target_update_interval=1000``
is SB3's name for ``algo.target_network_frequency``. ``unknown_key`` says so, for every algorithm, whether the
key reached Hydra (``algo.x=1``: "not in struct", cli/train.py) or the schema check (``+algo.x=1``: cli/build.py)
- the same line either way, and never "add it with +" inside a typed group (the key would only be refused
next). Only a free-form mapping (``env.kwargs``, ``model.key_encoders``, ``trainer.ray.actor_resources``)
takes new keys, with ``+``.
"""

from __future__ import annotations

import functools

from rltrain.errors import close_matches

# other library's name -> (rltrain's key, or None where rltrain has no counterpart; whose name; a note)
Alias = tuple[str | None, str, str]

COMMON: dict[str, Alias] = {
    "total_timesteps": ("total_env_steps", "SB3 learn() / CleanRL", ""),
    "n_timesteps": ("total_env_steps", "rl-baselines3-zoo", ""),
    "total_steps": ("total_env_steps", "torchbeast", ""),
    "n_envs": ("env.num_envs", "rl-baselines3-zoo", ""),
    "num_envs": ("env.num_envs", "CleanRL", ""),
    "env_id": ("env.id", "CleanRL", ""),
    "seed": ("seed", "SB3 / CleanRL", ""),
    "device": ("device", "SB3", ""),
    "cuda": ("device", "CleanRL", " (device=cuda or device=cpu)"),
    "capture_video": ("eval.video", "CleanRL", ""),
    "track": (None, "CleanRL", ": choose logger=wandb"),
    "wandb_project_name": ("logger.project", "CleanRL", " with logger=wandb"),
    "wandb_entity": ("logger.entity", "CleanRL", " with logger=wandb"),
    "tensorboard_log": ("logger.sinks", "SB3", " (TensorBoard is on by default, in <run dir>/tensorboard)"),
    "verbose": ("logger.progress", "SB3", ""),
    "hidden_sizes": ("model.hidden_sizes", "rltrain", "the MLP width"),  # algo.hidden_sizes until rltrain 0.2
    "activation": ("model.activation", "rltrain", "the MLP activation"),
    "net_arch": ("model.hidden_sizes", "SB3 policy_kwargs", ""),
    "activation_fn": ("model.activation", "SB3 policy_kwargs", " (tanh, relu, elu, silu)"),
    "policy_kwargs": ("model.hidden_sizes", "SB3", " (and model.activation, model.shared)"),
    "normalize": ("algo.norm_obs", "rl-baselines3-zoo", " (and algo.norm_reward)"),
    "n_eval_episodes": ("eval.episodes", "SB3 / rl-baselines3-zoo", ""),
    "eval_freq": ("eval.every_env_steps", "SB3 EvalCallback", " (in env steps over all envs)"),
}

_LR = ("algo.lr", "SB3 / CleanRL", "")
# SB3's off-policy learners take n_steps for n-step returns, which only the DQN family has here
_NO_NSTEP = (None, "SB3", ": n-step returns are algo.n_step of algo=dqn and algo=rainbow")
PER_ALGO: dict[str, dict[str, Alias]] = {
    "ppo": {
        "learning_rate": _LR,
        "n_steps": ("algo.rollout_len", "SB3", " (steps per env per update)"),
        "num_steps": ("algo.rollout_len", "CleanRL", ""),
        "batch_size": ("algo.num_minibatches", "SB3", ": SB3 sets the minibatch size, rltrain the number of "
                       "minibatches (rollout_len x num_envs / batch_size)"),
        "n_epochs": ("algo.update_epochs", "SB3", ""),
        "clip_range": ("algo.clip_coef", "SB3", ""),
        "clip_range_vf": ("algo.clip_vloss", "SB3", " (true clips the value loss at algo.clip_coef)"),
        "normalize_advantage": ("algo.norm_adv", "SB3", ""),
        "use_sde": (None, "SB3", ": generalized state-dependent exploration is not implemented"),
        "log_std_init": ("algo.init_log_std", "SB3 policy_kwargs", ""),
    },
    "a2c": {
        "learning_rate": ("algo.lr", "SB3", ""),
        "n_steps": ("algo.rollout_len", "SB3", ""),
        "use_rms_prop": ("algo.optimizer", "SB3", " (rmsprop | adam)"),
        "rms_prop_eps": ("algo.optimizer_eps", "SB3", ""),
        "normalize_advantage": ("algo.norm_adv", "SB3", ""),
        "use_sde": (None, "SB3", ": generalized state-dependent exploration is not implemented"),
        "log_std_init": ("algo.init_log_std", "SB3 policy_kwargs", ""),
    },
    "dqn": {
        "learning_rate": _LR,
        "target_update_interval": ("algo.target_network_frequency", "SB3", " (in env steps)"),
        "train_freq": ("algo.train_frequency", "SB3", ""),
        "exploration_initial_eps": ("algo.start_e", "SB3", ""),
        "exploration_final_eps": ("algo.end_e", "SB3", ""),
        "optimize_memory_usage": ("algo.frame_stack", "SB3", " (frame stacks are stored once per frame on their "
                                  "own; 0 turns it off)"),
        "n_steps": ("algo.n_step", "SB3", " (n-step returns)"),  # not PPO's rollout length on a Q-learner
        "categorical": ("algo.distributional", "categorical DQN (C51)", "=c51"),
    },
    "pqn": {
        "learning_rate": _LR,
        "num_steps": ("algo.rollout_len", "CleanRL", ""),
    },
    "sac": {
        "learning_rate": ("algo.policy_lr", "SB3", " (and algo.q_lr: one per network)"),
        "train_freq": ("algo.train_frequency", "SB3", ""),
        "ent_coef": ("algo.alpha", "SB3", " (ent_coef=auto is algo.autotune=true, starting at algo.alpha)"),
        "target_entropy": ("algo.target_entropy_scale", "SB3", " (target entropy = -scale x dim(A))"),
        "target_update_interval": (None, "SB3", ": the target critics move after every critic step, at algo.tau"),
        "target_network_frequency": (None, "CleanRL", ": the target critics move after every critic step, at "
                                     "algo.tau"),
        "policy_delay": ("algo.policy_frequency", "SB3 TD3", ""),
        "n_steps": _NO_NSTEP,
        "use_sde": (None, "SB3", ": generalized state-dependent exploration is not implemented"),
    },
    "impala": {
        "learning_rate": ("algo.lr", "torchbeast", ""),
        "unroll_length": ("algo.rollout_len", "torchbeast", ""),
        "entropy_cost": ("algo.ent_coef", "torchbeast", ""),
        "baseline_cost": ("algo.vf_coef", "torchbeast", ""),
        "discounting": ("algo.gamma", "torchbeast", ""),
        "grad_norm_clipping": ("algo.max_grad_norm", "torchbeast", ""),
        "epsilon": ("algo.optimizer_eps", "torchbeast", ""),
        "batch_size": ("trainer.batch_rollouts", "torchbeast", " (with trainer=subprocess_actors)"),
        "num_actors": ("trainer.num_actors", "torchbeast", " (with trainer=subprocess_actors)"),
        "reward_clipping": ("env.wrappers", "torchbeast", " (e.g. env.wrappers=[SignReward])"),
    },
}


PER_ALGO["ippo"] = PER_ALGO["mappo"] = PER_ALGO["ppo"]  # PPO's settings, one learner per policy group

# hindsight replay (every off-policy learner): SB3's HerReplayBuffer arguments
HER: dict[str, Alias] = {
    "replay_buffer_class": ("algo.her", "SB3", " (algo.her=true relabels with hindsight goals: HerReplayBuffer)"),
    "n_sampled_goal": ("algo.her_k", "SB3 HerReplayBuffer", ""),
    "goal_selection_strategy": (None, "SB3 HerReplayBuffer", ": the future strategy is the one implemented"),
}
PER_ALGO["td3"] = {
    "learning_rate": _LR,
    "train_freq": ("algo.train_frequency", "SB3", ""),
    "action_noise": ("algo.exploration_noise", "SB3", " (NormalActionNoise's sigma, in half action ranges)"),
    "noise_std": ("algo.exploration_noise", "rl-baselines3-zoo", ""),
    "policy_noise": ("algo.target_policy_noise", "CleanRL", ""),
    "noise_clip": ("algo.target_noise_clip", "CleanRL", ""),
    "policy_frequency": ("algo.policy_delay", "CleanRL", ""),
    "n_critics": (None, "SB3", ": algo=td3 has two critics, algo=ddpg one"),
    "n_steps": _NO_NSTEP,
}
PER_ALGO["ddpg"] = {k: v for k, v in PER_ALGO["td3"].items() if k in ("learning_rate", "train_freq", "action_noise",
                                                                       "noise_std", "n_steps")}
for _name in ("dqn", "sac", "td3", "ddpg"):
    PER_ALGO[_name].update(HER)
PER_ALGO["rainbow"] = PER_ALGO["dqn"]  # DQN's settings with Rainbow's defaults

# the algorithms a user of one most likely borrowed a name from, nearest first: a DDPG user's policy_delay is
# TD3's, not SAC's; the rest follow in the order the tables list them
FAMILIES = (("ddpg", "td3", "sac"), ("dqn", "rainbow", "pqn"), ("ppo", "a2c", "impala", "ippo", "mappo"))


def alias(key: str, algo: str | None) -> Alias | None:
    """What another library's ``key`` is called here (``algo``: the run's algorithm, or None)."""
    return PER_ALGO.get(algo or "", {}).get(key) or COMMON.get(key)


def unknown_key(path: str, valid: list[str], *, algo: str | None = None) -> str:
    """One line for an unknown key ``path`` (``algo.n_steps``, ``total_timesteps``) of a group whose keys are
    ``valid``: another library's name for a key of this algorithm (or of every one), else the algorithm nearest
    to ``algo`` that has the key or a key by that name, else the closest keys."""
    group, _, key = path.rpartition(".")
    listing = f"(valid: {', '.join(valid)})" if group else f"(top-level keys: {', '.join(valid)})"
    if not valid:
        listing = f"({group} takes no keys here)"
    found = alias(key, algo if group == "algo" else None)
    if found is None and group == "algo":
        elsewhere = _elsewhere(key, algo, valid)
        close = close_matches(key, valid)
        if elsewhere is not None and close and " is a key of " in elsewhere:  # this algorithm's keys first
            return f"{path}: unknown key{close} ({elsewhere})"
        if elsewhere is not None:
            return f"{path}: unknown key; {elsewhere}"
    if found is not None:
        target, source, note = found
        if target is None:
            return f"{path}: unknown key; {source}'s {key} has no counterpart here{note}"
        if source == "rltrain":  # a key rltrain itself moved
            return f"{path}: unknown key; {note} is {target}, one setting for every algorithm"
        if target != path:
            return f"{path}: unknown key; {_names(key, found, 'here')}"
    return f"{path}: unknown key{close_matches(key, valid)} {listing}"


def _names(key: str, found: Alias, where: str) -> str:
    """``found`` in words: another library's name (``SB3's n_steps is algo.n_step here``) or a method's
    (``categorical DQN (C51) is algo.distributional=c51 here``: its note is the value to set)."""
    target, source, note = found
    if note.startswith("="):
        return f"{source} is {target}{note} {where}"
    return f"{source}'s {key} is {target} {where}{note}"


def _elsewhere(key: str, algo: str | None, valid: list[str]) -> str | None:
    """The nearest other algorithm's word on ``key``: its own key of that name, or its alias (said as ``here``
    when the alias's target is a key of this algorithm too); None: no algorithm has either."""
    order = _nearest(algo)
    keys = _algo_keys()
    for name in order:
        if key in keys.get(name, ()):
            holders = [n for n in order if key in keys.get(n, ())]
            named = ", ".join(f"algo={n}" for n in holders[:3]) + (", ..." if len(holders) > 3 else "")
            return f"{key} is a key of {named}, not of algo={algo}" if algo else f"{key} is a key of {named}"
        found = PER_ALGO.get(name, {}).get(key)
        if found is not None and found[0] is not None:
            here = found[0].removeprefix("algo.") in valid
            return _names(key, found, "here" if here else f"of algo={name}")
    return None


def _nearest(algo: str | None) -> list[str]:
    """Every other algorithm, those of ``algo``'s family first (``FAMILIES``)."""
    family = next((f for f in FAMILIES if algo in f), ())
    return [n for n in dict.fromkeys([*family, *PER_ALGO, *_algo_keys()]) if n != algo]


@functools.cache
def _algo_keys() -> dict[str, tuple[str, ...]]:
    """Each algorithm's keys, as the schema reads them from its settings class (no module imported)."""
    from rltrain.cli import schema

    return {name: tuple(schema.defaults(*info["settings"])) for name, info in schema.options("algos").items()}


def free_form_key(path: str) -> str:
    """One line for a new key inside a free-form mapping (``env.kwargs.size``): it takes new keys with ``+``."""
    parent, _, key = path.rpartition(".")
    return f"{path}: {parent} has no key {key!r} yet; it is a free-form mapping: add one with +{path}=..."
