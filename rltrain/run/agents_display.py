"""One progress display for many agents: a rich table (a row per agent) on a terminal, plain lines elsewhere.

Fed by the agents' progress messages in the parent. What an agent process prints itself (a warning, an env's
own output) goes to the shared stdout/stderr; without a terminal each of those lines is prefixed with the
agent and written whole (``prefix_agent_output``), so K agents' lines never cut into each other.
"""

from __future__ import annotations

import io
import math
import os
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
            from rich.markup import escape

            self._live.console.print(escape(text))  # type: ignore[union-attr]
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
        from rich.markup import escape
        from rich.table import Table

        table = Table(title="rltrain parallel")
        for col in ("agent", "env steps", "%", "SPS", "return", "status"):
            table.add_column(col, justify="right" if col not in ("agent", "status") else "left")
        for k, r in enumerate(self.rows):
            table.add_row(f"agent_{k}", f"{r['steps']:,}/{r['total']:,}",
                          f"{100 * r['steps'] / max(r['total'], 1):.0f}", f"{r['sps']:,.0f}", _ret(r["ret"]),
                          escape(r["status"]))  # a failure's line as it is, "[...]" no style tag
        return table


def _ret(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1f}"


class PrefixedLines(io.TextIOBase):
    """A text stream for one agent process: buffers until a newline, then writes ``<prefix><line>\n`` with one
    ``os.write`` per line to the inherited file descriptor.

    One write per whole line is what keeps lines intact: a pipe takes a write of up to PIPE_BUF (4 KiB) bytes
    atomically, and processes sharing a file's offset append whole writes. A partial line waits for its newline
    (``flush`` does not write it: another agent's line would land in the middle).
    """

    def __init__(self, stream, prefix: str):
        super().__init__()
        stream.flush()  # whatever the process wrote before goes out first, unprefixed but in order
        self._fd, self._prefix, self._pending = stream.fileno(), prefix, ""
        self._encoding = getattr(stream, "encoding", None) or "utf-8"

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            *lines, self._pending = self._pending.split("\n")
            for line in lines:
                self._write_line(line)
        return len(text)

    def finish(self) -> None:
        """Write a last line that never got its newline."""
        if self._pending:
            line, self._pending = self._pending, ""
            self._write_line(line)

    def _write_line(self, line: str) -> None:
        data = f"{self._prefix}{line}\n".encode(self._encoding, errors="replace")
        while data:  # a short write (a full pipe, a signal) goes on where it stopped
            data = data[os.write(self._fd, data):]


def prefix_agent_output(index: int) -> list[PrefixedLines]:
    """In agent ``index``'s process: prefix its stdout and stderr lines with ``[agent_<index>] `` unless stdout
    is a terminal (there the parent's rich table owns the screen). Returns the streams to ``finish``."""
    if sys.stdout is None or sys.stdout.isatty():
        return []
    streams = []
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            wrapped = PrefixedLines(stream, f"[agent_{index}] ")
        except (AttributeError, OSError, io.UnsupportedOperation):  # no file descriptor (captured by a harness)
            continue
        setattr(sys, name, wrapped)
        streams.append(wrapped)
    return streams
