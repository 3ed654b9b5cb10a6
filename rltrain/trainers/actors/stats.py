"""What the ``subprocess_actors`` learner reports about its actors: the ``actors/*`` metric columns, the
progress rows (one per actor, then lag / queue / drops), and the display that shows them.

``ActorStats`` is told what happened (a rollout arrived, was dropped, a batch was taken, an update was
learned) by the queue (``batches.py``), the rollout source and the loop hooks; it never asks them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from rltrain.data.structs import Metrics
from rltrain.run.progress import ProgressDisplay
from rltrain.trainers.actors.actor import RolloutMsg
from rltrain.trainers.actors.pool import ActorSlot


class ActorStats:
    """Lag, queue and drop accounting. ``counts`` are the run's totals (kept in checkpoints); the per-batch
    figures are averaged over the batches since the last metrics row."""

    def __init__(self) -> None:
        self.version = 0  # the learner's update count: the policy version it last published
        self.counts: dict[str, float] = {"dropped_steps": 0.0, "dropped_rollouts": 0.0, "preempted_batches": 0.0}
        self._window: dict[str, list[float]] = {}  # per-batch figures since the last log row
        self._received_steps, self._recv_t0 = 0, time.perf_counter()
        self._first_seen: dict[int, float] = {}  # progress rows: actor -> when it began its first rollout

    # -- told by the queue, the source and the hooks ----------------------------------------------------------
    def received(self, msgs: Sequence[RolloutMsg]) -> None:
        for m in msgs:
            self._first_seen.setdefault(m.actor_id, time.perf_counter() - m.collect_s)
        self._received_steps += sum(m.num_steps for m in msgs)

    def dropped(self, msg: RolloutMsg) -> None:
        self.counts["dropped_steps"] += msg.num_steps
        self.counts["dropped_rollouts"] += 1

    def preempted(self) -> None:
        self.counts["preempted_batches"] += 1

    def queue_fill(self, fill: float) -> None:
        self._window.setdefault("queue_fill", []).append(fill)

    def waited(self, seconds: float) -> None:
        self._window.setdefault("dequeue_wait_s", []).append(seconds)

    def batch(self, lags: list[int]) -> None:
        """A batch of ``len(lags)`` rollouts went to the learner, each ``lag`` versions behind it."""
        self._window.setdefault("lag", []).extend(lags)
        self._window.setdefault("batch_rollouts", []).append(len(lags))

    def learned(self, *, version: int, steps: int, learn_s: float) -> None:
        self.version = version
        self._window.setdefault("learner_sps", []).append(steps / max(learn_s, 1e-9))

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, float]:
        return dict(self.counts)

    def load_state_dict(self, counts: dict[str, float]) -> None:
        self.counts.update(counts)

    # -- what the learner logs and shows --------------------------------------------------------------------------
    def row(self, *, restarts: int) -> Metrics:
        """The ``actors/*`` columns (and ``time/actor_sps``, ``time/learner_sps``, ``time/dequeue_wait_s``: wall-clock
        figures go under ``time/``, the columns a same-seed rerun may differ in) of this metrics row."""
        w, self._window = self._window, {}
        lag = w.get("lag", [])
        now = time.perf_counter()
        actor_sps = self._received_steps / max(now - self._recv_t0, 1e-9)
        self._received_steps, self._recv_t0 = 0, now

        def mean(key: str) -> float:
            return float(np.mean(w[key])) if w.get(key) else math.nan

        return {
            "actors/policy_lag_min": float(min(lag)) if lag else math.nan,
            "actors/policy_lag_mean": float(np.mean(lag)) if lag else math.nan,
            "actors/policy_lag_max": float(max(lag)) if lag else math.nan,
            "actors/queue_fill": mean("queue_fill"), "time/dequeue_wait_s": mean("dequeue_wait_s"),
            "actors/batch_rollouts": mean("batch_rollouts"), "time/actor_sps": actor_sps,
            "time/learner_sps": mean("learner_sps"), "actors/policy_version": float(self.version),
            "actors/restarts": float(restarts),
            **{f"actors/{k}": v for k, v in self.counts.items()},
        }

    def progress_rows(self, slots: Sequence[ActorSlot], *, queued: int, capacity: int) -> list[str]:
        """One row per actor (throughput of what reached the learner, episodes, version of its last rollout),
        then the learner's policy version, lag, queue and drops."""
        rows = [self._actor_row(slot) for slot in slots]
        lag = self._window.get("lag", [])
        lag_txt = f"{min(lag)}/{np.mean(lag):.1f}/{max(lag)}" if lag else "-"
        rows.append(f"policy v{self.version}  lag min/mean/max {lag_txt}  queue "
                    f"{queued}/{capacity}  dropped {int(self.counts['dropped_rollouts'])} rollouts")
        return rows

    def _actor_row(self, slot: ActorSlot) -> str:
        # throughput since it began its first rollout (process start-up is not the actor's speed)
        elapsed = time.perf_counter() - self._first_seen.get(slot.actor_id, math.inf)
        sps = slot.steps / elapsed if elapsed > 0 else 0.0
        version = f"v{slot.version}" if slot.version >= 0 else "no rollout yet"
        where = f" on {slot.node}" if slot.node else ""
        return (f"actor {slot.actor_id}{where}: {sps:,.0f} sps ({slot.sps:,.0f} while collecting)  "
                f"steps {slot.steps:,}  episodes {slot.episodes}  {version}  restarts {slot.restarts}")


class ActorsProgress(ProgressDisplay):
    """The usual bar/line plus ``rows()`` (one per actor, then the lag / queue figures): under the bar on a
    terminal, every ``interval_s`` as plain lines elsewhere."""

    def __init__(self, *args, rows: Callable[[], list[str]], **kwargs):
        super().__init__(*args, **kwargs)
        self._rows_of, self._last_rows = rows, 0.0

    def update(self, env_steps: int, **kwargs) -> None:
        super().update(env_steps, **kwargs)
        if self.mode == "rich":
            self.set_rows(self._rows_of())  # rich redraws at most 4 times a second
            return
        now = time.monotonic()
        if self.mode == "off" or (now - self._last_rows < self.interval_s and env_steps < self.total):
            return
        self._last_rows = now
        print("\n".join("  " + r for r in self._rows_of()), flush=True)
