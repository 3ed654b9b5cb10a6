"""Metric sinks: CSV, TensorBoard (W&B and MLflow: trackers.py). Scalar names use slash namespaces
(``rollout/episode_return``).

Columns under ``time/`` are wall-clock dependent; everything else is a function of the seed.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Protocol

from rltrain.data.structs import Metrics

WALL_CLOCK_PREFIX = "time/"
EVAL_PREFIX = "eval/"  # the columns an evaluation adds to its row


class MetricLogger(Protocol):
    # again: the row of a step logged before, cut short (its evaluation, owed after a stop, now run): a file sink
    # was cut back to before that step and takes it whole; a tracker holds the step already and takes what is new
    def log(self, step: int, metrics: Metrics, *, again: bool = False) -> None: ...
    def close(self, summary: dict | None = None) -> None: ...  # summary: what summary.json says, at the end


class CSVLogger:
    """``metrics.csv``: one row per log interval. New keys widen the header (the file is rewritten)."""

    def __init__(self, path: Path, *, resume: bool = False):
        self.path = Path(path)
        self.rows: list[dict] = []
        self.columns: list[str] = ["env_steps"]
        if resume and self.path.exists():
            with open(self.path, newline="") as f:
                reader = csv.DictReader(f)
                self.columns = list(reader.fieldnames or self.columns)
                self.rows = list(reader)

    def truncate_after(self, env_steps: int) -> None:
        """On resume, drop rows logged after the checkpoint (they will be logged again)."""
        self.rows = [r for r in self.rows if int(float(r["env_steps"])) <= env_steps]
        self._rewrite()

    def last_step(self) -> int:
        """The env step of the last row (-1 when there is none)."""
        return int(float(self.rows[-1]["env_steps"])) if self.rows else -1

    def log(self, step: int, metrics: Metrics, *, again: bool = False) -> None:
        row = {"env_steps": step, **{k: _fmt(v) for k, v in metrics.items()}}
        self.rows.append(row)
        new = [k for k in row if k not in self.columns]
        if new:
            self.columns += new
            self._rewrite()
            return
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.columns).writerow(row)

    def _rewrite(self) -> None:
        tmp = self.path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, self.columns)
            w.writeheader()
            w.writerows(self.rows)
        tmp.replace(self.path)

    def close(self, summary: dict | None = None) -> None:
        pass


def _fmt(v: float) -> float | str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else v


class TensorBoardLogger:
    def __init__(self, directory: Path, *, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events written after the checkpoint we resumed from
        self.writer = SummaryWriter(str(directory), purge_step=purge_step)

    def log(self, step: int, metrics: Metrics, *, again: bool = False) -> None:
        for k, v in metrics.items():
            if v is not None and not (isinstance(v, float) and math.isnan(v)):
                self.writer.add_scalar(k, v, step)

    def close(self, summary: dict | None = None) -> None:
        self.writer.flush()
        self.writer.close()


def read_metrics(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
