"""Progress display: a rich bar on a terminal, one plain line every N seconds elsewhere (CI, SLURM logs)."""

from __future__ import annotations

import math
import sys
import time


class ProgressDisplay:
    """``mode``: auto (rich on a TTY, plain otherwise), rich, plain, off."""

    def __init__(self, total: int, *, mode: str = "auto", interval_s: float = 10.0, initial: int = 0,
                 title: str = "training"):
        if mode == "auto":
            mode = "rich" if sys.stdout.isatty() else "plain"
        self.mode, self.total, self.interval_s, self.title = mode, total, interval_s, title
        self._last_print = 0.0
        self._t0 = time.monotonic()
        self._start_steps = initial
        self.rows: list[str] = []  # extra lines shown under the bar (e.g. one per actor); see ``set_rows``
        if mode == "rich":
            self._bar = _rich_progress(self)
            self._task = self._bar.add_task(title, total=total, completed=initial, info="")
            self._bar.start()

    def update(self, env_steps: int, *, sps: float, episode_return: float | None) -> None:
        if self.mode == "off":
            return
        ret = "-" if episode_return is None or math.isnan(episode_return) else f"{episode_return:.1f}"
        if self.mode == "rich":
            self._bar.update(self._task, completed=min(env_steps, self.total), info=f"{sps:,.0f} sps  return {ret}")
            return
        now = time.monotonic()
        if now - self._last_print >= self.interval_s or env_steps >= self.total:
            self._last_print = now
            done = env_steps - self._start_steps
            # the last rollout may overshoot the budget: never print (102%) or a negative eta
            left = max(self.total - env_steps, 0)
            eta = left / max(done / max(now - self._t0, 1e-9), 1e-9)
            pct = min(100.0, 100 * env_steps / max(self.total, 1))
            print(f"[{self.title}] {min(env_steps, self.total)}/{self.total} steps ({pct:.0f}%)  "
                  f"{sps:,.0f} sps  return {ret}  eta {eta:.0f}s", flush=True)

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
            from rich.table import Table

            table = Table(title="rltrain summary", show_header=False)
            for k, v in summary.items():
                table.add_row(k, _fmt(v))
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
        TimeRemainingColumn,
    )
    from rich.text import Text

    class RowsProgress(Progress):
        def get_renderables(self):
            yield self.make_tasks_table(self.tasks)
            rows = display.rows  # replaced as a whole by the main thread, read here by rich's refresh thread
            if rows:
                yield Text("\n".join(rows))

    return RowsProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"),
                        TimeRemainingColumn(), refresh_per_second=4)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.4g}"
    return str(v)
