"""Experiment trackers as metric sinks beside CSV and TensorBoard: Weights & Biases and MLflow.

Both receive exactly what ``metrics.csv`` receives (same scalar names, one point per log row, the x axis is
env steps), the resolved config as parameters (flattened to dotted keys: ``algo.lr``) with the run's seeds
(``seeds.*``) and system (``system.*``), and, when the run ends, the numbers of ``summary.json`` as final
metrics. Neither package is imported unless its sink is chosen.

Settings left ``None`` defer to the tracker's own conventions, so a user's usual setup works unchanged:
W&B reads ``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_MODE`` (and ``wandb offline``'s settings file) and
``WANDB_DIR``; MLflow reads ``MLFLOW_TRACKING_URI`` and ``MLFLOW_EXPERIMENT_NAME``. Without them: project
``rltrain``, W&B online into ``<run dir>/wandb``, MLflow's local store ``<run dir>/mlruns``.

Who a tracker run is follows from the run dir (``run_identity``): a multirun job is grouped under its sweep
dir's name, an agent of ``trainer=parallel`` (``<run>/agent_<k>``) under its run's name; ``logger.group`` and
``logger.name`` override both.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from rltrain.data.structs import Metrics
from rltrain.errors import ConfigError
from rltrain.run.metrics import EVAL_PREFIX

EXTRAS = {"wandb": "wandb", "mlflow": "mlflow"}  # sink -> (package, rltrain extra) share the name
DEFAULT_PROJECT = "rltrain"


@dataclass(frozen=True)
class RunIdentity:
    name: str  # the tracker run's display name
    group: str | None  # wandb group / mlflow tag ``group``: runs that belong together
    store_root: Path  # where a local store goes: the top-level run dir, or the sweep dir of a multirun


def run_identity(run_dir: Path) -> RunIdentity:
    """``outputs/multirun/D/T/3_algo=a2c`` -> (3_algo=a2c, group T); ``<run>/agent_1`` -> (agent_1, group run)."""
    run_dir = Path(run_dir).resolve()
    top, name, group = run_dir, run_dir.name, None
    if re.fullmatch(r"agent_\d+", run_dir.name) and (run_dir.parent / "config.yaml").exists():
        top, group = run_dir.parent, run_dir.parent.name
    if (top.parent / "multirun.yaml").exists():  # Hydra writes it into the sweep dir of every multirun
        name = name if top == run_dir else f"{top.name}/{name}"
        return RunIdentity(name=name, group=top.parent.name, store_root=top.parent)
    return RunIdentity(name=name, group=group, store_root=top)


class TrackerRecord:
    """``<run dir>/trackers.json``: each tracker's run id and the last env step sent to it, of each stream: the
    log rows (``last_step``) and the summary's final numbers (``final_step``), which share the last row's step.
    A resumed run continues the same tracker run (one curve, the config logged once) and sends no step twice:
    after a crash, the steps between the checkpoint and the crash were sent already, and they come again, the
    same numbers, from the replayed training; a finished run resumed in its run dir ends at the step it ended
    at, and its final numbers at that step were sent already."""

    FILE = "trackers.json"
    STREAMS = {"rows": "last_step", "final": "final_step"}  # stream -> its key in the record

    def __init__(self, run_dir: Path, sink: str, *, resumed: bool):
        self.path, self.sink = Path(run_dir) / self.FILE, sink
        mine = self._read().get(sink) if resumed else None
        mine = mine if isinstance(mine, dict) else {}
        self.run_id: str | None = mine.get("id") if isinstance(mine.get("id"), str) else None
        # a record written before final_step existed has none: its final numbers count as not sent
        self.last = {stream: mine[key] if isinstance(mine.get(key), int) else -1
                     for stream, key in self.STREAMS.items()}

    def due(self, step: int, *, stream: str = "rows") -> bool:
        """Whether ``step`` of ``stream`` is new to the tracker (every step up to the recorded one it has)."""
        return step > self.last[stream]

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def sent(self, run_id: str, step: int = -1, *, stream: str = "rows") -> None:
        """Record the run and the last step of ``stream`` sent (written whole, then renamed: a crash leaves the
        old record); no step: the run is opened, nothing sent yet."""
        self.run_id, self.last[stream] = run_id, max(self.last[stream], step)
        data = {**self._read(), self.sink: {"id": run_id, **{key: self.last[s] for s, key in self.STREAMS.items()}}}
        tmp = self.path.with_name(f".{self.FILE}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.path)


def flat_params(config: dict, prefix: str = "") -> dict[str, str | float | int | bool | None]:
    """{"algo": {"lr": 0.01}} -> {"algo.lr": 0.01}; lists become JSON text."""
    out: dict = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_params(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, tuple)) else value
    return out


def final_numbers(summary: dict) -> dict[str, float]:
    """The summary's finite numbers (status, paths and None left out: trackers take numbers only)."""
    return {k: float(v) for k, v in summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def final_step(summary: dict) -> int:
    """The env step the summary's final numbers are sent at: the run's last (that of its last log row)."""
    steps = summary.get("total_env_steps")  # None in a summary written before any step (a failed start)
    ok = isinstance(steps, (int, float)) and not isinstance(steps, bool) and math.isfinite(steps)
    return int(steps) if ok else 0


def system_info(device: str) -> dict[str, str | int | None]:
    """Where the run ran: interpreter, platform, host, cores, device and the versions that shape the numbers."""
    import importlib.metadata
    import platform
    import socket

    info: dict[str, str | int | None] = {"python": platform.python_version(), "platform": platform.platform(),
                                         "hostname": socket.gethostname(), "cpu_count": os.cpu_count(),
                                         "device": device}
    for package in ("rltrain", "torch", "gymnasium", "numpy"):
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:  # a source checkout that was never pip-installed
            info[package] = None
    if device.startswith("cuda"):
        import torch

        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def tracked_params(config: dict, *, seeds: dict | None, device: str) -> dict:
    """The parameters a tracker run records: the config, ``seeds.*`` (root, torch, env, eval) and ``system.*``."""
    return flat_params({**config, "seeds": seeds or {}, "system": system_info(device)})


def _finite(metrics: Metrics) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}


def _require(sink: str):
    import importlib

    try:
        return importlib.import_module(sink)
    except ImportError:
        raise ConfigError(f"logger.sinks={sink}: the {sink} package is missing; "
                          f"pip install 'rltrain[{EXTRAS[sink]}]'") from None


class WandbLogger:
    """One W&B run per process that logs (rank 0; each agent of ``trainer=parallel``).

    Offline (``WANDB_MODE=offline`` or ``logger.mode=offline``) needs no key and no network: the run lands in
    ``<WANDB_DIR or run dir>/wandb/offline-run-*``, the directory ``wandb sync`` uploads later.
    """

    def __init__(self, run_dir: Path, *, config: dict, project: str | None, entity: str | None,
                 group: str | None, name: str | None, tags: tuple[str, ...], mode: str | None,
                 seeds: dict | None = None, device: str = "cpu", resumed: bool = False):
        wandb = _require("wandb")
        who = run_identity(run_dir)
        self.record = TrackerRecord(run_dir, "wandb", resumed=resumed)
        # a resumed run continues its W&B run (offline: a second offline-run dir of the same id; `wandb sync`
        # uploads both into it)
        same = {"id": self.record.run_id, "resume": "allow"} if self.record.run_id else {}
        if project is None and not os.environ.get("WANDB_PROJECT"):
            project = DEFAULT_PROJECT  # wandb's own fallback would be "uncategorized"
        try:
            # None (project, entity, mode, dir) lets wandb read its environment variables and settings files
            self.run = wandb.init(project=project, entity=entity, group=group or who.group, name=name or who.name,
                                  tags=list(tags), mode=mode, dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
                                  config=tracked_params(config, seeds=seeds, device=device), reinit="create_new",
                                  # our progress display owns the terminal; wandb's console capture would fight it
                                  settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
                                  **same)
        except wandb.errors.Error as err:
            raise ConfigError(wandb_error_line(err)) from None
        self.record.sent(self.run.id)

    def log(self, step: int, metrics: Metrics, *, again: bool = False) -> None:
        # W&B takes no step below the resumed run's next one: a row logged again (an owed evaluation's) keeps
        # what W&B got first at that step, without the evaluation (docs/guide/trackers.md)
        if not self.record.due(step):  # sent before a crash, replayed since
            return
        self.run.log(_finite(metrics), step=step)
        self.record.sent(self.run.id, step)

    def close(self, summary: dict | None = None) -> None:
        if summary is not None:
            step = final_step(summary)
            if self.record.due(step, stream="final"):  # a finished run resumed ends where it ended: sent already
                self.run.summary.update(final_numbers(summary))
                self.record.sent(self.run.id, step, stream="final")
            self.run.summary["status"] = summary.get("status")  # the run's state now, not a number sent before
        failed = summary is not None and summary.get("status") == "failed"
        offline, sync_dir = self.run.offline, self.run.sync_dir
        self.run.finish(exit_code=1 if failed else 0)
        if offline:  # where the run is, and the one command that uploads it
            print(f"rltrain: W&B offline run saved; upload it with: wandb sync {sync_dir}", file=sys.stderr)


def wandb_error_line(err: Exception) -> str:
    """One line for a failed ``wandb.init``; both ways out named when it is about the key or the network."""
    text = " ".join(str(err).split())
    fixes = "run `wandb login` (or set WANDB_API_KEY), or train offline with WANDB_MODE=offline and `wandb sync` later"
    if "api key" in text.lower() or "login" in text.lower():
        return f"logger=wandb: no W&B API key for an online run; {fixes}"
    return f"logger=wandb: W&B did not start a run ({text}); {fixes}"


def mlflow_error_line(err: Exception, tracking_uri: str) -> str:
    """One line for a tracking store MLflow will not open; for a directory store (which MLflow 3 opens only
    with ``MLFLOW_ALLOW_FILE_STORE=true``), both ways out."""
    text = " ".join(str(err).split())
    if "MLFLOW_ALLOW_FILE_STORE" in text:
        store = tracking_uri.removeprefix("file://")
        return (f"logger=mlflow: MLflow 3 opens the directory store {tracking_uri} only with "
                f"MLFLOW_ALLOW_FILE_STORE=true; set it, or use a database store: "
                f"MLFLOW_TRACKING_URI=sqlite:///{Path(store).resolve()}.db")
    return (f"logger=mlflow: MLflow could not open the tracking store {tracking_uri} "
            f"({type(err).__name__}: {text[:300]})")


class MLflowLogger:
    """One MLflow run per process that logs; ``tracking_uri=None`` uses ``MLFLOW_TRACKING_URI``, else a local
    store ``<run dir>/mlruns`` (the sweep dir's under a multirun, the run's for parallel agents: one store per
    experiment). A multirun's jobs carry the tag ``group`` = the sweep dir's name."""

    def __init__(self, run_dir: Path, *, config: dict, project: str | None, group: str | None, name: str | None,
                 tags: tuple[str, ...], tracking_uri: str | None, seeds: dict | None = None, device: str = "cpu",
                 resumed: bool = False):
        _require("mlflow")
        from mlflow.tracking import MlflowClient

        who = run_identity(run_dir)
        project = project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        if tracking_uri is None:
            tracking_uri = str(who.store_root / "mlruns")
            # a plain directory is MLflow's file store, which MLflow 3 keeps behind this opt-in; pass
            # logger.tracking_uri=sqlite:///... (or a server) for a database store
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            self.client = MlflowClient(tracking_uri=tracking_uri)
            experiment = self.client.get_experiment_by_name(project)
        except Exception as err:  # noqa: BLE001 - MlflowException and what its stores raise: one line
            raise ConfigError(mlflow_error_line(err, tracking_uri)) from None
        if experiment is None:
            try:
                experiment_id = self.client.create_experiment(project)
            except Exception:  # another agent of this run created it first
                experiment_id = self.client.get_experiment_by_name(project).experiment_id
        else:
            experiment_id = experiment.experiment_id
        self.record = TrackerRecord(run_dir, "mlflow", resumed=resumed)
        if self.record.run_id and self._reopen(self.record.run_id):
            self.run_id = self.record.run_id  # its parameters are the run's from its start (MLflow keeps them)
        else:
            run_tags = {"group": group or who.group or "", "run_dir": str(Path(run_dir).resolve()),
                        **{f"tag.{t}": "true" for t in tags}}
            self.run_id = self.client.create_run(experiment_id, run_name=name or who.name,
                                                 tags=run_tags).info.run_id
            self._log_params(tracked_params(config, seeds=seeds, device=device))
        self.record.sent(self.run_id)

    def _reopen(self, run_id: str) -> bool:
        """Mark the recorded run running again; False where this store does not hold it (another store)."""
        try:
            self.client.update_run(run_id, status="RUNNING")
        except Exception:  # noqa: BLE001 - MlflowException and what its stores raise: start a new run
            return False
        return True

    def _log_params(self, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # log_batch takes at most 100 params per call
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def _log_numbers(self, step: int, numbers: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in numbers.items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i:i + 1000])

    def log(self, step: int, metrics: Metrics, *, again: bool = False) -> None:
        if again and not self.record.due(step):  # MLflow had this step's row without its evaluation: add that
            self._log_numbers(step, _finite({k: v for k, v in metrics.items() if k.startswith(EVAL_PREFIX)}))
            return
        if not self.record.due(step):  # sent before a crash, replayed since
            return
        self._log_numbers(step, _finite(metrics))
        self.record.sent(self.run_id, step)

    def close(self, summary: dict | None = None) -> None:
        status = "FINISHED"
        if summary is not None:
            step = final_step(summary)
            if self.record.due(step, stream="final"):  # a finished run resumed ends where it ended: sent already
                self._log_numbers(step, final_numbers(summary))
                self.record.sent(self.run_id, step, stream="final")
            self.client.set_tag(self.run_id, "status", str(summary.get("status")))  # the run's state now
            status = {"failed": "FAILED", "interrupted": "KILLED"}.get(summary.get("status"), "FINISHED")
        self.client.set_terminated(self.run_id, status)
