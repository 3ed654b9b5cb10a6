"""What the SLURM launcher says and does around its job array: sbatch's refusals in one line, jobs pending
for a reason that never clears, and stopping the array when the sweep is stopped.

submitit raises sbatch's stderr as a ``FailedJobError`` and waits on jobs without looking at why one is
pending; the launcher (``rltrain.sweeps.requeue.Resumable``) calls these around ``map_array`` and its wait.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rltrain.errors import ConfigError

STOP_GRACE_S = 60.0  # a stopped sweep gives its running jobs this long to checkpoint on SIGTERM, then cancels them
PENDING_CHECK_S = 10.0  # how often the wait asks squeue why a job is pending
SLURM_CMD_TIMEOUT_S = 30
LIVE = "PD,CF,R,CG,S,RQ,RS,RH,SI,SO,ST"  # the states of a job still queued or running (squeue -t)
SIZE_KEYS = ("cpus_per_task", "tasks_per_node", "nodes", "mem_gb", "gpus_per_node")

# sbatch's refusal (a fragment of its message, lower case) -> what to change; {asked} is the size asked for
REFUSALS = (
    ("invalid partition", "set hydra.launcher.partition to one of the cluster's partitions{partitions}"),
    ("node configuration is not available", "no node of the partition has that much: lower {asked}"),
    ("memory specification can not be satisfied", "lower hydra.launcher.mem_gb ({asked})"),
    ("invalid generic resource", "lower or unset hydra.launcher.gpus_per_node ({asked})"),
    ("time limit", "lower hydra.launcher.timeout_min to the partition's limit"),
    ("invalid account", "set the account the cluster knows (hydra.launcher.additional_parameters)"),
    ("invalid qos", "set a QOS the cluster knows (hydra.launcher.qos)"),
    ("unable to contact slurm controller", "SLURM's controller does not answer: check the cluster (sinfo) and "
                                           "submit again"),
    ("no such file or directory", "sbatch is not on PATH: hydra/launcher=slurm submits to a SLURM cluster "
                                  "(hydra/launcher=local runs the sweep on this machine)"),
    ("socket timed out", "SLURM's controller does not answer in time: check the cluster (sinfo) and submit again"),
)

# squeue's pending reasons that no wait clears (the request exceeds what the partition is or allows) -> the keys
HOPELESS = {
    "PartitionConfig": "it asks for more than any node of its partition has: lower hydra.launcher.cpus_per_task x "
                       "tasks_per_node, mem_gb or gpus_per_node",
    "PartitionNodeLimit": "it asks for more nodes than its partition allows: lower hydra.launcher.nodes",
    "PartitionTimeLimit": "it asks for more time than its partition allows: lower hydra.launcher.timeout_min",
    "BadConstraints": "no node of its partition meets its constraints (hydra.launcher.constraint)",
    "ReqNodeNotAvail": "the nodes it needs are down, drained or reserved: it starts only when they come back",
}


def sbatch_refusal(said: str, *, params: dict[str, Any]) -> str:
    """The one line for sbatch's refusal ``said`` (its stderr): what sbatch said and the key that fixes it."""
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    # sbatch's first error line is the specific one ("invalid partition specified: x"); the last is generic
    errors = [ln.removeprefix("sbatch: error: ") for ln in lines if ln.startswith("sbatch: error:")] or lines or ["?"]
    text = errors[0].removeprefix("Batch job submission failed: ")
    low = " ".join(errors).lower()
    asked = ", ".join(f"hydra.launcher.{k}={params[k]}" for k in SIZE_KEYS if params.get(k) is not None)
    fix = next((f for fragment, f in REFUSALS if fragment in low), "check the hydra.launcher.* settings")
    # sinfo only where the line names the partitions: with the controller down it takes SLURM's own retries
    # (about 9 s) to say so, which every other refusal would wait out for nothing
    fix = fix.format(asked=asked, partitions=_partitions() if "{partitions}" in fix else "")
    return f"sbatch refused the sweep's job array: {text}; {fix}. Nothing was submitted"


def _partitions() -> str:
    """`` (this cluster's: a, b)`` from sinfo, or nothing when sinfo does not answer."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True,
                             timeout=SLURM_CMD_TIMEOUT_S).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f" (this cluster's: {', '.join(out)})" if out else ""


def hopeless_reason(reason: str) -> str | None:
    """Why a job pending for ``reason`` will not start as asked, or None for a reason a wait clears."""
    return HOPELESS.get(reason)


class Leftovers:
    """What a submission that sbatch refused leaves: taken before ``map_array``, ``discard()`` removes what
    this command added to the sweep dir (submitit's pickles and script under ``.submitit/``; Hydra's
    ``multirun.yaml`` and the dir itself when the sweep dir held nothing else before)."""

    def __init__(self, sweep_dir: Path, *, cwd: Path):
        self.sweep_dir = Path(sweep_dir)
        self.cwd = Path(cwd).resolve()
        self.submitit = self.sweep_dir / ".submitit"
        self.before = set(self.submitit.iterdir()) if self.submitit.is_dir() else None
        others = [p for p in self.sweep_dir.iterdir() if p.name not in ("multirun.yaml", ".submitit")]
        self.fresh = self.before is None and not others  # Hydra made it for this sweep

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            if self.fresh:
                shutil.rmtree(self.sweep_dir)
                self._remove_empty_parents()
                return
            for path in set(self.submitit.iterdir()) - (self.before or set()):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            if self.before is None:
                self.submitit.rmdir()

    def _remove_empty_parents(self) -> None:
        # Hydra's default sweep dir is multirun/<date>/<time>: the dated dirs it made are empty now. Only dirs
        # under the working dir, and only empty ones, go (an empty dir there that was made by hand may go too)
        parent = self.sweep_dir.resolve().parent
        while parent != self.cwd and self.cwd in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                return
            parent = parent.parent


def squeue(array_ids: list[str], *args: str) -> list[list[str]] | None:
    """squeue's rows (``|``-separated fields of ``-o``) for the tasks of these arrays, one row per array task;
    None when squeue does not answer."""
    try:
        res = subprocess.run(["squeue", "-h", "-r", "-j", ",".join(array_ids), *args], capture_output=True,
                             text=True, timeout=SLURM_CMD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None if "Invalid job id" not in res.stderr else []  # every job has left the queue
    return [ln.split("|") for ln in res.stdout.splitlines() if ln.strip()]


class PendingWatch:
    """Called while the launcher waits: one line per job that is pending for a reason that never clears."""

    def __init__(self, jobs: dict[str, int]):
        self.jobs = jobs  # SLURM job id ("123_4") -> Hydra job num
        self.arrays = sorted({job_id.split("_")[0] for job_id in jobs})
        self.told: set[tuple[str, str]] = set()
        self.next_check = time.monotonic() + PENDING_CHECK_S / 2

    def check(self) -> None:
        if time.monotonic() < self.next_check:
            return
        self.next_check = time.monotonic() + PENDING_CHECK_S
        for row in squeue(self.arrays, "-t", "PD", "-o", "%i|%r") or []:
            if len(row) != 2 or (row[0], row[1]) in self.told or row[0] not in self.jobs:
                continue
            why = hopeless_reason(row[1])
            if why:
                self.told.add((row[0], row[1]))
                print(f"rltrain: job {self.jobs[row[0]]} (SLURM {row[0]}) is pending with reason {row[1]}: {why}; "
                      f"stop the sweep (Ctrl-C cancels its jobs) and submit it again", file=sys.stderr, flush=True)


def stop_jobs(job_ids: list[str], *, grace_s: float = STOP_GRACE_S) -> None:
    """The sweep was stopped: its pending jobs are cancelled, its running ones get SIGTERM (the signal rltrain
    checkpoints on; submitit ignores it outside training, so a job that does not end within ``grace_s`` is
    cancelled). A second stop request cancels at once."""
    arrays = sorted({job_id.split("_")[0] for job_id in job_ids})
    if not arrays:
        return
    print(f"rltrain: stopping the sweep's SLURM jobs (scancel {' '.join(arrays)}): pending ones are cancelled, "
          f"running ones get SIGTERM and checkpoint (cancelled if still running after {grace_s:.0f} s)",
          file=sys.stderr, flush=True)
    try:
        _scancel("--state=PENDING", *arrays)
        _scancel("--signal=TERM", "--state=RUNNING", *arrays)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            rows = squeue(arrays, "-t", LIVE, "-o", "%i")
            if rows == []:
                return
            time.sleep(1.0)
    finally:
        if squeue(arrays, "-t", LIVE, "-o", "%i") != []:
            _scancel(*arrays)


def _scancel(*args: str) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["scancel", *args], capture_output=True, timeout=SLURM_CMD_TIMEOUT_S)


def job_tasks(config: Any) -> int:
    """SLURM tasks per job that a sweep's ``config`` asks for: ``tasks_per_node`` x ``nodes`` under the SLURM
    launcher (its target names slurm), else 1."""
    launcher = config.hydra.launcher
    if "slurm" not in str(launcher.get("_target_", "")).lower():
        return 1
    return int(launcher.get("tasks_per_node") or 1) * int(launcher.get("nodes") or 1)


def trainers_of(config: Any, jobs: list[list[str]], *, loader: Any) -> dict[str, bool]:
    """{trainer name: whether it takes its ranks from the SLURM tasks} over ``jobs`` (overrides), each composed
    by Hydra's ``loader`` as its launcher will."""
    from hydra.utils import get_class

    found: dict[str, bool] = {}
    for job in jobs:
        cfg = loader.load_sweep_config(config, list(job))
        name = str(cfg.hydra.runtime.choices.get("trainer") or cfg.trainer.get("_target_"))
        if name not in found:
            cls = get_class(str(cfg.trainer._target_))
            found[name] = bool(getattr(getattr(cls, "capabilities", None), "all_reduce", False))
    return found


def refuse_single_process_ranks(*, trainers: dict[str, bool], tasks: int) -> None:
    """Before submitting: ``tasks`` SLURM tasks per job are the ranks of one run only for a trainer that takes
    ranks (``trainers``: name -> it does); any other would run that many copies of one run in one run dir."""
    if tasks <= 1:
        return
    single = sorted(name for name, takes in trainers.items() if not takes)
    if single:
        raise ConfigError(f"hydra.launcher.tasks_per_node x nodes = {tasks} SLURM tasks per job, but trainer="
                          f"{single[0]} runs in one process: {tasks} copies of one run would share its run dir. "
                          "Use trainer=distributed_simulator (each task becomes one rank of the run) or "
                          "hydra.launcher.tasks_per_node=1")
