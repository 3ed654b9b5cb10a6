"""One RLlib run at RLlib's own defaults, for scripts/bench_defaults.py: ``IMPALAConfig()`` (or another algorithm's
config) with only the env, the seed and, with ``--lstm``, its default LSTM set; trained for a budget of env steps,
then evaluated deterministic and stochastic; prints one JSON line. Needs ``pip install "ray[rllib]"`` (not an
rltrain dependency).

    python scripts/peers/rllib_defaults.py --algo impala --env bench_envs:CueRecall --steps 200000 --seed 1 --lstm

RLlib runs on a private local Ray instance that this process starts and shuts down (``address="local"``), with
its default number of env runner processes (2 for IMPALA); their CPU is the caller's, as rltrain's actors' is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def make_env(env: str, kwargs: dict) -> gym.Env:
    """The task as RLlib's default model takes it: a Discrete or Dict observation flattened into one float vector
    (one-hot; keys concatenated), as gymnasium's FlattenObservation does (RLlib's default encoders read Box only),
    in float32."""
    if ":" in env and env.split(":")[0] == "bench_envs":
        import bench_envs

        made = getattr(bench_envs, env.split(":")[1])(**kwargs)
    else:
        made = gym.make(env, **kwargs)
    if not isinstance(made.observation_space, gym.spaces.Box):
        made = gym.wrappers.FlattenObservation(made)
    if made.observation_space.dtype != np.float32:  # a one-hot of a Discrete flattens to int64: RLlib's MLP reads
        made = gym.wrappers.DtypeObservation(made, np.float32)  # float32 only (values kept, not rescaled)
    return made


def evaluate(module, env: gym.Env, episodes: int, *, explore: bool, seed: int) -> float:
    """The mean return of ``episodes`` episodes acted by ``module``: greedy (the logits' argmax) or sampled, with the
    LSTM state carried step to step and zeroed at each episode's start."""
    import torch
    from ray.rllib.core.columns import Columns

    stateful = module.is_stateful()
    gen = torch.Generator().manual_seed(seed)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        state = module.get_initial_state() if stateful else None
        total, done = 0.0, False
        while not done:
            x = torch.as_tensor(obs, dtype=torch.float32)[None]
            batch = {Columns.OBS: x[:, None] if stateful else x}  # [B, T, ...] for a stateful module
            if stateful:
                batch[Columns.STATE_IN] = torch.utils._pytree.tree_map(lambda t: t[None], state)
            with torch.no_grad():
                out = module.forward_inference(batch)
            logits = out[Columns.ACTION_DIST_INPUTS].reshape(-1)
            if explore:
                action = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            else:
                action = int(logits.argmax())
            if stateful:
                state = torch.utils._pytree.tree_map(lambda t: t[0], out[Columns.STATE_OUT])
            obs, reward, term, trunc, _ = env.step(action)
            total += float(reward)
            done = term or trunc
        returns.append(total)
    return sum(returns) / len(returns)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", required=True, choices=["impala", "appo", "ppo"])
    ap.add_argument("--env", required=True)
    ap.add_argument("--kwargs", default="{}")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--lstm", action="store_true", help="RLlib's default model with its LSTM (use_lstm=True)")
    args = ap.parse_args()
    import ray
    import torch
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.tune.registry import register_env

    torch.set_num_threads(1)
    kwargs = json.loads(args.kwargs)
    register_env("bench", lambda _: make_env(args.env, kwargs))
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    code = 1
    try:
        config = {"impala": IMPALAConfig, "appo": APPOConfig, "ppo": PPOConfig}[args.algo]()
        config = config.environment("bench").debugging(seed=args.seed)
        if args.lstm:
            config = config.rl_module(model_config=DefaultModelConfig(use_lstm=True))
        algo = config.build_algo()
        steps = 0
        while steps < args.steps:
            steps = int(algo.train()["num_env_steps_sampled_lifetime"])
        module, env = algo.get_module(), make_env(args.env, kwargs)
        out = {"deterministic": evaluate(module, env, args.episodes, explore=False, seed=10_000 + args.seed),
               "stochastic": evaluate(module, env, args.episodes, explore=True, seed=10_000 + args.seed),
               "env_steps": steps}
        print(json.dumps(out), flush=True)
        algo.stop()
        code = 0
    except BaseException:
        traceback.print_exc()
    ray.shutdown()
    # RLlib's learner group reconnects to Ray from its __del__ at interpreter exit and waits there for a GCS that is
    # gone: leave without running finalizers (both streams flushed)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
