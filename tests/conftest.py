"""Shared fixtures: Hydra composition (as the app composes), CLI subprocess runs, /dev/shm and process checks."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "rltrain" / "conf"
# the per-user key that signs env sidecars (run/checkpoint.py): a temp dir for the whole session, inherited by
# every subprocess, so tests never write into the real ~/.config
# (made only where none is set yet, and removed at exit by the process that made it: the subprocesses and
# xdist workers inherit it, and made one each before, leaving hundreds of empty dirs in /tmp)
if "RLTRAIN_CONFIG_DIR" not in os.environ:
    os.environ["RLTRAIN_CONFIG_DIR"] = tempfile.mkdtemp(prefix="rltrain-config-")
    atexit.register(shutil.rmtree, os.environ["RLTRAIN_CONFIG_DIR"], ignore_errors=True)
REPO = Path(__file__).resolve().parent.parent


def compose_cfg(overrides: list[str] | None = None) -> DictConfig:
    """Compose ``train.yaml`` with overrides, exactly as ``rltrain`` would (``experiment=auto`` resolved first)."""
    from rltrain.cli.presets import resolve_experiment

    overrides, _ = resolve_experiment(list(overrides or []))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=False)


@pytest.fixture
def cfg_factory():
    return compose_cfg


def run_cli(args: list[str], *, cwd: Path, timeout: float = 300, env: dict | None = None,
            module: str = "rltrain") -> subprocess.CompletedProcess:
    """Run ``python -m rltrain <args>`` (same code as the console script) in ``cwd``."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env)


@pytest.fixture
def cli(tmp_path):
    def _run(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
        return run_cli(list(args), cwd=tmp_path, timeout=timeout, env=env)

    return _run


def shm_entries() -> set[str]:
    try:
        return {p for p in os.listdir("/dev/shm") if p.startswith(("sem.mp-", "psm_", "torch_", "wnsm_"))}
    except FileNotFoundError:
        return set()


def child_pids(pid: int | None = None) -> set[int]:
    """PIDs of the (recursive) children of ``pid`` (default: this process)."""
    pid = pid or os.getpid()
    out: set[int] = set()
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return out
    for k in map(int, kids):
        out.add(k)
        out |= child_pids(k)
    return out


def _helper_servers() -> set[int]:
    """multiprocessing's own servers in this test process (the forkserver, the resource tracker): a run made
    in-process (``build.run``) starts them once and they serve every later one; they are not the run's
    processes (its workers, the servers' children, still count)."""
    from multiprocessing import forkserver, resource_tracker

    pids = {getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None)}
    return {p for p in pids if p}


def leftover_children() -> set[int]:
    return child_pids() - _helper_servers()


def held_shm_entries(pids: Iterable[int] | None = None) -> set[str]:
    """The /dev/shm entries that live processes (``pids``, default: all) have open or mapped."""
    held: set[str] = set()
    if pids is None:
        pids = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    for pid in pids:
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                target = os.readlink(fd.path)
                if target.startswith("/dev/shm/"):
                    held.add(target[len("/dev/shm/"):].removesuffix(" (deleted)"))
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    at = line.find("/dev/shm/")
                    if at >= 0:
                        held.add(line[at + len("/dev/shm/"):].strip().removesuffix(" (deleted)"))
        except (FileNotFoundError, PermissionError, ProcessLookupError, NotADirectoryError):
            continue  # the process ended while being read
    return held


class ShmWatch:
    """Which /dev/shm entries this test's own processes (this one and its descendants) held while it ran,
    sampled by a thread. A leak is an entry one of them held that is left behind with no live holder; entries
    of other test runs on this machine (pytest-xdist's other worker) are theirs, not this test's."""

    def __init__(self, period: float = 0.1) -> None:
        self.before, self.ours, self.period = shm_entries(), set(), period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="shm-watch")
        self._thread.start()

    def sample(self) -> None:
        self.ours.update(held_shm_entries({os.getpid(), *child_pids()}))  # in place: the thread and a test both sample

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def leaked(self) -> set[str]:
        suspects = (shm_entries() - self.before) & self.ours
        return suspects - held_shm_entries() if suspects else suspects


@pytest.fixture
def no_leaks():
    """Asserts that the test leaves no ownerless /dev/shm entry of its own and no child processes behind."""
    watch = ShmWatch()
    try:
        yield watch
    finally:
        watch.stop()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (leftover_children() or watch.leaked()):
        _reap_zombies()  # exited processes re-parented to us (see orphan_watch) are gone, not orphans
        time.sleep(0.2)
    assert not leftover_children(), f"orphan child processes: {leftover_children()}"
    assert not watch.leaked(), f"leaked /dev/shm entries: {watch.leaked()}"


@pytest.fixture
def orphan_watch(no_leaks):
    """``no_leaks`` that also sees grandchildren whose parent died: the test process becomes a child
    subreaper (Linux prctl), so orphans are re-parented to it instead of init. Zombies (processes that did
    exit, e.g. a resource tracker after its parent) are reaped here; live orphans are left for ``no_leaks``."""
    import ctypes
    import time

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    try:
        yield
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            _reap_zombies()
            if not leftover_children():
                break
            time.sleep(0.1)
    finally:
        libc.prctl(36, 0, 0, 0, 0)  # later tests see orphans of their own only


def _reap_zombies() -> None:
    import contextlib

    for pid in [p for p in child_pids() if _state(p) == "Z"]:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "?"
