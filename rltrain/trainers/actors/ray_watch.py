"""A lost Ray head ends the learner from inside Ray: its driver's core worker exits the process at once, with no
Python code run (no handler, no ``finally``), when the raylet it is attached to dies with the head. So the run's
end is written by a watcher outside it: a small process started when the run joins a cluster, holding the read
end of a pipe whose write end only the learner holds. The learner's death closes it; if the run's
``summary.json`` still says ``running`` with the learner's pid, the watcher records it ``failed`` (the last
checkpoint, the last step logged), naming the Ray head if it no longer answers, and says so in one line on the
learner's stderr. A learner that ends normally tells the watcher first (one byte), and it exits in silence.

    python -m rltrain.trainers.actors.ray_watch <learner pid> <run dir> <head host:port>   (stdin: the pipe)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

DONE = b"d"


class RunWatcher:
    """The learner's side: start the watcher, and tell it (``done``) when the run ended by itself."""

    def __init__(self, run_dir: Path, head: str):
        read, self._write = os.pipe()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid()), str(run_dir), head],
                                         stdin=read, stdout=subprocess.DEVNULL, close_fds=True)
        finally:
            os.close(read)

    def done(self) -> None:
        if self._write >= 0:
            try:
                os.write(self._write, DONE)
            finally:
                os.close(self._write)
                self._write = -1
            self.proc.wait(timeout=10)


def _answers(head: str) -> bool:
    host, _, port = head.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            return True
    except (OSError, ValueError):
        return False


def main(pid: int, run_dir: Path, head: str) -> int:
    said = sys.stdin.buffer.read(1)  # blocks until the learner says done, or dies (EOF)
    if said == DONE:
        return 0
    import json

    from rltrain.run.summary import newest_checkpoint, record_lost

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return 0
    if summary.get("status") != "running" or summary.get("pid") != pid:
        return 0  # it wrote how it ended (or another run owns the dir now)
    why = (f"the Ray head at {head} stopped answering (lost) and Ray ended the learner (pid {pid})" if not
           _answers(head) else f"the learner (pid {pid}) ended without a word while joined to the Ray cluster at "
                               f"{head} (killed from outside or by Ray)")
    if record_lost(run_dir, why):
        ckpt = newest_checkpoint(run_dir)
        print(f"rltrain: error: {why}; summary.json says failed; last checkpoint: {ckpt or 'none'}; resume with "
              "resume=auto once the cluster is back", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))
