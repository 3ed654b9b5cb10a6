"""skrl's IPPO / MAPPO on a PettingZoo env, as a skrl user writes it (run by scripts/bench_multiagent.py with the
peers' python): ``python skrl_multiagent.py --env spread|c4 --algo ippo|mappo --steps N --seed S --out F``.

skrl's PettingZoo wrapper takes the Parallel API and one env: connect four (an AEC game) goes through
PettingZoo's ``turn_based_aec_to_parallel``; skrl has no action masking and no self-play, so its two players
learn against each other, each from its own seat. Networks: 64x64 tanh MLPs for policy and value (rltrain's
generic width); the algorithms' settings are skrl's defaults. The evaluation is the bench's own (the same for
every tool): 10 deterministic episodes from seeds 1000..1009; on connect four each player's policy against
uniformly random legal moves, seats alternating, its argmax taken over the legal moves.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from torch import nn

EPISODES = 10


def make_env(name: str):
    if name == "spread":
        from mpe2 import simple_spread_v3

        return simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)
    from pettingzoo.classic import connect_four_v3
    from pettingzoo.utils.conversions import turn_based_aec_to_parallel

    return JoinedState(turn_based_aec_to_parallel(connect_four_v3.env()))


class JoinedState:
    """Connect four has no ``state()``, which skrl's agents ask of every env every step: the players'
    observations joined (what rltrain's MAPPO falls back to)."""

    def __init__(self, env):
        import gymnasium

        self.env = env
        size = sum(int(np.prod(s.shape)) for s in env.observation_space(env.possible_agents[0]).spaces.values())
        self.state_space = gymnasium.spaces.Box(0, 1, (2 * size,), np.float32)

    @property
    def unwrapped(self):
        # skrl's wrapper reads the state space from ``env.unwrapped``: forwarding it (as __getattr__ would) hands
        # skrl the bare connect-four env, which has none, and its MAPPO value network then gets no state at all
        return self

    def __getattr__(self, name):
        return getattr(self.env, name)

    def state(self):
        aec = self.env.aec_env
        parts = [np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in aec.observe(a).values()])
                 for a in aec.possible_agents]
        return np.concatenate(parts)


def models(env, algo: str, device):
    from skrl.models.torch import CategoricalMixin, DeterministicMixin, Model

    class Policy(CategoricalMixin, Model):
        def __init__(self, observation_space, action_space):
            Model.__init__(self, observation_space=observation_space, action_space=action_space, device=device)
            CategoricalMixin.__init__(self, unnormalized_log_prob=True)
            self.net = nn.Sequential(nn.Linear(self.num_observations, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                                     nn.Linear(64, self.num_actions))

        def compute(self, inputs, role=""):
            return self.net(inputs["observations"]), {}

    class Value(DeterministicMixin, Model):
        def __init__(self, observation_space, state_space, action_space):
            Model.__init__(self, observation_space=observation_space, state_space=state_space,
                           action_space=action_space, device=device)
            DeterministicMixin.__init__(self)
            width = self.num_states if algo == "mappo" else self.num_observations
            self.key = "states" if algo == "mappo" else "observations"
            self.net = nn.Sequential(nn.Linear(width, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))

        def compute(self, inputs, role=""):
            return self.net(inputs[self.key]), {}

    return {a: {"policy": Policy(env.observation_spaces[a], env.action_spaces[a]),
                "value": Value(env.observation_spaces[a], env.state_spaces[a], env.action_spaces[a])}
            for a in env.possible_agents}


def evaluate(name: str, policies: dict, seed: int = 1000) -> dict:
    """The bench's evaluation: MPE: the mean over agents of each agent's return; connect four: each player's
    policy against random legal moves in its own seat, alternating, with win / draw / loss."""
    rng = np.random.default_rng(seed)
    if name == "spread":
        env = make_env(name)
        totals = []
        for e in range(EPISODES):
            obs, _ = env.reset(seed=seed + e)
            ret = dict.fromkeys(env.possible_agents, 0.0)
            while env.agents:
                actions = {a: int(policies[a](torch.as_tensor(obs[a], dtype=torch.float32)[None]).argmax())
                           for a in env.agents}
                obs, rew, _, _, _ = env.step(actions)
                for a, r in rew.items():
                    ret[a] += r
            totals.append(np.mean(list(ret.values())))
        return {"return": float(np.mean(totals))}
    from pettingzoo.classic import connect_four_v3

    env = connect_four_v3.env()
    results = []
    for e in range(EPISODES):
        env.reset(seed=seed + e)
        learner, ret = env.possible_agents[e % 2], 0.0
        for agent in env.agent_iter():
            obs, reward, term, trunc, _ = env.last()
            ret += reward if agent == learner else 0.0
            if term or trunc:
                env.step(None)
                continue
            legal = np.flatnonzero(obs["action_mask"])
            if agent == learner:
                flat = np.concatenate([np.asarray(obs["action_mask"], np.float32),
                                       np.asarray(obs["observation"], np.float32).reshape(-1)])
                logits = policies[agent](torch.as_tensor(flat)[None])[0].detach().numpy()
                env.step(int(legal[np.argmax(logits[legal])]))
            else:
                env.step(int(rng.choice(legal)))
        results.append(ret)
    r = np.array(results, float)
    return {"return": float(r.mean()), "win": float((r > 0).mean()), "draw": float((r == 0).mean()),
            "loss": float((r < 0).mean())}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--env", choices=("spread", "c4"), required=True)
    p.add_argument("--algo", choices=("ippo", "mappo"), required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    from skrl.envs.wrappers.torch import wrap_env
    from skrl.memories.torch import RandomMemory
    from skrl.trainers.torch import SequentialTrainer
    from skrl.utils import set_seed

    set_seed(args.seed)
    device = torch.device("cpu")
    env = wrap_env(make_env(args.env), wrapper="pettingzoo", verbose=False)
    nets = models(env, args.algo, device)
    if args.algo == "ippo":
        from skrl.multi_agents.torch.ippo import IPPO as Algo
        from skrl.multi_agents.torch.ippo import IPPO_CFG as Cfg
    else:
        from skrl.multi_agents.torch.mappo import MAPPO as Algo
        from skrl.multi_agents.torch.mappo import MAPPO_CFG as Cfg
    cfg = Cfg()
    cfg.experiment.write_interval = 0
    cfg.experiment.checkpoint_interval = 0
    for field in ("learning_rate_scheduler_kwargs", "observation_preprocessor_kwargs", "state_preprocessor_kwargs",
                  "value_preprocessor_kwargs"):  # skrl 2.1 refuses its own default {} unless keyed by agent
        if getattr(cfg, field, None) == {}:
            setattr(cfg, field, {a: {} for a in env.possible_agents})
    memories = {a: RandomMemory(memory_size=cfg.rollouts, num_envs=env.num_envs, device=device)
                for a in env.possible_agents}
    kwargs = {"state_spaces": env.state_spaces}
    agent = Algo(possible_agents=env.possible_agents, models=nets, memories=memories,
                 observation_spaces=env.observation_spaces, action_spaces=env.action_spaces, device=device, cfg=cfg,
                 **kwargs)
    SequentialTrainer(env=env, agents=agent, cfg={"timesteps": args.steps, "headless": True,
                                                  "disable_progressbar": True}).train()
    policies = {a: nets[a]["policy"].net.eval() for a in env.possible_agents}
    with torch.no_grad():
        result = evaluate(args.env, policies)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
