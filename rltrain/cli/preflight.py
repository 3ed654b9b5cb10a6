"""Pre-flight checks that need the built trainer and one real env, run by ``rltrain`` and ``rltrain-check`` alike.

Each refuses a run that would train nothing, train silently more than asked, hang while memory grows, or fail
later with a traceback, and says so in one line with the arithmetic:

- the budget: ``total_env_steps`` below one update (the loop would round it up), and an off-policy budget at
  or below ``learning_starts``, or too short to fill one batch or to reach the first round of updates after it,
  or a replay too small to hold one (no gradient step would ever be taken); a warning where a scheduled target
  network (DQN's) would take no trained weights before the run's last round;
- the size: one update's rollout (env steps per update x bytes per step; a multi-agent env's: each policy
  group's rows x bytes per row, ``group_batches``) larger than the available memory,
  more envs per worker than a vector env can step, more env processes than the machine can schedule;
- the env: the one env the run built and reset before (``probe_env``: a factory or ``reset`` that raises is
  reported with its env id) is the spec every check reads;
- the algorithm: constructed for that env, so its own checks (``algo.target_kl``, minibatch divisibility, the
  action space) fail here, also in ``rltrain-check``, not in the first worker. Where the trainer's loop runs
  in this process, this is the loop's own instance (built once per run); else a CPU copy for the checks.

What the run then says of that algorithm (``show_model``: ``model.txt``, and the model block at start) is here too.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rltrain.algos.base import Algorithm
from rltrain.cli.replay_budget import (
    at_least,
    check_actor_delay,
    check_replay,
    first_round,
    starts_that_train,
    target_sync_line,
)
from rltrain.data.agents import AgentGroup, AgentsSpec
from rltrain.data.memory import available_memory
from rltrain.data.structs import EnvSpec, ObsSpace, storage_dtype
from rltrain.errors import ConfigError
from rltrain.trainers.base import Trainer, UpdateSize, agent_turns
from rltrain.trainers.settings import RunSettings

# Envs of one worker are Python objects stepped one after another; beyond this many a worker spends its time
# building and stepping envs, never learning (1e9 envs hangs while memory grows). Raise it here if you mean it.
MAX_ENVS_PER_WORKER = 65_536
PROCESSES_PER_CORE = 8  # async env processes beyond this per core only time-slice


def check_envs(settings: RunSettings) -> None:
    """Refuse absurd env counts before anything is built or multiplied."""
    env = settings.env
    if env.num_envs > MAX_ENVS_PER_WORKER:
        raise ConfigError(f"env.num_envs={env.num_envs} is more envs than one worker can step (at most "
                          f"{MAX_ENVS_PER_WORKER}); spread them over workers (trainer=subprocess_actors, "
                          "distributed_simulator) or use fewer")


def check_budget(settings: RunSettings, size: UpdateSize, *, replicas: int = 1, streams: int | None = None,
                 ask: Callable[[int], str] = at_least) -> None:
    """``total_env_steps`` against one update (``size``), and an off-policy one against its ``learning_starts`` and
    its replay (``check_replay``: ``replicas`` replay buffers, ``streams`` env streams writing each, None where
    they vary from one update to the next). ``ask``: the words of a suggested budget (cli/replay_budget.py)."""
    cls, hp, total = settings.algo_class, settings.algo_settings, settings.total_env_steps
    batch, text = size.env_steps, size.text
    if total < batch:
        raise ConfigError(f"total_env_steps={total} is less than one update: {text} = {batch} env steps; set "
                          f"{ask(batch)} or make the rollout smaller")
    starts = getattr(hp, "learning_starts", None)
    replay = (getattr(hp, "batch_size", None), getattr(hp, "buffer_size", None))  # a replay learner's settings
    if not getattr(cls, "on_policy", True) and starts is not None and total <= starts:
        if None in replay:  # no replay to count: a budget past the warm-up
            raise ConfigError(f"total_env_steps={total} <= algo.learning_starts={starts}: no gradient step would "
                              f"ever be taken; set {ask(starts + 1)} or lower algo.learning_starts")
        # the budget whose first round trains (check_replay's), the warm-up that lets this budget reach one
        first = first_round(settings, size, replicas=replicas, streams=streams)[2]
        lower = starts_that_train(settings, size, replicas=replicas, streams=streams)
        fewer = f" or algo.learning_starts <= {lower}" if lower is not None else ""
        raise ConfigError(f"total_env_steps={total} <= algo.learning_starts={starts}: no gradient step would ever be "
                          f"taken; set {ask(first)}{fewer}")
    if not getattr(cls, "on_policy", True) and None not in replay:
        check_replay(settings, size, replicas=replicas, streams=streams, ask=ask)
        check_actor_delay(settings, size, replicas=replicas, streams=streams, ask=ask)  # an actor that never steps


def fixed_streams(trainer: Trainer) -> int | None:
    """The env streams whose rollouts every update holds, one replica's: its learner's columns, or None where an
    update merges the rollouts of whichever actors delivered (trainer.batch_rollouts)."""
    return None if trainer.capabilities.batched_rollouts else trainer.learner_envs()


def obs_bytes(space: ObsSpace) -> int:
    """Bytes of one stored observation (Dict: the sum of its parts)."""
    if space.kind == "dict":
        return sum(obs_bytes(part) for _, part in space.parts)
    return int(np.prod(space.shape or (1,))) * storage_dtype(space.dtype or "float32").itemsize


def check_size(settings: RunSettings, size: UpdateSize, spec: EnvSpec | AgentsSpec) -> None:
    """Env processes, and one update's rollout (``size``) in memory, each against this machine."""
    env = settings.env
    batch, text, processes = size.env_steps, size.text, size.env_processes
    cap = PROCESSES_PER_CORE * (os.cpu_count() or 1)
    if env.vectorization == "async" and processes > cap:
        raise ConfigError(f"env.vectorization=async would start {processes} env processes, more than "
                          f"{PROCESSES_PER_CORE} per core on this machine ({cap}); use env.vectorization=sync or "
                          "fewer envs")
    if isinstance(spec, AgentsSpec):  # each policy group's rows: its own observation, index and state
        batches = group_batches(settings, size, spec)
        need = sum(b.rows * b.row_bytes for b in batches)
        said = " + ".join(f"{b.group.name}: {b.rows} rows x {b.row_bytes} bytes" for b in batches)
        words = f"{text} = {batch} env steps; {said}"
    else:
        need = batch * row_bytes(spec)
        words = f"{text} = {batch} env steps x {row_bytes(spec)} bytes per step"
    avail = available_memory()
    if need > avail:
        raise ConfigError(f"one update's rollout needs {need / 2**30:.1f} GiB: {words}, but {avail / 2**30:.1f} GiB "
                          "are available; lower env.num_envs or algo.rollout_len")


def row_bytes(spec: EnvSpec) -> int:
    """Bytes one stored transition takes: obs and next_obs, the action, its log-prob, the reward, two flags."""
    return 2 * obs_bytes(spec.observation) + int(np.prod(spec.action_shape or (1,))) * 8 + 4 + 4 + 2


@dataclass(frozen=True)
class GroupBatch:
    """One policy group's share of an update: ``slots`` columns (one per agent of the group per env column; with
    self-play, the learner's seat) of ``rows`` rows each, ``row_bytes`` stored per row."""

    group: AgentGroup
    seats: int
    slots: int
    rows: int
    row_bytes: int


def group_batches(settings: RunSettings, size: UpdateSize, spec: AgentsSpec) -> list[GroupBatch]:
    """What each policy group holds in one update of ``size`` (every replica's columns, as ``size.env_steps``
    counts them): the arithmetic of the memory check (``check_size``) and of ``rltrain-check``'s rows."""
    cls, hp, T = settings.algo_class, settings.algo_settings, size.rollout_len
    columns = size.env_steps // (T * agent_turns(spec)[0])  # env columns over every replica
    out = []
    for g in cls.plan_groups(spec, hp):
        seats = 1 if hp.self_play else len(g.agents)
        out.append(GroupBatch(g, seats, columns * seats, T * columns * seats, row_bytes(g.spec)))
    return out


# bytes per network parameter over a run's life: weights, gradient, two Adam moments, a target / actor copy
BYTES_PER_PARAMETER = 4 * 6


def check_network_size(settings: RunSettings, spec: EnvSpec | AgentsSpec) -> None:
    """MLP widths whose weights alone would not fit in memory (``hidden_sizes=[1000000,1000000]``): one line
    before anything is allocated (building them would end in the OOM killer or an allocator traceback)."""
    # the flat input width, bounded: pixels go through a conv encoder first, whose output is far narrower
    largest = max(spec.specs, key=lambda s: obs_bytes(s.observation)) if isinstance(spec, AgentsSpec) else spec
    inputs = min(max(obs_bytes(largest.observation), 1), 4096)
    for key, widths in _width_lists(settings.config):
        layers = [inputs, *widths]
        params = sum(a * b for a, b in zip(layers, layers[1:], strict=False)) + sum(widths)
        need, avail = params * BYTES_PER_PARAMETER, available_memory()
        if need > avail:
            raise ConfigError(f"{key}={list(widths)}: the networks would need about {need / 2**30:.1f} GiB "
                              f"({params:.3g} parameters per network), but {avail / 2**30:.1f} GiB are available; "
                              f"use smaller widths (e.g. {key}=[64,64])")


def _width_lists(config: dict) -> list[tuple[str, list[int]]]:
    value = (config.get("model") or {}).get("hidden_sizes")
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                 for v in value):
        return [("model.hidden_sizes", value)]
    return []


def preflight(settings: RunSettings, trainer: Trainer, *, check_only: bool = False) -> Algorithm:
    """Every check above, on the env the run probed once (``settings.env_spec``); returns the algorithm built
    for them, which ``show_model`` describes: the very instance the trainer's loop then trains when that loop
    runs in this process (``Trainer.loop_algorithm``), else, as always with ``check_only`` (``rltrain-check``),
    a CPU copy that only the checks use."""
    check_envs(settings)
    if settings.eval.video:  # a video the final evaluation could not make: refused now, not after training
        from rltrain.trainers.episodes import check_video

        check_video(settings.env.make)
    spec = settings.env_spec or settings.env.spec()
    check_network_size(settings, spec)
    try:
        algo = None if check_only else trainer.loop_algorithm(spec)
        if algo is None:
            algo = settings.algo(spec, num_envs=trainer.learner_envs(), device=torch.device("cpu"))
    except (MemoryError, RuntimeError) as err:
        if not isinstance(err, MemoryError) and "alloc" not in str(err).lower():
            raise
        raise ConfigError(f"building the networks ran out of memory ({str(err).splitlines()[0][:160]}); use "
                          "smaller model.hidden_sizes") from None
    size = trainer.update_size()  # the algorithm's own sizes (PPO's rollout_len=null resolved), not a guess
    if trainer.capabilities.agent_configs:  # trainer=parallel: each agent runs its own share; only they are checked
        late = check_agents(settings, trainer)
    else:
        check_budget(settings, size, replicas=trainer.replicas(), streams=fixed_streams(trainer))
        late = target_sync_line(settings, size, replicas=trainer.replicas(), streams=fixed_streams(trainer))
    check_size(settings, size, spec)
    if late and check_only:  # a warning, on stderr as the tool's others: the run goes on
        print(f"rltrain-check: warning: {late}", file=sys.stderr, flush=True)
    elif late:  # rltrain's logger: stderr and train.log as Hydra's job logging says (or silenced)
        logging.getLogger("rltrain.cli.preflight").warning(late)
    if not check_only and settings.logger.progress != "off":  # rltrain-check's table says it in any case
        line = budget_line(trainer)
        if line:
            print(f"[rltrain] {line}", flush=True)
    if str(settings.env.id).startswith("__main__:"):  # works here; no other process can build it
        print(f"[rltrain] env.id={settings.env.id} is defined in the running script: only a script that defines it "
              "can evaluate or resume this run (rltrain.evaluate(..., allow_import=True) there; rltrain-eval "
              f"cannot); a module (env.id=my_envs:{settings.env.id.partition(':')[2]}) is found by any process",
              flush=True)
    dist = getattr(getattr(algo, "policy", None), "dist", None)
    line = action_scale_line(spec) if getattr(dist, "clips_to_bounds", False) else None
    if line:
        print(f"[rltrain] {line}", flush=True)
    return algo


def budget_words(num_agents: int, *, own: bool) -> Callable[[int], str]:
    """An agent's words for a budget of ``n``: ``num_agents`` x ``n`` in all (each agent's share at least ``n``),
    or the agent's own ``total_env_steps`` (``own``: its ``trainer.agent_overrides`` entry sets it)."""
    if own:
        return lambda n: f"its total_env_steps >= {n}"
    return lambda n: f"total_env_steps >= {num_agents * n} ({n} for each agent)"


def check_agents(settings: RunSettings, trainer: Trainer) -> str | None:
    """``trainer=parallel``'s budget checks, each agent's run on its own budget (``ParallelTrainer.agent_runs``), said
    in the parent's terms: a budget is suggested as the total that gives each agent sharing it what it needs (the
    last agents get ``total // num_agents``: ``num_agents`` x the need). The smallest share is checked first: what
    its line suggests (a batch, a warm-up) fits every larger one. Returns the first target-network warning."""
    from rltrain.cli.agents import sets_budget

    runs, total, late = trainer.agent_runs(), settings.total_env_steps, None  # type: ignore[attr-defined]
    K, entries = len(runs), trainer.agent_overrides or [[]] * len(runs)  # type: ignore[attr-defined]
    for k in sorted(range(K), key=lambda k: runs[k].settings.total_env_steps):
        run, own = runs[k], sets_budget(entries[k])
        size, share = run.update_size(), run.settings.total_env_steps
        where = f"trainer=parallel: agent {k} of {K} " + (f"runs its own total_env_steps={share} (its "
                                                          "trainer.agent_overrides entry)" if own else
                                                          f"gets {share} of total_env_steps={total}")
        if share < size.env_steps:
            raise ConfigError(f"{where}, less than one update: {size.text} = {size.env_steps} env steps; raise "
                              "total_env_steps (the agents share it) or make the rollout smaller")
        ask = budget_words(K, own=own)
        try:  # an off-policy share within its algo.learning_starts, and one that fills a batch
            check_budget(run.settings, size, replicas=run.replicas(), streams=fixed_streams(run), ask=ask)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
        line = target_sync_line(run.settings, size, replicas=run.replicas(), streams=fixed_streams(run), ask=ask)
        late = late or (f"{where}: {line}" if line else None)
    return late


def action_scale_line(spec: EnvSpec) -> str | None:
    """A Gaussian policy (PPO, A2C, IMPALA) starts at mean 0, std 1, and the env gets its samples clipped to the
    Box: bounds that exclude 0, or whose half-width is an order of magnitude off 1, make early actions the
    bound itself, or explore a sliver of the range. Said once at start, with the wrapper that fixes it (SB3's
    env checker gives the same advice); None where the bounds are fine or infinite."""
    low, high = np.asarray(spec.action_low, np.float64), np.asarray(spec.action_high, np.float64)
    if not low.size or not (np.isfinite(low).all() and np.isfinite(high).all()):
        return None
    moves = high > low  # a dimension with low == high holds one action: nothing to explore or rescale there
    if not moves.any():
        return None
    low, high = low[moves], high[moves]
    half = (high - low) / 2
    if (low <= 0).all() and (high >= 0).all() and (half >= 0.1).all() and (half <= 10).all():
        return None
    where = f"[{low.min():g}, {high.max():g}]" if low.size > 1 else f"[{low[0]:g}, {high[0]:g}]"
    return (f"note: Box actions in {where}: the Gaussian policy starts at mean 0 with std 1 and the env gets its "
            "samples clipped to the bounds, so early actions sit at a bound or explore a sliver of the range; "
            "rescale them: env.wrappers=[{gymnasium.wrappers.RescaleAction: {min_action: -1, max_action: 1}}]")


def overshoot_line(total: int, size: UpdateSize) -> str | None:
    """The budget a run of whole updates reaches, said where it passes ``total_env_steps`` by more than 1% (an
    update is never cut short: its rollout is what the algorithm learns from)."""
    updates, reached = size.whole_updates(total)
    if reached - total <= 0.01 * total:
        return None
    fewer = " or fewer" if size.turns else ""  # a turn-based update's turns: up to its size (UpdateSize.turns)
    return (f"budget: total_env_steps={total} runs to {reached} env steps{fewer} ({updates} whole updates of "
            f"{size.text} = {size.env_steps}; {100 * (reached - total) / total:.0f}% over)")


def budget_line(trainer: Trainer, *, always: bool = False) -> str | None:
    """The start line on where the run ends (None: its whole updates land within 1% of its budget, unless
    ``always``): ``trainer=parallel``'s over its agents, as each agent's process runs (``ParallelTrainer.agent_runs``),
    every other trainer's over its own update."""
    if trainer.capabilities.agent_configs:
        runs = trainer.agent_runs()  # type: ignore[attr-defined]
        return agents_budget_line(trainer.settings.total_env_steps,
                                  [(run.settings.total_env_steps, run.update_size()) for run in runs], always=always)
    return overshoot_line(trainer.settings.total_env_steps, trainer.update_size())


def agents_budget_line(total: int, agents: list[tuple[int, UpdateSize]], *, always: bool = False) -> str | None:
    """``trainer=parallel``'s budget line: ``total_env_steps`` split over the agents, (budget, update size) each, and
    where each agent's run of whole updates ends (``UpdateSize.whole_updates``, as its loop's ``Trainer.ends_at``).
    Said where an agent's run passes its budget by more than 1%, as ``overshoot_line`` says one run's; agents
    whose runs differ (``trainer.agent_overrides``: envs, rollout, algorithm, budget) each get theirs."""
    budgets, sizes = [b for b, _ in agents], [size for _, size in agents]
    ends = [size.whole_updates(b) for b, size in agents]
    if not always and all(reached - b <= 0.01 * b for b, (_, reached) in zip(budgets, ends, strict=True)):
        return None
    asked, reached = sum(budgets), sum(r for _, r in ends)
    fewer = " or fewer" if any(size.turns for size in sizes) else ""  # a turn-based update: up to its size
    split = f"{budgets[0]} each" if len(set(budgets)) == 1 else " / ".join(map(str, budgets))
    runs = [(u, r, size.env_steps, size.text) for (u, r), size in zip(ends, sizes, strict=True)]
    if len(set(runs)) == 1:
        u, r, steps, text = runs[0]
        each = f"each runs to {r} env steps{fewer} ({u} whole updates of {text} = {steps})"
    else:
        each = "in whole updates, " + ", ".join(f"agent {k}: {r} ({u} x {steps})" for k, (u, r, steps, _) in
                                                enumerate(runs))
    agents_word = "agent" if len(agents) == 1 else "agents"
    return (f"budget: total_env_steps={total} over {len(agents)} {agents_word}, {split}: {each}, {reached} env "
            f"steps{fewer} in all; {100 * (reached - asked) / asked:.0f}% over")


def show_model(algo: Algorithm, run_dir: Path | None, *, echo: bool) -> None:
    """The model in words (models/describe.py), in ``<run dir>/model.txt`` (None: rltrain-check); echo: on stdout."""
    from rltrain.models.describe import describe_model, networks_of

    stacked = getattr(getattr(algo, "spec", None), "frame_stack", None)  # the env's own (EnvSpec.frame_stack)
    notes = [f"frame stack: {algo.frame_stack} frames (read from the env's FrameStackObservation; stored once "
             "per frame in the replay)"] if algo.frame_stack else \
        [f"frame stack: {stacked} frames (the env's FrameStackObservation: the policy reads them as "
         "channels)"] if stacked else []
    text = f"algo={algo.name}\n" + describe_model(networks_of(algo), notes)
    if run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        Path(run_dir, "model.txt").write_text(text + "\n")
    if echo:  # rltrain-check writes no run dir: its model under its own prefix, as all of its lines
        tag = "rltrain" if run_dir is not None else "rltrain-check"
        print(f"[{tag}] model:\n" + "\n".join(f"  {ln}" for ln in text.splitlines()), flush=True)
