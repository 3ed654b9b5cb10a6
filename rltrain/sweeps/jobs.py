"""Jobs lost from outside: a sweep records them as failed and goes on with the others.

A job killed without a word (SIGKILL, the OOM killer, a node gone) leaves its ``summary.json`` saying
``running``. submitit's job states (``FAILED``, ``OUT_OF_MEMORY``, ``CANCELLED``) say so for the whole job; we do
the same for the run dir: ``mark_lost`` records the job as ``failed`` with why, the last checkpoint and the last
step it logged, and the launcher hands the sweep a ``FAILED_RETURN`` for it instead of an exception, so the
other jobs run on and the sweep ends with its count (``SweepCallback``).

``SeparateProcesses`` is the local parallel launcher's job runner (``hydra/launcher=joblib_procs``): each job in a
process of its own, ``n_jobs`` at a time. A pool of reused workers (joblib's loky) breaks as a whole when one
worker dies, ending every running job and the sweep with it; one process per job cannot.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from rltrain.errors import ConfigError
from rltrain.run.signals import StopRequested
from rltrain.run.summary import FAILED_RETURN, record_lost

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 60.0  # a stopped sweep gives its running jobs this long to checkpoint, then kills them


def mark_lost(run_dir: Path, why: str) -> bool:
    """Record a job that died without a word as ``failed`` (under its run-dir lock, which its death freed);
    False when another process holds the dir or its summary already says how it ended."""
    from rltrain.run.lock import RunDirLock
    from rltrain.sweeps import ledger

    run_dir = Path(run_dir)
    ledger.enter_lost(run_dir, reason=why)  # lost before it could say it started: still one of this sweep's jobs
    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
    except (ConfigError, OSError):
        return False
    try:
        return record_lost(run_dir, why)
    finally:
        lock.release()


def lost_if_dead(run_dir: Path, summary: dict) -> bool:
    """A ``running`` summary of a process of this host that is gone: record it lost (``mark_lost``)."""
    pid, host = summary.get("pid"), summary.get("host")
    if summary.get("status") != "running" or host != socket.gethostname() or not isinstance(pid, int):
        return False
    if process_alive(pid):
        return False
    return mark_lost(run_dir, f"the job's process (pid {pid}) ended without a word while running: killed from "
                              "outside (SIGKILL, the OOM killer) or crashed; resume it with resume=auto")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def lost_return(overrides: list[str], run_dir: Path | None) -> Any:
    """What the sweeper gets for a lost job: a completed ``JobReturn`` worth ``FAILED_RETURN`` (a failed one
    would make Hydra's sweepers raise and end the sweep)."""
    from hydra.core.utils import JobReturn, JobStatus

    ret = JobReturn(overrides=list(overrides), working_dir=str(run_dir) if run_dir else None,
                    status=JobStatus.COMPLETED)
    ret.return_value = FAILED_RETURN
    return ret


def how_it_ended(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode} without a result"


class SeparateProcesses:
    """Mixed in before a Hydra launcher that has ``config``, ``hydra_context``, ``task_function`` (Hydra's
    ``setup``) and ``n_jobs``: runs each job in a forked process of its own, ``n_jobs`` at a time."""

    def launch(self, job_overrides, initial_job_idx: int) -> list:
        from hydra.core.singleton import Singleton
        from hydra.core.utils import configure_log, setup_globals

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        n_jobs = int(self.joblib.get("n_jobs") or -1)
        width = n_jobs if n_jobs >= 1 else os.cpu_count() or 1
        state = Singleton.get_state()
        ctx = mp.get_context("fork")  # the job inherits Hydra's state (nothing is pickled) and imports torch itself
        pending = list(enumerate(job_overrides))
        running: dict[Any, tuple[int, list[str], Any, Any]] = {}  # sentinel -> (slot, overrides, process, pipe)
        results: list = [None] * len(job_overrides)
        dirs: dict[int, Path] = {}
        try:
            while pending or running:
                while pending and len(running) < width:
                    slot, overrides = pending.pop(0)
                    here, there = ctx.Pipe(duplex=False)
                    proc = ctx.Process(target=_job, args=(self, initial_job_idx + slot, list(overrides), state, there,
                                                          os.getpid()), name=f"rltrain-job-{initial_job_idx + slot}")
                    proc.start()
                    there.close()
                    running[proc.sentinel] = (slot, list(overrides), proc, here)
                for ready in wait(list(running) + [r[3] for r in running.values()], timeout=1.0):
                    for sentinel, (slot, overrides, proc, pipe) in list(running.items()):
                        if ready not in (sentinel, pipe):
                            continue
                        with contextlib.suppress(EOFError, OSError):
                            while pipe.poll(0):
                                kind, value = pipe.recv()
                                if kind == "dir":
                                    dirs[slot] = Path(value)
                                else:
                                    results[slot] = value
                        if not proc.is_alive():
                            proc.join()
                            running.pop(sentinel)
                            pipe.close()
                            if results[slot] is None:  # died without a result: lost from outside
                                results[slot] = self._lost(slot, overrides, dirs.get(slot), proc.exitcode)
        except BaseException:
            _stop_jobs([r[2] for r in running.values()])
            raise
        return results

    def _lost(self, slot: int, overrides: list[str], run_dir: Path | None, exitcode: int | None):
        """A job process that ended without handing back a result: stopped by a signal of its own (its summary
        says so), or lost from outside (recorded here as failed)."""
        why = f"the job's process was {how_it_ended(exitcode)} (from outside: a kill, the OOM killer)"
        if run_dir is None or mark_lost(run_dir, f"{why}; resume it with resume=auto"):
            print(f"rltrain: job {slot} failed: {why}{f' ({run_dir})' if run_dir else ''}", file=sys.stderr,
                  flush=True)
        return lost_return(overrides, run_dir)


def _stop_jobs(procs: list) -> None:
    """The sweep is stopping: each running job gets SIGTERM (it checkpoints), then SIGKILL after the grace."""
    for proc in procs:
        if proc.is_alive():
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        proc.join(timeout=max(deadline - time.monotonic(), 0.0))
        if proc.is_alive():
            proc.kill()
            proc.join()


def _job(launcher, num: int, overrides: list[str], state: dict, pipe, parent: int) -> None:
    """One job, in its own process (forked): Hydra's ``run_job`` under its sweep config; the result piped back."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals
    from omegaconf import OmegaConf, open_dict

    with contextlib.suppress(OSError, AttributeError):  # Linux: a killed sweep takes its jobs along (SIGTERM)
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)
    setup_globals()
    Singleton.set_state(state)
    cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    with open_dict(cfg):
        cfg.hydra.job.id, cfg.hydra.job.num = f"{cfg.hydra.job.name}_{num}", num
    HydraConfig.instance().set_config(cfg)
    pipe.send(("dir", str(Path(str(cfg.hydra.sweep.dir)) / str(OmegaConf.select(cfg, "hydra.sweep.subdir")))))
    code = 0
    try:
        ret = run_job(hydra_context=launcher.hydra_context, config=cfg, task_function=launcher.task_function,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        ret.cfg = ret.hydra_cfg = None  # the parent has them (and structured configs do not pickle)
        try:
            pipe.send(("result", ret))
        except Exception:  # noqa: BLE001 - a return value that does not pickle: the sweep gets FAILED_RETURN
            pipe.send(("result", lost_return(overrides, Path(ret.working_dir or "."))))
    except SystemExit as err:  # a job stopped by a signal hands it over by exiting (callbacks.hand_over_signal)
        code = err.code if isinstance(err.code, int) else 1
    except StopRequested as err:  # stopped before its run began: nothing of it to keep
        code = err.exit_code
    finally:
        pipe.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
