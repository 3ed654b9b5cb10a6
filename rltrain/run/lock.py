"""One owner per run dir: an OS lock on ``<run dir>/.rltrain.lock``.

``fcntl.flock`` belongs to the open file, so the kernel drops it when the owner exits in any way (SIGKILL, a
SLURM preemption, a crash): a stale lock file never blocks the next run, a requeued job finds the dir free.
The holder's PID is written into the file only so the refusal can name it.

Who takes it: the process that owns the run (the CLI process; rank 0 of a torchrun / SLURM launch). Processes
it starts (parallel agents, locally spawned ranks, actors) work under its lock and take none.

Before the lock is taken, the run dir is checked for what rltrain must never write through (SQLite's rule: a
tool never corrupts what it did not write): a symbolic link that leads out of the run dir (a copied run dir
whose ``config.yaml`` points at someone's file would have it overwritten), and, among the names rltrain itself
writes, any link or anything that is not a regular file (a FIFO named ``metrics.csv`` or like a checkpoint
would block the run). Such a run dir is refused in one line naming every offender. The trackers' own dirs
(``wandb/``, ``mlruns/``) are theirs: rltrain writes nothing there, and wandb links its debug log out of the run.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
from pathlib import Path

from rltrain.errors import ConfigError
from rltrain.run.trust import kind_of

LOCK_FILE = ".rltrain.lock"
# what rltrain writes in a run dir (each parallel agent's agent_<k>/ the same), and its directories of files
OWN_FILES = ("config.yaml", "seeds.json", "model.txt", "summary.json", "metrics.csv", "error.txt", LOCK_FILE,
             "train.log", "learning_curves.png", "trackers.json")
OWN_DIRS = ("checkpoints",)
# what the trackers' own libraries write and link as they please (wandb links its debug log to ~/.cache/wandb):
# rltrain writes nothing there, so their links are theirs, and are not walked
TRACKER_DIRS = ("wandb", "mlruns")
_AGENT_DIR = re.compile(r"^agent_\d+$")


def owns_run(env: dict | None = None) -> bool:
    """True unless this process is a non-zero rank of an external launch (torchrun RANK, SLURM_PROCID)."""
    env = os.environ if env is None else env
    if "RANK" in env:
        return env["RANK"].strip() == "0"
    ntasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    if "SLURM_PROCID" in env and ntasks.strip().isdigit() and int(ntasks) > 1:
        return env["SLURM_PROCID"].strip() == "0"
    return True


def check_ranks(*, trainer: str, takes_ranks: bool, env: dict | None = None) -> None:
    """Refuse a process that is one of several of an external launch (torchrun, a multi-task SLURM step) when
    its trainer does not take ranks: every process would run the whole run in the same dir, and only rank 0
    takes the lock (``owns_run``)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        size, source = env["WORLD_SIZE"].strip(), "torchrun's WORLD_SIZE"
    elif "SLURM_PROCID" in env:
        size = (env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1").strip()
        source = "a SLURM step of (hydra.launcher.tasks_per_node x nodes, srun --ntasks)"
    else:
        return
    if takes_ranks or not size.isdigit() or int(size) <= 1:
        return
    raise ConfigError(f"trainer={trainer} runs in one process, but this is one of {size} tasks of {source}: each "
                      f"would run the whole run in one run dir. Use trainer=distributed_simulator (each task one "
                      f"rank of the run) or launch one task per run")


class RunDirLock:
    """``with RunDirLock(run_dir):`` holds the run dir; a second holder gets a one-line ConfigError."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        check_run_dir(self.path.parent)
        try:  # never through a link (check_run_dir refused one; this closes the race)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            raise ConfigError(f"hydra.run.dir={self.path.parent}: cannot open its lock file {self.path} "
                              f"({err.strerror or err}); pick another hydra.run.dir") from None
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


def check_run_dir(run_dir: Path) -> None:
    """Refuse, in one line naming them, a run dir holding links that lead out of it, or links / non-regular
    files where rltrain writes its own files (see the module docstring)."""
    offenders = run_dir_offenders(Path(run_dir))
    if offenders:
        shown = ", ".join(offenders[:8]) + (f" and {len(offenders) - 8} more" if len(offenders) > 8 else "")
        raise ConfigError(f"hydra.run.dir={run_dir}: refusing to write into a run dir holding {shown}: rltrain "
                          "writes only regular files of its own there; replace them by the files themselves (cp -L) "
                          "or pick another hydra.run.dir")


def run_dir_offenders(run_dir: Path) -> list[str]:
    """``name -> target`` for each link leading out of ``run_dir``, ``name (a FIFO)``... for each link or
    non-regular file at a name rltrain writes; paths relative to the run dir, links not followed."""
    try:
        root = run_dir.resolve()
    except OSError:
        return []
    found: list[str] = []
    for top, dirs, files in os.walk(run_dir, followlinks=False, onerror=lambda err: None):
        here = Path(top)
        parts = here.relative_to(run_dir).parts
        if parts and _AGENT_DIR.match(parts[0]):
            parts = parts[1:]  # an agent's dir of trainer=parallel holds what a run dir holds
        own_dir, in_checkpoints = parts in ((), OWN_DIRS[:1]), parts == OWN_DIRS[:1]
        if parts == ():
            dirs[:] = [d for d in dirs if d not in TRACKER_DIRS]  # os.walk descends into what is left
        for name in [*dirs, *files]:
            path = here / name
            rel = str(path.relative_to(run_dir))
            try:
                st = path.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(path)
                if not _inside(path, root):
                    found.append(f"{rel} -> {target} (a link out of the run dir)")
                elif own_dir and (name in OWN_FILES or name in OWN_DIRS or in_checkpoints):
                    found.append(f"{rel} -> {target} (a link where rltrain writes its own file)")
            elif own_dir and (name in OWN_FILES or in_checkpoints) and not stat.S_ISREG(st.st_mode):
                found.append(f"{rel} ({kind_of(st.st_mode)}, not a regular file)")
    return sorted(found)


def _inside(link: Path, root: Path) -> bool:
    try:
        target = link.resolve()  # follows the whole chain; a dangling link resolves as far as it can
    except (OSError, RuntimeError):  # a loop
        return False
    return target == root or root in target.parents
