"""BenchMARL's MAPPO on MPE simple_spread, as a BenchMARL user writes it (run by scripts/bench_multiagent.py with
``--benchmarl-python``): ``python benchmarl_mappo.py --steps N --seed S --out F``.

BenchMARL installs into a venv of its own: ``pip install benchmarl`` (1.5.2) requires ``torchvision`` unpinned,
pip picks torchvision 0.29.1, which pins torch 2.14.1, and so replaces the peers' torch 2.13.0+cpu with 2.14.1 and
its CUDA 13 wheels (cuda-toolkit, nvidia-*, triton). Pinning torchvision to 0.28 (torch 2.13's) keeps the CPU torch.
What works (BenchMARL 1.5.2, TorchRL 0.11.1, TensorDict 0.11.0 on torch 2.13 CPU)::

    python3 -m venv /tmp/benchmarl-venv && /tmp/benchmarl-venv/bin/pip install torch==2.13.0 "torchvision<0.29" \
        "av<14" hydra-core tqdm cloudpickle pyvers importlib_metadata orjson pettingzoo mpe2
    /tmp/benchmarl-venv/bin/pip install --no-deps benchmarl==1.5.2 torchrl==0.11.1 tensordict==0.11.0

TorchRL's PettingZoo env finds the MPE games under ``pettingzoo.mpe``, which PettingZoo 1.25+ replaced by an
ImportError pointing to the ``mpe2`` package: the task's env factory is swapped for TorchRL's ``PettingZooWrapper``
around ``mpe2.simple_spread_v3`` with the arguments BenchMARL would pass (categorical actions, the global state),
with discrete actions as the other tools have them (``prefer_continuous_actions=False``).
Everything else is BenchMARL's defaults (its MAPPO and MLP yaml, its experiment yaml: 6,000 frames per batch over
10 envs, 45 minibatch iterations of 400), on CPU, with no loggers, no evaluation during training and no checkpoints.
A frame is one joint env step, as an env step is for rltrain and skrl; the collector rounds the budget up to a whole
batch, so the frames run are written to the result. The evaluation is the bench's own (scripts/peers/
skrl_multiagent.py's): 10 deterministic episodes from seeds 1000..1009, the mean over agents of each agent's return.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

EPISODES = 10
ENV_KWARGS = {"N": 3, "max_cycles": 25, "continuous_actions": False}


def mpe2_env(*, task, categorical_actions, device, seed, parallel, return_state, render_mode, **config):
    """What BenchMARL's PettingZoo task builds, from the mpe2 package (``task`` is simple_spread's name)."""
    from mpe2 import simple_spread_v3
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper

    return PettingZooWrapper(env=simple_spread_v3.parallel_env(**config), categorical_actions=categorical_actions,
                             device=device, seed=seed, return_state=return_state, use_mask=False)


def evaluate(experiment, seed: int = 1000) -> float:
    """The mean over agents of each agent's return, 10 episodes, the policy's most likely actions."""
    from mpe2 import simple_spread_v3
    from tensordict import TensorDict
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    (group, agents), = experiment.group_map.items()
    env = simple_spread_v3.parallel_env(**ENV_KWARGS)
    totals = []
    for e in range(EPISODES):
        obs, _ = env.reset(seed=seed + e)
        ret = dict.fromkeys(env.possible_agents, 0.0)
        while env.agents:
            inner = TensorDict({"observation": torch.as_tensor(np.stack([obs[a] for a in agents]))},
                               batch_size=[len(agents)])
            with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
                out = experiment.policy(TensorDict({group: inner}, batch_size=[]))
            picked = out[group, "action"].reshape(len(agents), -1)
            obs, rew, _, _, _ = env.step({a: int(picked[k].argmax() if picked.shape[1] > 1 else picked[k, 0])
                                          for k, a in enumerate(agents)})
            for a, r in rew.items():
                ret[a] += r
        totals.append(np.mean(list(ret.values())))
    return float(np.mean(totals))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--save-folder", required=True, help="BenchMARL's run folder (its experiment writes one)")
    args = p.parse_args()
    torch.set_num_threads(1)
    import benchmarl.environments.pettingzoo.common as pettingzoo_tasks
    from benchmarl.algorithms import MappoConfig
    from benchmarl.environments import PettingZooTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    pettingzoo_tasks.PettingZooEnv = mpe2_env
    task = PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
    task.config.update({k: v for k, v in ENV_KWARGS.items() if k != "continuous_actions"})
    config = ExperimentConfig.get_from_yaml()
    config.sampling_device = config.train_device = config.buffer_device = "cpu"
    config.prefer_continuous_actions = False
    config.max_n_frames = args.steps
    config.loggers = []
    config.evaluation = False
    config.render = False
    config.create_json = False
    config.checkpoint_interval = 0
    config.save_folder = args.save_folder
    experiment = Experiment(task=task, algorithm_config=MappoConfig.get_from_yaml(),
                            model_config=MlpConfig.get_from_yaml(), critic_model_config=MlpConfig.get_from_yaml(),
                            seed=args.seed, config=config)
    experiment.run()
    with open(args.out, "w") as f:
        json.dump({"return": evaluate(experiment), "steps_run": int(experiment.total_frames)}, f)


if __name__ == "__main__":
    main()
