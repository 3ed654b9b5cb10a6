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

from typing import Any


def with_resume_auto(overrides: list[str], *, force: bool = False) -> list[str]:
    """``resume=auto`` unless the user chose a resume mode (``force``: a requeue always resumes)."""
    has = any(o.lstrip("+~").startswith("resume=") for o in overrides)
    if has and not force:
        return list(overrides)
    return [o for o in overrides if not o.lstrip("+~").startswith("resume=")] + ["resume=auto"]


class Resumable:
    """Mixed into the plugin's launchers (first in the MRO): the job and its requeue resume in place."""

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: dict) -> Any:
        return super().__call__(with_resume_auto(sweep_overrides), job_dir_key, job_num, job_id,  # type: ignore[misc]
                                singleton_state)

    def checkpoint(self, sweep_overrides: list[str], *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, with_resume_auto(sweep_overrides, force=True), *args,
                                                  **kwargs)
