"""Helpers shared by the sweep / submitit / SLURM tests: tiny budgets, reading a sweep dir, signalling a job."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from tests.conftest import REPO, child_pids

# the smallest run that still logs, evaluates and checkpoints
TINY = ["debug=smoke", "logger=quiet", "total_env_steps=256", "eval.every_env_steps=0", "eval.episodes=1"]
ENV = {"PYTHONPATH": str(REPO)}  # jobs import tests.helpers.faulty_envs


def summaries(sweep_dir: Path) -> dict[str, dict]:
    """{job subdir name: summary.json} for every job of a sweep dir."""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(Path(sweep_dir).glob("*/summary.json"))}


def by_job_num(sweep_dir: Path) -> dict[int, dict]:
    return {int(name.split("_", 1)[0]): s for name, s in summaries(sweep_dir).items()}


def wait_for(predicate, *, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def csv_rows(path: Path) -> int:
    try:
        return max(len(path.read_text().splitlines()) - 1, 0)
    except FileNotFoundError:
        return 0


def submitit_task_pids(root_pid: int) -> list[int]:
    """PIDs of submitit task processes (``submitit.core._submit``) below ``root_pid``."""
    out = []
    for pid in child_pids(root_pid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except FileNotFoundError:
            continue
        if "submitit.core._submit" in cmd:
            out.append(pid)
    return out


def send(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
