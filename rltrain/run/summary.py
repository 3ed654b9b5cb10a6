"""The run's ``summary.json`` (written atomically), the command that resumes an interrupted run, and the
value a failed run reports to sweepers."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import numbers
import os
import re
import shlex
import stat
import sys
from pathlib import Path
from typing import Any

FAILED_RETURN = -1e9  # what a failed or eval-less run reports to sweepers: finite, never NaN


def json_safe(value: Any) -> Any:
    """Plain JSON values: NaN / inf become None (JSON has no spelling for them), numpy scalars plain numbers."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else None
    try:  # 0-d tensors and arrays
        return json_safe(float(value))
    except (TypeError, ValueError):
        return str(value)


def write_summary(run_dir: Path, summary: dict) -> None:
    """Valid JSON, written atomically (temp, fsync, rename); the temp file never outlives a failed write."""
    run_dir = Path(run_dir)
    tmp = run_dir / f".summary.json.tmp{os.getpid()}"
    text = json.dumps(json_safe(summary), indent=2, allow_nan=False) + "\n"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, run_dir / "summary.json")
    finally:
        tmp.unlink(missing_ok=True)


def mark_failed(run_dir: Path, error: str) -> None:
    """Make ``summary.json`` say ``failed`` unless it already does; best effort (the disk may be full)."""
    path = Path(run_dir) / "summary.json"
    try:
        if json.loads(path.read_text()).get("status") == "failed":
            return
    except (OSError, ValueError, AttributeError):
        pass
    with contextlib.suppress(OSError):
        write_summary(Path(run_dir), {"status": "failed", "error": error})


def hydra_quote(value: str) -> str:
    """``value`` as a Hydra override value that parses back to exactly ``value``.

    Plain ASCII path characters stay bare; anything else is single-quoted, where Hydra's grammar treats a
    backslash as an escape only before a quote (or the closing quote), so ``'`` becomes ``\\'``, backslashes
    right before a quote or the end are doubled, and ``${`` (an interpolation even inside quotes) becomes
    ``\\${``."""
    if re.fullmatch(r"[\w./-]+", value, re.ASCII):
        return value
    body = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
    return "'" + body.replace("${", "\\${") + "'"


# the job's own overrides, as cli/train.py (the one reader of Hydra's job record) hands them on: in the environment,
# so that every process the job starts (spawned ranks, agents) says the same resume command
JOB_ARGS_ENV = "RLTRAIN_JOB_ARGS"


def set_job_args(args: list[str]) -> None:
    """Record the overrides this job was composed from (a multirun job's own, under any launcher: not the sweep's
    command line, nor submitit's, which is ``sys.argv`` in a SLURM job)."""
    os.environ[JOB_ARGS_ENV] = json.dumps([str(a) for a in args])


def job_args() -> list[str]:
    """The overrides ``set_job_args`` recorded; without a record (the Python API), the command line."""
    try:
        recorded = json.loads(os.environ.get(JOB_ARGS_ENV, "null"))
    except ValueError:
        recorded = None
    return recorded if isinstance(recorded, list) else sys.argv[1:]


def resume_command(run_dir: Path) -> str:
    """The exact command that continues this run in the same directory, as a single run (also a multirun
    job's): the job's overrides, the run dir quoted for Hydra's override grammar, then every argument quoted for
    a POSIX shell."""
    args = [a for a in job_args() if not a.startswith(("resume=", "hydra.run.dir=", "-"))]
    return shlex.join(["rltrain", *args, f"hydra.run.dir={hydra_quote(str(run_dir))}", "resume=auto"])


def last_logged_step(run_dir: Path) -> int | None:
    """The last ``env_steps`` in the run's ``metrics.csv`` (for trainer=parallel: the most any agent logged)."""
    steps = []
    for path in [run_dir / "metrics.csv", *sorted(run_dir.glob("agent_*/metrics.csv"))]:
        try:
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
            if rows:
                steps.append(int(float(rows[-1]["env_steps"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(steps) if steps else None


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The most recently written checkpoint file of the run dir, by name and time only (nothing is opened: a
    stop must not wait on a file)."""
    found = []
    for p in Path(run_dir, "checkpoints").glob("*.pt"):
        try:
            st = p.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.append((st.st_mtime, p))
    return max(found)[1] if found else None


def record_lost(run_dir: Path, why: str, *, only_running: bool = True) -> bool:
    """Rewrite ``summary.json`` as ``failed`` because of ``why`` (the run, or what it ran on, was lost), with the
    last checkpoint and the last env step it logged; ``only_running``: not over a summary that says how the run
    ended. False when it says so already or cannot be written."""
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    if not isinstance(summary, dict) or (only_running and summary.get("status") not in (None, "running")):
        return False
    ckpt = newest_checkpoint(run_dir)
    summary.update(status="failed", error=why, final_eval_return=None,
                   last_checkpoint=str(ckpt) if ckpt else None, total_env_steps=last_logged_step(run_dir))
    try:
        write_summary(run_dir, summary)
    except OSError:
        return False
    return True
