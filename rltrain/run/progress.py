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
        if mode == "rich":
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"),
                                 TimeRemainingColumn(), refresh_per_second=4)
            self._task = self._bar.add_task(title, total=total, completed=initial, info="")
            self._bar.start()

    def update(self, env_steps: int, *, sps: float, episode_return: float | None) -> None:
        if self.mode == "off":
            return
        ret = "-" if episode_return is None or math.isnan(episode_return) else f"{episode_return:.1f}"
        if self.mode == "rich":
            self._bar.update(self._task, completed=env_steps, info=f"{sps:,.0f} sps  return {ret}")
            return
        now = time.monotonic()
        if now - self._last_print >= self.interval_s or env_steps >= self.total:
            self._last_print = now
            done = env_steps - self._start_steps
            eta = (self.total - env_steps) / max(done / max(now - self._t0, 1e-9), 1e-9)
            print(f"[{self.title}] {env_steps}/{self.total} steps ({100 * env_steps / self.total:.0f}%)  "
                  f"{sps:,.0f} sps  return {ret}  eta {eta:.0f}s", flush=True)

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


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.4g}"
    return str(v)
