"""submitit launchers (SLURM and local) whose jobs survive a requeue: same run dir, ``resume=auto``.

hydra-submitit-launcher submits the launcher object itself; on submitit's signal (SIGUSR2, ``signal_delay_s``
before the time limit, or a preemption) submitit calls ``launcher.checkpoint(*args)`` and requeues the
``DelayedSubmission`` it returns (https://github.com/facebookincubator/submitit/blob/main/docs/checkpointing.md).
The run dir does not move: the sweep dir's timestamp is resolved once at submit time and the job subdir is
``<job num>_<overrides>`` (``resume`` excluded). We only add ``resume=auto`` to the job's overrides, so the
requeued attempt (or one SLURM requeued on its own after a preemption) continues from the checkpoint that the
train loop wrote when it caught the signal.

Hydra only instantiates launcher classes that live under ``hydra_plugins``: the concrete classes (this mixin
plus the plugin's launcher) are in ``hydra_plugins/rltrain_plugins/launchers.py``.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from typing import Any

from rltrain.errors import ConfigError


def with_resume_auto(overrides: list[str], *, force: bool = False) -> list[str]:
    """``resume=auto`` unless the user chose a resume mode (``force``: a requeue always resumes)."""
    has = any(o.lstrip("+~").startswith("resume=") for o in overrides)
    if has and not force:
        return list(overrides)
    return [o for o in overrides if not o.lstrip("+~").startswith("resume=")] + ["resume=auto"]


class Resumable:
    """Mixed into the plugin's launchers (first in the MRO): the job and its requeue resume in place, and a job
    lost from outside (killed, out of memory) is recorded failed while the sweep collects the others
    (``launch``: the plugin's own gathers results in order and ends the sweep at the first lost job).

    On SLURM: sbatch's refusal is one line (nothing left of the sweep it refused), a job pending for a reason
    that never clears is named, and a stopped sweep stops its jobs (``rltrain.sweeps.slurm``)."""


    def launch(self, job_overrides, initial_job_idx: int) -> list:
        try:
            import submitit
        except ImportError:  # the plugin is installed, the package it drives is not
            raise ConfigError(f"submitit_{self._EXECUTOR} needs the 'slurm' extra: "  # type: ignore[attr-defined]
                              "pip install 'rltrain[slurm]'") from None
        from hydra.core.singleton import Singleton
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
        from omegaconf import OmegaConf

        from rltrain.sweeps import slurm

        params = dict(self.params)  # type: ignore[attr-defined]
        cluster = self._EXECUTOR  # type: ignore[attr-defined]
        overrides = [list(o) for o in job_overrides]
        nums = [initial_job_idx + i for i in range(len(overrides))]
        if cluster == "slurm":  # refused here, before anything is queued (the task refuses it too: run.lock)
            tasks = int(params.get("tasks_per_node") or 1) * int(params.get("nodes") or 1)
            trainers = slurm.trainers_of(self.config, overrides, loader=self.hydra_context.config_loader) \
                if tasks > 1 else {}  # type: ignore[attr-defined]
            slurm.refuse_single_process_ranks(trainers=trainers, tasks=tasks)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))  # type: ignore[attr-defined]
        sweep_dir.mkdir(parents=True, exist_ok=True)
        # what the sweep dir holds before submitit writes there: an sbatch refusal takes back only what it added
        leftovers = slurm.Leftovers(sweep_dir, cwd=Path(str(self.config.hydra.runtime.cwd)))  # type: ignore
        init = {f"{cluster}_max_num_timeout": params.pop("max_num_timeout")} if "max_num_timeout" in params else {}
        executor = submitit.AutoExecutor(cluster=cluster, folder=params.pop("submitit_folder"), **init)
        shared = set(OmegaConf.structured(BaseQueueConf).keys())  # the rest are the executor's own keys
        executor.update_parameters(**{k if k in shared else f"{cluster}_{k}": v for k, v in params.items()})
        said = io.StringIO()  # submitit prints sbatch's refusal as it raises it: the one line below says it
        try:
            with contextlib.redirect_stderr(said):
                jobs = executor.map_array(self, overrides, ["hydra.sweep.dir"] * len(nums), nums,
                                          [f"job_id_for_{n}" for n in nums], [Singleton.get_state()] * len(nums))
            sys.stderr.write(said.getvalue())
        except (submitit.core.utils.FailedJobError, OSError) as err:  # sbatch refused, or is not there at all
            leftovers.discard()
            said = str(err) if isinstance(err, submitit.core.utils.FailedJobError) else f"cannot run sbatch: {err}"
            raise ConfigError(slurm.sbatch_refusal(said, params=dict(self.params))) from None  # type: ignore
        if cluster == "slurm":
            self._wait(jobs, nums)
        return [self._result(job, o, n) for job, o, n in zip(jobs, overrides, nums, strict=True)]

    def _wait(self, jobs: list, nums: list[int]) -> None:
        """Wait for the array as ``job.results()`` would, naming a job that cannot start; a stop request
        (Ctrl-C, SIGTERM: ``StopRequested``) or any error stops the array's jobs before it goes on up."""
        import time

        from rltrain.sweeps import slurm

        watch = slurm.PendingWatch({str(job.job_id): n for job, n in zip(jobs, nums, strict=True)})
        try:
            while not all(job.done() for job in jobs):
                watch.check()
                time.sleep(1.0)
        except BaseException:
            slurm.stop_jobs([str(job.job_id) for job in jobs])
            raise

    def _result(self, job: Any, overrides: list[str], num: int) -> Any:
        from hydra.core.utils import JobStatus

        from rltrain.sweeps.jobs import lost_return, mark_lost

        try:
            ret = job.results()[0]
        except Exception as err:  # noqa: BLE001 - submitit's UncompletedJobError / FailedJobError
            run_dir = self._job_dir(overrides, num)
            state = getattr(job, "state", "?")
            why = (f"submitit job {job.job_id} ended without a result (state {state}: killed from outside, out of "
                   f"memory or preempted without a requeue): {str(err).splitlines()[0] if str(err) else ''}")
            if mark_lost(run_dir, f"{why}; resume it with resume=auto"):
                print(f"rltrain: job {num} failed: {why} ({run_dir})", file=sys.stderr, flush=True)
            return lost_return(overrides, run_dir)
        if getattr(ret, "status", None) == JobStatus.FAILED:  # raised past rltrain's task: Hydra's sweep would
            return self._not_completed(ret, job, overrides, num)  # re-raise it at the end as a traceback
        return ret

    def _not_completed(self, ret: Any, job: Any, overrides: list[str], num: int) -> Any:
        """A job whose result is an exception: submitit's refusal to requeue it again (the job checkpointed on
        SIGUSR2 and its summary says ``interrupted``), or an error raised outside rltrain's task."""
        import json

        from rltrain.errors import described
        from rltrain.sweeps.jobs import lost_return, mark_lost

        err = ret._return_value  # ``return_value`` raises it
        run_dir = self._job_dir(overrides, num)
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError):
            summary = {}
        if summary.get("status") == "interrupted":
            left = f"checkpoint {summary['checkpoint']}" if summary.get("checkpoint") else "no checkpoint yet"
            limits = f"hydra.launcher.max_num_timeout={self.params.get('max_num_timeout')}"  # type: ignore
            print(f"rltrain: job {num} did not complete: stopped ({summary.get('stop_reason')}) and not requeued "
                  f"({str(err).rstrip('.')}; {limits}); {left}; continue it with: "
                  f"{summary.get('resume_command') or 'resume=auto'} (or submit it again with a larger "
                  f"hydra.launcher.timeout_min / max_num_timeout)", file=sys.stderr, flush=True)
        elif mark_lost(run_dir, f"submitit job {job.job_id} raised {described(err)}; resume it with resume=auto"):
            print(f"rltrain: job {num} failed: {described(err)} ({run_dir})", file=sys.stderr, flush=True)
        return lost_return(overrides, run_dir)

    def _job_dir(self, overrides: list[str], num: int):
        from omegaconf import OmegaConf, open_dict

        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))  # type: ignore
        with open_dict(cfg):
            cfg.hydra.job.num = num
        return Path(str(cfg.hydra.sweep.dir)) / str(OmegaConf.select(cfg, "hydra.sweep.subdir"))

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: dict) -> Any:
        return super().__call__(with_resume_auto(sweep_overrides), job_dir_key, job_num, job_id,  # type: ignore[misc]
                                singleton_state)

    def checkpoint(self, sweep_overrides: list[str], *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, with_resume_auto(sweep_overrides, force=True), *args,
                                                  **kwargs)
