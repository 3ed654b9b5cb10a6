"""One owner per run dir: an OS lock on ``<run dir>/.rltrain.lock``.

``fcntl.flock`` belongs to the open file, so the kernel drops it when the owner exits in any way (SIGKILL, a
SLURM preemption, a crash): a stale lock file never blocks the next run, a requeued job finds the dir free.
The holder's PID is written into the file only so the refusal can name it.

Who takes it: the process that owns the run (the CLI process; rank 0 of a torchrun / SLURM launch). Processes
it starts (parallel agents, locally spawned ranks, actors) work under its lock and take none.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from rltrain.errors import ConfigError

LOCK_FILE = ".rltrain.lock"


def owns_run(env: dict | None = None) -> bool:
    """True unless this process is a non-zero rank of an external launch (torchrun RANK, SLURM_PROCID)."""
    env = os.environ if env is None else env
    if "RANK" in env:
        return env["RANK"].strip() == "0"
    ntasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    if "SLURM_PROCID" in env and ntasks.strip().isdigit() and int(ntasks) > 1:
        return env["SLURM_PROCID"].strip() == "0"
    return True


class RunDirLock:
    """``with RunDirLock(run_dir):`` holds the run dir; a second holder gets a one-line ConfigError."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(f"hydra.run.dir={self.path.parent}: another rltrain run (pid {holder}) is using this "
                              "run dir; wait for it to end or stop it, or pick another hydra.run.dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            # the file stays: deleting it would let a third process lock a fresh inode while a second holds the old
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
