"""Which jobs this sweep launched, and which of them were refused: a ledger in the sweep dir.

The end of a sweep (``SweepCallback.on_multirun_end``) must count the jobs this sweep ran, not every job dir in
the sweep dir: a sweep re-run into a dir that holds an earlier sweep's jobs would count those too. And it must
name a job refused because its dir holds another run, which by design writes nothing into that dir. The jobs run
in the submitting process (Hydra's basic launcher), in forked processes (``joblib_procs``) or on other hosts
(SLURM); what they all share is the sweep dir. So the sweep starts with an empty ``.rltrain_jobs/`` there, each
job writes one entry for itself as it starts (a job requeued by SLURM writes it again: one entry, its last
word) and replaces it if it is refused, or fails where another run holds its dir by then; the launcher adds one
for a job lost before it wrote any (its dir's summary, if any, is an earlier run's); the end of the sweep reads
them and removes the ledger. Any other job says how it ended in its own ``summary.json``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

LEDGER = ".rltrain_jobs"
# a job ``failed`` here has no record of its own in its dir: lost before it began, or its dir another run's
STARTED, REFUSED, FAILED = "started", "refused", "failed"

_current: Path | None = None  # the sweep dir of the sweep this (submitting) process runs: ``start``


@dataclass(frozen=True)
class Entry:
    """One job of this sweep: its dir, relative to the sweep dir, and how it began (started / refused / failed
    without a record in its dir, and why)."""

    job_dir: str
    state: str
    reason: str = ""
    num: int | None = None


def start(sweep_dir: Path) -> None:
    """A new sweep: entries left by an earlier sweep into the same dir (one that was killed) are not its jobs."""
    global _current
    _current = Path(os.path.abspath(sweep_dir))
    shutil.rmtree(_current / LEDGER, ignore_errors=True)


def sweep_dir_of(job_dir: Path, *, subdir: str) -> Path:
    """The sweep dir of a job, from its absolute dir and its ``hydra.sweep.subdir`` (which may nest)."""
    depth = max(len(Path(subdir).parts), 1)
    return Path(os.path.abspath(job_dir)).parents[depth - 1]


def enter(sweep_dir: Path, job_dir: Path, *, state: str = STARTED, reason: str = "", num: int | None = None,
          if_absent: bool = False) -> None:
    """Write the job's entry (``if_absent``: only where it wrote none). Best effort: a ledger that cannot be
    written costs the end of the sweep a line, never the job."""
    root = Path(os.path.abspath(sweep_dir))
    rel = os.path.relpath(os.path.abspath(job_dir), root)
    # a job dir's name can be as long as a file name may be: the entry is named by a digest of it
    path = root / LEDGER / f"{hashlib.sha1(rel.encode()).hexdigest()[:20]}.json"
    if if_absent and path.exists():
        return
    text = json.dumps({"job_dir": rel, "state": state, "reason": reason, "num": num})
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)  # the end of the sweep never reads half an entry
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


def enter_lost(job_dir: Path, *, reason: str) -> None:
    """The launcher's entry for a job lost before it wrote its own (killed while starting): still this
    sweep's job. Only in the submitting process, where ``start`` named the sweep dir."""
    if _current is not None:
        enter(_current, job_dir, state=FAILED, reason=reason, if_absent=True)


def entries(sweep_dir: Path) -> list[Entry]:
    """This sweep's jobs, by job number (an entry unreadable as JSON is skipped: it is being replaced)."""
    found = []
    for path in Path(sweep_dir, LEDGER).glob("*.json"):
        try:
            data = json.loads(path.read_text())
            found.append(Entry(job_dir=str(data["job_dir"]), state=str(data["state"]),
                               reason=str(data.get("reason") or ""), num=data.get("num")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda e: (_num(e), e.job_dir))


def _num(entry: Entry) -> int:
    """The job number, from the entry or the dir name (``<num>_<overrides>``); unknown ones last."""
    if isinstance(entry.num, int):
        return entry.num
    head = Path(entry.job_dir).name.split("_", 1)[0]
    return int(head) if head.isdigit() else 1 << 62


def remove(sweep_dir: Path) -> None:
    """The sweep has ended: its ledger goes (the job dirs are the record)."""
    global _current
    shutil.rmtree(Path(sweep_dir) / LEDGER, ignore_errors=True)
    _current = None
