"""A replay learner's budget, checked at start (cli/preflight.py ``check_budget``): where its first round of
updates falls (``UpdateSchedule.first_round``, every env stream's newest row held back), the refusal of a budget
that never reaches it (``check_replay``), and the values its refusals suggest: the budget that reaches that round
and the largest ``algo.learning_starts`` that lets this budget reach one (``starts_that_train``); a delayed actor
whose first step the run's gradient steps never reach (``check_actor_delay``), and the warning for a scheduled
target network that takes no trained weights before the last round (``target_sync_line``).

A suggested budget is said through ``ask`` (``n`` -> the words that set it): one run's ``total_env_steps >= n``;
under ``trainer=parallel`` the total that gives every agent ``n`` (cli/preflight.py ``preflight``).
"""

from __future__ import annotations

from collections.abc import Callable

from rltrain.algos.off_policy import OffPolicy, UpdateSchedule, first_trained_sync
from rltrain.errors import ConfigError
from rltrain.trainers.base import UpdateSize
from rltrain.trainers.settings import RunSettings


def at_least(n: int) -> str:
    """One run's words for a budget of ``n`` env steps or more."""
    return f"total_env_steps >= {n}"


def schedule_key(settings: RunSettings, which: str) -> str | None:
    """The settings key an off-policy algorithm names for a schedule (``which``: ``target_sync_key`` or
    ``actor_delay_key``, ``OffPolicy``'s classmethods); None for any other algorithm."""
    cls = settings.algo_class
    return getattr(cls, which)() if isinstance(cls, type) and issubclass(cls, OffPolicy) else None


def held_back(size: UpdateSize, *, replicas: int, streams: int | None) -> int:
    """The rows of each replica's replay whose successor has not arrived, at most: one per env stream (where the
    streams vary from one update to the next, one per env process of a replica)."""
    return max(size.env_processes // replicas, 1) if streams is None else streams


def first_round(settings: RunSettings, size: UpdateSize, *, replicas: int, streams: int | None,
                starts: int | None = None) -> tuple[int, int, int]:
    """``UpdateSchedule.first_round`` of this run (``starts``: another ``algo.learning_starts``), every stream's
    newest row held back: (the first learn() that holds a batch, where its owed steps count from, the env step of
    the first learn() that runs a round: a budget of whole updates that trains)."""
    hp = settings.algo_settings
    return UpdateSchedule(hp.train_frequency, hp.gradient_steps).first_round(
        per_call=size.env_steps, learning_starts=hp.learning_starts if starts is None else starts,
        batch_at=replicas * (hp.batch_size + held_back(size, replicas=replicas, streams=streams)))


def starts_that_train(settings: RunSettings, size: UpdateSize, *, replicas: int, streams: int | None) -> int | None:
    """The largest ``algo.learning_starts`` below ``total_env_steps`` whose first round (``first_round``) comes
    within the budget's whole updates; ``first_round`` never falls as ``learning_starts`` falls, so every value
    at or below it trains too. None where even 0 does not (the batch, or ``train_frequency``, is too large)."""
    total = settings.total_env_steps
    reached = size.whole_updates(total)[1]

    def trains(starts: int) -> bool:
        return first_round(settings, size, replicas=replicas, streams=streams, starts=starts)[2] <= reached

    if total < 1 or not trains(0):
        return None
    lo, hi = 0, total - 1  # trains(lo); the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if trains(mid) else (lo, mid - 1)
    return lo


def check_replay(settings: RunSettings, size: UpdateSize, *, replicas: int, streams: int | None,
                 ask: Callable[[int], str] = at_least) -> None:
    """A replay learner takes its first gradient step once its replay holds ``algo.batch_size`` transitions whose
    successor has arrived (``ReplayBuffer.ready``, read by ``OffPolicy._learn``; n-step returns and frame stacks
    count the same ones) and ``algo.train_frequency`` env steps are owed (``UpdateSchedule.first_round``: from the
    warm-up's end or the learn() that first holds a batch). Refused where that can never happen: a replay whose
    rows, less the newest of each env stream (its successor comes with the next step, or it is an episode's final
    observation), are fewer than a batch (``algo.batch_size > algo.buffer_size`` is the settings' own check), and a
    budget whose whole updates end before the first round, with each replica's replay holding its share of the
    transitions less the newest of each fixed stream. An episode's end adds a row (its final observation) and
    takes no transition away: it only counts where the ring wraps before the first round, which depends on how
    many episodes end, not known at start. The suggested budget is the first round's env step with every
    stream's newest row held back."""
    hp, total = settings.algo_settings, settings.total_env_steps
    batch, capacity, every = hp.batch_size, hp.buffer_size, size.env_steps
    # a buffer of at least (rollout_len + 1) rows per stream keeps each stream's newest row (behind at most every
    # final row of the last rollout); below that, the rows held back depend on the episodes' ends: not refused
    if streams and capacity >= streams * (size.rollout_len + 1) and batch > capacity - streams:
        raise ConfigError(f"algo.batch_size={batch} > the {capacity - streams} transitions the replay can offer at "
                          f"most: algo.buffer_size={capacity} rows less the newest of each env stream ({streams}), "
                          "whose successor is not there yet, so no gradient step would ever be taken; lower "
                          f"algo.batch_size (e.g. {max(capacity // 2, 1)}) or raise algo.buffer_size (e.g. "
                          f"{2 * batch + streams})")
    reached = size.whole_updates(total)[1]
    collected = reached // replicas  # each replica's replay gets its share of the steps
    schedule, starts = UpdateSchedule(hp.train_frequency, hp.gradient_steps), hp.learning_starts
    # a fixed stream's newest transition waits for its successor unless it ended an episode on that very step;
    # where the streams vary from one update to the next, none is counted (refused only when nothing can train)
    if schedule.first_round(per_call=every, learning_starts=starts,
                            batch_at=replicas * (batch + (streams or 0)))[2] <= reached:
        return
    held = held_back(size, replicas=replicas, streams=streams)
    _, owed_from, first = first_round(settings, size, replicas=replicas, streams=streams)
    if collected - (streams or 0) >= batch:  # a batch in time, but not the steps a round is owed after it
        since = f"algo.learning_starts={starts}" if owed_from == starts else \
            f"env step {owed_from}, where the update that first leaves algo.batch_size={batch} sampleable starts"
        fewer = f" or algo.train_frequency <= {reached - owed_from}" if reached > owed_from else ""
        raise ConfigError(f"total_env_steps={total} ends at env step {reached}, before the first round of updates: "
                          f"the env steps owed count from {since}, and algo.train_frequency={hp.train_frequency} "
                          f"of them make it due in the update that reaches env step {first}: no gradient step would "
                          f"ever be taken; set {ask(first)}{fewer}")
    where = "the replay" if replicas == 1 else f"each of the {replicas} replicas' replays"
    # the largest batch this budget fills in time for a round: held in the last update at most train_frequency
    # env steps (rounded up to one update) before the end, the warm-up over train_frequency steps before it
    last = min(reached, ((reached - hp.train_frequency) // every + 1) * every)
    fits = last // replicas - held if starts <= reached - hp.train_frequency else 0
    smaller = f"algo.batch_size <= {fits}" if fits >= 1 else "a smaller algo.batch_size"
    less = f" ({collected - streams} sampleable: the newest of each env stream ({streams}) waits for its successor)" \
        if streams else ""
    raise ConfigError(f"total_env_steps={total} puts {collected} transitions into {where}{less}, fewer than "
                      f"algo.batch_size={batch}: no gradient step would ever be taken; set {ask(first)} or "
                      f"{smaller}")


def check_actor_delay(settings: RunSettings, size: UpdateSize, *, replicas: int, streams: int | None,
                      ask: Callable[[int], str] = at_least) -> None:
    """A delayed actor (``OffPolicy.actor_delay_key``: TD3's ``algo.policy_delay``, SAC's ``algo.policy_frequency``)
    steps at every delay-th gradient step of the run, the first at the delay-th (``OffPolicy.actor_steps_at``):
    refused where the run takes fewer (each replica the same), counted from ``first_round`` as ``check_replay``
    counts (every stream's newest row held back)."""
    hp, every = settings.algo_settings, size.env_steps
    key = schedule_key(settings, "actor_delay_key")
    if key is None:
        return
    delay = getattr(hp, key)
    ready, owed_from, first = first_round(settings, size, replicas=replicas, streams=streams)
    reached = size.whole_updates(settings.total_env_steps)[1]
    taken = (reached - owed_from) // hp.train_frequency * hp.gradient_steps  # from the round due at `first` on
    if taken >= delay or first > reached:  # no round at all: check_replay's refusal (or its best case)
        return
    enough = max(ready, -(-(owed_from + -(-delay // hp.gradient_steps) * hp.train_frequency) // every) * every)
    raise ConfigError(f"algo.{key}={delay}: the run takes {taken} gradient steps (algo.gradient_steps="
                      f"{hp.gradient_steps} per algo.train_frequency={hp.train_frequency} env steps owed from env "
                      f"step {owed_from} to {reached}) and the actor steps once per {delay}, first at gradient step "
                      f"{delay}, so it would never be trained; set algo.{key} <= {taken} or {ask(enough)}")


def target_sync_line(settings: RunSettings, size: UpdateSize, *, replicas: int, streams: int | None,
                     ask: Callable[[int], str] = at_least) -> str | None:
    """A replay learner whose targets are updated on a schedule of env steps (``OffPolicy.target_sync_key``: DQN's
    ``algo.target_network_frequency``) and whose run ends before a round of updates follows the first update
    that carries trained weights: every TD target of the run comes from the initial network. Said at start (a
    warning: the generic default, 10k env steps, is longer than a smoke test's budget); None where it syncs in
    time or has no such schedule. Counted as ``check_replay`` suggests (every stream's newest row held back).
    The frequencies that sync in time are no range (a shorter one can wait for a later multiple of itself past
    the first round): the line names one, a copy right after the first round, as an example."""
    hp = settings.algo_settings
    key = schedule_key(settings, "target_sync_key")
    if key is None:
        return None
    target_every, every = getattr(hp, key), size.env_steps
    schedule = UpdateSchedule(hp.train_frequency, hp.gradient_steps)
    ready, owed_from, first = first_round(settings, size, replicas=replicas, streams=streams)
    reached = size.whole_updates(settings.total_env_steps)[1]
    if first > reached:  # no round at all: check_replay's refusal (or its best case) has said so
        return None
    synced = first_trained_sync(target_every, per_call=every, ready=ready, first_round=first)
    last = schedule.last_round(owed_from, per_call=every, end=reached)
    if synced < last:
        return None
    due = ((synced - owed_from) // hp.train_frequency + 1) * hp.train_frequency  # the round after that update
    enough = -(-(owed_from + due) // every) * every
    # a target updated right after the first round is updated every `first` env steps: in time for the last
    other = f"e.g. algo.{key}={first} or " if last > first else ""
    return (f"algo.{key}={target_every}: the target network first takes trained weights in the update that reaches "
            f"env step {synced}, and the run's last round of updates comes at env step {last} (total_env_steps="
            f"{settings.total_env_steps}), so every TD target comes from the initial, untrained network; set "
            f"{other}{ask(enough)}")
