"""What a multi-agent env asks of the ``algo`` group, checked before anything is built.

- ``algo=ppo`` on a PettingZoo env means independent PPO: the config is rewritten to ``algo=ippo`` (same keys,
  said in one line), so the run's record, its checkpoints and ``rltrain-eval`` all build IPPO;
- an algorithm that trains one agent (A2C, IMPALA, DQN, SAC) on a multi-agent env, and IPPO / MAPPO on a
  single-agent env, are one line each;
- ``algo.self_play=true`` needs a two-player zero-sum game: a few random games are played to check it.

``agent_batch_rows`` is ``rltrain-check``'s batch arithmetic for a multi-agent env: the agents, the policy groups
they map to, each group's slots, rows and memory per update (``preflight.group_batches``, which the memory
check reads), and what ``total_env_steps`` counts.
"""

from __future__ import annotations

from typing import Any

from rltrain.data.agents import AgentsSpec
from rltrain.envs.make import EnvFactory
from rltrain.errors import ConfigError

PPO_TARGET = "rltrain.algos.ppo.PPO"
MULTIAGENT_TARGETS = ("rltrain.algos.ippo.IPPO", "rltrain.algos.mappo.MAPPO")


def check_agents(cfg: dict, env: EnvFactory) -> None:
    """Refuse (one line) or rewrite (``algo=ppo`` -> ``algo=ippo``) the ``algo`` group for ``env`` (the run's
    probed factory: ``probe_env`` found whether it is multi-agent)."""
    algo = cfg["algo"]
    target = algo.get("_target_")
    name = str(target).rpartition(".")[2].lower()
    if not env.multiagent:  # probe_env's one build found it
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
        from rltrain.trainers.matches import zero_sum_problem

        problem = zero_sum_problem(env.make, env.spec())  # type: ignore[arg-type]
        if problem:
            raise ConfigError(f"algo.self_play=true needs a two-player zero-sum game; env.id={env.id}: {problem}. "
                              "Set algo.self_play=false (a cooperative game trains all its agents together)")


def agent_batch_rows(plain: dict, trainer: Any, spec: AgentsSpec) -> list[tuple[str, str]]:
    """What one update of a multi-agent run consumes, in ``rltrain-check``'s (key, words) rows. A policy group's
    rollout has one column (*slot*) per agent per env (with self-play: the learner's seat), ``rollout_len`` rows
    each; env steps count a parallel env's joint steps or an AEC env's turns (one agent each)."""
    from rltrain.algos.ippo import group_minibatches
    from rltrain.cli.preflight import group_batches

    s = trainer.settings
    hp, size = s.algo_settings, trainer.update_size()
    T, recurrent, workers = size.rollout_len, s.model.core != "identity", trainer.replicas()
    aec = spec.api == "aec"
    acts = "one agent acts per env step (its turn)" if aec else "every live agent acts at each env step"
    rows = [("env.num_envs", f"{s.env.num_envs} whole envs, each holding every agent"),
            ("agents", f"{len(spec.agents)} ({', '.join(spec.agents)}): a {'turn-based (AEC)' if aec else 'parallel'}"
                       f" env, {acts}")]
    critic = {"env": "its critic reads env.state()", "joined": "its critic reads the agents' observations joined"}
    batches = group_batches(s, size, spec)
    said = []
    for b in batches:
        g = b.group
        extra = ([f"self-play: the other seat is a past version from a pool of {hp.self_play_pool}"]
                 if hp.self_play else []) + (["the agent's one-hot index"] if g.ids else []) + \
            ([critic[g.state]] if g.state else [])
        said.append(f"{g.name} = {', '.join(g.agents)}" + (f" ({'; '.join(extra)})" if extra else ""))
    rows.append((f"policy groups (algo.policies={hp.policies})", "; ".join(said)))
    who = "learner seat" if hp.self_play else "agents"
    ranks = f" over {workers} ranks" if workers > 1 else ""
    for b in batches:
        per_rank = b.slots // workers
        n = group_minibatches(size.num_minibatches or 1, T * per_rank, per_rank, recurrent=recurrent)
        rows.append((f"group {b.group.name} per update",
                     f"{b.slots // b.seats} envs{ranks} x {b.seats} {who} = {b.slots} slots x {T} rows "
                     f"(algo.rollout_len: rows per slot) = {b.rows} rows; {n} minibatch{'es' if n > 1 else ''} of "
                     f"{T * per_rank // n}{' per rank' if workers > 1 else ''}, {hp.update_epochs} epochs; "
                     f"{b.row_bytes} bytes per row = {b.rows * b.row_bytes / 2**20:.1f} MiB"))
    about = " (at most about: an env stops at its first slot with its rows, the others padded)" if aec else ""
    rows.append(("env steps per update", f"{size.text} = {size.env_steps}{about}"))
    total = int(plain["total_env_steps"])
    rows.append(("updates", size.updates_text(total)))
    rows.append(("total_env_steps counts", "env steps over all envs and workers: " +
                 ("an AEC env step is one agent's turn" if aec else "a parallel env step is one joint step of all "
                  "its live agents") + " (skrl and BenchMARL count frames the same way)"))
    return rows
