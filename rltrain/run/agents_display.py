"""One progress display for many agents: a rich table (a row per agent) on a terminal, plain lines elsewhere.

Fed by the agents' progress messages in the parent; the agents themselves print nothing.
"""

from __future__ import annotations

import math
import sys
import time


class AgentsDisplay:
    """``mode``: auto (rich on a TTY, plain otherwise), rich, plain, off. One row per agent:
    env steps / total, SPS, recent training return, status."""

    def __init__(self, totals: list[int], *, mode: str = "auto", interval_s: float = 10.0):
        if mode == "auto":
            mode = "rich" if sys.stdout.isatty() else "plain"
        self.mode, self.interval_s = mode, interval_s
        self.rows = [{"steps": 0, "total": t, "sps": 0.0, "ret": None, "status": "starting"} for t in totals]
        self._last_print = 0.0
        self._dirty = False
        self._live = None
        if mode == "rich":
            from rich.live import Live

            self._live = Live(self._table(), refresh_per_second=4, transient=False)
            self._live.start()

    def update(self, k: int, *, env_steps: int, sps: float, episode_return: float | None) -> None:
        self.rows[k].update(steps=env_steps, sps=sps, ret=episode_return)
        self._dirty = True

    def set_status(self, k: int, status: str) -> None:
        self.rows[k]["status"] = status
        self._dirty = True
        if self.mode == "plain":
            print(f"[agent_{k}] {status}", flush=True)

    def note(self, text: str) -> None:
        if self.mode == "rich":
            self._live.console.print(text)  # type: ignore[union-attr]
        elif self.mode == "plain":
            print(f"[parallel] {text}", flush=True)

    def refresh(self) -> None:
        if self.mode == "off" or not self._dirty:
            return
        if self.mode == "rich":
            self._live.update(self._table())  # type: ignore[union-attr]
            self._dirty = False
            return
        now = time.monotonic()
        if now - self._last_print >= self.interval_s:
            self._last_print, self._dirty = now, False
            for k, r in enumerate(self.rows):
                print(f"[agent_{k}] {r['steps']}/{r['total']} steps ({100 * r['steps'] / max(r['total'], 1):.0f}%)  "
                      f"{r['sps']:,.0f} sps  return {_ret(r['ret'])}  {r['status']}", flush=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.stop()
            self._live = None

    def _table(self):
        from rich.table import Table

        table = Table(title="rltrain parallel")
        for col in ("agent", "env steps", "%", "SPS", "return", "status"):
            table.add_column(col, justify="right" if col not in ("agent", "status") else "left")
        for k, r in enumerate(self.rows):
            table.add_row(f"agent_{k}", f"{r['steps']:,}/{r['total']:,}",
                          f"{100 * r['steps'] / max(r['total'], 1):.0f}", f"{r['sps']:,.0f}", _ret(r["ret"]),
                          r["status"])
        return table


def _ret(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1f}"
