"""Progress display: a rich bar on a terminal, one plain line every N seconds elsewhere (CI, SLURM logs)."""

from __future__ import annotations

import math
import sys
import time
from collections import deque

RATE_WINDOW_S = 60.0  # the ETA follows the rate of the last minute: a run's speed changes (warm-up, evaluations)


class EtaEstimate:
    """Seconds left from the recent rate (the last ``RATE_WINDOW_S``), counted from ``rate_from`` env steps on.

    An off-policy run acts at random, without updates, until ``learning_starts``: several times faster than
    afterwards. Its steps would make the ETA far too short, so the rate only starts at ``rate_from``.
    """

    def __init__(self, total: int, *, rate_from: int = 0):
        self.total, self.rate_from = total, rate_from
        self._points: deque[tuple[float, int]] = deque()

    def add(self, now: float, env_steps: int) -> None:
        if env_steps < self.rate_from:
            return
        self._points.append((now, env_steps))
        while len(self._points) > 2 and now - self._points[1][0] >= RATE_WINDOW_S:
            self._points.popleft()

    def seconds_left(self, env_steps: int) -> float | None:
        """None until two points after ``rate_from`` give a rate."""
        if len(self._points) < 2:
            return None
        (t0, s0), (t1, s1) = self._points[0], self._points[-1]
        if s1 <= s0 or t1 <= t0:
            return None
        # the last rollout may overshoot the budget: never a negative eta
        return max(self.total - env_steps, 0) / ((s1 - s0) / (t1 - t0))

    def text(self, env_steps: int) -> str:
        left = self.seconds_left(env_steps)
        if left is not None:
            return f"{left:.0f}s"
        return f"- (learning starts at {self.rate_from})" if env_steps < self.rate_from else "-"


class ProgressDisplay:
    """``mode``: auto (rich on a TTY, plain otherwise), rich, plain, off. ``rate_from``: env steps from which
    the ETA's rate is measured (an off-policy algo's ``learning_starts``)."""

    def __init__(self, total: int, *, mode: str = "auto", interval_s: float = 10.0, initial: int = 0,
                 title: str = "training", rate_from: int = 0):
        if mode == "auto":
            mode = "rich" if sys.stdout.isatty() else "plain"
        self.mode, self.total, self.interval_s, self.title = mode, total, interval_s, title
        self._last_print = 0.0
        self._t0 = time.monotonic()
        self._start_steps = initial
        self.eta = EtaEstimate(total, rate_from=rate_from)
        self.eta.add(self._t0, initial)
        self.rows: list[str] = []  # extra lines shown under the bar (e.g. one per actor); see ``set_rows``
        if mode == "rich":
            self._bar = _rich_progress(self)
            self._task = self._bar.add_task(title, total=total, completed=initial, info="", eta="-")
            self._bar.start()

    def update(self, env_steps: int, *, sps: float, episode_return: float | None,
               per_agent: dict[str, float] | None = None) -> None:
        """``per_agent``: a multi-agent env's recent return of each agent (shown after the mean)."""
        if self.mode == "off":
            return
        ret = "-" if episode_return is None or math.isnan(episode_return) else f"{episode_return:.1f}"
        if per_agent:
            ret += " (" + ", ".join(f"{a} {v:.1f}" for a, v in per_agent.items()) + ")"
        now = time.monotonic()
        self.eta.add(now, env_steps)
        if self.mode == "rich":
            self._bar.update(self._task, completed=min(env_steps, self.total), info=f"{sps:,.0f} sps  return {ret}",
                             eta=self.eta.text(env_steps))
            return
        if now - self._last_print >= self.interval_s or env_steps >= self.total:
            self._last_print = now
            # the last rollout may overshoot the budget: never print (102%)
            pct = min(100.0, 100 * env_steps / max(self.total, 1))
            print(f"[{self.title}] {min(env_steps, self.total)}/{self.total} steps ({pct:.0f}%)  "
                  f"{sps:,.0f} sps  return {ret}  eta {self.eta.text(env_steps)}", flush=True)

    def set_rows(self, rows: list[str]) -> None:
        """Lines shown under the rich bar (redrawn with it); plain mode prints nothing here."""
        self.rows = list(rows)

    def close(self, summary: dict | None = None) -> None:
        if self.mode == "rich":
            self._bar.stop()
        if self.mode == "off" or not summary:
            return
        if self.mode == "rich":
            from rich.console import Console
            from rich.markup import escape
            from rich.table import Table

            table = Table(title="rltrain summary", show_header=False)
            for k, v in summary.items():  # escaped: rich would read "[env.kwargs.length: 5 -> 8]" as a style tag
                table.add_row(k, escape(_fmt(v)))
            Console().print(table)
        else:
            print("[summary] " + "  ".join(f"{k}={_fmt(v)}" for k, v in summary.items()), flush=True)


def _rich_progress(display: ProgressDisplay):
    """A rich Progress whose live view is the bar and, below it, ``display.rows`` as plain text lines.

    Rows inside a task's column would stretch the bar's table (cutting the step count) and add a task that
    has no total (``0/?``); rendered after the tasks table they cost the bar nothing.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.text import Text

    class RowsProgress(Progress):
        def get_renderables(self):
            yield self.make_tasks_table(self.tasks)
            rows = display.rows  # replaced as a whole by the main thread, read here by rich's refresh thread
            if rows:
                yield Text("\n".join(rows))

    return RowsProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                        TextColumn("eta {task.fields[eta]}"), refresh_per_second=4)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.4g}"
    return str(v)
