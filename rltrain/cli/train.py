"""The ``rltrain`` console script: a thin ``@hydra.main`` entrypoint.

This is the only module that reads ``HydraConfig``. ``task`` returns a finite float (the final eval
return) so sweepers can optimise it. Bad input is reported as one line on stderr, never a traceback
(set ``HYDRA_FULL_ERROR=1`` for the full stack).
"""

from __future__ import annotations

import errno
import gc
import math
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rltrain.errors import ConfigError, RunDirRefused, UserCodeError, described
from rltrain.run.signals import StopFlag, StopRequested
from rltrain.run.summary import FAILED_RETURN

if TYPE_CHECKING:
    from omegaconf import DictConfig

WRITE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _sweep_value(summary: dict) -> float:
    value = summary.get("final_eval_return")
    if value is None or not math.isfinite(float(value)):
        return FAILED_RETURN
    return float(value)


def prepare_job(cfg: DictConfig, launch_dir: str) -> None:
    """What a job does between composition and ``build.run``, from the command line and from ``rltrain.train``
    alike: the launch directory recorded as ``env.search_path``, so that every process of the run (and a SLURM
    job, which starts elsewhere) finds an env module beside the user whatever its working directory
    (envs/make.py). (``experiment=auto`` is resolved before composition: ``announce_experiment``.)"""
    if not cfg.env.get("search_path"):
        from omegaconf import open_dict

        with open_dict(cfg):
            cfg.env.search_path = launch_dir


def full_traceback(err: BaseException) -> None:
    """The whole traceback on the terminal when the user set ``HYDRA_FULL_ERROR=1`` (the one line follows)."""
    if _USER_FULL_ERROR if _USER_FULL_ERROR is not None else os.environ.get("HYDRA_FULL_ERROR") == "1":
        import traceback

        traceback.print_exception(err, file=sys.stderr)


def announce_experiment(overrides: list[str]) -> list[str]:
    """``experiment=auto`` (the default) resolved to the preset made for this algo and env, or the generic
    defaults, announced in one line on stdout (stderr stays for errors); returns the overrides to compose."""
    from rltrain.cli.presets import resolve_experiment

    resolved, line = resolve_experiment(overrides)
    if line:
        print(f"[rltrain] {line}", flush=True)
    return resolved


def help_overrides(argv: list[str]) -> list[str]:
    """``rltrain --help [overrides]`` shows the config without the preset ``experiment=auto`` would add (the
    generic defaults, what each settings dataclass says) and names that preset in a line of its own."""
    from rltrain.cli.presets import resolve_experiment
    from rltrain.cli.resolvers import HELP

    resolved, line = resolve_experiment(argv)
    added = [o for o in resolved if o.startswith("experiment=") and o not in argv]
    if added:
        preset = added[0].partition("=")[2]
        HELP["preset"] = (f"The generic defaults: the settings dataclasses' values (docs/reference/config.md). "
                          f"experiment=auto (the default) adds {line.removeprefix('preset ').split(';')[0]} "
                          f"when you run this: rltrain --help experiment={preset} shows it; experiment=none runs "
                          "without it.")
        return [o for o in resolved if o not in added]
    chosen = next((o for o in argv if o.startswith("experiment=")), None)
    HELP["preset"] = (f"With {chosen}." if chosen and chosen not in ("experiment=auto", "experiment=none")
                      else f"The generic defaults: the settings dataclasses' values (docs/reference/config.md). "
                           f"{line or 'experiment=auto adds no preset here.'}")
    return resolved


def run_task(cfg: DictConfig) -> float:
    """One job: the body of the ``@hydra.main`` task (``task``, built on first use so that the console script
    catches a stop before Hydra and torch are imported)."""
    # within a second of launch, before torch & co. are imported: the raw value (false is off, true is auto)
    if cfg.logger.progress not in ("off", False):
        print("[rltrain] starting ...", flush=True)
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from rltrain.cli.build import run
    from rltrain.run.summary import set_job_args
    from rltrain.sweeps import ledger
    from rltrain.sweeps.callbacks import (
        discard_fresh_run_dir,
        hand_over_signal,
        record_failure,
        restore_hydra_files,
        stopped_by_signal,
    )

    hc = HydraConfig.get()
    set_job_args(list(hc.overrides.task))  # the job's own overrides: its resume command (run/summary.py)
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    # a sweep's job enters itself in its sweep's ledger first: the end of the sweep counts the jobs it launched,
    # not every dir of the sweep dir (sweeps/ledger.py)
    sweep_dir = ledger.sweep_dir_of(run_dir, subdir=str(hc.sweep.subdir)) if multirun else None
    if sweep_dir is not None:
        ledger.enter(sweep_dir, run_dir, num=int(hc.job.num))
    prepare_job(cfg, hc.runtime.cwd)
    if not gc.isenabled():  # main() kept the collector off for start-up: what it imported stays out of its walks
        gc.freeze()
        gc.enable()
    global _FINISHED
    try:
        summary = run(cfg, run_dir)
        _FINISHED = not multirun
    except ConfigError as err:
        if not multirun:
            note = ""
            if isinstance(err, UserCodeError) and record_failure(run_dir, err):  # the user's code raised
                note = f"; traceback in {run_dir / 'error.txt'}"
            elif not (run_dir / "summary.json").exists():  # refused before anything ran: leave no files
                discard_fresh_run_dir(run_dir)
            if isinstance(err, RunDirRefused):  # another run's dir: its .hydra/ as it was before this command
                restore_hydra_files(run_dir)
            full_traceback(err)
            print(f"rltrain: error: {err}{note}", file=sys.stderr)
            sys.exit(2)
        if isinstance(err, RunDirRefused):  # another run's dir: left as it is, the sweep's end names the job
            print(f"rltrain: job {hc.job.num} refused: {err}", file=sys.stderr)
            ledger.enter(sweep_dir, run_dir, state=ledger.REFUSED, reason=str(err), num=int(hc.job.num))
            return FAILED_RETURN
        # one bad job (e.g. a swept value out of range) must not end the sweep: record it, go on
        print(f"rltrain: job {hc.job.num} failed: {err}", file=sys.stderr)
        record_failure(run_dir, err, sweep_dir=sweep_dir)
        return FAILED_RETURN
    except StopRequested:
        if not multirun and not (run_dir / "summary.json").exists():  # stopped before anything ran
            discard_fresh_run_dir(run_dir)
        raise
    except Exception as err:
        # anything else is rltrain's own failure: still one line, the traceback in error.txt
        where = f" (traceback in {run_dir / 'error.txt'})" if record_failure(run_dir, err, sweep_dir=sweep_dir) else ""
        full_traceback(err)
        if not multirun:
            print(f"rltrain: error: {described(err)}{where}", file=sys.stderr)
            sys.exit(1)
        print(f"rltrain: job {hc.job.num} failed: {described(err)}{where}", file=sys.stderr)
        return FAILED_RETURN
    if summary.get("exit_code") and (not multirun or stopped_by_signal(summary)):
        hand_over_signal(summary)  # exits (or, under submitit, requeues)
    return _sweep_value(summary)


# Hydra plugins behind optional extras: a missing one names the extra instead of listing the valid options.
PLUGIN_EXTRAS = {"hydra/launcher/joblib": "joblib", "hydra/launcher/submitit_slurm": "slurm",
                 "hydra/launcher/submitit_local": "slurm", "hydra/sweeper/optuna": "sweep"}
OUR_LAUNCHERS = {"JoblibLauncher": "joblib", "SlurmLauncher": "submitit_slurm", "LocalLauncher": "submitit_local"}


def one_line(err: BaseException) -> str:
    """Condense a Hydra / OmegaConf composition error into one line that names the key and valid choices."""
    text = str(err)
    cause = err.__cause__
    missing = re.search(r"Could not find '([^']+)'", text)
    plugin = re.search(r"Could not (?:find|load) '(hydra/(?:launcher|sweeper)/[^']+)'", text)
    if plugin and plugin.group(1) in PLUGIN_EXTRAS:
        extra = PLUGIN_EXTRAS[plugin.group(1)]
        return f"{plugin.group(1).rpartition('/')[2]} needs the '{extra}' extra: pip install 'rltrain[{extra}]'"
    ours = re.search(r"Unknown plugin class : 'hydra_plugins\.rltrain_plugins\.launchers\.(\w+)'", text)
    if ours and f"hydra/launcher/{OUR_LAUNCHERS.get(ours.group(1))}" in PLUGIN_EXTRAS:  # defined with its extra only
        extra = PLUGIN_EXTRAS[f"hydra/launcher/{OUR_LAUNCHERS[ours.group(1)]}"]
        return f"{OUR_LAUNCHERS[ours.group(1)]} needs the '{extra}' extra: pip install 'rltrain[{extra}]'"
    if missing:
        group, _, option = missing.group(1).rpartition("/")
        options = re.findall(r"^\t(\S+)$", text, re.M)
        if group:
            return f"unknown option {group}={option} (valid: {', '.join(options)})" if options else \
                f"unknown option {group}={option}"
        return f"unknown config {missing.group(1)!r}"
    key = (re.search(r"Could not override '([^']+)'", text)
           or re.search(r"Could not append to config\. An item is already at '([^']+)'", text))
    if key and cause is not None:
        detail = str(cause).splitlines()[0]
        if "not in struct" in detail:
            return unknown_key_line(key.group(1), cause)
        return f"cannot set '{key.group(1)}': {detail}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if cause is not None:
        lines += [ln.strip() for ln in str(cause).splitlines()[:1] if ln.strip()]
    override = getattr(err, "override", None)  # an OverrideParseException: Hydra names the override only sometimes
    if isinstance(override, str) and override not in text:
        lines.insert(0, f"Error parsing override '{override}':")
    return " ".join(lines)


def unknown_key_line(path: str, cause: BaseException) -> str:
    """Hydra's "Key ... is not in struct" as cli/build.py says an unknown key: the same line, whether the key
    reached Hydra (``algo.x=1``) or the schema check (``+algo.x=1``). Inside a free-form mapping
    (``env.kwargs``) a new key is fine: it takes ``+``."""
    from omegaconf import DictConfig

    from rltrain.cli.aliases import free_form_key, unknown_key
    from rltrain.cli.schema import algo_name, all_typed_groups

    parent = getattr(cause, "parent_node", None)
    if isinstance(parent, DictConfig):  # the first part of the path that is missing (trainer.preemption.x)
        node, parts = parent._get_root(), path.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if not isinstance(child, DictConfig):
                parent, path = node, ".".join(parts[: i + 1])
                break
            node = child
    group = path.rpartition(".")[0]
    if group not in all_typed_groups():
        return free_form_key(path)
    keys = parent.keys() if isinstance(parent, DictConfig) else []
    valid = [str(k) for k in keys if str(k) not in ("_target_", "_partial_") and (group or k != "hydra")]
    algo = algo_name(str(parent.get("_target_"))) if group == "algo" and isinstance(parent, DictConfig) else None
    return unknown_key(path, valid, algo=algo)


_TASK = None
_USER_FULL_ERROR: bool | None = None  # HYDRA_FULL_ERROR=1 set by the user (main() sets it for Hydra too)
_FINISHED = False  # the single run's trainer returned its summary


def task() -> None:
    """The ``@hydra.main`` app (composes the config from the command line, then ``run_task``)."""
    global _TASK
    if _TASK is None:
        import hydra

        from rltrain.cli import schema

        schema.register()  # before @hydra.main composes, whatever hides Hydra's plugin scan (cli/schema.py)
        _TASK = hydra.main(config_path="../conf", config_name="train", version_base="1.3")(run_task)
    _TASK()


def main() -> None:
    """Console entry point: runs the Hydra app, turning composition errors into one line. A stop request
    (SIGINT, SIGTERM, SIGHUP, SIGUSR1/2) is honoured in every phase: before training starts it ends the
    command at once in one line (``StopFlag.raising``); the trainer's own flag takes over while it trains."""
    startup = StopFlag().install()
    # Full collections walk every object tracked: start-up makes ~250k long-lived ones (torch, Hydra), and one
    # full collection of them cost about 0.3 s of CPU per run (during start-up, or the interpreter's at exit).
    # So none runs during start-up (run_task freezes what it made, then turns the collector back on), and
    # the objects left at the end are frozen too: the memory of any cycle among them goes back to the OS at exit.
    gc.disable()
    try:
        with startup.raising("start-up"):
            _main()
        gc.freeze()
    except StopRequested as err:
        startup.ignore()
        # loaded only if Hydra got as far as the run dir (a stop may have cut an import short: import nothing)
        callbacks = sys.modules.get("rltrain.sweeps.callbacks")
        if _FINISHED:
            line = f"stopped ({err.reason}) after the run had ended; its summary.json stands"
        elif callbacks is None:
            line = f"stopped ({err.reason} during start-up) before training began; no run dir was made"
        else:
            line = callbacks.stopped_before_training(err, removed=callbacks.discard_fresh_run_dir(None))
        print(f"rltrain: {line}", file=sys.stderr, flush=True)
        sys.exit(err.exit_code)
    finally:
        startup.uninstall()


def exit_as_the_sweep() -> None:
    """A sweep with jobs that did not complete fails as a whole (each job's summary.json says why, a job the
    launcher could not requeue again included: it ended interrupted): 1, or 3 where they only stopped at
    max_wall_time (``sweep_exit_code``)."""
    from rltrain.sweeps.callbacks import SweepCallback

    if SweepCallback.exit_code:
        sys.exit(SweepCallback.exit_code)


def _main() -> None:
    if sys.argv[1:] == ["--version"]:  # Hydra's own --version would name Hydra's version
        from rltrain import __version__

        print(f"rltrain {__version__}")
        return
    global _USER_FULL_ERROR
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        sys.argv[1:] = help_overrides(sys.argv[1:])  # the generic defaults, and the preset auto would add
    else:
        sys.argv[1:] = announce_experiment(sys.argv[1:])  # once per command line, before Hydra composes
    _USER_FULL_ERROR = os.environ.get("HYDRA_FULL_ERROR") == "1"
    if _USER_FULL_ERROR:
        task()
        exit_as_the_sweep()
        return
    # Let Hydra raise instead of printing a multi-line report, so we can condense it.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        task()
        exit_as_the_sweep()
    except ConfigError as err:
        print(f"rltrain: error: {err}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        if isinstance(err, (HydraException, OmegaConfBaseException)) or "Unknown plugin class" in str(err):
            print(f"rltrain: error: {one_line(err)}", file=sys.stderr)
            sys.exit(2)
        if isinstance(err, OSError) and err.errno in WRITE_ERRNOS:  # e.g. Hydra writing .hydra/ into a read-only dir
            where = f" {err.filename}" if err.filename else ""
            print(f"rltrain: error: cannot write{where}: {err.strerror or err}; pick a writable hydra.run.dir or "
                  "free disk space", file=sys.stderr)
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
