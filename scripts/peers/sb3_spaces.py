"""Stable-Baselines3 PPO / sb3-contrib MaskablePPO at their defaults on masked, MultiDiscrete,
MultiBinary and Tuple spaces, for
``scripts/bench_spaces.py``. Runs under a Python that has ``stable-baselines3`` and ``sb3-contrib`` (neither
is an rltrain dependency), with the repository on PYTHONPATH (the envs are ``tests/helpers/space_envs.py``'s):

    python scripts/peers/sb3_spaces.py multidiscrete SEED STEPS EPISODES   # PPO("MlpPolicy") defaults
    python scripts/peers/sb3_spaces.py masked SEED STEPS EPISODES          # MaskablePPO defaults (action_masks())
    python scripts/peers/sb3_spaces.py blackjack SEED STEPS EPISODES       # PPO defaults; SB3 refuses Tuple
                                                                           # observations: FlattenObservation

The envs as ``bench_spaces.py`` gives them to rltrain: MultiDiscreteEnv(nvec=[4, 4, 4, 4]), MaskedEnv(n=12).
Prints one JSON line: the mean return of EPISODES deterministic evaluation episodes after training, and the
mean return of the last 100 training episodes.
"""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import torch


def main(kind: str, seed: int, steps: int, episodes: int) -> dict:
    torch.set_num_threads(1)
    from tests.helpers.space_envs import MaskedEnv, MultiDiscreteEnv

    if kind == "masked":
        from sb3_contrib import MaskablePPO
        from sb3_contrib.common.maskable.evaluation import evaluate_policy

        model = MaskablePPO("MlpPolicy", MaskedEnv(n=12, source="method"), seed=seed, device="cpu")
        model.learn(steps)
        mean, _ = evaluate_policy(model, MaskedEnv(n=12, source="method"), n_eval_episodes=episodes,
                                  deterministic=True)
        return {"return": float(mean), "train": _train_return(model)}
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy

    make = (lambda: MultiDiscreteEnv(nvec=(4, 4, 4, 4))) if kind == "multidiscrete" else \
        (lambda: gym.wrappers.FlattenObservation(gym.make("Blackjack-v1")))
    model = PPO("MlpPolicy", make(), seed=seed, device="cpu")
    model.learn(steps)
    mean, _ = evaluate_policy(model, make(), n_eval_episodes=episodes, deterministic=True)
    return {"return": float(mean), "train": _train_return(model)}


def _train_return(model) -> float:
    """SB3 keeps the last 100 training episodes (stats_window_size) in ep_info_buffer."""
    buf = model.ep_info_buffer
    return float(sum(e["r"] for e in buf) / len(buf)) if buf else float("nan")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
