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

from pathlib import Path
from typing import Any


def with_resume_auto(overrides: list[str], *, force: bool = False) -> list[str]:
    """``resume=auto`` unless the user chose a resume mode (``force``: a requeue always resumes)."""
    has = any(o.lstrip("+~").startswith("resume=") for o in overrides)
    if has and not force:
        return list(overrides)
    return [o for o in overrides if not o.lstrip("+~").startswith("resume=")] + ["resume=auto"]


class Resumable:
    """Mixed into the plugin's launchers (first in the MRO): the job and its requeue resume in place, and a job
    lost from outside (killed, out of memory) is recorded failed while the sweep collects the others
    (``launch``: the plugin's own gathers results in order and ends the sweep at the first lost job)."""

    def launch(self, job_overrides, initial_job_idx: int) -> list:
        import submitit
        from hydra.core.singleton import Singleton
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
        from omegaconf import OmegaConf

        params = dict(self.params)  # type: ignore[attr-defined]
        cluster = self._EXECUTOR  # type: ignore[attr-defined]
        init = {f"{cluster}_max_num_timeout": params.pop("max_num_timeout")} if "max_num_timeout" in params else {}
        executor = submitit.AutoExecutor(cluster=cluster, folder=params.pop("submitit_folder"), **init)
        shared = set(OmegaConf.structured(BaseQueueConf).keys())  # the rest are the executor's own keys
        executor.update_parameters(**{k if k in shared else f"{cluster}_{k}": v for k, v in params.items()})
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)  # type: ignore[attr-defined]
        overrides = [list(o) for o in job_overrides]
        nums = [initial_job_idx + i for i in range(len(overrides))]
        jobs = executor.map_array(self, overrides, ["hydra.sweep.dir"] * len(nums), nums,
                                  [f"job_id_for_{n}" for n in nums], [Singleton.get_state()] * len(nums))
        return [self._result(job, o, n) for job, o, n in zip(jobs, overrides, nums, strict=True)]

    def _result(self, job: Any, overrides: list[str], num: int) -> Any:
        import sys

        from rltrain.sweeps.jobs import lost_return, mark_lost

        try:
            return job.results()[0]
        except Exception as err:  # noqa: BLE001 - submitit's UncompletedJobError / FailedJobError
            run_dir = self._job_dir(overrides, num)
            state = getattr(job, "state", "?")
            why = (f"submitit job {job.job_id} ended without a result (state {state}: killed from outside, out of "
                   f"memory or preempted without a requeue): {str(err).splitlines()[0] if str(err) else ''}")
            if mark_lost(run_dir, f"{why}; resume it with resume=auto"):
                print(f"rltrain: job {num} failed: {why} ({run_dir})", file=sys.stderr, flush=True)
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
