"""Multirun plumbing: per-job failure records, submitit hand-off on preemption, and the sweep callback.

A Hydra multirun must survive one bad job: the task catches the job's exception, marks the job ``failed`` in
its own ``summary.json`` (a SLURM job that raised would otherwise still show as COMPLETED) and returns
``FAILED_RETURN`` so the sweep, and an Optuna study, go on. ``SweepCallback`` runs in the submitting process:
it refuses process nesting that would oversubscribe the machine before any job starts, and prints one line per
job of this sweep that did not complete (failed / interrupted / refused) when the sweep ends, then sets the exit
code: 0 when every job completed, 3 when the others only stopped at their ``max_wall_time`` (as a single run
stopped so exits 3: resume them), 1 otherwise. A job requeued by SLURM counts as it ended, after its requeues.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rltrain.errors import ConfigError, described

# Trainers that start processes of their own; running several of them at once under a local parallel launcher
# multiplies the process count (jobs x workers) on the same cores.
MULTI_PROCESS_TRAINERS = ("parallel", "distributed_simulator", "subprocess_actors")
PARALLEL_LAUNCHERS = ("JoblibLauncher", "LocalLauncher")  # run jobs side by side on this machine


def in_submitit_job() -> bool:
    return bool(os.environ.get("SUBMITIT_EXECUTOR"))


def record_failure(run_dir: Path, err: BaseException, *, sweep_dir: Path | None = None) -> bool:
    """Mark the job ``failed`` in its ``summary.json`` (keeping what the train loop wrote) + ``error.txt``;
    True when written.

    Only under the run-dir lock: a job whose dir another run owns by now (a live run, e.g. a requeued copy of
    the job) must not write that run's summary; a sweep's job (``sweep_dir``) is then entered ``failed`` in the
    sweep's ledger, with why, which the end of the sweep counts."""
    from rltrain.run.lock import RunDirLock
    from rltrain.sweeps import ledger

    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
    except (ConfigError, OSError) as refusal:
        if sweep_dir is not None:
            reason = f"{err if isinstance(err, ConfigError) else described(err)} (not recorded in its dir: {refusal})"
            ledger.enter(sweep_dir, run_dir, state=ledger.FAILED, reason=reason)
        return False
    try:
        _write_failure(run_dir, err)
        return True
    except OSError:
        return False
    finally:
        lock.release()


def _write_failure(run_dir: Path, err: BaseException) -> None:
    from rltrain.run.summary import write_summary

    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        summary = {}
    summary["status"] = "failed"
    summary.setdefault("error", str(err) if isinstance(err, ConfigError) else described(err))
    summary.setdefault("final_eval_return", None)
    (run_dir / "error.txt").write_text("".join(traceback.format_exception(err)))
    write_summary(run_dir, summary)


def discard_fresh_run_dir(run_dir: Path | None) -> bool:
    """A refused command leaves no files: remove the run dir if this very command created it (Hydra's
    ``.hydra/`` and log, our config and lock) and no run wrote its summary there (``None``: the single run's
    dir, whichever it is). A dir that existed before is another run's: left alone. True when removed."""
    import shutil

    fresh = SweepCallback.fresh_run_dir
    if fresh is None or (run_dir is not None and Path(run_dir).resolve() != fresh):
        return False
    if (fresh / "summary.json").exists():
        return False
    shutil.rmtree(fresh, ignore_errors=True)
    SweepCallback.fresh_run_dir = None
    return not fresh.exists()


def restore_hydra_files(run_dir: Path) -> None:
    """A command refused in another run's dir (``RunDirRefused``) leaves it as it was: Hydra wrote the refused
    command's ``.hydra/`` files (config, overrides) over that run's before the task began, and ``rltrain-report``
    and a reader of the dir take them for the run's own. Put back what ``on_run_start`` kept."""
    kept = SweepCallback.kept_hydra
    if kept is None or Path(run_dir).resolve() != SweepCallback.run_dir:
        return
    hydra_dir = Path(run_dir) / ".hydra"
    for path in hydra_dir.glob("*") if hydra_dir.is_dir() else ():
        if path.is_file() and path.name not in kept:  # written by this command alone
            path.unlink(missing_ok=True)
    for name, content in kept.items():
        (hydra_dir / name).write_bytes(content)
    if hydra_dir.is_dir() and not kept and not any(hydra_dir.iterdir()):
        hydra_dir.rmdir()


def stopped_before_training(err: BaseException, *, removed: bool) -> str:
    """The one line of a command stopped before its run had begun (``StopRequested`` out of start-up);
    ``removed``: the run dir this command had created is gone again."""
    from rltrain.run.signals import during

    reason = getattr(err, "reason", type(err).__name__)
    if SweepCallback.sweep_dir is not None:
        return (f"stopped ({reason}) during the sweep {SweepCallback.sweep_dir}: its running jobs were stopped "
                "(each checkpoints); each job's summary.json says how it ended")
    run_dir = SweepCallback.run_dir
    if removed or run_dir is None or not run_dir.exists():
        note = "nothing was trained and no run dir was left"
    else:
        note = f"nothing was trained; {run_dir} holds what it held before (its summary.json is unchanged)"
    return f"stopped ({reason}{during(err)}) before training began; {note}"


def hand_over_signal(summary: dict) -> None:
    """A job stopped by a signal, already checkpointed: give the signal back to whoever owns it.

    Under submitit, SIGUSR2 is submitit's timeout/preemption signal: re-raising it (our handler is uninstalled
    by now) runs submitit's handler, which calls the launcher's ``checkpoint()`` (same job, ``resume=auto``),
    requeues the job and exits. Elsewhere (and for SIGTERM/SIGINT) the whole sweep was asked to stop: exit.
    """
    reason = summary.get("stop_reason")
    if summary.get("status") == "failed":
        print(f"rltrain: error: {summary.get('error') or 'the run failed'} (summary.json says failed)", file=sys.stderr)
        sys.exit(summary["exit_code"])
    # the reason names the phase it landed in ("SIGUSR2 during the final evaluation"): a preemption there is
    # requeued as well (final.pt is written before the final evaluation; the requeued attempt only evaluates)
    if str(reason or "").split(" ", 1)[0] == "SIGUSR2" and in_submitit_job():
        signal.raise_signal(signal.SIGUSR2)
        return  # only a non-zero rank gets here (submitit requeues from rank 0)
    if summary.get("resume_command"):
        print(f"rltrain: stopped ({reason}); {checkpoint_note(summary)}; resume with: {summary['resume_command']}",
              file=sys.stderr)
    sys.exit(summary["exit_code"])


def checkpoint_note(summary: dict) -> str:
    """What the stopped run has to resume from, as it is: never "checkpoint written" for a run (or an agent of
    trainer=parallel) that wrote none."""
    agents = summary.get("agents")
    if isinstance(agents, list):
        agents = [a for a in agents if isinstance(a, dict)]
        wrote = [f"agent {a.get('index')}: {Path(str(a['checkpoint'])).name}" for a in agents if a.get("checkpoint")]
        missing = [str(a.get("index")) for a in agents if not a.get("checkpoint")]
        killed = [f"agent {a.get('index')} {a['error']}" for a in agents
                  if str(a.get("error", "")).startswith("killed")]
        why = f" ({'; '.join(killed)})" if killed else ""
        if not wrote:
            return f"no agent had a checkpoint yet (a resume starts them from step 0){why}"
        had = f"checkpoints: {', '.join(wrote)}"
        return had + (f"; agent{'s' if len(missing) > 1 else ''} {', '.join(missing)} had none (a resume restarts "
                      f"{'them' if len(missing) > 1 else 'it'} from step 0)" if missing else "") + why
    if summary.get("checkpoint"):
        return f"checkpoint {summary['checkpoint']}"
    return "no checkpoint had been written yet (a resume starts from step 0)"


def stopped_by_signal(summary: dict) -> bool:
    return str(summary.get("stop_reason") or "").startswith("SIG")


# -- the callback -------------------------------------------------------------------------------------------
def _sweep_values(overrides: list[str], key: str) -> list[str]:
    """Values a task override list gives ``key`` (``trainer=a,b`` -> [a, b])."""
    values: list[str] = []
    for o in overrides:
        name, _, value = o.partition("=")
        if name.lstrip("+~") == key:
            values += [v.strip() for v in value.split(",") if v.strip()]
    return values


def check_nesting(launcher_target: str, trainer_choices: list[str], task_overrides: list[str]) -> None:
    """Refuse jobs-in-parallel x processes-per-job unless ``allow_nested_processes=true``."""
    if not any(launcher_target.endswith(name) for name in PARALLEL_LAUNCHERS):
        return
    if any(v.lower() == "true" for v in _sweep_values(task_overrides, "allow_nested_processes")):
        return
    nested = sorted({t for t in trainer_choices if t in MULTI_PROCESS_TRAINERS})
    if nested:
        launcher = launcher_target.rsplit(".", 1)[-1]
        raise ConfigError(f"trainer={nested[0]} starts its own processes; running it under {launcher} "
                          f"(several jobs at once on this machine) oversubscribes the cores. Use the basic "
                          f"launcher or hydra/launcher=slurm, or add allow_nested_processes=true")


def read_summary(run_dir: Path) -> dict:
    """The job's ``summary.json``; a stand-in that says why where there is none to read."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except FileNotFoundError:
        return {"status": "failed", "error": "the job left no summary.json (it ended before its run began)"}
    except (OSError, ValueError) as err:
        return {"status": "unreadable", "error": f"summary.json: {err}"}
    return summary if isinstance(summary, dict) else {"status": "unreadable", "error": "summary.json: not an object"}


def this_sweeps_jobs(sweep_dir: Path) -> list[tuple[Path, dict]]:
    """(job dir, how it ended) for each job this sweep launched (its ledger): a refused job by its refusal and a
    job that failed without a record in its dir (lost before it began, its dir another run's) by why (a summary
    in its dir is another run's), any other by its own summary.json, after a job that died without a word is
    recorded lost (``lost_if_dead``)."""
    from rltrain.sweeps import ledger
    from rltrain.sweeps.jobs import lost_if_dead

    rows = []
    for entry in ledger.entries(sweep_dir):
        job_dir = Path(sweep_dir) / entry.job_dir
        if entry.state == ledger.REFUSED:
            rows.append((job_dir, {"status": "refused", "error": entry.reason}))
            continue
        if entry.state == ledger.FAILED:  # no record of its own: a summary in its dir is another run's
            rows.append((job_dir, {"status": "failed", "error": entry.reason}))
            continue
        summary = read_summary(job_dir)
        if lost_if_dead(job_dir, summary):
            summary = read_summary(job_dir)
        rows.append((job_dir, summary))
    return rows


WALL_TIME_EXIT = 3  # a single run stopped at max_wall_time exits 3 (run/signals.py): the same for its sweep


def sweep_exit_code(summaries: list[dict]) -> int:
    """0 when every job completed; 3 when the others stopped at their ``max_wall_time`` (a budget the user set:
    each reports its last eval and resumes with resume=auto); 1 when any job failed, was refused, lost or stopped
    by a signal (a cancelled job; one SLURM requeued has ended as its last attempt did)."""
    left = [s for s in summaries if s.get("status") != "completed"]
    if not left:
        return 0
    # the reason may name the phase it landed in ("max_wall_time during the final evaluation")
    if all(s.get("status") == "interrupted" and str(s.get("stop_reason") or "").split(" ", 1)[0] == "max_wall_time"
           for s in left):
        return WALL_TIME_EXIT
    return 1


UPSTREAM_JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"

class SweepCallback(Callback):
    """Registered in ``train.yaml`` under ``hydra.callbacks``; only the multirun hooks do anything."""

    exit_code: int = 0  # read by cli.main: the exit code of the submitting process (``sweep_exit_code``)
    fresh_run_dir: Path | None = None  # the single run's dir, when this command created it
    # an existing single run dir's .hydra/ files, {name: bytes}, as they were before Hydra rewrote them
    kept_hydra: dict[str, bytes] | None = None
    run_dir: Path | None = None  # the single run's dir
    sweep_dir: Path | None = None  # a multirun's

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Hydra creates the run dir itself, before the task starts: an unwritable one (hydra.run.dir=/proc/x)
        # would end in its mkdir traceback
        run_dir = Path(str(config.hydra.run.dir))
        try:
            # a dir this command creates is removed again if the command is refused (discard_fresh_run_dir)
            SweepCallback.fresh_run_dir = None if run_dir.exists() else run_dir.resolve()
            SweepCallback.run_dir = run_dir.resolve()
            hydra_dir = run_dir / ".hydra"  # restore_hydra_files puts them back if the command is refused
            SweepCallback.kept_hydra = None if SweepCallback.fresh_run_dir else {
                p.name: p.read_bytes() for p in (hydra_dir.glob("*") if hydra_dir.is_dir() else ()) if p.is_file()}
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            print(f"rltrain: error: hydra.run.dir={run_dir}: cannot create it ({err.strerror or err}); pick a "
                  "writable hydra.run.dir", file=sys.stderr)
            sys.exit(2)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        SweepCallback.sweep_dir = Path(str(config.hydra.sweep.dir))
        launcher = str(config.hydra.launcher.get("_target_", ""))
        task_overrides = list(config.hydra.overrides.task)
        choices = [str(config.hydra.runtime.choices.get("trainer"))] + _sweep_values(task_overrides, "trainer")
        try:
            check_nesting(launcher, choices, task_overrides)
        except ConfigError as err:  # Hydra turns a callback's exception into a warning: exit ourselves
            print(f"rltrain: error: {err}", file=sys.stderr)
            sys.exit(2)
        from rltrain.sweeps import ledger

        ledger.start(SweepCallback.sweep_dir)  # after the refusals above: a refused sweep leaves no files
        if launcher == UPSTREAM_JOBLIB:  # hydra/launcher=joblib: the name rltrain's own launcher had before
            print("[rltrain] hydra/launcher=joblib is hydra-joblib-launcher's worker pool, where a job killed from "
                  "outside ends every running job; rltrain's launcher, one process per job, is "
                  "hydra/launcher=joblib_procs", flush=True)
        if "optuna" in str(config.hydra.sweeper.get("_target_", "")).lower():  # ours (ppo_optuna) or the plugin's
            from rltrain.sweeps.replicates import import_optuna_quietly

            import_optuna_quietly()  # Hydra builds the sweeper next: no alembic lines on the terminal

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from rltrain.sweeps import ledger

        sweep_dir = Path(str(config.hydra.sweep.dir))
        # this sweep's jobs only: the sweep dir may hold an earlier sweep's, whose records are not this one's
        rows = this_sweeps_jobs(sweep_dir)
        ledger.remove(sweep_dir)
        SweepCallback.exit_code = sweep_exit_code([s for _, s in rows])
        if not rows:
            return
        failed = [(d, s) for d, s in rows if s.get("status") != "completed"]
        done = len(rows) - len(failed)
        counts = {}
        for _, summary in failed:
            counts[summary.get("status")] = counts.get(summary.get("status"), 0) + 1
        others = "".join(f", {n} {status}" for status, n in sorted(counts.items(), key=str))
        print(f"rltrain: sweep {sweep_dir}: {done}/{len(rows)} jobs completed{others}", file=sys.stderr)
        for d, s in failed:
            print(f"  {s.get('status')}: {d.name}: {s.get('error') or s.get('stop_reason') or ''}", file=sys.stderr)
        if any(s.get("status") == "refused" for _, s in failed):  # the refusal names hydra.run.dir: say the sweep's
            print("  run the refused jobs: pick another hydra.sweep.dir, or add resume=auto to continue the runs "
                  "their dirs hold (left as they were)", file=sys.stderr)
        if any(s.get("status") == "interrupted" for _, s in failed):  # each has a checkpoint to go on from
            print(f"  continue: each interrupted job's summary.json has its resume_command; the whole sweep: the "
                  f"same command with resume=auto hydra.sweep.dir={sweep_dir}", file=sys.stderr)
        print(f"  report: rltrain-report {sweep_dir}", file=sys.stderr)
