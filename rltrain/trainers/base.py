"""``Trainer.fit()``: the one template every trainer runs; a trainer supplies placement only.

``fit`` owns what must be the same everywhere: the stop flag (SIGINT / SIGTERM / SIGUSR2 -> checkpoint and
stop at the next safe point), ``seeds.json`` (every seed tree the run uses, written before training starts),
the final ``summary.json`` and the exit code (0 completed, 1 failed, 130/143/140 interrupted by a signal, 3
interrupted for another reason). A trainer fills in two public hooks:

- ``seed_trees()``: the seed trees to record (``{}`` when this process records none, e.g. a rank > 0);
- ``train(stop)``: run the components where they belong (one process, K agents, W ranks, a learner and
  actors) and return the summary.

While the run is live, ``summary.json`` says ``running`` (PID, host, start time): a reader never mistakes a
live run, or one killed without a word (SIGKILL, OOM, power), for an earlier segment's ``completed``. The next
start in the run dir (it holds the run-dir lock, so that process is gone) records the dead one as ``crashed``
with the last env step it logged, warns in one line, and keeps that record in its own summary.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import sys
import time
from abc import ABC, abstractmethod
from pathlib import Path

from rltrain.errors import ConfigError
from rltrain.run.seeding import SeedTree, write_seeds
from rltrain.run.signals import StopFlag
from rltrain.run.summary import write_summary
from rltrain.trainers.settings import RunSettings


class Trainer(ABC):
    """Base of every trainer. Subclasses take ``(*, settings, run_dir, **their typed keyword arguments)``."""

    def __init__(self, *, settings: RunSettings, run_dir: Path):
        self.settings, self.run_dir = settings, Path(run_dir)
        self._previous_summary: str | None = None  # what summary.json said before this run marked it running

    def fit(self) -> dict:
        """Train; returns the run summary (also written to ``summary.json`` by the process that owns the run)."""
        crashed = self.mark_running() if self.writes_summary() else None
        stop = StopFlag().install()
        try:
            trees = self.seed_trees()
            if trees:
                self.record_seeds(trees)
            summary = self.train(stop)
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

    def record_seeds(self, trees: dict[str, SeedTree]) -> None:
        """(Re)write ``seeds.json`` with ``trees`` (a trainer calls it again when it starts a new worker)."""
        write_seeds(self.run_dir / "seeds.json", self.settings.seed, trees, drawn=self.settings.seed_drawn)

    def writes_summary(self) -> bool:
        """Whether this process writes the run's ``summary.json`` (False on distributed ranks > 0)."""
        return True

    @abstractmethod
    def seed_trees(self) -> dict[str, SeedTree]:
        """The seed trees this run uses, by worker name (recorded in ``seeds.json``)."""

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


def last_logged_step(run_dir: Path) -> int | None:
    """The last ``env_steps`` in the run's ``metrics.csv`` (for trainer=parallel: the most any agent logged)."""
    steps = []
    for path in [run_dir / "metrics.csv", *sorted(run_dir.glob("agent_*/metrics.csv"))]:
        try:
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
            if rows:
                steps.append(int(float(rows[-1]["env_steps"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(steps) if steps else None
