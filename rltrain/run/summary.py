"""The run's ``summary.json`` (written atomically) and the command that resumes an interrupted run."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path


def write_summary(run_dir: Path, summary: dict) -> None:
    tmp = run_dir / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=float) + "\n")
    tmp.replace(run_dir / "summary.json")


def resume_command(run_dir: Path) -> str:
    """The exact command that continues this run in the same directory."""
    args = [a for a in sys.argv[1:] if not a.startswith(("resume=", "hydra.run.dir="))]
    path = str(run_dir)
    if not re.fullmatch(r"[\w./-]+", path):
        path = f"'{path}'"  # Hydra's override grammar needs quotes around '=', ',', spaces...
    return shlex.join(["rltrain", *args, f"hydra.run.dir={path}", "resume=auto"])
