"""What a multi-agent env asks of the ``algo`` group, checked before anything is built.

- ``algo=ppo`` on a PettingZoo env means independent PPO: the config is rewritten to ``algo=ippo`` (same keys,
  said in one line), so the run's record, its checkpoints and ``rltrain-eval`` all build IPPO;
- an algorithm that trains one agent (A2C, IMPALA, DQN, SAC) on a multi-agent env, and IPPO / MAPPO on a
  single-agent env, are one line each;
- ``algo.self_play=true`` needs a two-player zero-sum game: a few random games are played to check it.
"""

from __future__ import annotations

from rltrain.envs.make import EnvFactory, probed_env
from rltrain.envs.multiagent import is_multiagent
from rltrain.errors import ConfigError

PPO_TARGET = "rltrain.algos.ppo.PPO"
MULTIAGENT_TARGETS = ("rltrain.algos.ippo.IPPO", "rltrain.algos.mappo.MAPPO")


def check_agents(cfg: dict, env: EnvFactory) -> None:
    """Refuse (one line) or rewrite (``algo=ppo`` -> ``algo=ippo``) the ``algo`` group for ``env``."""
    algo = cfg["algo"]
    target = algo.get("_target_")
    name = str(target).rpartition(".")[2].lower()
    with probed_env(env) as built:  # a factory that raises is one line naming the env (probe_env's)
        multiagent = is_multiagent(built)
    if not multiagent:
        if target in MULTIAGENT_TARGETS:
            raise ConfigError(f"algo={name} trains the agents of a PettingZoo multi-agent env; env.id={env.id} is a "
                              "single-agent Gymnasium env: use algo=ppo")
        return
    if env.vectorization != "sync":
        raise ConfigError(f"env.vectorization={env.vectorization}: a multi-agent env is stepped in the process that "
                          "collects (trainer=subprocess_actors steps envs in other processes); set "
                          "env.vectorization=sync")
    if (cfg.get("eval") or {}).get("video"):
        raise ConfigError(f"eval.video=true records a single-agent env's episodes; env.id={env.id} is a PettingZoo "
                          "multi-agent env: set eval.video=false")
    if target == PPO_TARGET:
        algo["_target_"] = MULTIAGENT_TARGETS[0]
        print(f"[rltrain] env.id={env.id} is a multi-agent env: algo=ppo trains it as independent PPO, one per "
              "policy group (algo=ippo; algo=mappo adds a centralised critic)", flush=True)
    elif target not in MULTIAGENT_TARGETS:
        raise ConfigError(f"algo={name} trains one agent, but env.id={env.id} is a PettingZoo multi-agent env: use "
                          "algo=ippo or algo=mappo (algo=ppo means ippo there)")
    if algo.get("self_play"):
        from rltrain.envs.multiagent import zero_sum_problem

        problem = zero_sum_problem(env.make, env.spec())  # type: ignore[arg-type]
        if problem:
            raise ConfigError(f"algo.self_play=true needs a two-player zero-sum game; env.id={env.id}: {problem}. "
                              "Set algo.self_play=false (a cooperative game trains all its agents together)")
