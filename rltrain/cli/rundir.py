"""The run dir before a run starts in it: writable, and holding nothing the run would contradict (a recorded run of
other settings under ``resume=auto``, an earlier run's checkpoints under ``resume=never``). ``run`` and
``rltrain-check`` ask the same questions here, so both answer in the same line. Each "no" is a ``RunDirRefused``:
the dir is left as it was, and a sweep lists the job ``refused`` rather than failed (a failed job's record would
be written over the run the dir holds)."""

from __future__ import annotations

import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from rltrain.errors import ConfigError, RunDirRefused


def check_resume_config(cfg: dict, run_dir: Path, *, unread: Collection[str] = ()) -> None:
    """``resume=auto`` in a run dir whose recorded run had other trainer / algo / model / env settings: one
    line listing them (a trainer that keeps its checkpoints elsewhere would otherwise restart from step 0
    over the run's summary), unless ``resume_allow_changes`` names them or this run does not read them
    (``unread``: ``RunSettings.unread_keys``)."""
    from rltrain.run.resume_rules import ALLOW_KEY, resume_mismatch, upgrade_config

    allow = cfg.get(ALLOW_KEY) or []
    if not isinstance(allow, list) or not all(isinstance(a, str) and a for a in allow):
        raise ConfigError(f"{ALLOW_KEY}={allow!r} must be a list of setting names, e.g. [env.kwargs]")
    if cfg.get("resume") != "auto" or not (run_dir / "config.yaml").is_file():
        return
    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return  # the checkpoint's own config is compared at resume
    error = resume_mismatch("auto", upgrade_config(saved) if isinstance(saved, dict) else {}, cfg, unread=unread)
    if error:
        raise RunDirRefused(error.replace("resume=auto:", f"resume=auto in {run_dir}:", 1))


def check_fresh_run_dir(cfg: dict, run_dir: Path) -> None:
    """``resume=never`` (the default) in a run dir holding an earlier run's checkpoints: one line, before anything
    is written. Starting over there would mix two runs: the new run's checkpoints, numbered from step 0, would be
    the ones pruned beside the old run's later steps, and ``--checkpoint latest`` would pick the old run."""
    if (cfg.get("resume") or "never") != "never":
        return
    found = sorted(p.relative_to(run_dir) for pattern in ("checkpoints/*.pt", "agent_*/checkpoints/*.pt")
                   for p in run_dir.glob(pattern))
    if found:
        shown = ", ".join(map(str, found[:2])) + (f" and {len(found) - 2} more" if len(found) > 2 else "")
        raise RunDirRefused(f"hydra.run.dir={run_dir} holds an earlier run's checkpoints ({shown}): resume=auto "
                            "continues that run; to start afresh pick another hydra.run.dir (or move its "
                            "checkpoints away)")


def writable_run_dir(run_dir: Path) -> None:
    """Create the run dir and write a file in it, or fail in one line naming it (e.g. ``/proc/x``, read-only)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as err:
        raise RunDirRefused(f"hydra.run.dir={run_dir}: cannot write there ({err.strerror or err}); pick a "
                            "writable hydra.run.dir") from None


@contextmanager
def claim_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold the run dir's lock for the block; a dir another run holds (or one the lock cannot be taken in) is
    refused as ``RunDirRefused``, told apart from the failures of the run itself, which raise inside the block."""
    from rltrain.run.lock import RunDirLock

    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
    except ConfigError as err:
        raise RunDirRefused(str(err)) from None
    try:
        yield
    finally:
        lock.release()
