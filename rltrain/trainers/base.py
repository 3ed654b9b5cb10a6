"""``Trainer.fit()``: the one template every trainer runs; a trainer supplies placement only.

``fit`` owns what must be the same everywhere: the stop flag (SIGINT / SIGTERM / SIGUSR2 -> checkpoint and
stop at the next safe point), ``seeds.json`` (every seed tree the run uses, written before training starts),
the final ``summary.json`` and the exit code (0 completed, 1 failed, 130/143/140 interrupted by a signal, 3
interrupted for another reason). A trainer fills in two public hooks:

- ``seed_trees()``: the seed trees to record (``{}`` when this process records none, e.g. a rank > 0);
- ``train(stop)``: run the components where they belong (one process, K agents, W ranks, a learner and
  actors) and return the summary.

and declares what it is (``name``, ``capabilities``), what one update consumes (``update_size``, from the
algorithm's own ``update_sizes``) and the processes it starts (``describe``): the CLI asks the trainer these,
never its name or attributes. A trainer whose loop runs in the CLI's process builds that loop's algorithm when
the pre-flight checks ask for it (``loop_algorithm``), so a run builds it once.

While the run is live, ``summary.json`` says ``running`` (PID, host, start time): a reader never mistakes a
live run, or one killed without a word (SIGKILL, OOM, power), for an earlier segment's ``completed``. The next
start in the run dir (it holds the run-dir lock, so that process is gone) records the dead one as ``crashed``
with the last env step it logged, warns in one line, and keeps that record in its own summary.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rltrain.algos.base import Algorithm, UpdateSizes
from rltrain.data.agents import AgentsSpec
from rltrain.data.structs import EnvSpec
from rltrain.errors import ConfigError
from rltrain.run.seeding import SeedTree, write_seeds
from rltrain.run.signals import StopFlag, StopRequested, during
from rltrain.run.summary import last_logged_step, newest_checkpoint, resume_command, write_summary
from rltrain.trainers.settings import RunSettings


@dataclass(frozen=True)
class Capabilities:
    """What a trainer can do, declared on its class (``Trainer.capabilities``)."""

    batched_rollouts: bool = False  # an update merges trainer.batch_rollouts rollouts of several actors
    all_reduce: bool = False  # replicas all-reduce every update: one global batch over trainer.world_size
    agent_configs: bool = False  # takes ``agents``: one RunSettings per agent, composed by the CLI


@dataclass(frozen=True)
class UpdateSize:
    """What one update consumes: env steps, that product spelled out with the keys that set it, the env
    processes the run starts with ``env.vectorization=async``, and the algorithm's sizes it comes from."""

    env_steps: int
    text: str
    env_processes: int
    rollout_len: int  # steps per env the update's rollouts hold
    num_minibatches: int | None = None  # the algorithm's minibatches per epoch (PPO), None for the others
    # a turn-based (AEC) env's update: ``env_steps`` is what its rows cost if every slot fills, but an env stops at
    # its first full slot (a first mover's, an agent's done early: the others are padded), so it takes fewer
    turns: bool = False

    def whole_updates(self, total: int) -> tuple[int, int]:
        """(updates, env steps reached) of a ``total_env_steps`` budget: an update is never cut short."""
        updates = -(-total // self.env_steps)
        return updates, updates * self.env_steps

    def budget_updates(self, total: int) -> int | None:
        """The updates after which a turn-based run ends (None: its env steps end it). Counting its turns instead
        would add an update the start line never announced (its updates fall short of ``env_steps``), and ranks
        whose turns differ could disagree on the last one; the update count is the same everywhere."""
        return self.whole_updates(total)[0] if self.turns else None

    def updates_text(self, total: int) -> str:
        """rltrain-check's updates row: the arithmetic and where the run ends."""
        updates, reached = self.whole_updates(total)
        head = f"{total} total_env_steps / {self.env_steps} = {updates}, whole: the run ends"
        if self.turns:
            return f"{head} after {updates} updates, at about {reached} env steps or fewer (an update's turns: " \
                   f"about {self.env_steps}, fewer when one agent's slots fill before the others')"
        return f"{head} at {reached} env steps"


def agent_turns(spec: EnvSpec | AgentsSpec | None) -> tuple[int, str]:
    """(env steps per rollout row of an env, said as a factor of the update's size): 1 for one agent or a
    parallel multi-agent env (its joint step gives every agent a row, ``rollout_len`` counting rows per agent);
    a turn-based (AEC) env's agents each take about one turn per row of theirs (data/agents.py)."""
    if not isinstance(spec, AgentsSpec) or spec.steps_per_row == 1:
        return 1, ""
    return spec.steps_per_row, f" x {spec.steps_per_row} agents taking turns (an AEC env step is one agent's turn)"


class Trainer(ABC):
    """Base of every trainer. Subclasses take ``(*, settings, run_dir, trainer)``: ``trainer`` an instance of
    their ``settings_class`` (the ``trainer`` group's schema, trainers/settings.py)."""

    name: ClassVar[str] = "custom"  # the trainer= choice that selects it
    settings_class: ClassVar[type]  # the frozen dataclass of its trainer.* keys
    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init__(self, *, settings: RunSettings, run_dir: Path, trainer: Any = None):
        self.settings, self.run_dir = settings, Path(run_dir)
        self._previous_summary: str | None = None  # what summary.json said before this run marked it running

    def fit(self) -> dict:
        """Train; returns the run summary (also written to ``summary.json`` by the process that owns the run)."""
        stop = StopFlag().install()
        crashed = None
        try:
            with stop.raising("start-up"):
                crashed = self.mark_running() if self.writes_summary() else None
                trees = self.seed_trees()
                if trees:
                    self.record_seeds(trees)
            summary = self.train(stop)
        except StopRequested as err:  # where the run had no safe point to stop at (or a second Ctrl-C)
            summary = self.stopped_at_once(err)
        except BaseException as err:
            if self.writes_summary():
                self.never_left_running(err)
            raise
        finally:
            stop.uninstall()
        if "exit_code" not in summary:
            status = summary.get("status")
            summary["exit_code"] = stop.exit_code if status == "interrupted" else 1 if status == "failed" else 0
        if crashed:
            summary["crashed_before"] = crashed
        if self.writes_summary():
            write_summary(self.run_dir, summary)
        return summary

    def stopped_at_once(self, err: StopRequested) -> dict:
        """The summary of a run stopped where it could not wait for a safe point (building its envs, loading a
        checkpoint, connecting, the rendezvous) or by a second Ctrl-C: ``interrupted``, with the checkpoint
        that exists already (none is written now: nothing is in a state worth saving)."""
        ckpt = newest_checkpoint(self.run_dir)
        summary = {"status": "interrupted", "stop_reason": f"{err.reason}{during(err)}", "checkpoint":
                   str(ckpt) if ckpt else None, "resume_command": resume_command(self.run_dir),
                   "exit_code": err.exit_code}
        return summary

    def never_left_running(self, err: BaseException) -> None:
        """The run ended by an exception before any summary was written: a refusal (ConfigError: e.g. a resume
        that does not fit) puts back the summary that was there, anything else says ``failed``."""
        path = self.run_dir / "summary.json"
        try:
            current = json.loads(path.read_text())
            if current.get("status") != "running" or current.get("pid") != os.getpid():
                return
            if isinstance(err, ConfigError):
                if self._previous_summary is None:
                    path.unlink()
                else:
                    write_summary(self.run_dir, json.loads(self._previous_summary))
                return
            write_summary(self.run_dir, {**current, "status": "failed", "error": f"{type(err).__name__}: {err}"})
        except (OSError, ValueError, AttributeError):
            pass  # a full disk: build.run reports it in one line

    def mark_running(self) -> dict | None:
        """Write the ``running`` summary; returns the record of a previous run that died while running."""
        try:
            self._previous_summary: str | None = (self.run_dir / "summary.json").read_text()
        except OSError:
            self._previous_summary = None
        crashed = crashed_record(self.run_dir)
        if crashed:
            print(f"rltrain: warning: the previous run in {self.run_dir} (pid {crashed.get('pid')} on "
                  f"{crashed.get('host')}) crashed without a word; last env step it logged: "
                  f"{crashed.get('last_env_steps')}", file=sys.stderr, flush=True)
        write_summary(self.run_dir, {"status": "running", "pid": os.getpid(), "host": socket.gethostname(),
                                     "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                     **({"crashed_before": crashed} if crashed else {})})
        return crashed

    def earlier_summary(self) -> dict:
        """``summary.json`` as the previous session left it, before this one marked the run running ({} where
        there was none, or it is unreadable): what a trainer without checkpoints of its own continues from."""
        try:
            earlier = json.loads(self._previous_summary or "{}")
        except ValueError:
            return {}
        return earlier if isinstance(earlier, dict) else {}

    def record_seeds(self, trees: dict[str, SeedTree]) -> None:
        """(Re)write ``seeds.json`` with ``trees`` (a trainer calls it again when it starts a new worker)."""
        write_seeds(self.run_dir / "seeds.json", self.settings.seed, trees, drawn=self.settings.seed_drawn)

    def resume_layout_error(self, meta: dict, path: Path) -> str | None:
        """The line refusing to continue the checkpoint at ``path`` (``meta``: its record) with this run's process
        layout, else None: a trainer whose workers must match the checkpoint's says so here, so ``rltrain-check``
        refuses what the run will (cli/check.py)."""
        return None

    def writes_summary(self) -> bool:
        """Whether this process writes the run's ``summary.json`` (False on distributed ranks > 0)."""
        return True

    def replicas(self) -> int:
        """Workers that all-reduce each update (``capabilities.all_reduce``); 1 otherwise."""
        return 1

    def learner_envs(self) -> int:
        """The env columns of one update at the loop's algorithm (its ``num_envs``): one worker's envs."""
        return self.settings.env.num_envs

    def algo_sizes(self) -> UpdateSizes:
        """The algorithm's sizes over ``learner_envs`` (``Algorithm.update_sizes``: the one place they are
        worked out, e.g. PPO's ``rollout_len=null``), before any algorithm is built."""
        s = self.settings
        return s.algo_class.update_sizes(s.algo_settings, num_envs=self.learner_envs(),
                                         recurrent=s.model.core != "identity")

    def update_size(self) -> UpdateSize:
        """One update of the algorithm's ``rollout_len`` steps per env, on every replica."""
        sizes, envs, workers = self.algo_sizes(), self.settings.env.num_envs, self.replicas()
        turns, said = agent_turns(self.settings.env_spec)
        text = f"algo.rollout_len ({sizes.rollout_len}) x env.num_envs ({envs})" + \
            (f" x trainer.world_size ({workers})" if workers > 1 else "") + said
        return UpdateSize(sizes.rollout_len * envs * workers * turns, text, envs * workers, sizes.rollout_len,
                          sizes.num_minibatches, turns=turns > 1)

    def ends_at(self) -> int:
        """The env step this run ends at: ``total_env_steps`` in whole updates (an update is never cut short), the
        figure the start line and rltrain-check's updates row give, and the progress display's total (a
        turn-based run's updates may end before it: ``UpdateSize.turns``)."""
        return self.update_size().whole_updates(self.settings.total_env_steps)[1]

    def budget_updates(self) -> int | None:
        """The updates a turn-based run ends after (``UpdateSize.budget_updates``); None: its env steps end it."""
        return self.update_size().budget_updates(self.settings.total_env_steps)

    def loop_algorithm(self, spec: EnvSpec) -> Algorithm | None:
        """The algorithm of the loop this trainer runs in THIS process, built now for the pre-flight checks and
        handed to that loop, so the run builds it once (seeded and placed as the loop would); None when the
        trainer's loops run in other processes or need what only exists there (a rank's all-reduce): the
        checks then build a CPU copy of their own (cli/preflight.py)."""
        return None

    def envs_text(self) -> str:
        env = self.settings.env
        return f"{env.num_envs} x {env.id} ({env.vectorization})"

    def describe(self) -> list[tuple[str, str]]:
        """(what, where) rows: the processes this run starts (``rltrain-check`` prints them)."""
        keys = {k: v for k, v in (self.settings.config.get("trainer") or {}).items() if not k.startswith("_")}
        return [(f"trainer {self.name}", ", ".join(f"{k}={v}" for k, v in keys.items()) or "(no keys)"),
                ("envs per worker", self.envs_text())]

    @abstractmethod
    def seed_trees(self) -> dict[str, SeedTree]:
        """The seed trees this run uses, by worker name (recorded in ``seeds.json``)."""

    def planned_seed_trees(self) -> dict[str, SeedTree]:
        """The seed trees a fresh run of these settings starts its workers with, by worker name, for
        ``rltrain-check``'s seeds table; ``seed_trees`` unless a trainer records them only once it runs."""
        return self.seed_trees()

    @abstractmethod
    def train(self, stop: StopFlag) -> dict:
        """Place and run the components; return the summary (``status`` at least)."""


def crashed_record(run_dir: Path) -> dict | None:
    """``summary.json`` says ``running`` but its process is gone (the caller holds the run-dir lock): the record
    ``{"status": "crashed", pid, host, started_at, last_env_steps}``, else None."""
    try:
        old = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(old, dict) or old.get("status") != "running":
        return None
    return {"status": "crashed", "pid": old.get("pid"), "host": old.get("host"), "started_at": old.get("started_at"),
            "last_env_steps": last_logged_step(Path(run_dir))}
