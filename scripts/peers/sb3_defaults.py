"""One Stable-Baselines3 run at SB3's own defaults, for scripts/bench_defaults.py: ``ALGO(policy, env)`` with
nothing else set, trained for a budget, then evaluated deterministic and stochastic; prints one JSON line.

    python scripts/peers/sb3_defaults.py --algo ppo --env Taxi-v4 --steps 100000 --seed 1 --episodes 10
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gymnasium as gym
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def make_env(env: str, kwargs: dict) -> gym.Env:
    if ":" in env and env.split(":")[0] == "bench_envs":
        import bench_envs

        return getattr(bench_envs, env.split(":")[1])(**kwargs)
    return gym.make(env, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", required=True, choices=["ppo", "a2c", "dqn", "sac"])
    ap.add_argument("--env", required=True)
    ap.add_argument("--kwargs", default="{}")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--episodes", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from stable_baselines3 import A2C, DQN, PPO, SAC
    from stable_baselines3.common.evaluation import evaluate_policy

    kwargs = json.loads(args.kwargs)
    env = make_env(args.env, kwargs)
    policy = "MultiInputPolicy" if isinstance(env.observation_space, gym.spaces.Dict) else "MlpPolicy"
    model = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "sac": SAC}[args.algo](policy, env, seed=args.seed, device="cpu")
    model.learn(total_timesteps=args.steps)
    out = {}
    for mode, det in (("deterministic", True), ("stochastic", False)):
        eval_env = make_env(args.env, kwargs)
        eval_env.reset(seed=10_000 + args.seed)
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=args.episodes, deterministic=det)
        out[mode] = float(mean)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
